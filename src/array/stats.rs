//! Statistical reductions and scans: `var`/`std` (population), `logsumexp` (stable),
//! `norm` (L2 of all elements) and `cumsum`. Each forward is one fused kernel with its
//! gradient rule beside it.

use super::NDArray;
use super::grad::{full_beside, zero_like};
use super::reduce::{normalize_axes, normalize_axis, reduced_shape};
use crate::DType;
use crate::autograd::{self, Backward, BackwardCtx, Grads};
use crate::backend::cpu;
use crate::backend::cpu::new_overwritten;
use crate::dtype::{Native, dispatch, dispatch_float};
use crate::engine::{self, Operand, Output};
use crate::error::{Result, SourceLocation, twins};
use crate::shape::keep_dims_shape;
use crate::shape::{Dims, Shape};
use smallvec::{SmallVec, smallvec};
use std::panic::Location;

type AxisList = Option<SmallVec<[isize; 4]>>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stat {
    Var,
    Std,
    LogSumExp,
}

impl Stat {
    fn name(self) -> &'static str {
        match self {
            Stat::Var => "var",
            Stat::Std => "std",
            Stat::LogSumExp => "logsumexp",
        }
    }
}

/// Welford's running count, mean and sum of squared deviations (in f64): stable, and
/// exactly 0 for a constant lane.
#[derive(Clone, Copy)]
struct Welford {
    n: f64,
    mean: f64,
    m2: f64,
}

#[inline]
fn welford_row<T: Native>(
    mut w: Welford,
    data: &[T],
    start: isize,
    len: usize,
    stride: isize,
) -> Welford {
    for i in 0..len as isize {
        let v = data[(start + i * stride) as usize].to_f64();
        w.n += 1.0;
        let d = v - w.mean;
        w.mean += d / w.n;
        w.m2 += d * (v - w.mean);
    }
    w
}

/// Running max `m` and `s = sum exp(x - m)` (rescaled when the max grows), in f64.
#[derive(Clone, Copy)]
struct Lse {
    m: f64,
    s: f64,
}

#[inline]
fn lse_row<T: Native>(mut a: Lse, data: &[T], start: isize, len: usize, stride: isize) -> Lse {
    for i in 0..len as isize {
        let v = data[(start + i * stride) as usize].to_f64();
        if v > a.m {
            // exp(-inf) = 0 when the old max is -inf (nothing seen yet).
            a.s = a.s * (a.m - v).exp() + 1.0;
            a.m = v;
        } else if v == a.m {
            a.s += 1.0; // exact; also +inf == +inf, where v - m would be NaN
        } else if v < a.m {
            a.s += (v - a.m).exp();
        } else {
            a.m = f64::NAN; // v is NaN (or m already is): NaN from here on
        }
    }
    a
}

impl Lse {
    fn value(self) -> f64 {
        if self.m == f64::NEG_INFINITY || self.m.is_nan() {
            self.m // every element -inf (or none) gives -inf, not NaN
        } else {
            self.m + self.s.ln()
        }
    }
}

fn stat_reduction(
    x: NDArray,
    stat: Stat,
    axes: Option<&[isize]>,
    keep_dims: bool,
    at: SourceLocation,
) -> Result<NDArray> {
    let name = stat.name();
    let id = engine::run_op_on(name, &[x.id], at, |o| {
        let a = &o[0];
        if !a.dtype.is_float() {
            return Err(engine::unsupported(name, a));
        }
        let axes = normalize_axes(name, a, axes)?;
        let shape = reduced_shape(a.shape(), &axes, keep_dims);
        #[cfg(feature = "gpu")]
        if let Some(ga) = a.gpu() {
            use crate::backend::wgpu::stats;
            let buf = match stat {
                Stat::Var | Stat::Std => stats::var(name, ga, &axes, stat == Stat::Std)?,
                Stat::LogSumExp => stats::logsumexp(name, ga, &axes)?,
            };
            return Ok(Output::device(buf, shape, a.dtype));
        }
        let buf = dispatch_float!(a.dtype, T => {
            let v: Vec<T> = match stat {
                Stat::Var | Stat::Std => {
                    let init = Welford { n: 0.0, mean: 0.0, m2: 0.0 };
                    cpu::reduce::<T, Welford>(a, &axes, init, welford_row)
                        .into_iter()
                        .map(|w| {
                            let var = w.m2 / w.n; // an empty lane: 0/0 = NaN, as numpy
                            T::from_f64(if stat == Stat::Std { var.sqrt() } else { var })
                        })
                        .collect()
                }
                Stat::LogSumExp => {
                    let init = Lse { m: f64::NEG_INFINITY, s: 0.0 };
                    cpu::reduce::<T, Lse>(a, &axes, init, lse_row)
                        .into_iter()
                        .map(|l| T::from_f64(l.value()))
                        .collect()
                }
            };
            new_overwritten::<T>(v.len(), |out| out.copy_from_slice(&v))?
        }, else unreachable!("checked above"));
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    let axes: AxisList = axes.map(SmallVec::from_slice);
    autograd::record(&[x.id], id, || StatRule { stat, axes });
    Ok(NDArray { id })
}

/// `g` where `cond`, else 0.
fn or_zero(cond: NDArray, g: NDArray) -> Result<NDArray> {
    cond.try_where_(g, zero_like(g)?)
}

/// The gradients of var, std and logsumexp (`y` the output, `n` the lane length):
/// var `g * 2 (x - mean) / n`; std `g * (x - mean) / (n * y)`, 0 where `y = 0` (a
/// constant lane, where the derivative does not exist); logsumexp `g` times the
/// softmax weights of the lane (never above 1, so stable; 0 for a lane of -inf).
struct StatRule {
    stat: Stat,
    axes: AxisList,
}

impl Backward for StatRule {
    fn name(&self) -> &'static str {
        self.stat.name()
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (1, self.stat == Stat::Std)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let x = cx.input(0);
        let (ks, n) = keep_dims_shape(&cx.shapes[0], &self.axes);
        let axes: SmallVec<[isize; 4]> = match &self.axes {
            Some(a) => a.clone(),
            None => (0..cx.shapes[0].ndim() as isize).collect(),
        };
        let gk = g.try_reshape(ks.clone())?;
        let grad = match self.stat {
            Stat::Var => {
                let d = x.try_sub(x.try_mean_axes(&axes, true)?)?;
                d.try_mul(gk.try_mul(2.0 / n as f64)?)?
            }
            Stat::Std => {
                let d = x.try_sub(x.try_mean_axes(&axes, true)?)?;
                let y = cx.output.try_reshape(ks)?;
                let coef = or_zero(y.try_gt(0.0)?, gk.try_div(y.try_mul(n as f64)?)?)?;
                d.try_mul(coef)?
            }
            Stat::LogSumExp => {
                // The softmax weights exp(x - max) / sum(exp(x - max)), recomputed:
                // exp(x - y) would carry y's rounding error, |y| * eps, into every
                // weight (0.5 + 3e-14 for x = [1000, 1000]).
                if cx.shapes[0].size() == 0 {
                    return Ok(smallvec![Some(full_beside(x, cx.shapes[0].clone(), 0.0)?)]);
                }
                let mx = x.try_max_axes(&axes, true)?;
                // A lane of -inf (or +inf) is shifted by 0 instead: no inf - inf.
                let shift = or_zero(mx.try_abs()?.try_lt(f64::INFINITY)?, mx)?;
                let e = x.try_sub(shift)?.try_exp()?;
                let sum = e.try_sum_axes(&axes, true)?;
                // A lane of -inf sums to 0: its weights are 0, not 0/0.
                let one = full_beside(x, Shape(Dims::new()), 1.0)?;
                let sum = sum.try_gt(0.0)?.try_where_(sum, one)?;
                e.try_mul(gk.try_div(sum)?)?
            }
        };
        Ok(smallvec![Some(grad)])
    }
}

/// Sum of squares of a strided row, in f64.
#[inline]
fn sumsq_row<T: Native>(acc: f64, data: &[T], start: isize, len: usize, stride: isize) -> f64 {
    let mut acc = acc;
    for i in 0..len as isize {
        let v = data[(start + i * stride) as usize].to_f64();
        acc += v * v;
    }
    acc
}

/// Largest |x| of a strided row (NaN propagates).
#[inline]
fn absmax_row<T: Native>(acc: f64, data: &[T], start: isize, len: usize, stride: isize) -> f64 {
    let mut acc = acc;
    for i in 0..len as isize {
        acc = acc.max_of(data[(start + i * stride) as usize].to_f64().abs());
    }
    acc
}

fn l2_norm<T: Native>(a: &Operand<'_>) -> f64 {
    let all: Dims = (0..a.shape().ndim()).collect();
    let ss = cpu::reduce::<T, f64>(a, &all, 0.0, sumsq_row)[0];
    // f32 squares never overflow or underflow in f64; f64 ones may: then scale by the
    // largest magnitude (as LAPACK's nrm2; numpy's sqrt(dot(x, x)) gives inf or 0).
    if ss.is_finite() && ss > 1e-250 && ss < 1e250 {
        return ss.sqrt();
    }
    let amax = cpu::reduce::<T, f64>(a, &all, 0.0, absmax_row)[0];
    if amax == 0.0 || !amax.is_finite() {
        return amax; // all zeros, or an inf / NaN decides
    }
    let inv = 1.0 / amax;
    let scaled = cpu::reduce::<T, f64>(a, &all, 0.0, |acc, d, s, n, st| {
        let mut acc = acc;
        for i in 0..n as isize {
            let v = d[(s + i * st) as usize].to_f64() * inv;
            acc += v * v;
        }
        acc
    })[0];
    amax * scaled.sqrt()
}

fn norm_impl(x: NDArray, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "norm";
    let id = engine::run_op_on(OP, &[x.id], at, |o| {
        let a = &o[0];
        #[cfg(feature = "gpu")]
        if let Some(ga) = a.gpu().filter(|_| a.dtype.is_float()) {
            let buf = crate::backend::wgpu::stats::norm(OP, ga)?;
            return Ok(Output::device(buf, Shape(Dims::new()), a.dtype));
        }
        let buf = dispatch_float!(a.dtype, T => {
            let v = T::from_f64(l2_norm::<T>(a));
            new_overwritten::<T>(1, |out| out[0] = v)?
        }, else return Err(engine::unsupported(OP, a)));
        Ok(Output::New {
            buf,
            shape: Shape(Dims::new()),
            dtype: a.dtype,
        })
    })?;
    autograd::record(&[x.id], id, || NormRule);
    Ok(NDArray { id })
}

/// `norm`'s gradient: `g * x / norm`, defined as 0 at `x = 0` (a subgradient; the
/// derivative does not exist there).
struct NormRule;

impl Backward for NormRule {
    fn name(&self) -> &'static str {
        "norm"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (1, true)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let y = cx.output;
        let coef = or_zero(y.try_gt(0.0)?, g.try_div(y)?)?;
        Ok(smallvec![Some(cx.input(0).try_mul(coef)?)])
    }
}

fn cumsum_impl(x: NDArray, axis: isize, reverse: bool, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "cumsum";
    let id = engine::run_op_on(OP, &[x.id], at, |o| {
        let a = &o[0];
        if a.dtype == DType::Bool {
            return Err(engine::unsupported(OP, a));
        }
        let ax = normalize_axis(OP, a, axis)?;
        #[cfg(feature = "gpu")]
        if let Some(ga) = a.gpu() {
            let buf = crate::backend::wgpu::stats::cumsum(OP, ga, ax, reverse)?;
            return Ok(Output::device(buf, a.shape().clone(), a.dtype));
        }
        let buf = dispatch!(a.dtype, T => cpu::reduce::cumsum::<T>(a.into(), ax, reverse)?);
        Ok(Output::New {
            buf,
            shape: a.shape().clone(),
            dtype: a.dtype,
        })
    })?;
    autograd::record(&[x.id], id, || CumsumRule { axis, reverse });
    Ok(NDArray { id })
}

/// `cumsum`'s gradient: the cumulative sum of `g` in the other direction.
struct CumsumRule {
    axis: isize,
    reverse: bool,
}

impl Backward for CumsumRule {
    fn name(&self) -> &'static str {
        "cumsum"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn backward(&self, _: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        Ok(smallvec![Some(cumsum_impl(
            g,
            self.axis,
            !self.reverse,
            Location::caller()
        )?)])
    }
}

impl NDArray {
    twins! {
        /// Population variance of all elements, `mean((x - mean(x))^2)` (numpy's default
        /// `ddof=0`; PyTorch's default is the sample variance), as a 0-d array of the same
        /// float dtype. Computed in one stable pass (Welford, in f64): a constant array
        /// gives exactly 0; an empty one NaN. Differentiable. Panics with the error's
        /// message on failure (see the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[1.0f64, 2.0, 3.0, 4.0], [2, 2]);
        /// assert_eq!(x.var().to_scalar::<f64>()?, 1.25);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn var,
        /// [`NDArray::var`]. Errors: `Closed`, `UnsupportedDType` (not a float dtype:
        /// convert integers with `to_dtype` first), `ManagerClosed`/`ManagerCapped`.
        pub fn try_var(self) -> NDArray {
            stat_reduction(self, Stat::Var, None, false, Location::caller())
        }
    }

    twins! {
        /// [`NDArray::var`] over `axes` (negative counts from the end; `&[]` reduces
        /// nothing, giving zeros); with `keep_dims` the reduced axes stay as size 1. Panics
        /// with the error's message on failure (see the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[1.0f32, 2.0, 3.0, 5.0], [2, 2]);
        /// assert_eq!(x.var_axes(&[-1], true).to_vec::<f32>()?, vec![0.25, 1.0]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn var_axes,
        /// [`NDArray::var_axes`]. Errors: `Closed`, `AxisOutOfRange`, `InvalidArgument` (a
        /// repeated axis), `UnsupportedDType` (not a float dtype),
        /// `ManagerClosed`/`ManagerCapped`.
        pub fn try_var_axes(self, axes: &[isize], keep_dims: bool) -> NDArray {
            stat_reduction(self, Stat::Var, Some(axes), keep_dims, Location::caller())
        }
    }

    twins! {
        /// Population standard deviation of all elements, `sqrt(var)` (numpy's default
        /// `ddof=0`), as a 0-d array of the same float dtype. Differentiable; where the
        /// result is 0 (a constant array) the gradient is defined as 0 (PyTorch gives
        /// NaN). Panics with the error's message on failure (see the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[2.0f64, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0], [8]);
        /// assert_eq!(x.std().to_scalar::<f64>()?, 2.0);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn std,
        /// [`NDArray::std`]. Errors: `Closed`, `UnsupportedDType` (not a float dtype),
        /// `ManagerClosed`/`ManagerCapped`.
        pub fn try_std(self) -> NDArray {
            stat_reduction(self, Stat::Std, None, false, Location::caller())
        }
    }

    twins! {
        /// [`NDArray::std`] over `axes` (negative counts from the end); with `keep_dims`
        /// the reduced axes stay as size 1. Panics with the error's message on failure (see
        /// the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[1.0f64, 3.0, 5.0, 5.0], [2, 2]);
        /// assert_eq!(x.std_axes(&[1], false).to_vec::<f64>()?, vec![1.0, 0.0]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn std_axes,
        /// [`NDArray::std_axes`]. Errors: `Closed`, `AxisOutOfRange`, `InvalidArgument` (a
        /// repeated axis), `UnsupportedDType` (not a float dtype),
        /// `ManagerClosed`/`ManagerCapped`.
        pub fn try_std_axes(self, axes: &[isize], keep_dims: bool) -> NDArray {
            stat_reduction(self, Stat::Std, Some(axes), keep_dims, Location::caller())
        }
    }

    twins! {
        /// `log(sum(exp(x)))` of all elements, computed stably (shifted by the maximum, in
        /// one pass, accumulated in f64), as a 0-d array of the same float dtype: huge
        /// values do not overflow, and an array of only `-inf` (or an empty one) gives
        /// `-inf`, not NaN; `+inf` gives `+inf`, NaN gives NaN. Differentiable: the
        /// gradient is the softmax weights `exp(x - logsumexp)`, stable too. Panics with
        /// the error's message on failure (see the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[1000.0f64, 1000.0], [2]);
        /// let y = x.logsumexp().to_scalar::<f64>()?;
        /// assert_eq!(y, 1000.0 + std::f64::consts::LN_2);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn logsumexp,
        /// [`NDArray::logsumexp`]. Errors: `Closed`, `UnsupportedDType` (not a float
        /// dtype), `ManagerClosed`/`ManagerCapped`.
        pub fn try_logsumexp(self) -> NDArray {
            stat_reduction(self, Stat::LogSumExp, None, false, Location::caller())
        }
    }

    twins! {
        /// [`NDArray::logsumexp`] over `axes` (negative counts from the end); with
        /// `keep_dims` the reduced axes stay as size 1. Panics with the error's message on
        /// failure (see the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let ninf = f32::NEG_INFINITY;
        /// let x = m.create(&[0.0f32, 0.0, ninf, ninf], [2, 2]);
        /// assert_eq!(x.logsumexp_axes(&[-1], false).to_vec::<f32>()?, vec![std::f32::consts::LN_2, ninf]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn logsumexp_axes,
        /// [`NDArray::logsumexp_axes`]. Errors: `Closed`, `AxisOutOfRange`,
        /// `InvalidArgument` (a repeated axis), `UnsupportedDType` (not a float dtype),
        /// `ManagerClosed`/`ManagerCapped`.
        pub fn try_logsumexp_axes(self, axes: &[isize], keep_dims: bool) -> NDArray {
            stat_reduction(
                self,
                Stat::LogSumExp,
                Some(axes),
                keep_dims,
                Location::caller(),
            )
        }
    }

    twins! {
        /// The L2 (Frobenius) norm of all elements, `sqrt(sum(x^2))`, as a 0-d array of the
        /// same float dtype (0 for an empty array). Accumulated in f64 and rescaled when
        /// the squares would overflow or underflow (numpy's `linalg.norm` gives inf for
        /// `[1e200, 1e200]`; this gives `1.414e200`). Differentiable: `g * x / norm`,
        /// defined as 0 at `x = 0`, where the derivative does not exist (a subgradient).
        /// Panics with the error's message on failure (see the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[3.0f64, 4.0], [2]);
        /// assert_eq!(x.norm().to_scalar::<f64>()?, 5.0);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn norm,
        /// [`NDArray::norm`]. Errors: `Closed`, `UnsupportedDType` (not a float dtype),
        /// `ManagerClosed`/`ManagerCapped`.
        pub fn try_norm(self) -> NDArray {
            norm_impl(self, Location::caller())
        }
    }

    twins! {
        /// Cumulative sum along `axis` (negative counts from the end), same shape. Integer
        /// arrays keep their dtype and wrap on overflow (numpy widens I32 and U8 to 64
        /// bits); Bool is unsupported (numpy counts it as integers: convert with
        /// `to_dtype`). Floats sum sequentially, as numpy. Differentiable: the gradient is
        /// the reverse cumulative sum of `g`. Panics with the error's message on failure
        /// (see the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[1i32, 2, 3, 4, 5, 6], [2, 3]);
        /// assert_eq!(x.cumsum(-1).to_vec::<i32>()?, vec![1, 3, 6, 4, 9, 15]);
        /// assert_eq!(x.cumsum(0).to_vec::<i32>()?, vec![1, 2, 3, 5, 7, 9]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn cumsum,
        /// [`NDArray::cumsum`]. Errors: `Closed`, `AxisOutOfRange` (a 0-d array has no
        /// axis), `UnsupportedDType` (Bool), `ManagerClosed`/`ManagerCapped`.
        pub fn try_cumsum(self, axis: isize) -> NDArray {
            cumsum_impl(self, axis, false, Location::caller())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lse(v: &[f64]) -> f64 {
        lse_row(
            Lse {
                m: f64::NEG_INFINITY,
                s: 0.0,
            },
            v,
            0,
            v.len(),
            1,
        )
        .value()
    }

    #[test]
    fn lse_row_edge_cases() {
        let (inf, nan) = (f64::INFINITY, f64::NAN);
        assert_eq!(lse(&[]), -inf);
        assert_eq!(lse(&[-inf, -inf]), -inf);
        assert_eq!(lse(&[-inf, 0.0, -inf]), 0.0);
        assert_eq!(lse(&[1.0, inf, inf, 2.0]), inf);
        assert!(lse(&[1.0, nan, 2.0]).is_nan());
        assert!(lse(&[nan, inf]).is_nan());
        // Increasing values rescale the running sum.
        let want = (1.0f64.exp() + 2.0f64.exp() + 3.0f64.exp()).ln();
        assert!((lse(&[1.0, 2.0, 3.0]) - want).abs() < 1e-15);
        assert_eq!(lse(&[1e308, 1e308]), 1e308);
    }

    #[test]
    fn welford_row_strided_and_constant() {
        let init = Welford {
            n: 0.0,
            mean: 0.0,
            m2: 0.0,
        };
        // Every other element of [1, x, 2, x, 3, x, 4]: var 1.25.
        let data = [1.0f32, 9.0, 2.0, 9.0, 3.0, 9.0, 4.0];
        let w = welford_row(init, &data, 0, 4, 2);
        assert_eq!((w.n, w.mean, w.m2 / w.n), (4.0, 2.5, 1.25));
        // Backwards from the end, in two rows.
        let w = welford_row(welford_row(init, &data, 6, 2, -2), &data, 2, 2, -2);
        assert_eq!(w.m2 / w.n, 1.25);
        let c = [0.1f64; 9];
        assert_eq!(welford_row(init, &c, 0, 9, 1).m2, 0.0);
    }
}
