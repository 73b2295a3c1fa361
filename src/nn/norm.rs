//! Normalisation layers: [`LayerNorm`] and [`BatchNorm2d`].

use super::init::Init;
use super::{Module, build_in, make_parameter};
use crate::error::{NdError, Result, twins, unwrap};
use crate::{DType, NDArray, NDManager, Shape};

/// Layer normalisation over the trailing dimensions (PyTorch's `nn.LayerNorm`): an
/// input `[*, normalized_shape]` becomes `(x - mean) / sqrt(var + eps) * weight + bias`,
/// with the mean and the biased variance of each group of `normalized_shape`
/// elements. `weight` (ones) and `bias` (zeros) have `normalized_shape`; eps is 1e-5.
/// [`LayerNorm::builder`] sets eps, no affine parameters, or the dtype. Forward is
/// the [`NDArray::layer_norm`](crate::NDArray::layer_norm) op. Same behaviour in both
/// modes.
///
/// ```
/// use ndscope::nn::{LayerNorm, Module};
/// use ndscope::NDManager;
/// let m = NDManager::new();
/// let ln = LayerNorm::new(&m, [3]);
/// let y = ln.forward(m.create(&[1.0f32, 2.0, 3.0, 10.0, 10.0, 10.0], [2, 3]));
/// let v = y.to_vec::<f32>()?;
/// assert!((v[0] + 1.2247).abs() < 1e-3 && v[1].abs() < 1e-6 && (v[2] - 1.2247).abs() < 1e-3);
/// assert_eq!(&v[3..], &[0.0, 0.0, 0.0]);
/// let names: Vec<String> = ln.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["weight", "bias"]);
/// # Ok::<(), ndscope::NdError>(())
/// ```
#[derive(Debug)]
pub struct LayerNorm {
    weight: Option<NDArray>,
    bias: Option<NDArray>,
    manager: NDManager,
    normalized_shape: Shape,
    eps: f64,
    training: bool,
}

/// Options of a [`LayerNorm`] layer ([`LayerNorm::builder`]).
#[derive(Clone, Debug)]
pub struct LayerNormBuilder {
    normalized_shape: Shape,
    eps: f64,
    affine: bool,
    bias: bool,
    dtype: DType,
}

impl LayerNormBuilder {
    /// Added to the variance (default 1e-5).
    pub fn eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }

    /// Whether the layer has a weight and a bias (PyTorch's `elementwise_affine`,
    /// default `true`).
    pub fn elementwise_affine(mut self, affine: bool) -> Self {
        self.affine = affine;
        self
    }

    /// Whether the layer has a bias when it is affine (default `true`).
    pub fn bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self
    }

    /// The parameters' dtype, F32 (default) or F64.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    twins! {
        /// Build the layer in a new sub-manager of `m`. Panics on failure.
        pub fn build,
        /// [`LayerNormBuilder::build`]. Errors: `InvalidArgument` (an empty
        /// `normalized_shape`, a non-float dtype, a negative or NaN eps),
        /// `ManagerClosed`/`ManagerCapped`. Nothing is left in `m` on an error.
        pub fn try_build(&self, m: &NDManager) -> LayerNorm {
            const OP: &str = "layer_norm";
            super::check_param_dtype(OP, self.dtype)?;
            if self.normalized_shape.ndim() == 0 {
                return Err(NdError::invalid(
                    OP,
                    "normalized_shape must have at least one dimension",
                ));
            }
            if self.eps.is_nan() || self.eps < 0.0 {
                return Err(NdError::invalid(
                    OP,
                    format!("eps must be >= 0, got {}", self.eps),
                ));
            }
            let shape = self.normalized_shape.clone();
            let (manager, (weight, bias)) = build_in(m, "LayerNorm", |sub| {
                if !self.affine {
                    return Ok((None, None));
                }
                let w = make_parameter(Init::Ones.try_create(sub, shape.clone(), self.dtype)?)?;
                let b = match self.bias {
                    true => Some(make_parameter(Init::Zeros.try_create(
                        sub,
                        shape.clone(),
                        self.dtype,
                    )?)?),
                    false => None,
                };
                Ok((Some(w), b))
            })?;
            Ok(LayerNorm {
                weight,
                bias,
                manager,
                normalized_shape: shape,
                eps: self.eps,
                training: true,
            })
        }
    }
}

impl LayerNorm {
    /// Normalisation over trailing dimensions `normalized_shape`, with a weight and a
    /// bias, eps 1e-5, f32, in a new sub-manager of `m`. Panics on failure.
    #[track_caller]
    pub fn new(m: &NDManager, normalized_shape: impl Into<Shape>) -> LayerNorm {
        unwrap(LayerNorm::builder(normalized_shape).try_build(m))
    }

    /// [`LayerNorm::new`]; errors as [`LayerNormBuilder::try_build`].
    pub fn try_new(m: &NDManager, normalized_shape: impl Into<Shape>) -> Result<LayerNorm> {
        LayerNorm::builder(normalized_shape).try_build(m)
    }

    /// Options for normalisation over trailing dimensions `normalized_shape`.
    ///
    /// ```
    /// use ndscope::nn::{LayerNorm, Module};
    /// use ndscope::{DType, NDManager};
    /// let m = NDManager::new();
    /// let ln = LayerNorm::builder([2, 3]).eps(1e-6).elementwise_affine(false).build(&m);
    /// assert!(ln.parameters().is_empty());
    /// let y = ln.forward(m.ones([4, 2, 3], DType::F32));       // 6 values per group
    /// assert_eq!(y.shape().dims(), &[4, 2, 3]);
    /// ```
    pub fn builder(normalized_shape: impl Into<Shape>) -> LayerNormBuilder {
        LayerNormBuilder {
            normalized_shape: normalized_shape.into(),
            eps: 1e-5,
            affine: true,
            bias: true,
            dtype: DType::F32,
        }
    }

    /// The weight (`normalized_shape`), if the layer is affine.
    pub fn weight(&self) -> Option<NDArray> {
        self.weight
    }

    /// The bias (`normalized_shape`), if the layer has one.
    pub fn bias(&self) -> Option<NDArray> {
        self.bias
    }

    /// The trailing shape normalised over.
    pub fn normalized_shape(&self) -> &Shape {
        &self.normalized_shape
    }

    /// The value added to the variance.
    pub fn eps(&self) -> f64 {
        self.eps
    }

    /// The sub-manager holding the parameters and their gradients (empty when the
    /// layer is not affine).
    pub fn manager(&self) -> NDManager {
        self.manager.clone()
    }
}

impl Module for LayerNorm {
    /// Errors: `InvalidShape` (the input's trailing dimensions are not
    /// `normalized_shape`), those of [`NDArray::try_layer_norm`](crate::NDArray::try_layer_norm)
    /// (`DTypeMismatch`, `UnsupportedDType`), `Closed`.
    fn try_forward(&self, x: NDArray) -> Result<NDArray> {
        let shape = x.try_shape()?;
        let (d, k) = (shape.dims(), self.normalized_shape.ndim());
        if d.len() < k || d[d.len() - k..] != *self.normalized_shape.dims() {
            return Err(NdError::shape(
                "layer_norm",
                format!(
                    "normalized_shape {} expects an input [*, {}], got {shape}",
                    self.normalized_shape,
                    self.normalized_shape
                        .dims()
                        .iter()
                        .map(|v| v.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let axes: Vec<isize> = (1..=k as isize).rev().map(|a| -a).collect();
        x.try_layer_norm(&axes, self.weight, self.bias, self.eps)
    }

    fn named_parameters(&self) -> Vec<(String, NDArray)> {
        let mut v = Vec::new();
        if let Some(w) = self.weight {
            v.push(("weight".to_string(), w));
        }
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

/// Batch normalisation of `[N, C, H, W]` images per channel (PyTorch's
/// `nn.BatchNorm2d`). In training mode each channel is normalised with the batch's
/// mean and biased variance (over N, H and W), and the running statistics are updated
/// in place: `running = (1 - momentum) · running + momentum · batch` (the unbiased
/// batch variance for `running_var`), and `num_batches_tracked` grows by one. In
/// evaluation mode ([`Module::eval`]) the running statistics normalise and nothing
/// changes. Then `· weight + bias` (`[C]` each; ones and zeros at first).
///
/// Defaults as PyTorch: eps 1e-5, momentum 0.1, affine. The buffers `running_mean`
/// (zeros, `[C]`), `running_var` (ones, `[C]`) and `num_batches_tracked` (a 0-d i64)
/// are listed by [`Module::named_buffers`] (so a checkpoint saves them) and live in the
/// layer's manager, without a gradient. No cumulative-average mode (PyTorch's
/// `momentum=None`) and no `track_running_stats=False`. Forward is the
/// [`NDArray::batch_norm`](crate::NDArray::batch_norm) op.
///
/// ```
/// use ndscope::nn::{BatchNorm2d, Module};
/// use ndscope::{DType, NDManager};
/// let m = NDManager::new();
/// let mut bn = BatchNorm2d::new(&m, 2);
/// let x = m.arange(0.0, 16.0, 1.0, DType::F32).reshape([2, 2, 2, 2]);
/// let y = bn.forward(x);                                     // batch statistics
/// assert!(y.mean().to_scalar::<f32>()?.abs() < 1e-6);
/// // Channel 0 holds 0..4 and 8..12: mean 5.5, so running_mean = 0.1 · 5.5.
/// assert!((bn.running_mean().to_vec::<f32>()?[0] - 0.55).abs() < 1e-6);
/// bn.eval();
/// let y = bn.forward(x);                                     // running statistics
/// assert!(y.mean().to_scalar::<f32>()? > 1.0);
/// let names: Vec<String> = bn.named_buffers().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["running_mean", "running_var", "num_batches_tracked"]);
/// # Ok::<(), ndscope::NdError>(())
/// ```
#[derive(Debug)]
pub struct BatchNorm2d {
    weight: Option<NDArray>,
    bias: Option<NDArray>,
    running_mean: NDArray,
    running_var: NDArray,
    num_batches_tracked: NDArray,
    manager: NDManager,
    num_features: usize,
    eps: f64,
    momentum: f64,
    training: bool,
}

/// Options of a [`BatchNorm2d`] layer ([`BatchNorm2d::builder`]).
#[derive(Clone, Debug)]
pub struct BatchNorm2dBuilder {
    num_features: usize,
    eps: f64,
    momentum: f64,
    affine: bool,
    dtype: DType,
}

impl BatchNorm2dBuilder {
    /// Added to the variance (default 1e-5).
    pub fn eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }

    /// The weight of the batch statistics in the running ones (default 0.1).
    pub fn momentum(mut self, momentum: f64) -> Self {
        self.momentum = momentum;
        self
    }

    /// Whether the layer has a weight and a bias (default `true`).
    pub fn affine(mut self, affine: bool) -> Self {
        self.affine = affine;
        self
    }

    /// The parameters' and statistics' dtype, F32 (default) or F64.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    twins! {
        /// Build the layer in a new sub-manager of `m`. Panics on failure.
        pub fn build,
        /// [`BatchNorm2dBuilder::build`]. Errors: `InvalidArgument` (zero features, a
        /// non-float dtype, a negative or NaN eps, a momentum that is not finite),
        /// `ManagerClosed`/`ManagerCapped`. Nothing is left in `m` on an error.
        pub fn try_build(&self, m: &NDManager) -> BatchNorm2d {
            const OP: &str = "batch_norm";
            super::check_param_dtype(OP, self.dtype)?;
            if self.num_features == 0 {
                return Err(NdError::invalid(OP, "num_features must be positive"));
            }
            if self.eps.is_nan() || self.eps < 0.0 {
                return Err(NdError::invalid(
                    OP,
                    format!("eps must be >= 0, got {}", self.eps),
                ));
            }
            if !self.momentum.is_finite() {
                return Err(NdError::invalid(
                    OP,
                    format!("momentum must be finite, got {}", self.momentum),
                ));
            }
            let (c, dt) = (self.num_features, self.dtype);
            let (manager, (weight, bias, rm, rv, nbt)) = build_in(m, "BatchNorm2d", |sub| {
                let (w, b) = match self.affine {
                    true => (
                        Some(make_parameter(Init::Ones.try_create(sub, [c], dt)?)?),
                        Some(make_parameter(Init::Zeros.try_create(sub, [c], dt)?)?),
                    ),
                    false => (None, None),
                };
                let rm = sub.try_zeros([c], dt)?.keep();
                let rv = sub.try_ones([c], dt)?.keep();
                let nbt = sub.try_zeros([], DType::I64)?.keep();
                Ok((w, b, rm, rv, nbt))
            })?;
            Ok(BatchNorm2d {
                weight,
                bias,
                running_mean: rm,
                running_var: rv,
                num_batches_tracked: nbt,
                manager,
                num_features: c,
                eps: self.eps,
                momentum: self.momentum,
                training: true,
            })
        }
    }
}

impl BatchNorm2d {
    /// Batch normalisation of `num_features` channels with PyTorch's defaults (eps
    /// 1e-5, momentum 0.1, affine, f32), in a new sub-manager of `m`. Panics on
    /// failure.
    #[track_caller]
    pub fn new(m: &NDManager, num_features: usize) -> BatchNorm2d {
        unwrap(BatchNorm2d::builder(num_features).try_build(m))
    }

    /// [`BatchNorm2d::new`]; errors as [`BatchNorm2dBuilder::try_build`].
    pub fn try_new(m: &NDManager, num_features: usize) -> Result<BatchNorm2d> {
        BatchNorm2d::builder(num_features).try_build(m)
    }

    /// Options for batch normalisation of `num_features` channels.
    ///
    /// ```
    /// use ndscope::nn::{BatchNorm2d, Module};
    /// use ndscope::{DType, NDManager};
    /// let m = NDManager::new();
    /// let bn = BatchNorm2d::builder(3).momentum(0.5).affine(false).dtype(DType::F64).build(&m);
    /// assert!(bn.parameters().is_empty());
    /// assert_eq!(bn.named_buffers().len(), 3);
    /// ```
    pub fn builder(num_features: usize) -> BatchNorm2dBuilder {
        BatchNorm2dBuilder {
            num_features,
            eps: 1e-5,
            momentum: 0.1,
            affine: true,
            dtype: DType::F32,
        }
    }

    /// The weight (`[C]`), if the layer is affine.
    pub fn weight(&self) -> Option<NDArray> {
        self.weight
    }

    /// The bias (`[C]`), if the layer is affine.
    pub fn bias(&self) -> Option<NDArray> {
        self.bias
    }

    /// The running mean, `[C]`.
    pub fn running_mean(&self) -> NDArray {
        self.running_mean
    }

    /// The running (unbiased) variance, `[C]`.
    pub fn running_var(&self) -> NDArray {
        self.running_var
    }

    /// The number of training-mode forward passes (a 0-d i64 array).
    pub fn num_batches_tracked(&self) -> NDArray {
        self.num_batches_tracked
    }

    /// The number of channels.
    pub fn num_features(&self) -> usize {
        self.num_features
    }

    /// The value added to the variance.
    pub fn eps(&self) -> f64 {
        self.eps
    }

    /// The weight of the batch statistics in the running ones.
    pub fn momentum(&self) -> f64 {
        self.momentum
    }

    /// The sub-manager holding the parameters, their gradients and the buffers.
    pub fn manager(&self) -> NDManager {
        self.manager.clone()
    }
}

impl Module for BatchNorm2d {
    /// Errors: `InvalidArgument` (an input that is not 4-D, or has another channel
    /// count; in training mode, one value per channel), those of
    /// [`NDArray::try_batch_norm`](crate::NDArray::try_batch_norm) (`DTypeMismatch`,
    /// `UnsupportedDType`), `Closed`. On an error the running statistics are
    /// unchanged.
    fn try_forward(&self, x: NDArray) -> Result<NDArray> {
        let shape = x.try_shape()?;
        if shape.ndim() != 4 || shape.dims()[1] != self.num_features {
            return Err(NdError::invalid(
                "batch_norm",
                format!(
                    "BatchNorm2d({}) expects an input [N, {}, H, W], got {shape}",
                    self.num_features, self.num_features
                ),
            ));
        }
        let y = x.try_batch_norm(
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            self.training,
            self.momentum,
            self.eps,
        )?;
        if self.training {
            // In place on a 0-d i64 (not recorded: it needs no gradient); the scalar
            // operand, if any, is freed by the scope.
            let counted = crate::scope(|| self.num_batches_tracked.try_addi(1i64));
            if let Err(e) = counted {
                y.close();
                return Err(e);
            }
        }
        Ok(y)
    }

    fn named_parameters(&self) -> Vec<(String, NDArray)> {
        let mut v = Vec::new();
        if let Some(w) = self.weight {
            v.push(("weight".to_string(), w));
        }
        if let Some(b) = self.bias {
            v.push(("bias".to_string(), b));
        }
        v
    }

    fn named_buffers(&self) -> Vec<(String, NDArray)> {
        vec![
            ("running_mean".to_string(), self.running_mean),
            ("running_var".to_string(), self.running_var),
            ("num_batches_tracked".to_string(), self.num_batches_tracked),
        ]
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
