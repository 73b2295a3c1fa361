//! [`Sequential`]: layers applied one after the other.

use super::Module;
use crate::error::{NdError, Result, unwrap};
use crate::{NDArray, NDManager};

/// Layers applied in order (PyTorch's `nn.Sequential`); itself a [`Module`].
///
/// A `Sequential` is a sub-manager of the manager it was built in
/// ([`Sequential::manager`]), and its layers are built in that sub-manager
/// ([`Sequential::add_with`] passes it), so closing it frees the whole model and its
/// `memory()` is the model's bytes. Adding a layer whose parameters live elsewhere is an
/// error. Parameter names are the layer's index and the layer's own name:
/// `"0.weight"`, `"0.bias"`, `"2.weight"`, ... (as PyTorch).
///
/// ```
/// use ndscope::nn::{Linear, Module, Sequential, Tanh};
/// use ndscope::{DType, NDManager};
/// let m = NDManager::new();
/// let mut model = Sequential::new(&m)
///     .add_with(|mm| Linear::new(mm, 2, 8))
///     .add(Tanh::new())
///     .add_with(|mm| Linear::new(mm, 8, 1));
/// assert_eq!(model.forward(m.ones([4, 2], DType::F32)).shape().dims(), &[4, 1]);
/// model.eval();
/// assert!(!model.layers()[0].is_training());       // propagated to every layer
/// assert_eq!(model.parameters().len(), 4);
/// model.manager().close();                         // frees every layer
/// assert!(model.parameters()[0].is_closed());
/// ```
pub struct Sequential {
    manager: NDManager,
    layers: Vec<Box<dyn Module>>,
    training: bool,
}

impl std::fmt::Debug for Sequential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Sequential({} layers, {:?}, {})",
            self.layers.len(),
            self.manager,
            if self.training { "train" } else { "eval" }
        )
    }
}

/// Whether manager `m` is `root` or below it.
fn within(m: NDManager, root: &NDManager) -> bool {
    let mut cur = Some(m);
    while let Some(c) = cur {
        if &c == root {
            return true;
        }
        cur = c.parent();
    }
    false
}

impl Sequential {
    /// An empty model in a new sub-manager of `m`. Panics if `m` is closed.
    #[track_caller]
    pub fn new(m: &NDManager) -> Sequential {
        unwrap(Sequential::try_new(m))
    }

    /// [`Sequential::new`], or `ManagerClosed`.
    pub fn try_new(m: &NDManager) -> Result<Sequential> {
        let manager = m.try_new_sub_manager()?;
        manager.set_name("Sequential");
        Ok(Sequential {
            manager,
            layers: Vec::new(),
            training: true,
        })
    }

    /// Append `layer` (built in [`Sequential::manager`] or a manager below it) and
    /// return the model, for chaining. Panics on failure (see [`Sequential::try_push`]).
    #[track_caller]
    #[allow(clippy::should_implement_trait)] // DJL's and Keras's name; not `+`
    pub fn add(mut self, layer: impl Module + 'static) -> Sequential {
        unwrap(self.try_push(layer));
        self
    }

    /// Build a layer in this model's manager with `build(&manager)` and append it.
    /// Panics on failure.
    #[track_caller]
    pub fn add_with<M: Module + 'static>(
        mut self,
        build: impl FnOnce(&NDManager) -> M,
    ) -> Sequential {
        let layer = build(&self.manager);
        unwrap(self.try_push(layer));
        self
    }

    /// Append `layer`. Panics on failure (see [`Sequential::try_push`]).
    #[track_caller]
    pub fn push(&mut self, layer: impl Module + 'static) {
        unwrap(self.try_push(layer))
    }

    /// Append `layer`. Errors: `InvalidArgument` when one of its parameters or buffers
    /// is not owned by this model's manager or a manager below it (closing the model
    /// would not free it: build the layer with [`Sequential::manager`]); `Closed` for a
    /// closed parameter. The model is unchanged on an error.
    pub fn try_push(&mut self, layer: impl Module + 'static) -> Result<()> {
        for (name, p) in layer
            .named_parameters()
            .into_iter()
            .chain(layer.named_buffers())
        {
            let owner = p.try_manager()?;
            if !within(owner.clone(), &self.manager) {
                return Err(NdError::invalid(
                    "sequential",
                    format!(
                        "the layer's '{name}' is owned by {owner:?}, outside this model's \
                         manager {:?}: build the layer in model.manager() (or with add_with)",
                        self.manager
                    ),
                ));
            }
        }
        self.layers.push(Box::new(layer));
        Ok(())
    }

    /// The layers, in order.
    pub fn layers(&self) -> &[Box<dyn Module>] {
        &self.layers
    }

    /// The layers, mutably (e.g. to set one layer's mode).
    pub fn layers_mut(&mut self) -> &mut [Box<dyn Module>] {
        &mut self.layers
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether the model has no layer (its forward pass is then the identity).
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// The sub-manager that owns the model (the same as [`Module::manager`], without
    /// the `Option`): build layers in it; close it to free the model.
    pub fn manager(&self) -> NDManager {
        self.manager.clone()
    }
}

/// Prefix every name with `i.`.
fn prefixed(i: usize, named: Vec<(String, NDArray)>) -> impl Iterator<Item = (String, NDArray)> {
    named.into_iter().map(move |(n, a)| (format!("{i}.{n}"), a))
}

impl Module for Sequential {
    fn try_forward(&self, x: NDArray) -> Result<NDArray> {
        // The intermediate outputs are freed by the scope once the next layer has
        // used them (a gradient tape keeps what backward needs).
        crate::scope(|| {
            let mut y = x;
            for layer in &self.layers {
                y = layer.try_forward(y)?;
            }
            Ok(y)
        })
    }

    fn named_parameters(&self) -> Vec<(String, NDArray)> {
        let mut v = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            v.extend(prefixed(i, l.named_parameters()));
        }
        v
    }

    fn named_buffers(&self) -> Vec<(String, NDArray)> {
        let mut v = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            v.extend(prefixed(i, l.named_buffers()));
        }
        v
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
        for l in &mut self.layers {
            l.set_training(training);
        }
    }

    fn is_training(&self) -> bool {
        self.training
    }

    fn manager(&self) -> Option<NDManager> {
        Some(self.manager.clone())
    }
}
