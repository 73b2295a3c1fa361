//! More elementwise math: `erf`, `gelu`, `silu`, `softplus`, `leaky_relu`,
//! `reciprocal`, `rsqrt`, `log1p`, `expm1` (differentiable, float dtypes), `floor`,
//! `ceil`, `round`, `sign` (not differentiable; numeric dtypes), and `stop_gradient`.
//!
//! Forward and backward are each one fused pass over the data: the backward of a
//! differentiable op is the internal op `<name>_backward`, `g * f'(x)` in one kernel,
//! never a chain of temporaries.

use super::NDArray;
use super::ops::broadcast_shape;
use crate::DType;
use crate::autograd::{self, Backward, BackwardCtx, Grads};
use crate::backend::cpu;
use crate::dtype::{Native, dispatch, dispatch_float};
use crate::engine::{self, Output};
use crate::error::{NdError, Result, SourceLocation, twins};
use crate::opkind::Fn1;
use smallvec::smallvec;
use std::panic::Location;

/// The scalar math of [`Fn1`] on one float type.
trait Math: Native {
    /// `f(x)` (`alpha`: leaky_relu's slope).
    fn apply(op: Fn1, x: Self, alpha: Self) -> Self;
    /// `f'(x)`.
    fn deriv(op: Fn1, x: Self, alpha: Self) -> Self;
}

macro_rules! math {
    ($t:ident, $erf:path, $erfc:path) => {
        impl Math for $t {
            #[inline(always)]
            fn apply(op: Fn1, x: $t, alpha: $t) -> $t {
                use std::$t::consts::FRAC_1_SQRT_2;
                match op {
                    Fn1::Erf => $erf(x),
                    // 0.5 x (1 + erf(x / sqrt 2)) written with erfc, which keeps the
                    // relative precision of the tiny values for x << 0. -inf gives the
                    // limit 0 (the formula would give -inf * 0 = NaN).
                    Fn1::Gelu if x == $t::NEG_INFINITY => 0.0,
                    Fn1::Gelu => 0.5 * x * $erfc(-x * FRAC_1_SQRT_2),
                    Fn1::Silu if x == $t::NEG_INFINITY => 0.0,
                    Fn1::Silu => x / (1.0 + (-x).exp()),
                    // max(x, 0) + log1p(exp(-|x|)): exact for every x, no overflow.
                    Fn1::Softplus => x.max_of(0.0) + (-x.abs()).exp().ln_1p(),
                    Fn1::LeakyRelu => {
                        if x > 0.0 {
                            x
                        } else {
                            x * alpha
                        }
                    }
                    Fn1::Reciprocal => 1.0 / x,
                    Fn1::Rsqrt => 1.0 / x.sqrt(),
                    Fn1::Log1p => x.ln_1p(),
                    Fn1::Expm1 => x.exp_m1(),
                    Fn1::Floor => x.floor(),
                    Fn1::Ceil => x.ceil(),
                    Fn1::Round => x.round_ties_even(),
                    Fn1::Sign => {
                        if x > 0.0 {
                            1.0
                        } else if x < 0.0 {
                            -1.0
                        } else if x.is_nan() {
                            x
                        } else {
                            0.0
                        }
                    }
                }
            }

            #[inline(always)]
            fn deriv(op: Fn1, x: $t, alpha: $t) -> $t {
                use std::$t::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI};
                // 1 / sqrt(2 pi)
                const INV_SQRT_2PI: $t = FRAC_2_SQRT_PI * FRAC_1_SQRT_2 * 0.5;
                let sigmoid = |x: $t| 1.0 / (1.0 + (-x).exp());
                match op {
                    Fn1::Erf => FRAC_2_SQRT_PI * (-x * x).exp(),
                    // At +-inf the limits 1 and 0 (the formulas give inf * 0 = NaN).
                    Fn1::Gelu | Fn1::Silu if x.is_infinite() => {
                        if x > 0.0 {
                            1.0
                        } else {
                            0.0
                        }
                    }
                    // Phi(x) + x phi(x)
                    Fn1::Gelu => {
                        0.5 * $erfc(-x * FRAC_1_SQRT_2) + x * INV_SQRT_2PI * (-0.5 * x * x).exp()
                    }
                    Fn1::Silu => {
                        let s = sigmoid(x);
                        s * (1.0 + x * (1.0 - s))
                    }
                    Fn1::Softplus => sigmoid(x),
                    Fn1::LeakyRelu => {
                        if x > 0.0 {
                            1.0
                        } else {
                            alpha
                        }
                    }
                    Fn1::Reciprocal => {
                        let r = 1.0 / x;
                        -(r * r)
                    }
                    Fn1::Rsqrt => {
                        let r = 1.0 / x.sqrt();
                        -0.5 * r * r * r
                    }
                    Fn1::Log1p => 1.0 / (1.0 + x),
                    Fn1::Expm1 => x.exp(),
                    Fn1::Floor | Fn1::Ceil | Fn1::Round | Fn1::Sign => 0.0,
                }
            }
        }
    };
}
math!(f32, libm::erff, libm::erfcf);
math!(f64, libm::erf, libm::erfc);

/// Monomorphise `$body` once per constant [`Fn1`] so inner loops carry no branch.
macro_rules! per_fn {
    ($op:expr, $O:ident => $body:expr) => {
        per_fn!(@arms $op, $O, $body, Erf Gelu Silu Softplus LeakyRelu Reciprocal Rsqrt
            Log1p Expm1 Floor Ceil Round Sign)
    };
    (@arms $op:expr, $O:ident, $body:expr, $($v:ident)*) => {
        match $op {
            $(Fn1::$v => {
                const $O: Fn1 = Fn1::$v;
                $body
            })*
        }
    };
}

/// Integer sign: -1, 0 or 1.
#[inline(always)]
fn int_sign<T: Native>(x: T) -> T {
    if x > T::ZERO {
        T::ONE
    } else if x < T::ZERO {
        T::ZERO.sub(T::ONE)
    } else {
        T::ZERO
    }
}

fn unary_fn(x: NDArray, op: Fn1, alpha: f64, at: SourceLocation) -> Result<NDArray> {
    let name = op.name();
    let id = engine::run_op_on(name, &[x.id], at, |o| {
        let a = &o[0];
        let ok = a.dtype.is_float()
            || (matches!(a.dtype, DType::I32 | DType::I64 | DType::U8) && op.on_integers());
        if !ok {
            return Err(engine::unsupported(name, a));
        }
        #[cfg(feature = "gpu")]
        if let Some(g) = a.gpu() {
            let buf = crate::backend::wgpu::math::forward(op, g, alpha)?;
            return Ok(Output::device(buf, a.shape().clone(), a.dtype));
        }
        let buf = match a.dtype {
            DType::F32 | DType::F64 => dispatch_float!(a.dtype, T => {
                let alpha = T::from_f64(alpha);
                per_fn!(op, O => cpu::map_unary::<T, T>(a, move |p| T::apply(O, p, alpha)))
            }, else unreachable!("float dtypes"))?,
            DType::I32 | DType::I64 | DType::U8 if op.on_integers() => {
                dispatch!(a.dtype, T => if op == Fn1::Sign {
                    cpu::map_unary::<T, T>(a, int_sign)
                } else {
                    cpu::map_unary::<T, T>(a, |p| p)
                })?
            }
            _ => return Err(engine::unsupported(name, a)),
        };
        Ok(Output::New {
            buf,
            shape: a.shape().clone(),
            dtype: a.dtype,
        })
    })?;
    if op.differentiable() {
        autograd::record(&[x.id], id, || UnaryFnRule { op, alpha });
    }
    Ok(NDArray { id })
}

/// The gradient of a [`Fn1`]: `g * f'(x)`, one fused pass.
struct UnaryFnRule {
    op: Fn1,
    alpha: f64,
}

impl Backward for UnaryFnRule {
    fn name(&self) -> &'static str {
        self.op.name()
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (1, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let (op, alpha, x) = (self.op, self.alpha, cx.input(0));
        let name = op.backward_name();
        let id = engine::run_op_on(name, &[x.id, g.id], Location::caller(), |o| {
            let (a, b) = (&o[0], &o[1]);
            let shape = broadcast_shape(name, a, b)?;
            #[cfg(feature = "gpu")]
            if let (Some(ga), Some(gb)) = (a.gpu(), b.gpu()) {
                let buf = crate::backend::wgpu::math::backward(op, ga, gb, &shape, alpha)?;
                return Ok(Output::device(buf, shape, a.dtype));
            }
            let buf = dispatch_float!(a.dtype, T => {
                let alpha = T::from_f64(alpha);
                per_fn!(op, O => cpu::map_binary::<T, T>(a, b, &shape,
                    move |p, q| q * T::deriv(O, p, alpha)))
            }, else return Err(engine::unsupported(name, a)))?;
            Ok(Output::New {
                buf,
                shape,
                dtype: a.dtype,
            })
        })?;
        Ok(smallvec![Some(NDArray { id })])
    }
}

fn stop_gradient_impl(x: NDArray, at: SourceLocation) -> Result<NDArray> {
    let id = engine::run_op_on("stop_gradient", &[x.id], at, |o| {
        #[cfg(feature = "gpu")]
        if let Some(g) = o[0].gpu() {
            let buf = crate::backend::wgpu::kernels::convert("stop_gradient", g, o[0].dtype)?;
            return Ok(Output::device(buf, o[0].shape().clone(), o[0].dtype));
        }
        let (buf, layout) = engine::materialize(&o[0])?;
        Ok(Output::New {
            buf,
            shape: layout.shape,
            dtype: o[0].dtype,
        })
    })?;
    // Deliberately not recorded.
    Ok(NDArray { id })
}

macro_rules! unary_fn_methods {
    ($($(#[$doc:meta])* $name:ident, $try_name:ident, $op:expr, $errors:literal;)*) => {
        impl NDArray {
            $(
                twins! {
                    $(#[$doc])*
                    ///
                    /// Panics with the error's message on failure (see the `try_` form).
                    pub fn $name,
                    #[doc = concat!("[`NDArray::", stringify!($name), "`], returning an error instead \
                        of panicking.\n\nErrors: `Closed`, `UnsupportedDType` (", $errors,
                        "), `ManagerClosed`/`ManagerCapped`.")]
                    pub fn $try_name(self) -> NDArray {
                        unary_fn(self, $op, 0.0, Location::caller())
                    }
                }
            )*
        }
    };
}

unary_fn_methods! {
    /// Elementwise error function `erf(x) = 2/sqrt(pi) * integral_0^x e^(-t^2) dt`
    /// (float dtypes; the `libm` implementation, accurate to about one ulp).
    /// Differentiable: `2/sqrt(pi) * e^(-x^2)`.
    ///
    /// ```
    /// # use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let y = m.create(&[0.0f64, 1.0, f64::INFINITY], [3]).erf();
    /// assert_eq!(y.to_vec::<f64>()?, vec![0.0, 0.8427007929497149, 1.0]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    erf, try_erf, Fn1::Erf, "not a float dtype";
    /// Elementwise GELU, the exact form `0.5 * x * (1 + erf(x / sqrt 2))` (PyTorch's
    /// default `approximate='none'`; float dtypes), computed as
    /// `0.5 * x * erfc(-x / sqrt 2)` so tiny negative results keep their precision.
    /// `gelu(-inf)` is 0 (the limit). Differentiable: `Phi(x) + x * phi(x)` (the normal
    /// CDF and density), one fused pass.
    ///
    /// ```
    /// # use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let y = m.create(&[-1.0f64, 0.0, 2.0], [3]).gelu();
    /// let v = y.to_vec::<f64>()?;
    /// assert!((v[0] + 0.15865525393145707).abs() < 1e-15 && v[1] == 0.0);
    /// assert!((v[2] - 1.9544997361036416).abs() < 1e-15);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    gelu, try_gelu, Fn1::Gelu, "not a float dtype";
    /// Elementwise SiLU (swish) `x * sigmoid(x)` (float dtypes); `silu(-inf)` is 0 (the
    /// limit). Differentiable: `s * (1 + x * (1 - s))` with `s = sigmoid(x)`.
    ///
    /// ```
    /// # use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let y = m.create(&[0.0f32, 1.0], [2]).silu();
    /// assert_eq!(y.to_vec::<f32>()?, vec![0.0, 0.7310586]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    silu, try_silu, Fn1::Silu, "not a float dtype";
    /// Elementwise softplus `log(1 + e^x)` (float dtypes), computed stably as
    /// `max(x, 0) + log1p(e^-|x|)`: no overflow for large `x`, full precision for
    /// very negative `x`. PyTorch returns `x` itself above a threshold of 20; this is
    /// exact there too (they differ by less than `2e-9`). Differentiable: `sigmoid(x)`.
    ///
    /// ```
    /// # use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let y = m.create(&[0.0f64, 1000.0, -1000.0], [3]).softplus();
    /// assert_eq!(y.to_vec::<f64>()?, vec![std::f64::consts::LN_2, 1000.0, 0.0]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    softplus, try_softplus, Fn1::Softplus, "not a float dtype";
    /// Elementwise `1 / x` (float dtypes only: numpy's integer `reciprocal` truncates,
    /// a trap). `1/0` is `inf`. Differentiable: `-1 / x^2`.
    ///
    /// ```
    /// # use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let y = m.create(&[2.0f32, -0.5, 0.0], [3]).reciprocal();
    /// assert_eq!(y.to_vec::<f32>()?, vec![0.5, -2.0, f32::INFINITY]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    reciprocal, try_reciprocal, Fn1::Reciprocal, "not a float dtype";
    /// Elementwise `1 / sqrt(x)` (float dtypes; NaN for `x < 0`, `inf` at 0).
    /// Differentiable: `-0.5 * x^(-3/2)`.
    ///
    /// ```
    /// # use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let y = m.create(&[4.0f64, 0.25], [2]).rsqrt();
    /// assert_eq!(y.to_vec::<f64>()?, vec![0.5, 2.0]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    rsqrt, try_rsqrt, Fn1::Rsqrt, "not a float dtype";
    /// Elementwise `log(1 + x)`, accurate for tiny `x` (float dtypes).
    /// Differentiable: `1 / (1 + x)`.
    ///
    /// ```
    /// # use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let y = m.create(&[1e-20f64, -1.0], [2]).log1p();
    /// assert_eq!(y.to_vec::<f64>()?, vec![1e-20, f64::NEG_INFINITY]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    log1p, try_log1p, Fn1::Log1p, "not a float dtype";
    /// Elementwise `e^x - 1`, accurate for tiny `x` (float dtypes).
    /// Differentiable: `e^x`.
    ///
    /// ```
    /// # use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let y = m.create(&[1e-20f64, f64::NEG_INFINITY], [2]).expm1();
    /// assert_eq!(y.to_vec::<f64>()?, vec![1e-20, -1.0]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    expm1, try_expm1, Fn1::Expm1, "not a float dtype";
    /// Elementwise floor (largest integer `<= x`). Integer arrays are returned
    /// unchanged (a copy, same dtype, as numpy). **Not differentiable**: like the
    /// comparisons it is not recorded, so no gradient flows back through it (the
    /// backward of a loss computed only through it is an error, never a silent zero).
    ///
    /// ```
    /// # use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let y = m.create(&[-1.5f64, 1.5, -0.0], [3]).floor();
    /// assert_eq!(y.to_vec::<f64>()?, vec![-2.0, 1.0, -0.0]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    floor, try_floor, Fn1::Floor, "Bool";
    /// Elementwise ceiling (smallest integer `>= x`). Integer arrays are returned
    /// unchanged (a copy, same dtype). **Not differentiable**: not recorded, like the
    /// comparisons.
    ///
    /// ```
    /// # use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let y = m.create(&[-1.5f64, 1.2], [2]).ceil();
    /// assert_eq!(y.to_vec::<f64>()?, vec![-1.0, 2.0]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    ceil, try_ceil, Fn1::Ceil, "Bool";
    /// Elementwise rounding to the nearest integer, **half to even** as numpy's
    /// `round` (0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> -0). Integer arrays are returned
    /// unchanged (a copy, same dtype). **Not differentiable**: not recorded, like the
    /// comparisons.
    ///
    /// ```
    /// # use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let y = m.create(&[0.5f64, 1.5, 2.5, -0.5, 2.6], [5]).round();
    /// assert_eq!(y.to_vec::<f64>()?, vec![0.0, 2.0, 2.0, -0.0, 3.0]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    round, try_round, Fn1::Round, "Bool";
    /// Elementwise sign: -1, 0 or 1 in the array's dtype (numeric dtypes; NaN stays
    /// NaN, -0.0 gives 0, as numpy). **Not differentiable**: not recorded, like the
    /// comparisons.
    ///
    /// ```
    /// # use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let y = m.create(&[-3i32, 0, 7], [3]).sign();
    /// assert_eq!(y.to_vec::<i32>()?, vec![-1, 0, 1]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    sign, try_sign, Fn1::Sign, "Bool";
}

impl NDArray {
    twins! {
        /// Elementwise leaky ReLU: `x` where `x > 0`, else `alpha * x` (float dtypes;
        /// PyTorch's `negative_slope`, usually 0.01; NaN stays NaN). Differentiable: 1 where
        /// `x > 0`, else `alpha` (at 0 too, as PyTorch). Panics with the error's message on
        /// failure (see the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let y = m.create(&[-2.0f64, 0.0, 3.0], [3]).leaky_relu(0.1);
        /// assert_eq!(y.to_vec::<f64>()?, vec![-0.2, 0.0, 3.0]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn leaky_relu,
        /// [`NDArray::leaky_relu`], returning an error instead of panicking.
        ///
        /// Errors: `Closed`, `InvalidArgument` (`alpha` not finite), `UnsupportedDType`
        /// (not a float dtype), `ManagerClosed`/`ManagerCapped`.
        pub fn try_leaky_relu(self, alpha: f64) -> NDArray {
            if !alpha.is_finite() {
                // Check the array first: a closed array reports that, not the slope.
                engine::dtype(self.id)?;
                return Err(NdError::invalid(
                    "leaky_relu",
                    format!("the slope alpha must be finite, got {alpha}"),
                ));
            }
            unary_fn(self, Fn1::LeakyRelu, alpha, Location::caller())
        }
    }

    twins! {
        /// The same values in a new array that is never recorded on the gradient tape, so
        /// no gradient flows back through it (DJL's `stopGradient`, PyTorch's `detach`):
        /// the gradient of `x.stop_gradient() * x` with respect to `x` is `x`, not `2x`.
        /// Any dtype. The result is a contiguous copy (PyTorch's `detach` shares storage),
        /// so writing into it never changes a value the tape saved. Panics with the error's
        /// message on failure (see the `try_` form).
        ///
        /// ```
        /// use ndscope::{GradientCollector, NDManager};
        /// let m = NDManager::new();
        /// let x = m.create(&[3.0f64], [1]).set_requires_gradient(true);
        /// let gc = GradientCollector::new();
        /// let loss = (x.stop_gradient() * x).sum();
        /// gc.backward(loss)?;
        /// assert_eq!(x.gradient().to_vec::<f64>()?, vec![3.0]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn stop_gradient,
        /// [`NDArray::stop_gradient`], returning an error instead of panicking.
        ///
        /// Errors: `Closed`, `ManagerClosed`/`ManagerCapped`.
        /// Not differentiable: never recorded, by design.
        pub fn try_stop_gradient(self) -> NDArray {
            stop_gradient_impl(self, Location::caller())
        }
    }
}
