//! [`Linear`]: `y = x Wᵀ + b`, with PyTorch's layout and initialisation.

use super::init::{Init, fan_in_and_fan_out};
use super::{Module, build_in, make_parameter};
use crate::error::{NdError, Result, twins, unwrap};
use crate::{DType, NDArray, NDManager};

/// A fully connected layer, `y = x Wᵀ + b` (PyTorch's `nn.Linear`).
///
/// `weight` is `[out_features, in_features]` and `bias` `[out_features]` (PyTorch's
/// layout, so checkpoints map one to one). The input is `[*, in_features]` (any
/// number of leading dimensions) and the output `[*, out_features]`. By default the
/// weight is [`Init::pytorch_default`] (U(-1/√in, 1/√in)) and the bias
/// U(-1/√in, 1/√in), both f32; [`Linear::builder`] chooses the dtype, the
/// initialisation or no bias. The layer's parameters live in a sub-manager of the
/// manager it was built in ([`Linear::manager`]).
///
/// ```
/// use ndscope::nn::{Linear, Module};
/// use ndscope::{DType, NDManager};
/// let m = NDManager::new();
/// let layer = Linear::new(&m, 3, 2);
/// assert_eq!(layer.weight().shape().dims(), &[2, 3]);
/// let y = layer.forward(m.ones([5, 3], DType::F32));
/// assert_eq!(y.shape().dims(), &[5, 2]);
/// // Its manager holds the weight, the bias and their gradients: (6 + 2) * 2 f32.
/// assert_eq!(layer.manager().memory().live_bytes, 64);
/// ```
#[derive(Debug)]
pub struct Linear {
    weight: NDArray,
    bias: Option<NDArray>,
    manager: NDManager,
    in_features: usize,
    out_features: usize,
    training: bool,
}

/// Options of a [`Linear`] layer: dtype, bias, initialisation ([`Linear::builder`]).
#[derive(Clone, Debug)]
pub struct LinearBuilder {
    in_features: usize,
    out_features: usize,
    bias: bool,
    dtype: DType,
    weight_init: Init,
    bias_init: Option<Init>,
}

impl LinearBuilder {
    /// Whether the layer has a bias (default `true`).
    pub fn bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self
    }

    /// The parameters' dtype, F32 (default) or F64.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// The weight's initialisation (default [`Init::pytorch_default`]).
    pub fn weight_init(mut self, init: Init) -> Self {
        self.weight_init = init;
        self
    }

    /// The bias's initialisation (default [`Init::bias_default`] of `in_features`).
    pub fn bias_init(mut self, init: Init) -> Self {
        self.bias_init = Some(init);
        self
    }

    twins! {
        /// Build the layer in a new sub-manager of `m`. Panics on failure.
        pub fn build,
        /// [`LinearBuilder::build`]. Errors: `InvalidArgument` (a non-float dtype, an
        /// initialisation that is invalid for the shape), `ManagerClosed`/`ManagerCapped`
        /// (of `m`). Nothing is left in `m` on an error.
        pub fn try_build(&self, m: &NDManager) -> Linear {
            super::check_param_dtype("linear", self.dtype)?;
            let shape = [self.out_features, self.in_features];
            let (fan_in, _) = fan_in_and_fan_out(&shape.into())?;
            let bias_init = self.bias_init.unwrap_or(Init::bias_default(fan_in));
            let (manager, (weight, bias)) = build_in(m, "Linear", |sub| {
                let weight = make_parameter(self.weight_init.try_create(sub, shape, self.dtype)?)?;
                let bias = match self.bias {
                    true => Some(make_parameter(bias_init.try_create(
                        sub,
                        [self.out_features],
                        self.dtype,
                    )?)?),
                    false => None,
                };
                Ok((weight, bias))
            })?;
            Ok(Linear {
                weight,
                bias,
                manager,
                in_features: self.in_features,
                out_features: self.out_features,
                training: true,
            })
        }
    }
}

impl Linear {
    /// A layer `in_features -> out_features` with bias, f32, PyTorch's default
    /// initialisation, in a new sub-manager of `m`. Panics on failure.
    #[track_caller]
    pub fn new(m: &NDManager, in_features: usize, out_features: usize) -> Linear {
        unwrap(Linear::builder(in_features, out_features).try_build(m))
    }

    /// [`Linear::new`], or `ManagerClosed`/`ManagerCapped`.
    #[track_caller]
    pub fn try_new(m: &NDManager, in_features: usize, out_features: usize) -> Result<Linear> {
        Linear::builder(in_features, out_features).try_build(m)
    }

    /// Options for a layer `in_features -> out_features`:
    ///
    /// ```
    /// use ndscope::nn::{Linear, init::Init};
    /// use ndscope::{DType, NDManager};
    /// let m = NDManager::new();
    /// let layer = Linear::builder(4, 3)
    ///     .dtype(DType::F64)
    ///     .weight_init(Init::xavier_uniform())
    ///     .bias(false)
    ///     .build(&m);
    /// assert!(layer.bias().is_none());
    /// ```
    pub fn builder(in_features: usize, out_features: usize) -> LinearBuilder {
        LinearBuilder {
            in_features,
            out_features,
            bias: true,
            dtype: DType::F32,
            weight_init: Init::pytorch_default(),
            bias_init: None,
        }
    }

    /// A layer with weights initialised by `weight_init` and the bias by `bias_init`
    /// (f32, with bias), in a new sub-manager of `m`. Panics on failure.
    #[track_caller]
    pub fn with_init(
        m: &NDManager,
        in_features: usize,
        out_features: usize,
        weight_init: Init,
        bias_init: Init,
    ) -> Linear {
        Linear::builder(in_features, out_features)
            .weight_init(weight_init)
            .bias_init(bias_init)
            .build(m)
    }

    /// A layer made of existing arrays: `weight` `[out, in]` and `bias` `[out]` (same
    /// float dtype) **move** into a new sub-manager of `m` (with their gradients, if
    /// they have one), leave every scope and require a gradient. Panics on failure.
    ///
    /// ```
    /// use ndscope::nn::{Linear, Module};
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let w = m.create(&[1.0f64, 2.0, 3.0, 4.0], [2, 2]);
    /// let b = m.create(&[0.5f64, -0.5], [2]);
    /// let layer = Linear::from_parameters(&m, w, Some(b));
    /// let y = layer.forward(m.create(&[1.0f64, 1.0], [1, 2]));
    /// assert_eq!(y.to_vec::<f64>()?, vec![3.5, 6.5]);   // [1+2+0.5, 3+4-0.5]
    /// assert_eq!(w.manager(), layer.manager());
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn from_parameters(m: &NDManager, weight: NDArray, bias: Option<NDArray>) -> Linear {
        unwrap(Linear::try_from_parameters(m, weight, bias))
    }

    /// [`Linear::from_parameters`]. Errors: `InvalidShape` (weight not 2-D, bias not
    /// `[out]`), `DTypeMismatch`/`UnsupportedDType` (bias of another dtype, not
    /// float), `Closed`, `ManagerClosed`/`ManagerCapped`. On an error nothing moves.
    pub fn try_from_parameters(
        m: &NDManager,
        weight: NDArray,
        bias: Option<NDArray>,
    ) -> Result<Linear> {
        let ws = weight.try_shape()?;
        let dtype = weight.try_dtype()?;
        if ws.ndim() != 2 {
            return Err(NdError::shape(
                "linear",
                format!("the weight must be [out, in], got {ws}"),
            ));
        }
        let (out_features, in_features) = (ws.dims()[0], ws.dims()[1]);
        if !dtype.is_float() {
            return Err(NdError::UnsupportedDType {
                op: "linear",
                dtype,
                array: crate::ext::desc(weight)?,
            });
        }
        if let Some(b) = bias {
            let bs = b.try_shape()?;
            if b.try_dtype()? != dtype {
                return Err(NdError::DTypeMismatch {
                    op: "linear",
                    lhs: crate::ext::desc(weight)?,
                    rhs: crate::ext::desc(b)?,
                });
            }
            if bs.dims() != [out_features] {
                return Err(NdError::shape(
                    "linear",
                    format!("the bias must be [{out_features}], got {bs}"),
                ));
            }
        }
        // Where each array (and gradient) lives now, to put it back on an error.
        let mut homes = Vec::new();
        for p in std::iter::once(weight).chain(bias) {
            homes.push((p, p.try_manager()?));
            if p.requires_gradient() {
                let g = p.try_gradient()?;
                homes.push((g, g.try_manager()?));
            }
        }
        let sub = m.try_new_sub_manager()?;
        sub.set_name("Linear");
        let moved = (|| {
            for &(a, _) in &homes {
                a.try_attach(&sub)?;
            }
            for p in std::iter::once(weight).chain(bias) {
                make_parameter(p)?;
            }
            Ok(())
        })();
        if let Err(e) = moved {
            for (a, home) in homes {
                let _ = a.try_attach(&home);
            }
            sub.close();
            return Err(e);
        }
        Ok(Linear {
            weight,
            bias,
            manager: sub,
            in_features,
            out_features,
            training: true,
        })
    }

    /// The weight, `[out_features, in_features]`.
    pub fn weight(&self) -> NDArray {
        self.weight
    }

    /// The bias, `[out_features]`, if the layer has one.
    pub fn bias(&self) -> Option<NDArray> {
        self.bias
    }

    /// The input size.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// The output size.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// The sub-manager holding the parameters and their gradients (the same as
    /// [`Module::manager`], without the `Option`).
    pub fn manager(&self) -> NDManager {
        self.manager.clone()
    }
}

impl Module for Linear {
    fn try_forward(&self, x: NDArray) -> Result<NDArray> {
        // Composite of matmul, a transposed view and a broadcast add (gradients come
        // from those ops); the view and the product are freed by the scope.
        crate::scope(|| {
            let y = x.try_matmul(self.weight.try_transpose()?)?;
            match self.bias {
                Some(b) => y.try_add(b),
                None => Ok(y),
            }
        })
    }

    fn named_parameters(&self) -> Vec<(String, NDArray)> {
        let mut v = vec![("weight".to_string(), self.weight)];
        if let Some(b) = self.bias {
            v.push(("bias".to_string(), b));
        }
        v
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }

    fn manager(&self) -> Option<NDManager> {
        Some(self.manager.clone())
    }
}
