//! [`Conv2d`] and [`MaxPool2d`]: 2-D convolution and max pooling over NCHW images,
//! with PyTorch's layouts, defaults and initialisation.

use super::init::{Init, fan_in_and_fan_out};
use super::{Module, Pair, build_in, make_parameter};
use crate::error::{NdError, Result, twins, unwrap};
use crate::{DType, NDArray, NDManager};

/// A 2-D convolution layer (PyTorch's `nn.Conv2d`): cross-correlation of an NCHW input
/// `[N, in_channels, H, W]` (or an unbatched `[in_channels, H, W]`) with a weight
/// `[out_channels, in_channels / groups, kh, kw]`, plus a bias `[out_channels]`; the
/// output is `[N, out_channels, oh, ow]` with `oh = (H + 2·padding - dilation·(kh - 1)
/// - 1) / stride + 1` (likewise `ow`; zero padding).
///
/// By default (as PyTorch) stride 1, padding 0, dilation 1, one group and a bias; the
/// weight is [`Init::pytorch_default`] (U(-1/√fan_in, 1/√fan_in) with `fan_in =
/// in_channels / groups · kh · kw`) and the bias U(-1/√fan_in, 1/√fan_in), f32.
/// [`Conv2d::builder`] sets the other options. Forward is the [`NDArray::conv2d`] op
/// (im2col + gemm, differentiable in the input, the weight and the bias). The
/// parameters live in a sub-manager of the manager the layer was built in
/// ([`Conv2d::manager`]).
///
/// ```
/// use ndscope::nn::{Conv2d, Module};
/// use ndscope::{DType, NDManager};
/// let m = NDManager::new();
/// let conv = Conv2d::builder(1, 16, 3).padding(1).build(&m);
/// assert_eq!(conv.weight().shape().dims(), &[16, 1, 3, 3]);
/// let y = conv.forward(m.ones([4, 1, 8, 8], DType::F32));
/// assert_eq!(y.shape().dims(), &[4, 16, 8, 8]);               // "same" padding
/// // Weight, bias and their gradients: (16·9 + 16) · 2 f32 values.
/// assert_eq!(conv.manager().memory().live_bytes, 160 * 2 * 4);
/// ```
///
/// [`NDArray::conv2d`]: crate::NDArray::conv2d
#[derive(Debug)]
pub struct Conv2d {
    weight: NDArray,
    bias: Option<NDArray>,
    manager: NDManager,
    in_channels: usize,
    out_channels: usize,
    kernel_size: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    training: bool,
}

/// Options of a [`Conv2d`] layer ([`Conv2d::builder`]). Sizes take one number for both
/// dimensions or `[h, w]` ([`Pair`]), as PyTorch's int-or-tuple arguments.
#[derive(Clone, Debug)]
pub struct Conv2dBuilder {
    in_channels: usize,
    out_channels: usize,
    kernel_size: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    bias: bool,
    dtype: DType,
    weight_init: Init,
    bias_init: Option<Init>,
}

impl Conv2dBuilder {
    /// The stride (default 1).
    pub fn stride(mut self, stride: impl Pair) -> Self {
        self.stride = stride.pair();
        self
    }

    /// Zero padding on each side (default 0).
    pub fn padding(mut self, padding: impl Pair) -> Self {
        self.padding = padding.pair();
        self
    }

    /// The spacing between kernel elements (default 1).
    pub fn dilation(mut self, dilation: impl Pair) -> Self {
        self.dilation = dilation.pair();
        self
    }

    /// The number of groups (default 1): both channel counts must be multiples of it;
    /// each group of `out_channels / groups` filters sees only its own
    /// `in_channels / groups` input channels.
    pub fn groups(mut self, groups: usize) -> Self {
        self.groups = groups;
        self
    }

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

    /// The bias's initialisation (default [`Init::bias_default`] of the weight's
    /// `fan_in`).
    pub fn bias_init(mut self, init: Init) -> Self {
        self.bias_init = Some(init);
        self
    }

    twins! {
        /// Build the layer in a new sub-manager of `m`. Panics on failure.
        pub fn build,
        /// [`Conv2dBuilder::build`]. Errors: `InvalidArgument` (a non-float dtype; a zero
        /// channel count, kernel size, stride, dilation or group count; channel counts
        /// that are not multiples of `groups`; an initialisation that is invalid),
        /// `ManagerClosed`/`ManagerCapped` (of `m`). Nothing is left in `m` on an error.
        pub fn try_build(&self, m: &NDManager) -> Conv2d {
            const OP: &str = "conv2d";
            super::check_param_dtype(OP, self.dtype)?;
            let zero = |what: &str, v: [usize; 2]| -> Result<()> {
                if v.contains(&0) {
                    return Err(NdError::invalid(
                        OP,
                        format!("{what} must be positive, got {v:?}"),
                    ));
                }
                Ok(())
            };
            zero("kernel_size", self.kernel_size)?;
            zero("stride", self.stride)?;
            zero("dilation", self.dilation)?;
            let (cin, cout, g) = (self.in_channels, self.out_channels, self.groups);
            if g == 0 || cin == 0 || cout == 0 {
                return Err(NdError::invalid(
                    OP,
                    format!(
                        "in_channels ({cin}), out_channels ({cout}) and groups ({g}) must be positive"
                    ),
                ));
            }
            if cin % g != 0 || cout % g != 0 {
                return Err(NdError::invalid(
                    OP,
                    format!(
                        "in_channels ({cin}) and out_channels ({cout}) must be multiples of groups ({g})"
                    ),
                ));
            }
            let [kh, kw] = self.kernel_size;
            let shape = [cout, cin / g, kh, kw];
            let (fan_in, _) = fan_in_and_fan_out(&shape.into())?;
            let bias_init = self.bias_init.unwrap_or(Init::bias_default(fan_in));
            let (manager, (weight, bias)) = build_in(m, "Conv2d", |sub| {
                let weight = make_parameter(self.weight_init.try_create(sub, shape, self.dtype)?)?;
                let bias = match self.bias {
                    true => Some(make_parameter(bias_init.try_create(
                        sub,
                        [cout],
                        self.dtype,
                    )?)?),
                    false => None,
                };
                Ok((weight, bias))
            })?;
            Ok(Conv2d {
                weight,
                bias,
                manager,
                in_channels: cin,
                out_channels: cout,
                kernel_size: self.kernel_size,
                stride: self.stride,
                padding: self.padding,
                dilation: self.dilation,
                groups: g,
                training: true,
            })
        }
    }
}

impl Conv2d {
    /// A layer `in_channels -> out_channels` with a `kernel_size` kernel (one number
    /// or `[kh, kw]`), PyTorch's defaults otherwise (stride 1, no padding, bias, f32),
    /// in a new sub-manager of `m`. Panics on failure.
    #[track_caller]
    pub fn new(
        m: &NDManager,
        in_channels: usize,
        out_channels: usize,
        kernel_size: impl Pair,
    ) -> Conv2d {
        unwrap(Conv2d::builder(in_channels, out_channels, kernel_size).try_build(m))
    }

    /// [`Conv2d::new`]; errors as [`Conv2dBuilder::try_build`].
    pub fn try_new(
        m: &NDManager,
        in_channels: usize,
        out_channels: usize,
        kernel_size: impl Pair,
    ) -> Result<Conv2d> {
        Conv2d::builder(in_channels, out_channels, kernel_size).try_build(m)
    }

    /// Options for a layer `in_channels -> out_channels` with a `kernel_size` kernel:
    ///
    /// ```
    /// use ndscope::nn::{Conv2d, Module};
    /// use ndscope::{DType, NDManager};
    /// let m = NDManager::new();
    /// let conv = Conv2d::builder(4, 8, [3, 1])
    ///     .stride(2)
    ///     .padding([1, 0])
    ///     .groups(2)
    ///     .bias(false)
    ///     .dtype(DType::F64)
    ///     .build(&m);
    /// assert_eq!(conv.weight().shape().dims(), &[8, 2, 3, 1]);
    /// let y = conv.forward(m.ones([1, 4, 5, 5], DType::F64));
    /// assert_eq!(y.shape().dims(), &[1, 8, 3, 3]);
    /// ```
    pub fn builder(
        in_channels: usize,
        out_channels: usize,
        kernel_size: impl Pair,
    ) -> Conv2dBuilder {
        Conv2dBuilder {
            in_channels,
            out_channels,
            kernel_size: kernel_size.pair(),
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            bias: true,
            dtype: DType::F32,
            weight_init: Init::pytorch_default(),
            bias_init: None,
        }
    }

    /// The weight, `[out_channels, in_channels / groups, kh, kw]`.
    pub fn weight(&self) -> NDArray {
        self.weight
    }

    /// The bias, `[out_channels]`, if the layer has one.
    pub fn bias(&self) -> Option<NDArray> {
        self.bias
    }

    /// The number of input channels.
    pub fn in_channels(&self) -> usize {
        self.in_channels
    }

    /// The number of output channels.
    pub fn out_channels(&self) -> usize {
        self.out_channels
    }

    /// The kernel size `[kh, kw]`.
    pub fn kernel_size(&self) -> [usize; 2] {
        self.kernel_size
    }

    /// The stride `[sh, sw]`.
    pub fn stride(&self) -> [usize; 2] {
        self.stride
    }

    /// The zero padding `[ph, pw]` on each side.
    pub fn padding(&self) -> [usize; 2] {
        self.padding
    }

    /// The dilation `[dh, dw]`.
    pub fn dilation(&self) -> [usize; 2] {
        self.dilation
    }

    /// The number of groups.
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// The sub-manager holding the parameters and their gradients (the same as
    /// [`Module::manager`], without the `Option`).
    pub fn manager(&self) -> NDManager {
        self.manager.clone()
    }
}

/// Run `f` on a 4-D input: a 3-D (unbatched) `x` gets a batch axis of 1, which the
/// result loses again (PyTorch's unbatched inputs). Composite of views; the
/// temporaries are freed by the scope.
fn batched(x: NDArray, f: impl FnOnce(NDArray) -> Result<NDArray>) -> Result<NDArray> {
    if x.try_shape()?.ndim() != 3 {
        return f(x);
    }
    crate::scope(|| f(x.try_expand_dims(0)?)?.try_squeeze_axis(0))
}

impl Module for Conv2d {
    /// Errors: those of [`NDArray::try_conv2d`](crate::NDArray::try_conv2d) (an input
    /// that is not 3-D or 4-D, or has another channel count or dtype, or is smaller
    /// than the kernel, is `InvalidArgument`/`DTypeMismatch`), `Closed`.
    fn try_forward(&self, x: NDArray) -> Result<NDArray> {
        batched(x, |x| {
            x.try_conv2d(
                self.weight,
                self.bias,
                self.stride,
                self.padding,
                self.dilation,
                self.groups,
            )
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

/// 2-D max pooling over the last two axes of `[N, C, H, W]` or `[C, H, W]` (PyTorch's
/// `nn.MaxPool2d`): each output element is the maximum of a `kernel_size` window;
/// the stride defaults to the kernel size (non-overlapping windows), padding (as -inf)
/// to 0, and the output size is rounded down. No parameters. Forward is the
/// [`NDArray::max_pool2d`](crate::NDArray::max_pool2d) op; the gradient goes to each
/// window's first maximum. No dilation or `ceil_mode` (the op has none).
///
/// ```
/// use ndscope::nn::{MaxPool2d, Module};
/// use ndscope::{DType, NDManager};
/// let m = NDManager::new();
/// let x = m.arange(0.0, 16.0, 1.0, DType::F32).reshape([1, 1, 4, 4]);
/// let y = MaxPool2d::new(2).forward(x);
/// assert_eq!(y.to_vec::<f32>()?, vec![5.0, 7.0, 13.0, 15.0]);
/// let y = MaxPool2d::new(3).stride(1).padding(1).forward(x);     // overlapping
/// assert_eq!(y.shape().dims(), &[1, 1, 4, 4]);
/// # Ok::<(), ndscope::NdError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool2d {
    kernel_size: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    training: bool,
}

impl MaxPool2d {
    /// Pooling with a `kernel_size` window (one number or `[kh, kw]`), stride =
    /// kernel size, no padding. Sizes are checked when the layer runs.
    pub fn new(kernel_size: impl Pair) -> MaxPool2d {
        let k = kernel_size.pair();
        MaxPool2d {
            kernel_size: k,
            stride: k,
            padding: [0, 0],
            training: true,
        }
    }

    /// The same layer with another stride.
    pub fn stride(mut self, stride: impl Pair) -> MaxPool2d {
        self.stride = stride.pair();
        self
    }

    /// The same layer with another padding (at most half the kernel, as PyTorch).
    pub fn padding(mut self, padding: impl Pair) -> MaxPool2d {
        self.padding = padding.pair();
        self
    }

    /// The window size `[kh, kw]`.
    pub fn kernel_size(&self) -> [usize; 2] {
        self.kernel_size
    }
}

impl Module for MaxPool2d {
    /// Errors: those of [`NDArray::try_max_pool2d`](crate::NDArray::try_max_pool2d)
    /// (`InvalidArgument` for an input that is not 3-D/4-D, a zero kernel or stride,
    /// padding over half the kernel, a window larger than the padded input;
    /// `UnsupportedDType`), `Closed`.
    fn try_forward(&self, x: NDArray) -> Result<NDArray> {
        x.try_max_pool2d(self.kernel_size, self.stride, self.padding)
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}
