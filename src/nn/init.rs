//! Parameter initialisation: Xavier/Glorot and Kaiming/He, uniform and normal, with
//! PyTorch's formulas (`torch.nn.init`) and its default for each layer.
//!
//! Samples come from the process-wide generator of [`crate::random`], so
//! [`crate::random::seed`] makes a model's initial values reproducible (the generator
//! is not PyTorch's: the same seed gives other values than PyTorch, from the same
//! distributions).
//!
//! | [`Init`] | distribution | PyTorch |
//! |---|---|---|
//! | `XavierUniform { gain }` | U(-b, b), b = gain·√(6 / (fan_in + fan_out)) | `xavier_uniform_` |
//! | `XavierNormal { gain }` | N(0, s²), s = gain·√(2 / (fan_in + fan_out)) | `xavier_normal_` |
//! | `KaimingUniform { mode, nonlinearity }` | U(-b, b), b = gain·√(3 / fan) | `kaiming_uniform_` |
//! | `KaimingNormal { mode, nonlinearity }` | N(0, s²), s = gain / √fan | `kaiming_normal_` |
//! | `Uniform`, `Normal`, `Constant`, `Zeros`, `Ones` | as named | `uniform_`, `normal_`, ... |
//!
//! `fan` is `fan_in` or `fan_out` by [`FanMode`] ([`fan_in_and_fan_out`]: for a weight
//! `[out, in, k...]`, `fan_in = in·k...` and `fan_out = out·k...`), and `gain` is
//! [`calculate_gain`] of the [`Nonlinearity`]. PyTorch's default for `Linear` and
//! `Conv*` weights is [`Init::pytorch_default`] (Kaiming uniform with a leaky-ReLU
//! slope of √5, that is U(-1/√fan_in, 1/√fan_in)), and their bias is
//! U(-1/√fan_in, 1/√fan_in) with the weight's `fan_in` ([`Init::bias_default`]).
//!
//! ```
//! use ndscope::nn::init::{FanMode, Init, Nonlinearity};
//! use ndscope::{DType, NDManager};
//! let m = NDManager::new();
//! ndscope::random::seed(1);
//! let w = Init::KaimingNormal { mode: FanMode::FanIn, nonlinearity: Nonlinearity::Relu }
//!     .create(&m, [256, 100], DType::F64);            // He init: std = sqrt(2 / 100)
//! let v = w.to_vec::<f64>()?;
//! let std = (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt();
//! assert!((std - (2.0f64 / 100.0).sqrt()).abs() < 0.01);
//!
//! Init::xavier_uniform().fill(w);                     // in place, like `xavier_uniform_`
//! let b = (6.0f64 / 356.0).sqrt();
//! assert!(w.to_vec::<f64>()?.iter().all(|x| x.abs() <= b));
//! # Ok::<(), ndscope::NdError>(())
//! ```

use crate::autograd;
use crate::backend::cpu::StridedMut;
use crate::dtype::{Native, dispatch_float};
use crate::error::{NdError, Result, twins, unwrap};
use crate::ext;
use crate::layout::for_each_row;
use crate::random;
use crate::{DType, NDArray, NDManager, Shape};

/// Which fan a Kaiming initialisation preserves the variance of: `FanIn` (the forward
/// pass, PyTorch's default) or `FanOut` (the backward pass).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FanMode {
    /// `fan_in`: preserves the variance of the activations in the forward pass.
    FanIn,
    /// `fan_out`: preserves the variance of the gradients in the backward pass.
    FanOut,
}

/// The nonlinearity that follows a layer, for [`calculate_gain`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Nonlinearity {
    /// Identity or a linear/convolution layer: gain 1.
    Linear,
    /// Sigmoid: gain 1.
    Sigmoid,
    /// Tanh: gain 5/3.
    Tanh,
    /// ReLU: gain √2.
    Relu,
    /// Leaky ReLU with this negative slope: gain √(2 / (1 + slope²)).
    LeakyRelu(f64),
    /// SELU: gain 3/4.
    Selu,
}

/// The recommended gain for a nonlinearity (PyTorch's `calculate_gain`).
///
/// ```
/// use ndscope::nn::init::{Nonlinearity, calculate_gain};
/// assert_eq!(calculate_gain(Nonlinearity::Relu), 2f64.sqrt());
/// assert_eq!(calculate_gain(Nonlinearity::Tanh), 5.0 / 3.0);
/// assert!((calculate_gain(Nonlinearity::LeakyRelu(5f64.sqrt())) - (1.0f64 / 3.0).sqrt()).abs() < 1e-15);
/// ```
pub fn calculate_gain(nonlinearity: Nonlinearity) -> f64 {
    match nonlinearity {
        Nonlinearity::Linear | Nonlinearity::Sigmoid => 1.0,
        Nonlinearity::Tanh => 5.0 / 3.0,
        Nonlinearity::Relu => 2f64.sqrt(),
        Nonlinearity::LeakyRelu(slope) => (2.0 / (1.0 + slope * slope)).sqrt(),
        Nonlinearity::Selu => 0.75,
    }
}

/// `(fan_in, fan_out)` of a weight of `shape` (PyTorch's
/// `_calculate_fan_in_and_fan_out`): for `[out, in, k1, k2, ...]`,
/// `fan_in = in·k1·k2·...` and `fan_out = out·k1·k2·...`. Errors: `InvalidArgument`
/// for fewer than 2 dimensions (as PyTorch).
///
/// ```
/// use ndscope::nn::init::fan_in_and_fan_out;
/// assert_eq!(fan_in_and_fan_out(&[16, 3, 5, 5].into())?, (75, 400));
/// assert!(fan_in_and_fan_out(&[10].into()).is_err());
/// # Ok::<(), ndscope::NdError>(())
/// ```
pub fn fan_in_and_fan_out(shape: &Shape) -> Result<(usize, usize)> {
    let d = shape.dims();
    if d.len() < 2 {
        return Err(NdError::invalid(
            "fan_in_and_fan_out",
            format!(
                "fan in and fan out cannot be computed for shape {shape} (fewer than 2 dimensions)"
            ),
        ));
    }
    let receptive: usize = d[2..].iter().product();
    Ok((d[1] * receptive, d[0] * receptive))
}

/// How to initialise an array; see the [module documentation](self) for the formulas.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
    /// All `value`.
    Constant(f64),
    /// U(`low`, `high`).
    Uniform {
        /// Lower bound (inclusive).
        low: f64,
        /// Upper bound (exclusive).
        high: f64,
    },
    /// N(`mean`, `std`²).
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
    /// Glorot & Bengio (2010), uniform: U(-b, b), b = gain·√(6 / (fan_in + fan_out)).
    XavierUniform {
        /// The gain ([`calculate_gain`]); 1 by default.
        gain: f64,
    },
    /// Glorot & Bengio (2010), normal: N(0, s²), s = gain·√(2 / (fan_in + fan_out)).
    XavierNormal {
        /// The gain ([`calculate_gain`]); 1 by default.
        gain: f64,
    },
    /// He et al. (2015), uniform: U(-b, b), b = gain·√(3 / fan).
    KaimingUniform {
        /// The fan to use.
        mode: FanMode,
        /// The nonlinearity whose gain scales the bound.
        nonlinearity: Nonlinearity,
    },
    /// He et al. (2015), normal: N(0, s²), s = gain / √fan.
    KaimingNormal {
        /// The fan to use.
        mode: FanMode,
        /// The nonlinearity whose gain scales the deviation.
        nonlinearity: Nonlinearity,
    },
}

/// The distribution an [`Init`] resolves to for one shape.
#[derive(Clone, Copy)]
enum Dist {
    Constant(f64),
    Uniform(f64, f64),
    Normal(f64, f64),
}

impl Init {
    /// Xavier uniform with gain 1 (`xavier_uniform_`'s default).
    pub fn xavier_uniform() -> Init {
        Init::XavierUniform { gain: 1.0 }
    }

    /// Xavier normal with gain 1 (`xavier_normal_`'s default).
    pub fn xavier_normal() -> Init {
        Init::XavierNormal { gain: 1.0 }
    }

    /// Kaiming uniform with `kaiming_uniform_`'s defaults: fan in, leaky ReLU with slope
    /// 0 (gain √2), so U(-√(6/fan_in), √(6/fan_in)).
    pub fn kaiming_uniform() -> Init {
        Init::KaimingUniform {
            mode: FanMode::FanIn,
            nonlinearity: Nonlinearity::LeakyRelu(0.0),
        }
    }

    /// Kaiming normal with `kaiming_normal_`'s defaults: fan in, gain √2, so
    /// N(0, 2/fan_in) (He initialisation).
    pub fn kaiming_normal() -> Init {
        Init::KaimingNormal {
            mode: FanMode::FanIn,
            nonlinearity: Nonlinearity::LeakyRelu(0.0),
        }
    }

    /// PyTorch's default for the weight of `Linear` and `Conv*` layers:
    /// `kaiming_uniform_(w, a=√5)`, that is U(-1/√fan_in, 1/√fan_in).
    pub fn pytorch_default() -> Init {
        Init::KaimingUniform {
            mode: FanMode::FanIn,
            nonlinearity: Nonlinearity::LeakyRelu(5f64.sqrt()),
        }
    }

    /// PyTorch's default for the bias of `Linear` and `Conv*` layers whose weight has
    /// `fan_in`: U(-1/√fan_in, 1/√fan_in), or zeros when `fan_in` is 0.
    pub fn bias_default(fan_in: usize) -> Init {
        let bound = if fan_in > 0 {
            1.0 / (fan_in as f64).sqrt()
        } else {
            0.0
        };
        Init::Uniform {
            low: -bound,
            high: bound,
        }
    }

    /// The distribution for `shape`; the fans are needed only by Xavier and Kaiming.
    fn dist(&self, op: &'static str, shape: &Shape) -> Result<Dist> {
        let fans = || {
            fan_in_and_fan_out(shape).map_err(|_| {
                NdError::invalid(
                    op,
                    format!("{self:?} needs a weight of 2 or more dimensions, got shape {shape}"),
                )
            })
        };
        let empty = shape.size() == 0; // PyTorch: a no-op on a zero-element tensor
        let d = match *self {
            Init::Zeros => Dist::Constant(0.0),
            Init::Ones => Dist::Constant(1.0),
            Init::Constant(v) => Dist::Constant(v),
            Init::Uniform { low, high } => Dist::Uniform(low, high),
            Init::Normal { mean, std } => Dist::Normal(mean, std),
            Init::XavierUniform { gain } => {
                let (fi, fo) = fans()?;
                let b = gain * (6.0 / (fi + fo) as f64).sqrt();
                Dist::Uniform(-b, b)
            }
            Init::XavierNormal { gain } => {
                let (fi, fo) = fans()?;
                Dist::Normal(0.0, gain * (2.0 / (fi + fo) as f64).sqrt())
            }
            Init::KaimingUniform { mode, nonlinearity } => {
                let fan = pick(fans()?, mode);
                let b = calculate_gain(nonlinearity) * (3.0 / fan as f64).sqrt();
                Dist::Uniform(-b, b)
            }
            Init::KaimingNormal { mode, nonlinearity } => {
                let fan = pick(fans()?, mode);
                Dist::Normal(0.0, calculate_gain(nonlinearity) / (fan as f64).sqrt())
            }
        };
        if empty {
            return Ok(Dist::Constant(0.0));
        }
        // Validate here so that `fill` fails before writing and `create` before
        // allocating (the sampler checks the same).
        let bad = match d {
            Dist::Constant(v) => v.is_nan(),
            Dist::Uniform(lo, hi) => !(lo.is_finite() && hi.is_finite() && lo <= hi),
            Dist::Normal(mean, std) => !(mean.is_finite() && std.is_finite() && std >= 0.0),
        };
        if bad {
            return Err(NdError::invalid(
                op,
                format!("{self:?} gives an invalid distribution for shape {shape}"),
            ));
        }
        Ok(d)
    }

    twins! {
        /// A new array of `shape` and `dtype` (a float dtype) in `m`, initialised this way.
        /// Panics on failure (see [`Init::try_create`]).
        pub fn create,
        /// [`Init::create`]. Errors: `InvalidArgument` (Xavier/Kaiming for fewer than 2
        /// dimensions; bounds that are not finite or out of order; a negative deviation; a
        /// non-float dtype), and the errors of creating an array (`ManagerClosed`, ...).
        pub fn try_create(&self, m: &NDManager, shape: impl Into<Shape>, dtype: DType) -> NDArray {
            let shape = shape.into();
            super::check_param_dtype("init", dtype)?;
            match self.dist("init", &shape)? {
                Dist::Constant(v) => m.try_full(shape, v, dtype),
                // Drawn on the host whatever the manager's device: a seeded model is
                // the same model on every device.
                Dist::Uniform(lo, hi) => m.try_random_host(false, (lo, hi), shape, dtype),
                Dist::Normal(mean, std) => m.try_random_host(true, (mean, std), shape, dtype),
            }
        }
    }

    /// Overwrite `a` in place with values drawn this way (PyTorch's `xavier_uniform_`
    /// and friends); views of `a` see the change. Panics on failure.
    #[track_caller]
    pub fn fill(&self, a: NDArray) {
        unwrap(self.try_fill(a))
    }

    /// [`Init::fill`]. Errors as [`Init::try_create`] (a non-float `a` is
    /// `UnsupportedDType`), `Closed`, and `InvalidArgument` while a
    /// [`GradientCollector`](crate::GradientCollector) records a tape that depends on
    /// `a`. `a` is unchanged on an error.
    pub fn try_fill(&self, a: NDArray) -> Result<()> {
        let shape = a.try_shape()?;
        let dist = self.dist("init_fill", &shape)?;
        autograd::check_inplace("init_fill", a.id)?;
        let n = shape.size();
        let values = match dist {
            Dist::Constant(_) => Vec::new(),
            Dist::Uniform(lo, hi) => random::uniform(lo, hi, n)?,
            Dist::Normal(mean, std) => random::normal(mean, std, n)?,
        };
        ext::update_in_place(a, [], |mut t, []| {
            dispatch_float!(t.dtype(), T => {
                let StridedMut { data: dst, layout: lt } = t.view_mut::<T>();
                let mut next = 0usize;
                for_each_row(lt.shape.dims(), [&lt.strides], [lt.offset], |off, len, s| {
                    for i in 0..len as isize {
                        let v = match dist {
                            Dist::Constant(v) => v,
                            _ => values[next],
                        };
                        next += 1;
                        dst[(off[0] + i * s[0]) as usize] = T::from_f64(v);
                    }
                });
                Ok(())
            }, else Err(NdError::UnsupportedDType {
                op: "init_fill",
                dtype: t.dtype(),
                array: t.desc(),
            }))
        })
    }
}

fn pick((fan_in, fan_out): (usize, usize), mode: FanMode) -> usize {
    match mode {
        FanMode::FanIn => fan_in,
        FanMode::FanOut => fan_out,
    }
}
