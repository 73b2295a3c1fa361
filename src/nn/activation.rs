//! Layers without parameters: the activations [`Relu`], [`Gelu`], [`Tanh`] and
//! [`Sigmoid`], [`Flatten`] and [`Dropout`].

use super::Module;
use crate::NDArray;
use crate::error::{NdError, Result};

macro_rules! activation {
    ($(#[$doc:meta])* $name:ident, $op:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name {
            training: bool,
        }

        impl $name {
            /// The layer (in training mode, which changes nothing for it).
            pub fn new() -> $name {
                $name { training: true }
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name::new()
            }
        }

        impl Module for $name {
            fn try_forward(&self, x: NDArray) -> Result<NDArray> {
                x.$op()
            }

            fn set_training(&mut self, training: bool) {
                self.training = training;
            }

            fn is_training(&self) -> bool {
                self.training
            }
        }
    };
}

activation! {
    /// `max(x, 0)` elementwise ([`NDArray::relu`]; PyTorch's `nn.ReLU`).
    ///
    /// ```
    /// use ndscope::nn::{Module, Relu};
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let y = Relu::new().forward(m.create(&[-1.0f32, 2.0], [2]));
    /// assert_eq!(y.to_vec::<f32>()?, vec![0.0, 2.0]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    Relu, try_relu
}

activation! {
    /// `tanh(x)` elementwise ([`NDArray::tanh`]; PyTorch's `nn.Tanh`).
    ///
    /// ```
    /// use ndscope::nn::{Module, Tanh};
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let y = Tanh::new().forward(m.create(&[0.0f64], [1]));
    /// assert_eq!(y.to_vec::<f64>()?, vec![0.0]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    Tanh, try_tanh
}

activation! {
    /// `1 / (1 + e^-x)` elementwise ([`NDArray::sigmoid`]; PyTorch's `nn.Sigmoid`).
    ///
    /// ```
    /// use ndscope::nn::{Module, Sigmoid};
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let y = Sigmoid::new().forward(m.create(&[0.0f64], [1]));
    /// assert_eq!(y.to_vec::<f64>()?, vec![0.5]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    Sigmoid, try_sigmoid
}

/// Flatten dimensions `start_dim..=end_dim` into one (PyTorch's `nn.Flatten`; by
/// default from dimension 1 to the last, so `[N, C, H, W]` becomes `[N, C·H·W]`).
/// Negative dimensions count from the end. A view when the input is contiguous (see
/// [`NDArray::reshape`]).
///
/// ```
/// use ndscope::nn::{Flatten, Module};
/// use ndscope::{DType, NDManager};
/// let m = NDManager::new();
/// let x = m.zeros([2, 3, 4, 5], DType::F32);
/// assert_eq!(Flatten::new().forward(x).shape().dims(), &[2, 60]);
/// assert_eq!(Flatten::with_dims(1, 2).forward(x).shape().dims(), &[2, 12, 5]);
/// assert!(Flatten::new().try_forward(m.zeros([4], DType::F32)).is_err()); // no dim 1
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flatten {
    start_dim: isize,
    end_dim: isize,
    training: bool,
}

impl Flatten {
    /// Flatten dimensions 1 to the last (PyTorch's default).
    pub fn new() -> Flatten {
        Flatten::with_dims(1, -1)
    }

    /// Flatten dimensions `start_dim` to `end_dim` (inclusive; negative from the end).
    pub fn with_dims(start_dim: isize, end_dim: isize) -> Flatten {
        Flatten {
            start_dim,
            end_dim,
            training: true,
        }
    }
}

impl Default for Flatten {
    fn default() -> Self {
        Flatten::new()
    }
}

impl Module for Flatten {
    /// Errors: `AxisOutOfRange` (a dimension out of range; a 0-d input counts as 1-D,
    /// as in PyTorch), `InvalidArgument` (`start_dim` after `end_dim`), `Closed`.
    fn try_forward(&self, x: NDArray) -> Result<NDArray> {
        let shape = x.try_shape()?;
        let nd = shape.ndim().max(1) as isize;
        let norm = |d: isize| -> Result<usize> {
            let n = if d < 0 { d + nd } else { d };
            if n < 0 || n >= nd {
                return Err(NdError::AxisOutOfRange {
                    op: "flatten",
                    axis: d,
                    array: crate::ext::desc(x)?,
                });
            }
            Ok(n as usize)
        };
        let (s, e) = (norm(self.start_dim)?, norm(self.end_dim)?);
        if s > e {
            return Err(NdError::invalid(
                "flatten",
                format!(
                    "start_dim {} comes after end_dim {} for shape {shape}",
                    self.start_dim, self.end_dim
                ),
            ));
        }
        let d = shape.dims();
        if d.is_empty() {
            return x.try_reshape([1]);
        }
        let mut out: Vec<usize> = d[..s].to_vec();
        out.push(d[s..=e].iter().product());
        out.extend_from_slice(&d[e + 1..]);
        x.try_reshape(out)
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// GELU elementwise (PyTorch's `nn.GELU`): by default the exact form
/// `x · Φ(x) = 0.5 · x · (1 + erf(x / √2))` ([`NDArray::gelu`], a fused op), or with
/// [`Gelu::tanh`] the approximation `0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 x³)))`
/// (PyTorch's `approximate='tanh'`, composed of elementwise ops, whose gradients give
/// its gradient).
///
/// ```
/// use ndscope::nn::{Gelu, Module};
/// use ndscope::NDManager;
/// let m = NDManager::new();
/// let x = m.create(&[-1.0f64, 0.0, 2.0], [3]);
/// let exact = Gelu::new().forward(x).to_vec::<f64>()?;
/// assert!((exact[0] + 0.15865525393145707).abs() < 1e-15 && exact[1] == 0.0);
/// let approx = Gelu::tanh().forward(x).to_vec::<f64>()?;
/// assert!((approx[2] - 1.954597694087775).abs() < 1e-12);     // the formula, in numpy
/// # Ok::<(), ndscope::NdError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gelu {
    approximate: bool,
    training: bool,
}

impl Gelu {
    /// The exact GELU (PyTorch's default, `approximate='none'`).
    pub fn new() -> Gelu {
        Gelu {
            approximate: false,
            training: true,
        }
    }

    /// The tanh approximation (PyTorch's `approximate='tanh'`).
    pub fn tanh() -> Gelu {
        Gelu {
            approximate: true,
            training: true,
        }
    }

    /// Whether this is the tanh approximation.
    pub fn is_approximate(&self) -> bool {
        self.approximate
    }
}

impl Default for Gelu {
    fn default() -> Self {
        Gelu::new()
    }
}

impl Module for Gelu {
    /// Errors: `UnsupportedDType` (not a float array), `Closed`.
    fn try_forward(&self, x: NDArray) -> Result<NDArray> {
        if !self.approximate {
            return x.try_gelu();
        }
        let dtype = x.try_dtype()?;
        if !dtype.is_float() {
            return Err(NdError::UnsupportedDType {
                op: "gelu",
                dtype,
                array: crate::ext::desc(x)?,
            });
        }
        // Composite (not hot in the models here): the temporaries are freed by the
        // scope; the gradient comes from the ops.
        crate::scope(|| {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let inner = x
                .try_square()?
                .try_mul(0.044715)?
                .try_add(1.0)?
                .try_mul(x)?
                .try_mul(c)?;
            inner.try_tanh()?.try_add(1.0)?.try_mul(x)?.try_mul(0.5)
        })
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// Dropout (PyTorch's `nn.Dropout`): in training mode each element is zeroed with
/// probability `p` and the others are scaled by `1 / (1 - p)` ([`NDArray::dropout`],
/// with a fresh mask from [`crate::random`]'s generator on every call); in evaluation
/// mode ([`Module::eval`]) the output is the input itself, the same handle, as
/// PyTorch returns its input.
///
/// ```
/// use ndscope::nn::{Dropout, Module};
/// use ndscope::{DType, NDManager};
/// let m = NDManager::new();
/// let mut drop = Dropout::new(0.5);
/// let x = m.ones([1000], DType::F32);
/// let v = drop.forward(x).to_vec::<f32>()?;
/// assert!(v.iter().all(|&e| e == 0.0 || e == 2.0));
/// assert!(v.iter().any(|&e| e == 0.0) && v.iter().any(|&e| e == 2.0));
/// drop.eval();
/// assert_eq!(drop.forward(x), x);                               // the identity
/// assert!(Dropout::try_new(1.5).is_err());
/// # Ok::<(), ndscope::NdError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    p: f64,
    training: bool,
}

impl Dropout {
    /// Dropout with probability `p` in `[0, 1]`. Panics otherwise (see
    /// [`Dropout::try_new`]).
    #[track_caller]
    pub fn new(p: f64) -> Dropout {
        crate::error::unwrap(Dropout::try_new(p))
    }

    /// [`Dropout::new`]. Errors: `InvalidArgument` (`p` outside `[0, 1]` or NaN).
    pub fn try_new(p: f64) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(NdError::invalid(
                "dropout",
                format!("dropout probability has to be between 0 and 1, got {p}"),
            ));
        }
        Ok(Dropout { p, training: true })
    }

    /// The probability of zeroing an element.
    pub fn p(&self) -> f64 {
        self.p
    }
}

impl Module for Dropout {
    /// Errors: `UnsupportedDType` (not a float array), `Closed`, and those of making
    /// the mask ([`NDArray::try_dropout`]).
    fn try_forward(&self, x: NDArray) -> Result<NDArray> {
        x.try_dropout(self.p, self.training)
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}
