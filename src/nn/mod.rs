//! Neural-network layers: the [`Module`] trait, [`Linear`], [`Sequential`],
//! [`Flatten`] and the activations [`Relu`], [`Tanh`] and [`Sigmoid`], with PyTorch's
//! parameter layout, names and default initialisation ([`init`]).
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
//!     gc.backward(loss)?;
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
//! PyTorch. None of today's layers behaves differently in the two modes.
//!
//! # Adding layers (the plan for the layers that need issue 11's operations)
//!
//! A layer is a struct implementing [`Module`]: `try_forward` (one op or a few, in a
//! scope), `named_parameters` (its own names, in PyTorch's order), `named_buffers`
//! (state that is saved but not trained), `set_training`/`is_training` (a `bool`
//! field) and `manager` (its sub-manager). Parameters are made with [`init`] in a
//! sub-manager of the given manager, `keep()`-ed out of every scope and marked
//! `set_requires_gradient(true)`; a constructor that fails closes its sub-manager.
//! The layers still to come, with PyTorch's layouts and defaults:
//!
//! * `Conv2d::new(m, in, out, kernel)` (+ builder for stride, padding, dilation,
//!   groups, bias): weight `[out, in/groups, kh, kw]` and bias `[out]`, both with
//!   [`init::Init::pytorch_default`] and the bias bound `1/sqrt(fan_in)` computed from
//!   the weight's shape by [`init::fan_in_and_fan_out`], exactly as [`Linear`];
//!   forward = the `conv2d` op.
//! * `MaxPool2d::new(kernel)` (+ stride, padding): no parameters; forward = the
//!   `max_pool2d` op.
//! * `Embedding::new(m, num, dim)`: weight `[num, dim]` ~ N(0, 1)
//!   ([`init::Init::Normal`]); forward = `index_select` of rows by an integer input.
//! * `LayerNorm::new(m, shape)`: weight = ones, bias = zeros of `shape`, eps 1e-5;
//!   forward = the `layer_norm` op.
//! * `BatchNorm2d::new(m, channels)`: weight = ones, bias = zeros `[C]`; buffers
//!   `running_mean` (zeros), `running_var` (ones) and `num_batches_tracked`, in the
//!   layer's manager, kept, without gradient, listed by `named_buffers`. Training mode
//!   normalises with the batch statistics and updates the running ones in place
//!   (momentum 0.1, unbiased variance for the running estimate); eval mode uses the
//!   running ones.
//! * `Dropout::new(p)`: no parameters; training mode = the `dropout` op (scaled by
//!   `1/(1-p)`), eval mode = the identity (the input itself).
//! * `Gelu::new()` (exact erf form, `Gelu::tanh()` for the approximation): the `gelu`
//!   op, defined like [`Relu`] here.
//!
//! [`NDArray::set_requires_gradient`]: crate::NDArray::set_requires_gradient
//! [`GradientCollector`]: crate::GradientCollector

mod activation;
pub mod init;
mod linear;
mod sequential;

pub use activation::{Flatten, Relu, Sigmoid, Tanh};
pub use linear::{Linear, LinearBuilder};
pub use sequential::Sequential;

use crate::error::{Result, unwrap};
use crate::{NDArray, NDManager};

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
