//! Neural-network helpers: `softmax`, `log_softmax`, `one_hot`, `clip` and `where_`.
//! Each is one kernel pass (or two over a lane) into a fresh contiguous result, never a
//! chain of temporary arrays. Every op has a `try_*` form and a panicking form.

use super::NDArray;
use super::ops::{broadcast_shape, same_dtype};
use super::reduce::normalize_axis;
use crate::DType;
use crate::autograd::{self, Backward, BackwardCtx, Grads, Rule};
use crate::dtype::{Float, Native, dispatch, dispatch_float};
use crate::engine::layout::{Strides, for_each_row};
use crate::engine::storage::new_filled;
use crate::engine::{self, Buffer, Operand, Output, kernels};
use crate::error::{NdError, Result, SourceLocation, unwrap};
use crate::shape::{Dims, Shape};
use rayon::prelude::*;
use smallvec::smallvec;
use std::panic::Location;

/// Element counts above which contiguous softmax rows are split across threads.
const PARALLEL_ELEMS: usize = 1 << 18;

/// Softmax (or log-softmax) of one lane: `src[s0 + i*ss]` into `dst[d0 + i*ds]`.
#[inline]
#[allow(clippy::too_many_arguments)]
fn softmax_lane<T: Float>(
    src: &[T],
    s0: isize,
    ss: isize,
    dst: &mut [T],
    d0: usize,
    ds: usize,
    len: usize,
    log: bool,
) {
    let x = |i: usize| src[(s0 + i as isize * ss) as usize];
    let mut mx = T::LOWEST;
    for i in 0..len {
        mx = mx.max_of(x(i));
    }
    let mut sum = T::ZERO;
    for i in 0..len {
        let e = x(i).sub(mx).exp();
        sum = sum.add(e);
        if !log {
            dst[d0 + i * ds] = e;
        }
    }
    if log {
        // (x - max) first: exact for nearby values, so large inputs lose no precision.
        let lse = sum.ln();
        for i in 0..len {
            dst[d0 + i * ds] = x(i).sub(mx).sub(lse);
        }
    } else {
        let inv = T::ONE.div(sum);
        for i in 0..len {
            let o = &mut dst[d0 + i * ds];
            *o = o.mul(inv);
        }
    }
}

fn softmax_kernel<T: Float>(a: &Operand<'_>, axis: usize, log: bool) -> Result<Buffer> {
    let l = a.layout;
    let src = a.data::<T>();
    let n = l.size();
    let dims = l.shape.dims();
    let len = dims[axis];
    new_filled::<T>(n, |out| {
        if len == 0 || n == 0 {
            return;
        }
        if axis == dims.len() - 1 && l.is_contiguous() {
            // Contiguous rows: independent, so large inputs run on several threads.
            let src = &src[l.offset..l.offset + n];
            let row = |(o, s): (&mut [T], &[T])| softmax_lane(s, 0, 1, o, 0, 1, len, log);
            if n >= PARALLEL_ELEMS {
                out.par_chunks_mut(len)
                    .zip(src.par_chunks(len))
                    .for_each(row);
            } else {
                out.chunks_mut(len).zip(src.chunks(len)).for_each(row);
            }
            return;
        }
        let out_strides = l.shape.contiguous_strides();
        let (mut outer, mut si, mut so) = (Dims::new(), Strides::new(), Strides::new());
        for d in (0..dims.len()).filter(|&d| d != axis) {
            outer.push(dims[d]);
            si.push(l.strides[d]);
            so.push(out_strides[d]);
        }
        let (ss, ds) = (l.strides[axis], out_strides[axis] as usize);
        for_each_row(&outer, [&si, &so], [l.offset, 0], |off, rows, s| {
            for r in 0..rows as isize {
                let (s0, d0) = (off[0] + r * s[0], (off[1] + r * s[1]) as usize);
                softmax_lane(src, s0, ss, out, d0, ds, len, log);
            }
        });
    })
}

fn softmax_impl(x: NDArray, axis: isize, log: bool, at: SourceLocation) -> Result<NDArray> {
    let name = if log { "log_softmax" } else { "softmax" };
    let id = engine::run_op(name, &[x.id], at, |o| {
        let a = &o[0];
        let axis = normalize_axis(name, a, axis)?;
        let buf = dispatch_float!(a.dtype, T => softmax_kernel::<T>(a, axis, log)?,
            else return Err(kernels::unsupported(name, a)));
        Ok(Output::New {
            buf,
            shape: a.shape().clone(),
            dtype: a.dtype,
        })
    })?;
    autograd::record_custom(&[x.id], id, || SoftmaxRule { axis, log });
    Ok(NDArray { id })
}

fn one_hot_impl(x: NDArray, depth: usize, dtype: DType, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "one_hot";
    let id = engine::run_op(OP, &[x.id], at, |o| {
        let a = &o[0];
        if a.dtype.is_float() || a.dtype == DType::Bool {
            return Err(kernels::unsupported(OP, a));
        }
        let mut dims = a.shape().0.clone();
        dims.push(depth);
        let shape = Shape(dims);
        let total = shape.checked_size().ok_or_else(|| {
            NdError::shape(OP, format!("the result shape {shape} overflows usize"))
        })?;
        let indices: Vec<i64> = dispatch!(a.dtype, T => kernels::to_vec::<T>(a)
            .into_iter()
            .map(|v| v.to_i64())
            .collect());
        if let Some(&bad) = indices.iter().find(|&&i| i < 0 || i as u64 >= depth as u64) {
            return Err(NdError::Index {
                op: OP,
                msg: format!("class index {bad} is out of range for depth {depth}"),
                array: a.desc(),
            });
        }
        let buf = dispatch!(dtype, T => new_filled::<T>(total, |out| {
            for (row, &i) in indices.iter().enumerate() {
                out[row * depth + i as usize] = T::ONE;
            }
        })?);
        Ok(Output::New { buf, shape, dtype })
    })?;
    Ok(NDArray { id })
}

fn clip_impl(x: NDArray, min: f64, max: f64, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "clip";
    let id = engine::run_op(OP, &[x.id], at, |o| {
        let a = &o[0];
        if a.dtype == DType::Bool {
            return Err(kernels::unsupported(OP, a));
        }
        if min.is_nan() || max.is_nan() || min > max {
            return Err(NdError::invalid(
                OP,
                format!("invalid bounds [{min}, {max}]: need min <= max"),
            ));
        }
        // Integer arrays: round the bounds inward (then cast, saturating).
        let (lo, hi) = if a.dtype.is_float() {
            (min, max)
        } else {
            (min.ceil(), max.floor())
        };
        if lo > hi {
            return Err(NdError::invalid(
                OP,
                format!("no {} value lies in [{min}, {max}]", a.dtype),
            ));
        }
        let buf = dispatch!(a.dtype, T => {
            let (lo, hi) = (T::from_f64(lo), T::from_f64(hi));
            kernels::map_unary::<T, T>(a, move |v| v.max_of(lo).min_of(hi))?
        });
        Ok(Output::New {
            buf,
            shape: a.shape().clone(),
            dtype: a.dtype,
        })
    })?;
    autograd::record_custom(&[x.id], id, || ClipRule { min, max });
    Ok(NDArray { id })
}

/// `softmax`/`log_softmax`'s gradient, from the output `y` alone:
/// softmax `y * (g - sum(g * y))`, log-softmax `g - exp(y) * sum(g)` (sums along `axis`).
struct SoftmaxRule {
    axis: isize,
    log: bool,
}

impl Backward for SoftmaxRule {
    fn name(&self) -> &'static str {
        if self.log { "log_softmax" } else { "softmax" }
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, true)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let (y, axes) = (cx.output, [self.axis]);
        Ok(smallvec![Some(if self.log {
            g.try_sub(y.try_exp()?.try_mul(g.try_sum_axes(&axes, true)?)?)?
        } else {
            y.try_mul(g.try_sub(g.try_mul(y)?.try_sum_axes(&axes, true)?)?)?
        })])
    }
}

/// `clip`'s gradient: `g` where `min <= x <= max`, else 0.
struct ClipRule {
    min: f64,
    max: f64,
}

impl Backward for ClipRule {
    fn name(&self) -> &'static str {
        "clip"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (1, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let x = cx.inputs[0];
        let zero = g.try_manager()?.try_zeros([], g.try_dtype()?)?;
        let below_max = x.try_le(self.max)?.try_where_(g, zero)?;
        Ok(smallvec![Some(
            x.try_ge(self.min)?.try_where_(below_max, zero)?
        )])
    }
}

/// `out = cond ? x : y` with broadcasting, into a new contiguous buffer of `shape`.
fn select<T: Native>(
    c: &Operand<'_>,
    x: &Operand<'_>,
    y: &Operand<'_>,
    shape: &Shape,
) -> Result<Buffer> {
    let (dc, dx, dy) = (c.data::<u8>(), x.data::<T>(), y.data::<T>());
    let os = shape.contiguous_strides();
    let (sc, sx, sy) = (
        c.layout.broadcast_strides(shape),
        x.layout.broadcast_strides(shape),
        y.layout.broadcast_strides(shape),
    );
    new_filled::<T>(shape.size(), |out| {
        for_each_row(
            shape.dims(),
            [&os, &sc, &sx, &sy],
            [0, c.layout.offset, x.layout.offset, y.layout.offset],
            |off, len, s| {
                let dst = &mut out[off[0] as usize..off[0] as usize + len];
                if s[1..] == [1, 1, 1] {
                    let (oc, ox, oy) = (off[1] as usize, off[2] as usize, off[3] as usize);
                    let it = dc[oc..oc + len]
                        .iter()
                        .zip(&dx[ox..ox + len])
                        .zip(&dy[oy..oy + len]);
                    for (o, ((&k, &p), &q)) in dst.iter_mut().zip(it) {
                        *o = if k != 0 { p } else { q };
                    }
                } else {
                    for (i, o) in dst.iter_mut().enumerate() {
                        let i = i as isize;
                        let at = |k: usize| (off[k] + i * s[k]) as usize;
                        *o = if dc[at(1)] != 0 { dx[at(2)] } else { dy[at(3)] };
                    }
                }
            },
        );
    })
}

fn where_impl(cond: NDArray, x: NDArray, y: NDArray, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "where";
    let id = engine::run_op(OP, &[cond.id, x.id, y.id], at, |o| {
        let (c, a, b) = (&o[0], &o[1], &o[2]);
        if c.dtype != DType::Bool {
            return Err(kernels::unsupported(OP, c));
        }
        same_dtype(OP, a, b)?;
        let xy = broadcast_shape(OP, a, b)?;
        let shape = Shape::broadcast(c.shape(), &xy).ok_or_else(|| NdError::ShapeMismatch {
            op: OP,
            lhs: c.desc(),
            rhs: a.desc(),
        })?;
        let buf = dispatch!(a.dtype, T => select::<T>(c, a, b, &shape)?);
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    autograd::record(&[cond.id, x.id, y.id], id, || Rule::Where);
    Ok(NDArray { id })
}

impl NDArray {
    /// Softmax along `axis` (negative counts from the end): `exp(x - max) / sum(exp(x -
    /// max))`, stable for large inputs. Float dtypes only. Panics on failure.
    #[track_caller]
    pub fn softmax(self, axis: isize) -> NDArray {
        unwrap(softmax_impl(self, axis, false, Location::caller()))
    }

    /// [`NDArray::softmax`]. Errors: `UnsupportedDType` (not a float), `AxisOutOfRange`,
    /// `Closed`.
    #[track_caller]
    pub fn try_softmax(self, axis: isize) -> Result<NDArray> {
        softmax_impl(self, axis, false, Location::caller())
    }

    /// Log-softmax along `axis`: `x - max - ln(sum(exp(x - max)))`, finite for large
    /// inputs. Float dtypes only. Panics on failure.
    #[track_caller]
    pub fn log_softmax(self, axis: isize) -> NDArray {
        unwrap(softmax_impl(self, axis, true, Location::caller()))
    }

    /// [`NDArray::log_softmax`]. Errors: `UnsupportedDType` (not a float),
    /// `AxisOutOfRange`, `Closed`.
    #[track_caller]
    pub fn try_log_softmax(self, axis: isize) -> Result<NDArray> {
        softmax_impl(self, axis, true, Location::caller())
    }

    /// One-hot encoding of integer class indices: an array of `dtype` (any dtype; Bool
    /// gives `true`/`false`) with a new last axis of length `depth`, 1 at each index and
    /// 0 elsewhere (PyTorch's `one_hot` always returns int64; here the caller picks).
    /// Not differentiable (integer input). Panics on failure.
    ///
    /// ```
    /// use ndscope::{DType, NDManager};
    /// let m = NDManager::new();
    /// let y = m.create(&[2i64, 0], [2]).one_hot(3, DType::F32);
    /// assert_eq!(y.to_vec::<f32>()?, vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
    /// # m.close();
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn one_hot(self, depth: usize, dtype: DType) -> NDArray {
        unwrap(one_hot_impl(self, depth, dtype, Location::caller()))
    }

    /// [`NDArray::one_hot`]. Errors: `Index` (an index is negative or `>= depth`),
    /// `UnsupportedDType` (float or Bool input), `InvalidShape`, `Closed`.
    #[track_caller]
    pub fn try_one_hot(self, depth: usize, dtype: DType) -> Result<NDArray> {
        one_hot_impl(self, depth, dtype, Location::caller())
    }

    /// Limit every element to `[min, max]` (same dtype; NaN stays NaN; for integer
    /// arrays the bounds are rounded inward). Panics on failure.
    #[track_caller]
    pub fn clip(self, min: f64, max: f64) -> NDArray {
        unwrap(clip_impl(self, min, max, Location::caller()))
    }

    /// [`NDArray::clip`]. Errors: `InvalidArgument` (`min > max`, a NaN bound, or no
    /// integer between them for an integer array), `UnsupportedDType` (Bool), `Closed`.
    #[track_caller]
    pub fn try_clip(self, min: f64, max: f64) -> Result<NDArray> {
        clip_impl(self, min, max, Location::caller())
    }

    /// Elementwise select: `x` where `self` (a Bool condition) is true, else `y`. The
    /// three arrays broadcast together; `x` and `y` must have the same dtype, which the
    /// result keeps. Panics on failure.
    ///
    /// ```
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let x = m.create(&[1.0f32, -2.0, 3.0], [3]);
    /// let y = m.create(&[0.0f32], [1]);
    /// assert_eq!(x.gt(0.0).where_(x, y).to_vec::<f32>()?, vec![1.0, 0.0, 3.0]);
    /// # m.close();
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn where_(self, x: NDArray, y: NDArray) -> NDArray {
        unwrap(where_impl(self, x, y, Location::caller()))
    }

    /// [`NDArray::where_`]. Errors: `UnsupportedDType` (condition not Bool),
    /// `DTypeMismatch` (`x` and `y`), `ShapeMismatch` (not broadcastable), `Closed`.
    #[track_caller]
    pub fn try_where_(self, x: NDArray, y: NDArray) -> Result<NDArray> {
        where_impl(self, x, y, Location::caller())
    }
}
