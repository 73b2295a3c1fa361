//! Layers without parameters: the activations [`Relu`], [`Tanh`] and [`Sigmoid`], and
//! [`Flatten`].

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
                    array: crate::engine::desc(x.id)?,
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
