//! Neural-network layers: the [`Module`] trait, [`Linear`], [`Conv2d`],
//! [`MaxPool2d`], [`Embedding`], [`LayerNorm`], [`BatchNorm2d`], [`Dropout`],
//! [`Sequential`], [`Flatten`] and the activations [`Relu`], [`Gelu`], [`Tanh`] and
//! [`Sigmoid`], with PyTorch's parameter layout, names and default initialisation
//! ([`init`]); checkpoints of a model and its optimizer ([`save_with_optimizer`]).
//!
//! # Ownership
//!
//! A layer with parameters is built in a manager `m` and creates **its own
//! sub-manager** of `m` ([`Module::manager`]) holding exactly its parameters and their
//! gradients: closing that manager frees the layer, and its `memory()` is the layer's
//! bytes. A [`Sequential`] is a sub-manager too, and its layers are built in it
//! ([`Sequential::add_with`], or with [`Sequential::manager`] as their manager), so
//! the whole model is one subtree of the manager tree:
//!
//! ```text
//! m
//! └── Sequential          <- model.manager(): closing it frees the model
//!     ├── Linear          <- weight, bias and their gradients
//!     └── Linear
//! ```
//!
//! Parameters are in no scope (like a gradient, rule 10 of the ownership model): a
//! model built inside an `NDScope` outlives it. They require a gradient
//! ([`NDArray::set_requires_gradient`]), so a [`GradientCollector`] fills
//! `p.gradient()` and an optimizer ([`crate::optim`]) updates them in place.
//!
//! A forward pass creates its intermediates in a scope of its own and returns only its
//! output (registered in the caller's scope, owned by the input's manager, as for any
//! op): a layer never leaves a temporary (a transposed weight, a pre-activation) in the
//! model's manager, and on an error nothing it made is left behind.
//!
//! ```
//! use ndscope::nn::{Linear, Module, Relu, Sequential};
//! use ndscope::{DType, GradientCollector, NDManager, NDScope};
//! let m = NDManager::new();
//! ndscope::random::seed(0);
//! let model = Sequential::new(&m)
//!     .add_with(|mm| Linear::new(mm, 4, 8))
//!     .add(Relu::new())
//!     .add_with(|mm| Linear::new(mm, 8, 1));
//! let names: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
//! assert_eq!(names, ["0.weight", "0.bias", "2.weight", "2.bias"]);
//!
//! let x = m.ones([16, 4], DType::F32);
//! {
//!     let _s = NDScope::new();                     // frees the step's intermediates
//!     let gc = GradientCollector::new();
//!     let loss = model.forward(x).square().mean();
//!     gc.backward(loss).expect("backward");
//! }
//! // Parameters and gradients: (8*4 + 8 + 8 + 1) * 2 f32 values.
//! assert_eq!(model.manager().memory().live_bytes, 49 * 2 * 4);
//! model.manager().close();                         // frees the model
//! assert!(model.parameters()[0].is_closed());
//! # Ok::<(), ndscope::NdError>(())
//! ```
//!
//! # Modes
//!
//! [`Module::train`] and [`Module::eval`] set the mode flag of a module and of all its
//! children ([`Module::is_training`]); a new module is in training mode, as in
//! PyTorch. [`Dropout`] (the identity in evaluation mode) and [`BatchNorm2d`] (batch
//! statistics and running-statistics updates in training mode, the running statistics
//! in evaluation mode) are the layers that behave differently.
//!
//! # Layers
//!
//! | layer | PyTorch | parameters (buffers) | forward |
//! |---|---|---|---|
//! | [`Linear`] | `nn.Linear` | `weight [out, in]`, `bias [out]` | `x Wᵀ + b` |
//! | [`Conv2d`] | `nn.Conv2d` | `weight [out, in/groups, kh, kw]`, `bias [out]` | the `conv2d` op |
//! | [`MaxPool2d`] | `nn.MaxPool2d` | | the `max_pool2d` op |
//! | [`Embedding`] | `nn.Embedding` | `weight [num, dim]` | the `embedding` op |
//! | [`LayerNorm`] | `nn.LayerNorm` | `weight`, `bias` of `normalized_shape` | the `layer_norm` op |
//! | [`BatchNorm2d`] | `nn.BatchNorm2d` | `weight [C]`, `bias [C]` (`running_mean`, `running_var`, `num_batches_tracked`) | the `batch_norm` op |
//! | [`Dropout`] | `nn.Dropout` | | the `dropout` op in training mode, the identity in evaluation mode |
//! | [`Relu`], [`Gelu`], [`Tanh`], [`Sigmoid`] | `nn.ReLU`, ... | | elementwise |
//! | [`Flatten`] | `nn.Flatten` | | a reshape |
//! | [`Sequential`] | `nn.Sequential` | its layers', as `"<i>.<name>"` | the layers in order |
//!
//! Initialisation is PyTorch's default for each layer ([`init`]): U(-1/√fan_in,
//! 1/√fan_in) for the weights and biases of `Linear` and `Conv2d`, N(0, 1) for
//! `Embedding`, ones and zeros for the normalisation layers.
//!
//! A layer of your own is a struct implementing [`Module`]: `try_forward` (one op or a
//! few, in a scope), `named_parameters` (its own names, in PyTorch's order),
//! `named_buffers` (state that is saved but not trained), `set_training`/`is_training`
//! (a `bool` field) and `manager` (its sub-manager). Parameters are made with [`init`]
//! in a sub-manager of the given manager, `keep()`-ed out of every scope and marked
//! `set_requires_gradient(true)`; a constructor that fails closes its sub-manager.
//!
//! # Checkpoints
//!
//! [`save`] and [`load`] write a model's [`state_dict`] (parameters and buffers, with
//! PyTorch's names) to a safetensors file and read it back in place;
//! [`save_with_optimizer`] and [`load_with_optimizer`] add an optimizer's state and
//! step count, so that training resumes exactly (feature `io`, on by default).
//!
//! # Training a model
//!
//! A small CNN on the bundled digits: a scope per step (the batch is taken inside it),
//! Adam, a checkpoint. `examples/digits.rs` is the full program.
//!
//! ```
//! use ndscope::data::{Batches, TestSize, load_digits, train_test_split};
//! use ndscope::nn::{self, Conv2d, Flatten, Linear, MaxPool2d, Module, Relu, Sequential};
//! use ndscope::optim::{Adam, AdamConfig, Optimizer};
//! use ndscope::{GradientCollector, NDManager, NDScope};
//!
//! let m = NDManager::new();
//! let (x, y) = load_digits(&m);                          // [1797, 64] f32, [1797] i64
//! let x = x.reshape([1797, 1, 8, 8]);
//! let (train, test) = train_test_split(&[x, y], TestSize::Count(360), None);
//!
//! ndscope::random::seed(0);
//! let mut model = Sequential::new(&m)
//!     .add_with(|mm| Conv2d::builder(1, 8, 3).padding(1).build(mm))
//!     .add(Relu::new())
//!     .add(MaxPool2d::new(2))
//!     .add(Flatten::new())
//!     .add_with(|mm| Linear::new(mm, 8 * 4 * 4, 10));
//! let mut opt = Adam::new(&m, &model.parameters(), AdamConfig { lr: 1e-2, ..Default::default() });
//!
//! let batches = Batches::new(&train, 32).shuffle(0);
//! let mut it = batches.iter();
//! for _step in 0..20 {
//!     let _s = NDScope::new();                            // frees the step's arrays,
//!     let batch = it.next().unwrap();                     // the batch included
//!     let gc = GradientCollector::new();
//!     let loss = model.forward(batch[0]).cross_entropy(batch[1]);
//!     gc.backward(loss).expect("backward");
//!     drop(gc);
//!     opt.step();                                         // in place
//! }
//!
//! model.eval();
//! let accuracy = ndscope::scope(|| {                      // frees the predictions
//!     let predicted = model.forward(test[0]).argmax_axis(-1, false);
//!     let hits = predicted.eq(test[1]).to_dtype(ndscope::DType::F64).mean();
//!     hits.to_scalar::<f64>().unwrap()
//! });
//! assert!(accuracy > 0.5, "{accuracy}");                  // 20 steps are enough for that
//!
//! let path = std::env::temp_dir().join(format!("ndscope-nn-doc-{}.safetensors", std::process::id()));
//! nn::save_with_optimizer(&path, &model, &opt);           // parameters, Adam's moments, step
//! nn::load_with_optimizer(&path, &model, &mut opt);
//! std::fs::remove_file(&path).unwrap();
//! ```
//!
//! [`NDArray::set_requires_gradient`]: crate::NDArray::set_requires_gradient
//! [`GradientCollector`]: crate::GradientCollector

mod activation;
#[cfg(feature = "io")]
mod checkpoint;
mod conv;
mod embedding;
pub mod init;
mod linear;
mod norm;
mod sequential;

pub use activation::{Dropout, Flatten, Gelu, Relu, Sigmoid, Tanh};
#[cfg(feature = "io")]
pub use checkpoint::{
    load, load_with_optimizer, save, save_with_optimizer, try_load, try_load_with_optimizer,
    try_save, try_save_with_optimizer,
};
pub use conv::{Conv2d, Conv2dBuilder, MaxPool2d};
pub use embedding::{Embedding, EmbeddingBuilder};
pub use linear::{Linear, LinearBuilder};
pub use norm::{BatchNorm2d, BatchNorm2dBuilder, LayerNorm, LayerNormBuilder};
pub use sequential::Sequential;

use crate::error::{NdError, Result, unwrap};
use crate::{DType, NDArray, NDManager};

/// A layer or a model: a function of an array with parameters that can be trained.
///
/// Implementations provide [`Module::try_forward`], their parameters (names in
/// PyTorch's `named_parameters` order and spelling: `"weight"`, `"bias"`, and
/// `"<i>.<name>"` inside a [`Sequential`]), the training-mode flag and their manager.
/// See the [module documentation](self) for ownership. Modules are `Send + Sync`
/// (their state is array handles and flags), so a model can be shared with other
/// threads.
pub trait Module: Send + Sync {
    /// The output for input `x`. Errors: those of the ops the layer runs (a
    /// `ShapeMismatch` for an input of the wrong size, a `DTypeMismatch` for an input of
    /// another dtype than the parameters, `Closed` for a closed model or input...).
    /// Nothing the forward pass created is left behind on an error.
    fn try_forward(&self, x: NDArray) -> Result<NDArray>;

    /// [`Module::try_forward`]; panics with the error's message on failure.
    #[track_caller]
    fn forward(&self, x: NDArray) -> NDArray {
        unwrap(self.try_forward(x))
    }

    /// The trainable parameters with their dotted names, in a stable order (PyTorch's
    /// `named_parameters`). Empty for a layer without parameters.
    fn named_parameters(&self) -> Vec<(String, NDArray)> {
        Vec::new()
    }

    /// The trainable parameters, in the order of [`Module::named_parameters`].
    fn parameters(&self) -> Vec<NDArray> {
        self.named_parameters()
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }

    /// State that is saved with the model but not trained (a batch-norm layer's running
    /// statistics), with dotted names (PyTorch's `named_buffers`). Empty by default.
    fn named_buffers(&self) -> Vec<(String, NDArray)> {
        Vec::new()
    }

    /// Set the mode of this module and of all its children: `true` for training,
    /// `false` for evaluation.
    fn set_training(&mut self, training: bool);

    /// Whether the module is in training mode (the default for a new module).
    fn is_training(&self) -> bool;

    /// Training mode, for this module and its children (PyTorch's `train()`).
    fn train(&mut self) {
        self.set_training(true);
    }

    /// Evaluation mode, for this module and its children (PyTorch's `eval()`).
    fn eval(&mut self) {
        self.set_training(false);
    }

    /// The sub-manager that owns this module's parameters, buffers and their gradients
    /// (closing it frees the module; its `memory()` is the module's bytes), or `None`
    /// for a module without state (an activation, [`Flatten`]). [`Linear`] and
    /// [`Sequential`] also have an inherent `manager()` returning the manager itself,
    /// which method-call syntax on those types picks (`model.manager().close()`).
    fn manager(&self) -> Option<NDManager> {
        None
    }

    /// Move the parameters (with their gradients) and the buffers to `device`, in
    /// place ([`NDArray::move_to_device`]): the same handles, in the same sub-managers,
    /// so an optimizer built on [`Module::parameters`] keeps updating them; move its
    /// state with [`Optimizer::try_to_device`](crate::optim::Optimizer::try_to_device).
    /// A checkpoint of the model ([`save`]) loads into a model on any device.
    /// Errors: those of [`NDArray::try_move_to_device`]; the arrays moved before an
    /// error stay moved (call again to finish).
    fn try_to_device(&self, device: crate::Device) -> Result<()> {
        for (_, a) in self
            .named_parameters()
            .into_iter()
            .chain(self.named_buffers())
        {
            a.try_move_to_device(device)?;
        }
        Ok(())
    }

    /// [`Module::try_to_device`]; panics with the error's message on failure.
    #[track_caller]
    fn to_device(&self, device: crate::Device) {
        unwrap(self.try_to_device(device))
    }
}

impl<M: Module + ?Sized> Module for Box<M> {
    fn try_forward(&self, x: NDArray) -> Result<NDArray> {
        (**self).try_forward(x)
    }

    #[track_caller]
    fn forward(&self, x: NDArray) -> NDArray {
        unwrap((**self).try_forward(x))
    }

    fn named_parameters(&self) -> Vec<(String, NDArray)> {
        (**self).named_parameters()
    }

    fn parameters(&self) -> Vec<NDArray> {
        (**self).parameters()
    }

    fn named_buffers(&self) -> Vec<(String, NDArray)> {
        (**self).named_buffers()
    }

    fn set_training(&mut self, training: bool) {
        (**self).set_training(training)
    }

    fn is_training(&self) -> bool {
        (**self).is_training()
    }

    fn manager(&self) -> Option<NDManager> {
        (**self).manager()
    }
}

/// Make `a` a parameter: out of every scope, requiring a gradient.
pub(crate) fn make_parameter(a: NDArray) -> Result<NDArray> {
    a.try_dtype()?; // `keep` panics on a closed array
    a.keep();
    a.try_set_requires_gradient(true)
}

/// A model's state: its parameters ([`Module::named_parameters`]) and then its buffers
/// ([`Module::named_buffers`]), with their names (PyTorch's `state_dict()`; the
/// arrays themselves, not copies).
///
/// ```
/// use ndscope::nn::{BatchNorm2d, Conv2d, Module, Sequential, state_dict};
/// use ndscope::NDManager;
/// let m = NDManager::new();
/// let model = Sequential::new(&m)
///     .add_with(|mm| Conv2d::new(mm, 1, 4, 3))
///     .add_with(|mm| BatchNorm2d::new(mm, 4));
/// let names: Vec<String> = state_dict(&model).into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["0.weight", "0.bias", "1.weight", "1.bias",
///                    "1.running_mean", "1.running_var", "1.num_batches_tracked"]);
/// ```
pub fn state_dict<M: Module + ?Sized>(model: &M) -> Vec<(String, NDArray)> {
    let mut v = model.named_parameters();
    v.extend(model.named_buffers());
    v
}

/// Make a layer's state in a new sub-manager of `m` named `name`: `make(&sub)` creates
/// it; on an error the sub-manager is closed (nothing is left in `m`).
/// `InvalidArgument` from `op` unless `dtype` is a float type (what every layer's
/// parameters and every initialisation need).
pub(crate) fn check_param_dtype(op: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        return Ok(());
    }
    Err(NdError::invalid(
        op,
        format!("parameters are float arrays, got dtype {dtype}"),
    ))
}

pub(crate) fn build_in<T>(
    m: &NDManager,
    name: &str,
    make: impl FnOnce(&NDManager) -> Result<T>,
) -> Result<(NDManager, T)> {
    let sub = m.try_new_sub_manager()?;
    sub.set_name(name);
    match make(&sub) {
        Ok(t) => Ok((sub, t)),
        Err(e) => {
            sub.close();
            Err(e)
        }
    }
}

/// A size for both spatial dimensions: one number for both (`3`) or `[h, w]`
/// (`[3, 1]`), as PyTorch's int-or-tuple arguments of `Conv2d` and `MaxPool2d`.
///
/// ```
/// use ndscope::nn::Pair;
/// assert_eq!(3.pair(), [3, 3]);
/// assert_eq!([3, 1].pair(), [3, 1]);
/// ```
pub trait Pair {
    /// `[h, w]`.
    fn pair(self) -> [usize; 2];
}

impl Pair for usize {
    fn pair(self) -> [usize; 2] {
        [self, self]
    }
}

impl Pair for [usize; 2] {
    fn pair(self) -> [usize; 2] {
        self
    }
}
