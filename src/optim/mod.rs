//! Optimizers ([`Sgd`], [`Adam`], [`AdamW`]), learning-rate schedules ([`StepLr`],
//! [`CosineAnnealing`]) and [`clip_grad_norm`], with PyTorch's update rules.
//!
//! # Ownership and allocation
//!
//! An optimizer is built over a list of parameters (arrays that require a gradient,
//! e.g. [`Module::parameters`](crate::nn::Module::parameters)) in a manager `m`; its
//! state (momentum buffers, Adam's moments) is made **once**, when it is built, in its
//! own sub-manager of `m` ([`Optimizer::manager`]): closing that manager frees the
//! state, and its `memory()` is the state's bytes. The state is in no scope, so an
//! optimizer built inside an `NDScope` outlives it.
//!
//! [`Optimizer::step`] updates every parameter **in place** from its gradient
//! (`p.gradient()`, filled by a [`GradientCollector`](crate::GradientCollector)): each
//! update is one fused elementwise pass through the in-place op path (like
//! `addi`), so a step creates no array and, in steady state, makes no heap allocation
//! at all (`tests/optim_alloc.rs` checks it with [`CountingAllocator`]). Step after
//! `backward`, outside the collector's recording (an update of a parameter the tape
//! depends on is an error, as for `addi`).
//!
//! ```
//! use ndscope::nn::{Linear, Module, Sequential, Tanh};
//! use ndscope::optim::{Adam, AdamConfig, Optimizer};
//! use ndscope::{DType, GradientCollector, NDManager, NDScope};
//! let m = NDManager::new();
//! ndscope::random::seed(3);
//! let model = Sequential::new(&m)
//!     .add_with(|mm| Linear::new(mm, 2, 16))
//!     .add(Tanh::new())
//!     .add_with(|mm| Linear::new(mm, 16, 1));
//! let mut opt = Adam::new(&m, &model.parameters(), AdamConfig { lr: 0.01, ..Default::default() });
//! let x = m.random_uniform(-1.0, 1.0, [64, 2], DType::F32);
//! let y = (x.get(":, 0:1") * x.get(":, 1:2")).keep();   // learn x0 * x1
//! let mut losses = vec![];
//! for _step in 0..200 {
//!     let _s = NDScope::new();                           // the step's intermediates
//!     let gc = GradientCollector::new();
//!     let loss = (model.forward(x) - y).square().mean();
//!     gc.backward(loss)?;
//!     drop(gc);
//!     opt.step();                                        // in place, allocation-free
//!     losses.push(loss.to_scalar::<f32>()?);
//! }
//! assert!(losses[199] < losses[0] / 4.0);
//! assert_eq!(opt.manager().memory().live_arrays, 8);     // m and v of 4 parameters
//! # Ok::<(), ndscope::NdError>(())
//! ```
//!
//! Schedules set an optimizer's learning rate by epoch (PyTorch's closed forms):
//! call [`LrScheduler::step`] once per epoch.
//!
//! [`CountingAllocator`]: crate::CountingAllocator

mod adam;
mod kernel;
mod schedule;
mod sgd;

pub use adam::{Adam, AdamConfig, AdamW};
pub use schedule::{CosineAnnealing, LrScheduler, StepLr};
pub use sgd::{Sgd, SgdConfig};

use crate::backend::cpu;
use crate::dtype::dispatch;
use crate::error::{NdError, Result, unwrap};
use crate::ext;
use crate::{NDArray, NDManager};

/// An optimizer: updates its parameters in place from their gradients.
pub trait Optimizer {
    /// One update of every parameter from its gradient, in place. Errors: `Closed` (a
    /// parameter, or the state after the optimizer's manager closed), `InvalidArgument`
    /// (a parameter no longer requires a gradient, or a gradient tape being recorded
    /// depends on it). On an error no parameter or state has changed.
    fn try_step(&mut self) -> Result<()>;

    /// [`Optimizer::try_step`]; panics with the error's message on failure.
    #[track_caller]
    fn step(&mut self) {
        unwrap(self.try_step())
    }

    /// The parameters, in the order they were given.
    fn parameters(&self) -> &[NDArray];

    /// The current learning rate.
    fn learning_rate(&self) -> f64;

    /// Set the learning rate used by the next steps (a schedule calls this), as given.
    fn set_learning_rate(&mut self, lr: f64);

    /// The number of steps taken (Adam's bias corrections use it; SGD's first step
    /// initialises the momentum buffers).
    fn step_count(&self) -> u64;

    /// Set the number of steps taken (to resume from a checkpoint together with the
    /// state of [`Optimizer::named_state`]).
    fn set_step_count(&mut self, steps: u64);

    /// The optimizer's own sub-manager, which owns its state.
    fn manager(&self) -> &NDManager;

    /// The state arrays with PyTorch's names, prefixed by the parameter's index:
    /// `"0.momentum_buffer"` (SGD with momentum), `"0.exp_avg"`, `"0.exp_avg_sq"`
    /// (Adam, AdamW). Writing into them in place (a loaded checkpoint) sets the state.
    fn named_state(&self) -> Vec<(String, NDArray)>;

    /// Move the state ([`Optimizer::named_state`]) to `device` in place, to follow a
    /// model moved there with [`Module::try_to_device`](crate::nn::Module::try_to_device)
    /// (a new optimizer makes its state on each parameter's device). Errors: those of
    /// [`NDArray::try_move_to_device`]; the arrays moved before an error stay moved.
    fn try_to_device(&self, device: crate::Device) -> Result<()> {
        for (_, a) in self.named_state() {
            a.try_move_to_device(device)?;
        }
        Ok(())
    }

    /// [`Optimizer::try_to_device`]; panics with the error's message on failure.
    #[track_caller]
    fn to_device(&self, device: crate::Device) {
        crate::error::unwrap(self.try_to_device(device))
    }

    /// Set every parameter's gradient to zero, in place (a [`GradientCollector`]
    /// zeroes them when it starts; this is for `GradientCollector::accumulating`).
    /// Parameters that no longer require a gradient are skipped. Errors: `Closed`.
    ///
    /// [`GradientCollector`]: crate::GradientCollector
    fn try_zero_grad(&self) -> Result<()> {
        for &p in self.parameters() {
            if p.try_dtype().is_ok() && !p.requires_gradient() {
                continue;
            }
            let g = p.try_gradient()?;
            if g.try_device()? != crate::Device::Cpu {
                g.try_set("", 0)?;
                continue;
            }
            ext::update_in_place(g, [], |mut t, []| {
                dispatch!(t.dtype(), T => {
                    let z = <T as crate::dtype::Native>::ZERO;
                    cpu::assign_unary::<T>(t.view_mut::<T>(), move |_| z)
                });
                Ok(())
            })?;
        }
        Ok(())
    }

    /// [`Optimizer::try_zero_grad`]; panics on failure.
    #[track_caller]
    fn zero_grad(&self) {
        unwrap(self.try_zero_grad())
    }
}

/// An error unless `v` is finite (and, with `non_negative`, ≥ 0).
pub(crate) fn check_finite(op: &'static str, what: &str, v: f64, non_negative: bool) -> Result<()> {
    if !v.is_finite() || (non_negative && v < 0.0) {
        let need = if non_negative {
            "finite and >= 0"
        } else {
            "finite"
        };
        return Err(NdError::invalid(
            op,
            format!("invalid {what} {v}: must be {need}"),
        ));
    }
    Ok(())
}

/// Parameters, per-parameter state buffers and the step count of an optimizer.
#[derive(Debug)]
pub(crate) struct State {
    params: Vec<NDArray>,
    /// `per` buffers for each parameter, parameter-major: `buffers[i * per + k]`.
    buffers: Vec<NDArray>,
    per: usize,
    manager: NDManager,
    steps: u64,
}

impl State {
    /// Validate `params` and make `per` zero buffers like each in a new sub-manager of
    /// `m` named `name` (closed again on an error).
    fn new(
        op: &'static str,
        name: &str,
        m: &NDManager,
        params: &[NDArray],
        per: usize,
    ) -> Result<State> {
        if params.is_empty() {
            return Err(NdError::invalid(
                op,
                "the optimizer got an empty parameter list",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, &p) in params.iter().enumerate() {
            p.try_dtype()?;
            if !p.requires_gradient() {
                return Err(NdError::invalid(
                    op,
                    format!(
                        "parameter {i} ({p:?}) does not require a gradient: call set_requires_gradient(true)"
                    ),
                ));
            }
            if !seen.insert(p) {
                return Err(NdError::invalid(
                    op,
                    format!("parameter {i} ({p:?}) appears more than once"),
                ));
            }
        }
        let manager = m.try_new_sub_manager()?;
        manager.set_name(name);
        let made = (|| {
            let mut buffers = Vec::with_capacity(params.len() * per);
            for &p in params {
                let (shape, dtype) = (p.try_shape()?, p.try_dtype()?);
                let device = p.try_device()?;
                for _ in 0..per {
                    let z = manager.try_zeros(shape.clone(), dtype)?.keep();
                    buffers.push(z);
                    // On the parameter's device, whatever the manager's.
                    z.try_move_to_device(device)?;
                }
            }
            Ok(buffers)
        })();
        match made {
            Ok(buffers) => Ok(State {
                params: params.to_vec(),
                buffers,
                per,
                manager,
                steps: 0,
            }),
            Err(e) => {
                manager.close();
                Err(e)
            }
        }
    }

    /// Everything a step needs is there, so that a step fails before changing anything.
    fn check(&self, op: &'static str) -> Result<()> {
        for &p in &self.params {
            p.try_gradient()?;
            crate::autograd::check_inplace(op, p.id)?;
        }
        for &b in &self.buffers {
            b.try_dtype()?;
        }
        Ok(())
    }

    fn named(&self, names: &[&str]) -> Vec<(String, NDArray)> {
        // (Plain SGD keeps no state: `per` is 0 and there is nothing to name.)
        debug_assert!(self.per == 0 || names.len() == self.per);
        let mut v = Vec::with_capacity(self.buffers.len());
        for (j, &b) in self.buffers.iter().enumerate() {
            v.push((format!("{}.{}", j / self.per, names[j % self.per]), b));
        }
        v
    }
}

/// Scale the gradients of `params` in place so that their total 2-norm is at most
/// `max_norm`, and return the total norm before clipping (PyTorch's
/// `clip_grad_norm_` with `norm_type=2`). Panics on failure.
///
/// The norm is over all gradients together: `sqrt(Σ ‖g‖²)`, accumulated in f64. When
/// it exceeds `max_norm`, every gradient is multiplied by
/// `max_norm / (total + 1e-6)`, as PyTorch. Parameters that do not require a gradient
/// are skipped (PyTorch skips parameters without `.grad`). A non-finite total norm is
/// returned and scales the gradients as in PyTorch without `error_if_nonfinite`
/// (making them NaN). Nothing is allocated.
///
/// ```
/// use ndscope::optim::clip_grad_norm;
/// use ndscope::{GradientCollector, NDManager};
/// let m = NDManager::new();
/// let w = m.create(&[3.0f64, 4.0], [2]).set_requires_gradient(true);
/// let gc = GradientCollector::new();
/// gc.backward((w * w).sum() * 0.5)?;                 // gradient = w, norm 5
/// drop(gc);
/// assert_eq!(clip_grad_norm(&[w], 1.0), 5.0);
/// let g = w.gradient().to_vec::<f64>()?;
/// assert!((g[0] - 0.6).abs() < 1e-6 && (g[1] - 0.8).abs() < 1e-6);
/// # Ok::<(), ndscope::NdError>(())
/// ```
#[track_caller]
pub fn clip_grad_norm(params: &[NDArray], max_norm: f64) -> f64 {
    unwrap(try_clip_grad_norm(params, max_norm))
}

/// [`clip_grad_norm`]. Errors: `InvalidArgument` (a negative or NaN `max_norm`, or a
/// gradient tape being recorded depends on a gradient), `Closed`. On an error no
/// gradient has changed.
pub fn try_clip_grad_norm(params: &[NDArray], max_norm: f64) -> Result<f64> {
    if max_norm.is_nan() || max_norm < 0.0 {
        return Err(NdError::invalid(
            "clip_grad_norm",
            format!("max_norm must be >= 0, got {max_norm}"),
        ));
    }
    let mut sum = 0.0f64;
    for &p in params {
        p.try_dtype()?;
        if !p.requires_gradient() {
            continue;
        }
        let g = p.try_gradient()?;
        crate::autograd::check_inplace("clip_grad_norm", g.id)?;
        sum += kernel::sum_of_squares("clip_grad_norm", g)?;
    }
    let total = sum.sqrt();
    let coef = max_norm / (total + 1e-6);
    // PyTorch: `grads *= clamp(coef, max=1)`; a NaN coefficient propagates.
    if coef < 1.0 || coef.is_nan() {
        for &p in params {
            if p.requires_gradient() {
                p.try_gradient()?.try_muli(coef)?;
            }
        }
    }
    Ok(total)
}
