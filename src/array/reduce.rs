//! Reductions: `sum`, `mean`, `max`, `min`, `prod` over all elements or chosen axes,
//! and `argmax`/`argmin`. Every op has a `try_*` form and a panicking form.
//!
//! All of them run one [`cpu::reduce()`] pass over the input (no temporaries). A full
//! reduction of a contiguous array merges into one long contiguous row, so `sum()` is
//! one pairwise, 8-lane, multi-threaded [`cpu::sum_row`] call.

use super::NDArray;
use super::grad::full_beside;
use crate::DType;
use crate::autograd::{self, Backward, BackwardCtx, Base, Grads, LazyGrad, LazyGrads, via_arrays};
use crate::backend::cpu;
use crate::backend::cpu::new_overwritten;
use crate::dtype::{Native, dispatch};
use crate::engine::{self, Buffer, Operand, Output};
use crate::error::{NdError, Result, SourceLocation, twins, unwrap};
use crate::shape::keep_dims_shape;
use crate::shape::{Dims, Shape};
use smallvec::SmallVec;
use std::panic::Location;

/// Normalised, sorted reduction axes.
pub(crate) type Axes = SmallVec<[usize; 4]>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Red {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
}

impl Red {
    fn name(self) -> &'static str {
        match self {
            Red::Sum => "sum",
            Red::Mean => "mean",
            Red::Max => "max",
            Red::Min => "min",
            Red::Prod => "prod",
        }
    }
}

/// One axis of `o`, negative counting from the end, or `AxisOutOfRange`.
pub(crate) fn normalize_axis(op: &'static str, o: &Operand<'_>, axis: isize) -> Result<usize> {
    super::axis::normalize_axis(op, axis, o.shape().ndim(), o)
}

/// Sorted axes (`None`: all of them); out of range is `AxisOutOfRange`, a repeated axis
/// `InvalidArgument`.
pub(crate) fn normalize_axes(
    op: &'static str,
    o: &Operand<'_>,
    axes: Option<&[isize]>,
) -> Result<Axes> {
    let Some(axes) = axes else {
        return Ok((0..o.shape().ndim()).collect());
    };
    let mut out = Axes::new();
    for &axis in axes {
        let a = normalize_axis(op, o, axis)?;
        if out.contains(&a) {
            return Err(NdError::invalid(
                op,
                format!("axis {axis} is repeated in {axes:?}"),
            ));
        }
        out.push(a);
    }
    out.sort_unstable();
    Ok(out)
}

/// The result shape of reducing `axes` (sorted) of `shape`.
pub(crate) fn reduced_shape(shape: &Shape, axes: &[usize], keep_dims: bool) -> Shape {
    let mut dims = Dims::new();
    for (d, &n) in shape.dims().iter().enumerate() {
        if !axes.contains(&d) {
            dims.push(n);
        } else if keep_dims {
            dims.push(1);
        }
    }
    Shape(dims)
}

/// Copy accumulated values into a fresh buffer.
fn to_buffer<T: Native>(v: &[T]) -> Result<Buffer> {
    new_overwritten::<T>(v.len(), |out| out.copy_from_slice(v))
}

/// Fold one strided row with `f`; contiguous rows use 8 independent lanes so the loop
/// vectorises (`f` must be associative and commutative, `init` its identity).
#[inline]
fn fold_row<T: Native>(
    data: &[T],
    start: isize,
    len: usize,
    stride: isize,
    init: T,
    f: impl Fn(T, T) -> T,
) -> T {
    if stride == 1 {
        let x = &data[start as usize..start as usize + len];
        let mut lanes = [init; 8];
        let chunks = x.chunks_exact(8);
        let rest = chunks.remainder();
        for c in chunks {
            for k in 0..8 {
                lanes[k] = f(lanes[k], c[k]);
            }
        }
        let mut acc = init;
        for &v in rest {
            acc = f(acc, v);
        }
        let a = f(f(lanes[0], lanes[1]), f(lanes[2], lanes[3]));
        let b = f(f(lanes[4], lanes[5]), f(lanes[6], lanes[7]));
        return f(f(a, b), acc);
    }
    let mut acc = init;
    for i in 0..len as isize {
        acc = f(acc, data[(start + i * stride) as usize]);
    }
    acc
}

/// Sum of a strided row, accumulated in f64 (integer `mean`).
#[inline]
fn sum_row_f64<T: Native>(data: &[T], start: isize, len: usize, stride: isize) -> f64 {
    let mut acc = 0.0;
    for i in 0..len as isize {
        acc += data[(start + i * stride) as usize].to_f64();
    }
    acc
}

fn reduction(
    x: NDArray,
    op: Red,
    axes: Option<&[isize]>,
    keep_dims: bool,
    at: SourceLocation,
) -> Result<NDArray> {
    let name = op.name();
    let id = engine::run_op_on(name, &[x.id], at, |o| {
        let a = &o[0];
        let axes = normalize_axes(name, a, axes)?;
        let shape = reduced_shape(a.shape(), &axes, keep_dims);
        let count: usize = axes.iter().map(|&d| a.shape().dims()[d]).product();
        let dtype = a.dtype;
        match op {
            Red::Sum | Red::Mean | Red::Prod if dtype == DType::Bool => {
                return Err(engine::unsupported(name, a));
            }
            Red::Max | Red::Min if count == 0 && shape.size() > 0 => {
                return Err(NdError::invalid(
                    name,
                    format!("zero-size array to reduction operation {name} which has no identity"),
                ));
            }
            _ => {}
        }
        #[cfg(feature = "gpu")]
        if let Some(ga) = a.gpu() {
            use crate::backend::wgpu::reduce::{Reduce, reduce};
            let kind = match op {
                Red::Sum => Reduce::Sum,
                Red::Mean => Reduce::Mean,
                Red::Max => Reduce::Max,
                Red::Min => Reduce::Min,
                Red::Prod => Reduce::Prod,
            };
            let (buf, dtype) = reduce(name, kind, ga, &axes)?;
            return Ok(Output::device(buf, shape, dtype));
        }
        let (buf, dtype) = match op {
            Red::Sum => dispatch!(dtype, T => {
                let v = fold::<T, T>(a, &axes, T::ZERO, |acc, d, s, n, st| {
                    acc.add(cpu::sum_row(d, s, n, st))
                }, |acc, x| acc.add(x));
                (to_buffer(&v)?, dtype)
            }),
            Red::Prod => dispatch!(dtype, T => {
                let v = fold::<T, T>(a, &axes, T::ONE, |acc, d, s, n, st| {
                    acc.mul(fold_row(d, s, n, st, T::ONE, |p, q| p.mul(q)))
                }, |acc, x| acc.mul(x));
                (to_buffer(&v)?, dtype)
            }),
            Red::Max => dispatch!(dtype, T => {
                let v = fold::<T, T>(a, &axes, T::LOWEST, |acc, d, s, n, st| {
                    acc.max_of(fold_row(d, s, n, st, T::LOWEST, |p, q| p.max_of(q)))
                }, |acc, x| acc.max_of(x));
                (to_buffer(&v)?, dtype)
            }),
            Red::Min => dispatch!(dtype, T => {
                let v = fold::<T, T>(a, &axes, T::HIGHEST, |acc, d, s, n, st| {
                    acc.min_of(fold_row(d, s, n, st, T::HIGHEST, |p, q| p.min_of(q)))
                }, |acc, x| acc.min_of(x));
                (to_buffer(&v)?, dtype)
            }),
            Red::Mean if dtype.is_float() => dispatch!(dtype, T => {
                let inv = T::from_f64(count as f64);
                let v: cpu::Accs<T> = fold::<T, T>(a, &axes, T::ZERO, |acc, d, s, n, st| {
                    acc.add(cpu::sum_row(d, s, n, st))
                }, |acc, x| acc.add(x))
                .into_iter()
                .map(|s| s.div(inv))
                .collect();
                (to_buffer(&v)?, dtype)
            }),
            Red::Mean => dispatch!(dtype, T => {
                let v: cpu::Accs<f64> = fold::<T, f64>(a, &axes, 0.0, |acc, d, s, n, st| {
                    acc + sum_row_f64(d, s, n, st)
                }, |acc, x| acc + x.to_f64())
                .into_iter()
                .map(|s| s / count as f64)
                .collect();
                (to_buffer(&v)?, DType::F64)
            }),
        };
        Ok(Output::New { buf, shape, dtype })
    })?;
    autograd::record(&[x.id], id, || ReduceRule {
        kind: op,
        axes: axes.map(SmallVec::from_slice),
    });
    Ok(NDArray { id })
}

/// Running state of an arg-reduction: best value, its index, elements seen.
#[derive(Clone, Copy)]
struct ArgAcc<T> {
    best: T,
    index: i64,
    seen: i64,
}

fn arg_reduction(
    x: NDArray,
    is_max: bool,
    axis: Option<isize>,
    keep_dims: bool,
    at: SourceLocation,
) -> Result<NDArray> {
    let name = if is_max { "argmax" } else { "argmin" };
    let id = engine::run_op_on(name, &[x.id], at, |o| {
        let a = &o[0];
        let axes: Axes = match axis {
            Some(axis) => std::iter::once(normalize_axis(name, a, axis)?).collect(),
            None => (0..a.shape().ndim()).collect(),
        };
        let shape = reduced_shape(a.shape(), &axes, keep_dims);
        let count: usize = axes.iter().map(|&d| a.shape().dims()[d]).product();
        if count == 0 && shape.size() > 0 {
            return Err(NdError::invalid(
                name,
                "attempt to get the index of an extreme of an empty sequence",
            ));
        }
        #[cfg(feature = "gpu")]
        if let Some(ga) = a.gpu() {
            let buf = crate::backend::wgpu::reduce::arg_reduce(name, is_max, ga, &axes)?;
            return Ok(Output::device(buf, shape, DType::I64));
        }
        let v: Vec<i64> = dispatch!(a.dtype, T => {
            let init = ArgAcc { best: T::ZERO, index: -1, seen: 0 };
            cpu::reduce::<T, ArgAcc<T>>(a, &axes, init, |mut acc, d, s, n, st| {
                for i in 0..n as isize {
                    let v = d[(s + i * st) as usize];
                    // The first NaN wins (as in numpy); among equal values the first.
                    let better = acc.index < 0
                        || (!acc.best.is_nan()
                            && (v.is_nan() || if is_max { v > acc.best } else { v < acc.best }));
                    if better {
                        acc.best = v;
                        acc.index = acc.seen + i as i64;
                    }
                }
                acc.seen += n as i64;
                acc
            })
            .into_iter()
            .map(|acc| acc.index)
            .collect()
        });
        Ok(Output::New {
            buf: to_buffer(&v)?,
            shape,
            dtype: DType::I64,
        })
    })?;
    Ok(NDArray { id })
}

macro_rules! reduce_methods {
    ($($(#[$doc:meta])* $name:ident, $try_name:ident, $axes_name:ident, $try_axes_name:ident,
       $op:expr;)*) => {
        impl NDArray {
            $(
                $(#[$doc])*
                /// Over all elements: gives a 0-d array. Panics with the error's message
                /// on failure (see the `try_` form).
                #[track_caller]
                pub fn $name(self) -> NDArray {
                    unwrap(reduction(self, $op, None, false, Location::caller()))
                }

                $(#[$doc])*
                /// Over all elements: gives a 0-d array.
                ///
                /// Errors: `Closed`, `UnsupportedDType`, `InvalidArgument` (an empty `max`
                /// or `min`), `ManagerClosed`/`ManagerCapped`.
                #[track_caller]
                pub fn $try_name(self) -> Result<NDArray> {
                    reduction(self, $op, None, false, Location::caller())
                }

                $(#[$doc])*
                /// Over `axes` (negative counts from the end; `&[]` reduces nothing); with
                /// `keep_dims` the reduced axes stay as size 1. Panics with the error's
                /// message on failure.
                #[track_caller]
                pub fn $axes_name(self, axes: &[isize], keep_dims: bool) -> NDArray {
                    unwrap(reduction(self, $op, Some(axes), keep_dims, Location::caller()))
                }

                $(#[$doc])*
                /// Over `axes` (negative counts from the end); with `keep_dims` the reduced
                /// axes stay as size 1.
                ///
                /// Errors: `AxisOutOfRange`, `InvalidArgument` (a repeated axis, or an empty
                /// `max`/`min` reduction), `UnsupportedDType`, `Closed`.
                #[track_caller]
                pub fn $try_axes_name(self, axes: &[isize], keep_dims: bool) -> Result<NDArray> {
                    reduction(self, $op, Some(axes), keep_dims, Location::caller())
                }
            )*
        }
    };
}

reduce_methods! {
    /// Sum (same dtype; integers wrap; Bool is unsupported; empty gives 0). Pairwise
    /// summation for floats.
    sum, try_sum, sum_axes, try_sum_axes, Red::Sum;
    /// Arithmetic mean: float arrays keep their dtype, integer arrays give F64 (as
    /// numpy); Bool is unsupported; an empty mean is NaN.
    mean, try_mean, mean_axes, try_mean_axes, Red::Mean;
    /// Maximum (same dtype; NaN propagates); an empty reduction is an error.
    max, try_max, max_axes, try_max_axes, Red::Max;
    /// Minimum (same dtype; NaN propagates); an empty reduction is an error.
    min, try_min, min_axes, try_min_axes, Red::Min;
    /// Product (same dtype; integers wrap; Bool is unsupported; empty gives 1).
    /// Differentiable: the gradient of each element is the product of the others,
    /// exact when elements are zero (as PyTorch).
    prod, try_prod, prod_axes, try_prod_axes, Red::Prod;
}

impl NDArray {
    twins! {
        /// Index of the largest element in the flattened (row-major) array as an I64 0-d
        /// array; ties give the first index, a NaN wins over numbers. Panics on failure.
        pub fn argmax,
        /// [`NDArray::argmax`]. Errors: `Closed`, `InvalidArgument` (empty array).
        /// Not differentiable: an integer result.
        pub fn try_argmax(self) -> NDArray {
            arg_reduction(self, true, None, false, Location::caller())
        }
    }

    twins! {
        /// Index of the smallest element in the flattened (row-major) array as an I64 0-d
        /// array; ties give the first index, a NaN wins over numbers. Panics on failure.
        pub fn argmin,
        /// [`NDArray::argmin`]. Errors: `Closed`, `InvalidArgument` (empty array).
        /// Not differentiable: an integer result.
        pub fn try_argmin(self) -> NDArray {
            arg_reduction(self, false, None, false, Location::caller())
        }
    }

    twins! {
        /// Indices (I64) of the largest elements along `axis` (negative counts from the
        /// end); with `keep_dims` the axis stays as size 1. Ties give the first index.
        /// Panics on failure.
        pub fn argmax_axis,
        /// [`NDArray::argmax_axis`]. Errors: `Closed`, `AxisOutOfRange`, `InvalidArgument`
        /// (the axis is empty while other axes are not).
        /// Not differentiable: an integer result.
        pub fn try_argmax_axis(self, axis: isize, keep_dims: bool) -> NDArray {
            arg_reduction(self, true, Some(axis), keep_dims, Location::caller())
        }
    }

    twins! {
        /// Indices (I64) of the smallest elements along `axis` (negative counts from the
        /// end); with `keep_dims` the axis stays as size 1. Ties give the first index.
        /// Panics on failure.
        pub fn argmin_axis,
        /// [`NDArray::argmin_axis`]. Errors: `Closed`, `AxisOutOfRange`, `InvalidArgument`
        /// (the axis is empty while other axes are not).
        /// Not differentiable: an integer result.
        pub fn try_argmin_axis(self, axis: isize, keep_dims: bool) -> NDArray {
            arg_reduction(self, false, Some(axis), keep_dims, Location::caller())
        }
    }
}

/// Reduce `a` over `axes`: `row` folds one strided lane into an output's accumulator,
/// or, when the reduced axes are outer to a kept contiguous one
/// ([`cpu::prefers_outer`], e.g. `sum_axes(&[0])` of a row-major matrix), `elem`
/// folds single elements while the input streams by in memory order.
fn fold<T: Native, A: Copy + Send + Sync>(
    a: &Operand<'_>,
    axes: &[usize],
    init: A,
    row: impl Fn(A, &[T], isize, usize, isize) -> A + Sync,
    elem: impl Fn(A, T) -> A + Sync,
) -> cpu::Accs<A> {
    if cpu::prefers_outer(a.layout, axes) {
        cpu::Accs::from_vec(cpu::reduce_outer::<T, A>(a, axes, init, elem))
    } else {
        cpu::reduce::<T, A>(a, axes, init, row)
    }
}

/// The gradient of `sum`/`mean`/`max`/`min`/`prod` over `axes` (`None`: all): `sum`
/// and `mean` spread the gradient (lazily: all ones stay all ones), `max`/`min` share it
/// among ties, `prod` multiplies by the product of the other elements.
struct ReduceRule {
    kind: Red,
    axes: Option<SmallVec<[isize; 4]>>,
}

impl Backward for ReduceRule {
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    fn saves(&self, _: usize) -> (u8, bool) {
        match self.kind {
            Red::Sum | Red::Mean => (0, false),
            Red::Prod => (1, false),
            Red::Max | Red::Min => (1, true),
        }
    }

    fn backward_lazy(&self, cx: &BackwardCtx<'_>, g: LazyGrad) -> Result<LazyGrads> {
        if !matches!(self.kind, Red::Sum | Red::Mean) {
            return via_arrays(self, cx, g);
        }
        let xs = &cx.shapes[0];
        let (ks, count) = keep_dims_shape(xs, &self.axes);
        let scale = if self.kind == Red::Mean {
            g.scale / count as f64
        } else {
            g.scale
        };
        let base = match g.base {
            Base::Ones(_) => Base::Ones(xs.clone()),
            Base::Arr(b) => Base::Arr(b.try_reshape(ks)?.try_broadcast_to(xs.clone())?),
            Base::Unreduced(..) => unreachable!("settled"),
        };
        Ok([Some(LazyGrad { base, scale })].into_iter().collect())
    }

    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let (x, out, axes) = (cx.input(0), cx.output, &self.axes);
        let xs = &cx.shapes[0];
        let (ks, count) = keep_dims_shape(xs, axes);
        let gk = g.try_reshape(ks.clone())?;
        let gx = match self.kind {
            Red::Sum => gk.try_broadcast_to(xs.clone())?,
            Red::Mean => gk.try_div(count as f64)?.try_broadcast_to(xs.clone())?,
            Red::Max | Red::Min => {
                // Ties share the gradient equally.
                let mask = x.try_eq(out.try_reshape(ks)?)?;
                let ones = mask.try_to_dtype(g.try_dtype()?)?;
                let n = ones.try_sum_axes(&axes_all(axes, xs.ndim()), true)?;
                ones.try_mul(gk.try_div(n)?)?
            }
            Red::Prod => gk.try_mul(prod_others(x, axes, &ks)?)?,
        };
        Ok([Some(gx)].into_iter().collect())
    }
}

/// For each element of `x`, the product of the other elements of its reduction group
/// (`axes`; `ks` is the reduced shape with kept dims). Exact with zeros, as PyTorch:
/// with no zero in a group it is `prod / x`; with one zero, the zero element gets the
/// product of the nonzero ones and the others 0; with two or more zeros, all 0.
fn prod_others(x: NDArray, axes: &Option<SmallVec<[isize; 4]>>, ks: &Shape) -> Result<NDArray> {
    let nd = x.try_shape()?.ndim();
    let axes = axes_all(axes, nd);
    let dtype = x.try_dtype()?;
    let one = full_beside(x, Shape(Dims::new()), 1.0)?;
    let zero = full_beside(x, Shape(Dims::new()), 0.0)?;
    let is_zero = x.try_eq(0.0)?;
    let zeros = is_zero.try_to_dtype(dtype)?.try_sum_axes(&axes, true)?;
    let safe = is_zero.try_where_(one, x)?;
    let p = safe.try_prod_axes(&axes, true)?;
    debug_assert_eq!(p.try_shape()?, *ks);
    let at_zero = zeros.try_eq(1.0)?.try_where_(p, zero)?;
    let elsewhere = zeros.try_eq(0.0)?.try_where_(p.try_div(safe)?, zero)?;
    is_zero.try_where_(at_zero, elsewhere)
}

fn axes_all(axes: &Option<SmallVec<[isize; 4]>>, nd: usize) -> SmallVec<[isize; 4]> {
    axes.clone().unwrap_or_else(|| (0..nd as isize).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NDManager;

    /// A full reduction of a contiguous array is one contiguous row: `sum_row` then
    /// takes its pairwise, 8-lane, rayon-split path over the whole buffer.
    #[test]
    fn full_contiguous_reduction_is_one_row() {
        let m = NDManager::new();
        let data: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let a = m.create(&data, [2, 3, 4]);
        let rows = engine::read(a.id, |o| {
            let mut rows = Vec::new();
            let rows_ref = std::sync::Mutex::new(&mut rows);
            let s = cpu::reduce::<f32, f32>(o, &[0, 1, 2], 0.0, |acc, d, s, n, st| {
                rows_ref.lock().unwrap().push((s, n, st));
                acc + cpu::sum_row(d, s, n, st)
            });
            assert_eq!(s.as_slice(), &[276.0]);
            rows
        })
        .unwrap();
        assert_eq!(rows, vec![(0, 24, 1)]);
        m.close();
    }
}
