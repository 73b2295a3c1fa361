//! Checkpoints of a model, and of a model with its optimizer: [`save`], [`load`],
//! [`save_with_optimizer`], [`load_with_optimizer`] (safetensors files written and read
//! by [`crate::io::save_checkpoint`] and [`crate::io::load_into`]).

use super::{Module, state_dict};
use crate::error::{Result, unwrap};
use crate::optim::Optimizer;
use crate::{NDArray, NDManager, io};
use std::path::Path;

/// The prefix of an optimizer's arrays in a checkpoint.
const OPTIM: &str = "optim.";
/// The name of an optimizer's step count (a 0-d i64) in a checkpoint.
const STEP: &str = "optim.step";

/// Write `model`'s [`state_dict`] to `path` (a safetensors file, replaced atomically;
/// PyTorch's names, so `safetensors.torch.load_file` reads it as a `state_dict`).
/// Panics on error (see [`try_save`]).
///
/// ```
/// use ndscope::nn::{self, Linear, Module};
/// use ndscope::NDManager;
/// let m = NDManager::new();
/// let path = std::env::temp_dir().join(format!("ndscope-nn-save-{}.safetensors", std::process::id()));
/// let a = Linear::new(&m, 3, 2);
/// let b = Linear::new(&m, 3, 2);                    // other random values
/// nn::save(&path, &a);
/// nn::load(&path, &b);                              // in place
/// assert_eq!(b.weight().to_vec::<f32>()?, a.weight().to_vec::<f32>()?);
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), ndscope::NdError>(())
/// ```
#[track_caller]
pub fn save<M: Module + ?Sized>(path: impl AsRef<Path>, model: &M) {
    unwrap(try_save(path, model))
}

/// [`save`]. Errors: `Closed` (a closed model), `InvalidArgument` (a repeated name),
/// `Io`.
pub fn try_save<M: Module + ?Sized>(path: impl AsRef<Path>, model: &M) -> Result<()> {
    io::try_save_checkpoint(path, &state_dict(model))
}

/// Load a checkpoint written by [`save`] into `model`'s parameters and buffers, in
/// place, bit for bit (all or nothing: the file must hold exactly the model's names,
/// dtypes and shapes). Panics on error (see [`try_load`]).
#[track_caller]
pub fn load<M: Module + ?Sized>(path: impl AsRef<Path>, model: &M) {
    unwrap(try_load(path, model))
}

/// [`load`]. Errors: those of [`io::try_load_into`] (`Format` for a file that does
/// not match the model, `Io`, `Closed`). Nothing changes on an error.
pub fn try_load<M: Module + ?Sized>(path: impl AsRef<Path>, model: &M) -> Result<()> {
    io::try_load_into(path, &state_dict(model))
}

/// The optimizer's state under `"optim."` ([`Optimizer::named_state`]).
fn optimizer_state<O: Optimizer + ?Sized>(opt: &O) -> impl Iterator<Item = (String, NDArray)> {
    opt.named_state()
        .into_iter()
        .map(|(n, a)| (format!("{OPTIM}{n}"), a))
}

/// Write `model`'s [`state_dict`] and `opt`'s state to `path`: the optimizer's
/// arrays ([`Optimizer::named_state`]) under `"optim."` (`"optim.0.exp_avg"`, ...)
/// and its step count as `"optim.step"` (a 0-d i64), so that
/// [`load_with_optimizer`] resumes training exactly where it stopped (the learning
/// rate is not saved: a schedule sets it). Panics on error (see
/// [`try_save_with_optimizer`]).
///
/// ```
/// use ndscope::nn::{self, Linear, Module};
/// use ndscope::optim::{Adam, AdamConfig, Optimizer};
/// use ndscope::{DType, GradientCollector, NDManager, NDScope};
/// let m = NDManager::new();
/// let path = std::env::temp_dir().join(format!("ndscope-nn-ckpt-{}.safetensors", std::process::id()));
/// let model = Linear::new(&m, 2, 1);
/// let mut opt = Adam::new(&m, &model.parameters(), AdamConfig::default());
/// let x = m.ones([4, 2], DType::F32);
/// let mut step = |opt: &mut Adam| {
///     let _s = NDScope::new();
///     let gc = GradientCollector::new();
///     gc.backward(model.forward(x).square().mean()).unwrap();
///     drop(gc);
///     opt.step();
/// };
/// step(&mut opt);
/// nn::save_with_optimizer(&path, &model, &opt);
/// let saved = model.weight().to_vec::<f32>()?;
/// step(&mut opt);                                   // training goes on...
/// nn::load_with_optimizer(&path, &model, &mut opt); // ...and is rolled back
/// assert_eq!(model.weight().to_vec::<f32>()?, saved);
/// assert_eq!(opt.step_count(), 1);
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), ndscope::NdError>(())
/// ```
#[track_caller]
pub fn save_with_optimizer<M: Module + ?Sized, O: Optimizer + ?Sized>(
    path: impl AsRef<Path>,
    model: &M,
    opt: &O,
) {
    unwrap(try_save_with_optimizer(path, model, opt))
}

/// [`save_with_optimizer`]. Errors: as [`try_save`].
pub fn try_save_with_optimizer<M: Module + ?Sized, O: Optimizer + ?Sized>(
    path: impl AsRef<Path>,
    model: &M,
    opt: &O,
) -> Result<()> {
    let path = path.as_ref();
    // The step count travels as a 0-d array made for the write and freed by the scope.
    crate::scope(|| {
        let step = NDManager::system().try_create(&[opt.step_count() as i64], [])?;
        let mut named = state_dict(model);
        named.extend(optimizer_state(opt));
        named.push((STEP.to_string(), step));
        io::try_save_checkpoint(path, &named)
    })
}

/// Load a checkpoint written by [`save_with_optimizer`] into `model` and `opt`, in
/// place: parameters, buffers, the optimizer's state and its step count, exactly as
/// they were saved (all or nothing). Panics on error (see
/// [`try_load_with_optimizer`]).
#[track_caller]
pub fn load_with_optimizer<M: Module + ?Sized, O: Optimizer + ?Sized>(
    path: impl AsRef<Path>,
    model: &M,
    opt: &mut O,
) {
    unwrap(try_load_with_optimizer(path, model, opt))
}

/// [`load_with_optimizer`]. Errors: as [`try_load`] (a file without the optimizer's
/// state, or written for another model or optimizer, is `Format`). Nothing changes on
/// an error.
pub fn try_load_with_optimizer<M: Module + ?Sized, O: Optimizer + ?Sized>(
    path: impl AsRef<Path>,
    model: &M,
    opt: &mut O,
) -> Result<()> {
    let path = path.as_ref();
    let steps = crate::scope(|| {
        let step = NDManager::system().try_create(&[0i64], [])?;
        let mut named = state_dict(model);
        named.extend(optimizer_state(opt));
        named.push((STEP.to_string(), step));
        io::try_load_into(path, &named)?;
        step.to_scalar::<i64>()
    })?;
    opt.set_step_count(steps.max(0) as u64);
    Ok(())
}
