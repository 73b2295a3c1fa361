//! Neural-network helpers: `softmax`, `log_softmax`, `one_hot`, `clip`, `where_`, the
//! normalisations (`layer_norm`, `batch_norm`), `embedding` and the losses
//! (`cross_entropy`, `mse_loss`, `binary_cross_entropy_with_logits`). Each is one fused
//! kernel pass into a fresh contiguous result, never a chain of temporary arrays, with
//! its gradient rule beside it. Every op has a `try_*` form and a panicking form.
//! Convolution and pooling live in `conv.rs`.

use super::NDArray;
use super::ops::{broadcast_shape, same_dtype};
use super::reduce::normalize_axis;
use crate::DType;
use crate::autograd::{self, Backward, BackwardCtx, Grads, Rule};
use crate::backend::cpu;
use crate::backend::cpu::{new_filled, new_overwritten};
use crate::dtype::{Float, Native, dispatch, dispatch_float};
use crate::engine::{self, ArrayId, Buffer, Operand, Output};
use crate::error::{NdError, Result, SourceLocation, unwrap};
use crate::layout::{Strides, for_each_row};
use crate::shape::{Dims, Shape};
use rayon::prelude::*;
use smallvec::{SmallVec, smallvec};
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
            if n >= PARALLEL_ELEMS && cpu::may_fork() {
                cpu::fork(|| {
                    out.par_chunks_mut(len)
                        .zip(src.par_chunks(len))
                        .for_each(row)
                });
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
            else return Err(engine::unsupported(name, a)));
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
            return Err(engine::unsupported(OP, a));
        }
        let mut dims = a.shape().0.clone();
        dims.push(depth);
        let shape = Shape(dims);
        let total = shape.checked_size().ok_or_else(|| {
            NdError::shape(OP, format!("the result shape {shape} overflows usize"))
        })?;
        let indices: Vec<i64> = dispatch!(a.dtype, T => cpu::to_vec::<T>(a)
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
            return Err(engine::unsupported(OP, a));
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
            cpu::map_unary::<T, T>(a, move |v| v.max_of(lo).min_of(hi))?
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
            return Err(engine::unsupported(OP, c));
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
    /// Not differentiable: its input is integer labels.
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

// ---- arrays saved for backward ----

/// An array a gradient rule reads in backward that is neither an input nor the output
/// (batch statistics, argmax indices, a softmax). The op computes its buffer anyway;
/// it becomes an array only when a collector records (the rule is built only then),
/// the tape holds it ([`Backward::extra`]), and it is closed when the rule is dropped:
/// after `backward`, when the collector drops, or at once if the tape does not keep
/// the node. So it never shows up as a live array outside a recording.
pub(super) struct Saved(Option<NDArray>);

impl Saved {
    /// An array of `buf` in the manager of `like` (the op's result). If it cannot be
    /// created, `backward` reports it ([`Saved::get`]).
    pub(super) fn new(like: ArrayId, buf: Buffer, shape: Shape, dtype: DType) -> Saved {
        let at = Location::caller();
        let id = engine::manager_of(like).and_then(|m| engine::create(m, buf, shape, dtype, at));
        Saved(id.ok().map(|id| NDArray { id }))
    }

    /// Its id, for [`Backward::extra`].
    pub(super) fn ids(&self) -> SmallVec<[ArrayId; 2]> {
        self.0.iter().map(|a| a.id).collect()
    }

    /// The array, or `InvalidArgument` if it could not be created.
    pub(super) fn get(&self, op: &'static str) -> Result<NDArray> {
        self.0.ok_or_else(|| {
            NdError::invalid(
                op,
                "the array saved for the gradient could not be created during the forward pass",
            )
        })
    }
}

impl Drop for Saved {
    fn drop(&mut self) {
        if let Some(a) = self.0 {
            engine::close_array(a.id, Location::caller());
        }
    }
}

/// A new buffer holding `v` converted to `T`.
fn buffer_of<T: Native>(v: &[f64]) -> Result<Buffer> {
    new_overwritten::<T>(v.len(), |o| {
        for (d, &s) in o.iter_mut().zip(v) {
            *d = T::from_f64(s);
        }
    })
}

/// `x` is F32/F64 (else `UnsupportedDType`) and each of `others` has its dtype (else
/// `DTypeMismatch`).
pub(super) fn float_operands(
    op: &'static str,
    x: &Operand<'_>,
    others: &[&Operand<'_>],
) -> Result<()> {
    if !x.dtype.is_float() {
        return Err(engine::unsupported(op, x));
    }
    for o in others {
        same_dtype(op, x, o)?;
    }
    Ok(())
}

/// Class ids / row ids of an integer operand as `i64` (float and Bool are
/// `UnsupportedDType`), each checked to lie in `0..limit` (else `Index`, naming `what`).
fn int_ids(op: &'static str, ids: &Operand<'_>, limit: usize, what: &str) -> Result<Vec<i64>> {
    if ids.dtype.is_float() || ids.dtype == DType::Bool {
        return Err(engine::unsupported(op, ids));
    }
    let v: Vec<i64> = dispatch!(ids.dtype, T => cpu::to_vec::<T>(ids)
        .into_iter()
        .map(|v| v.to_i64())
        .collect());
    if let Some(&bad) = v.iter().find(|&&i| i < 0 || i as u64 >= limit as u64) {
        return Err(NdError::Index {
            op,
            msg: format!("{what} {bad} is out of range 0..{limit}"),
            array: ids.desc(),
        });
    }
    Ok(v)
}

// ---- normalisation (layer_norm, batch_norm) ----

/// A per-element affine operand (`gamma`, `beta`) seen with one stride per axis of the
/// normalised array.
struct Affine<'a, T> {
    data: &'a [T],
    strides: Strides,
    offset: usize,
}

impl<'a, T: Native> Affine<'a, T> {
    /// `o` broadcast to `shape` (`channel`: `o` is `[C]` along axis 1 of `shape`).
    fn of(o: &'a Operand<'_>, shape: &Shape, channel: bool) -> Affine<'a, T> {
        let strides = if channel {
            let mut s = Strides::from_elem(0, shape.ndim());
            s[1] = o.layout.strides[0];
            s
        } else {
            o.layout.broadcast_strides(shape)
        };
        Affine {
            data: o.data::<T>(),
            strides,
            offset: o.layout.offset,
        }
    }

    /// The constant `v` everywhere.
    fn constant(v: &'a [T], ndim: usize) -> Affine<'a, T> {
        Affine {
            data: v,
            strides: Strides::from_elem(0, ndim),
            offset: 0,
        }
    }
}

/// Split `s` (one entry per axis) into the kept axes and the normalised ones.
fn split_axes(s: &[isize], red: &[bool]) -> (Strides, Strides) {
    let (mut kept, mut norm) = (Strides::new(), Strides::new());
    for (d, &v) in s.iter().enumerate() {
        if red[d] { norm.push(v) } else { kept.push(v) }
    }
    (kept, norm)
}

/// The normalisation kernel: for every group of elements that agree on the kept axes
/// (`!red`), `y = (x - mean) / sqrt(var + eps) * gamma + beta`, with the group's mean and
/// biased variance (f64 accumulation, two passes), or the `given` per-group statistics.
/// Returns `y` (contiguous, `x`'s shape) and the per-group mean and variance in
/// row-major order of the kept axes.
fn normalize_kernel<T: Float>(
    x: &Operand<'_>,
    red: &[bool],
    gamma: &Affine<'_, T>,
    beta: &Affine<'_, T>,
    eps: f64,
    given: Option<(Vec<f64>, Vec<f64>)>,
) -> Result<(Buffer, Vec<f64>, Vec<f64>)> {
    let l = x.layout;
    let dims = l.shape.dims();
    let xd = x.data::<T>();
    let ys = l.shape.contiguous_strides();
    let (kd, nd): (Dims, Dims) = {
        let (mut k, mut n) = (Dims::new(), Dims::new());
        for (d, &v) in dims.iter().enumerate() {
            if red[d] { n.push(v) } else { k.push(v) }
        }
        (k, n)
    };
    let m: usize = nd.iter().product();
    let (xk, xn) = split_axes(&l.strides, red);
    let (yk, yn) = split_axes(&ys, red);
    let (gk, gn) = split_axes(&gamma.strides, red);
    let (bk, bn) = split_axes(&beta.strides, red);
    let groups: usize = kd.iter().product();
    let (mut means, mut vars) = match given {
        Some((mm, vv)) => (mm, vv),
        None => (Vec::with_capacity(groups), Vec::with_capacity(groups)),
    };
    let compute = means.is_empty() && groups > 0;
    let buf = new_overwritten::<T>(l.size(), |out| {
        if l.size() == 0 && !compute {
            return;
        }
        let mut gi = 0usize;
        for_each_row(
            &kd,
            [&xk, &yk, &gk, &bk],
            [l.offset, 0, gamma.offset, beta.offset],
            |off, len, s| {
                for r in 0..len as isize {
                    let o: [usize; 4] = std::array::from_fn(|k| (off[k] + r * s[k]) as usize);
                    let (mean, var) = if compute {
                        let mut sum = 0.0;
                        for_each_row(&nd, [&xn], [o[0]], |p, n, st| {
                            for i in 0..n as isize {
                                sum += xd[(p[0] + i * st[0]) as usize].to_f64();
                            }
                        });
                        let mean = sum / m as f64;
                        let mut sq = 0.0;
                        for_each_row(&nd, [&xn], [o[0]], |p, n, st| {
                            for i in 0..n as isize {
                                let d = xd[(p[0] + i * st[0]) as usize].to_f64() - mean;
                                sq += d * d;
                            }
                        });
                        let var = sq / m as f64;
                        means.push(mean);
                        vars.push(var);
                        (mean, var)
                    } else {
                        (means[gi], vars[gi])
                    };
                    gi += 1;
                    let (mu, rstd) = (T::from_f64(mean), T::from_f64(1.0 / (var + eps).sqrt()));
                    for_each_row(&nd, [&xn, &yn, &gn, &bn], o, |p, n, st| {
                        for i in 0..n as isize {
                            let at = |k: usize| (p[k] + i * st[k]) as usize;
                            let v = xd[at(0)].sub(mu).mul(rstd);
                            out[at(1)] = v.mul(gamma.data[at(2)]).add(beta.data[at(3)]);
                        }
                    });
                }
            },
        );
    })?;
    Ok((buf, means, vars))
}

/// `(x - mean) * rstd` from the saved statistics.
fn x_hat(x: NDArray, mean: NDArray, rstd: NDArray) -> Result<NDArray> {
    x.try_sub(mean)?.try_mul(rstd)
}

/// The gradient of `layer_norm` and `batch_norm`. Inputs: `x`, then `gamma` and `beta`
/// where given. With batch statistics (`layer_norm`, `batch_norm` in training),
/// `dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))` with
/// `dxhat = g * gamma` and means over the normalised axes; with fixed statistics
/// (`batch_norm` in inference) `dx = g * gamma * rstd`. `dgamma = g * xhat` and
/// `dbeta = g`, summed over the normalised axes (`batch_norm`) or reduced to their
/// shape by the tape (`layer_norm`).
struct NormRule {
    op: &'static str,
    /// The normalised axes.
    axes: SmallVec<[isize; 4]>,
    /// `batch_norm`: gamma `[C]` is reshaped to this (`[C, 1, ...]`) to broadcast, and
    /// its gradient summed over `axes`.
    channel: Option<Shape>,
    /// The statistics were computed from this batch (not given).
    batch_stats: bool,
    has_gamma: bool,
    has_beta: bool,
    mean: Saved,
    rstd: Saved,
}

impl Backward for NormRule {
    fn name(&self) -> &'static str {
        self.op
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (if self.has_gamma { 0b11 } else { 0b01 }, false)
    }
    fn extra(&self) -> SmallVec<[ArrayId; 2]> {
        let mut v = self.mean.ids();
        v.extend(self.rstd.ids());
        v
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let (x, mean, rstd) = (
            cx.inputs[0],
            self.mean.get(self.op)?,
            self.rstd.get(self.op)?,
        );
        let gamma = match (self.has_gamma, &self.channel) {
            (false, _) => None,
            (true, None) => Some(cx.inputs[1]),
            (true, Some(shape)) => Some(cx.inputs[1].try_reshape(shape.clone())?),
        };
        let axes = &self.axes[..];
        let xhat = x_hat(x, mean, rstd)?;
        let mut grads: Grads = smallvec![None];
        if cx.need(0) {
            let dxhat = match gamma {
                Some(gm) => g.try_mul(gm)?,
                None => g,
            };
            grads[0] = Some(if self.batch_stats {
                let m1 = dxhat.try_mean_axes(axes, true)?;
                let m2 = dxhat.try_mul(xhat)?.try_mean_axes(axes, true)?;
                dxhat
                    .try_sub(m1)?
                    .try_sub(xhat.try_mul(m2)?)?
                    .try_mul(rstd)?
            } else {
                dxhat.try_mul(rstd)?
            });
        }
        let reduce = |v: NDArray| -> Result<NDArray> {
            if self.channel.is_some() {
                v.try_sum_axes(axes, false)
            } else {
                Ok(v)
            }
        };
        if self.has_gamma {
            grads.push(if cx.need(1) {
                Some(reduce(g.try_mul(xhat)?)?)
            } else {
                None
            });
        }
        if self.has_beta {
            let i = 1 + self.has_gamma as usize;
            grads.push(if cx.need(i) { Some(reduce(g)?) } else { None });
        }
        Ok(grads)
    }
}

/// `eps` must be finite and non-negative.
fn check_eps(op: &'static str, eps: f64) -> Result<()> {
    if !(eps >= 0.0 && eps.is_finite()) {
        return Err(NdError::invalid(
            op,
            format!("eps = {eps} must be finite and non-negative"),
        ));
    }
    Ok(())
}

fn layer_norm_impl(
    x: NDArray,
    axes: &[isize],
    gamma: Option<NDArray>,
    beta: Option<NDArray>,
    eps: f64,
    at: SourceLocation,
) -> Result<NDArray> {
    const OP: &str = "layer_norm";
    check_eps(OP, eps)?;
    let mut ids: SmallVec<[ArrayId; 3]> = smallvec![x.id];
    ids.extend(gamma.map(|a| a.id));
    ids.extend(beta.map(|a| a.id));
    let mut saved = None;
    let id = engine::run_op(OP, &ids, at, |o| {
        let a = &o[0];
        let (go, bo) = (
            gamma.map(|_| &o[1]),
            beta.map(|_| &o[1 + gamma.is_some() as usize]),
        );
        let others: SmallVec<[&Operand<'_>; 2]> = go.iter().chain(bo.iter()).copied().collect();
        float_operands(OP, a, &others)?;
        let norm = super::reduce::normalize_axes(OP, a, Some(axes))?;
        if norm.is_empty() {
            return Err(NdError::invalid(OP, "no axes to normalise over"));
        }
        let shape = a.shape().clone();
        for p in &others {
            if Shape::broadcast(p.shape(), &shape).as_ref() != Some(&shape) {
                return Err(NdError::ShapeMismatch {
                    op: OP,
                    lhs: a.desc(),
                    rhs: p.desc(),
                });
            }
        }
        let red: SmallVec<[bool; 4]> = (0..shape.ndim()).map(|d| norm.contains(&d)).collect();
        let stats_shape = super::reduce::reduced_shape(&shape, &norm, true);
        let (buf, mean, var) = dispatch_float!(a.dtype, T => {
            let (one, zero) = ([T::ONE], [T::ZERO]);
            let gm = go.map_or_else(|| Affine::constant(&one, shape.ndim()), |p| Affine::of(p, &shape, false));
            let bt = bo.map_or_else(|| Affine::constant(&zero, shape.ndim()), |p| Affine::of(p, &shape, false));
            let (buf, mean, var) = normalize_kernel::<T>(a, &red, &gm, &bt, eps, None)?;
            let rstd: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
            (buf, buffer_of::<T>(&mean)?, buffer_of::<T>(&rstd)?)
        }, else return Err(engine::unsupported(OP, a)));
        saved = Some((mean, var, stats_shape, a.dtype));
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    if let Some((mean, rstd, stats_shape, dtype)) = saved {
        autograd::record_custom(&ids, id, || NormRule {
            op: OP,
            axes: axes.iter().copied().collect(),
            channel: None,
            batch_stats: true,
            has_gamma: gamma.is_some(),
            has_beta: beta.is_some(),
            mean: Saved::new(id, mean, stats_shape.clone(), dtype),
            rstd: Saved::new(id, rstd, stats_shape, dtype),
        });
    }
    Ok(NDArray { id })
}

#[allow(clippy::too_many_arguments)]
fn batch_norm_impl(
    x: NDArray,
    running_mean: NDArray,
    running_var: NDArray,
    gamma: Option<NDArray>,
    beta: Option<NDArray>,
    training: bool,
    momentum: f64,
    eps: f64,
    at: SourceLocation,
) -> Result<NDArray> {
    const OP: &str = "batch_norm";
    check_eps(OP, eps)?;
    if !momentum.is_finite() {
        return Err(NdError::invalid(
            OP,
            format!("momentum = {momentum} must be finite"),
        ));
    }
    if training {
        autograd::check_inplace(OP, running_mean.id)?;
        autograd::check_inplace(OP, running_var.id)?;
    }
    let mut ids: SmallVec<[ArrayId; 5]> = smallvec![x.id, running_mean.id, running_var.id];
    ids.extend(gamma.map(|a| a.id));
    ids.extend(beta.map(|a| a.id));
    let mut saved = None;
    let id = engine::run_op(OP, &ids, at, |o| {
        let (a, rm, rv) = (&o[0], &o[1], &o[2]);
        let (go, bo) = (
            gamma.map(|_| &o[3]),
            beta.map(|_| &o[3 + gamma.is_some() as usize]),
        );
        let mut others: SmallVec<[&Operand<'_>; 4]> = smallvec![rm, rv];
        others.extend(go.iter().chain(bo.iter()).copied());
        float_operands(OP, a, &others)?;
        let shape = a.shape().clone();
        let dims = shape.dims();
        if dims.len() < 2 {
            return Err(NdError::invalid(
                OP,
                format!(
                    "the input must be [N, C] or [N, C, ...] (channels on axis 1), got shape {shape}"
                ),
            ));
        }
        let c = dims[1];
        for p in &others {
            if p.shape().dims() != [c] {
                return Err(NdError::invalid(
                    OP,
                    format!(
                        "the running statistics, gamma and beta must have shape [{c}] (the \
                         channels of input shape {shape}), got shape {} ({})",
                        p.shape(),
                        p.desc()
                    ),
                ));
            }
        }
        let per_channel = shape.size() / c.max(1);
        if training && per_channel <= 1 && shape.size() > 0 {
            return Err(NdError::invalid(
                OP,
                format!(
                    "expected more than 1 value per channel when training, got input shape {shape}"
                ),
            ));
        }
        let red: SmallVec<[bool; 4]> = (0..dims.len()).map(|d| d != 1).collect();
        let given = (!training).then(|| {
            let read = |o: &Operand<'_>| -> Vec<f64> {
                dispatch_float!(o.dtype, T => cpu::to_vec::<T>(o).iter().map(|v| v.to_f64()).collect(), else Vec::new())
            };
            (read(rm), read(rv))
        });
        let mut stats_dims = Dims::from_elem(1, dims.len());
        stats_dims[1] = c;
        let (buf, mean, var) = dispatch_float!(a.dtype, T => {
            let (one, zero) = ([T::ONE], [T::ZERO]);
            let gm = go.map_or_else(|| Affine::constant(&one, dims.len()), |p| Affine::of(p, &shape, true));
            let bt = bo.map_or_else(|| Affine::constant(&zero, dims.len()), |p| Affine::of(p, &shape, true));
            normalize_kernel::<T>(a, &red, &gm, &bt, eps, given)?
        }, else return Err(engine::unsupported(OP, a)));
        let rstd: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
        let (mb, rb) = dispatch_float!(a.dtype, T => (buffer_of::<T>(&mean)?, buffer_of::<T>(&rstd)?),
            else unreachable!("checked above"));
        saved = Some((mb, rb, Shape(stats_dims), a.dtype, mean, var, per_channel));
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    let Some((mb, rb, stats_shape, dtype, mean, var, count)) = saved else {
        unreachable!("set by the op");
    };
    if training && count > 1 {
        // PyTorch's rule: running = (1 - momentum) * running + momentum * batch, with the
        // unbiased batch variance for running_var.
        let unbias = count as f64 / (count - 1) as f64;
        let update = |target: NDArray, batch: &[f64], scale: f64| {
            engine::run_inplace(target.id, &[], |mut t, _| {
                let (off, stride) = (t.layout.offset as isize, t.layout.strides[0]);
                dispatch_float!(t.dtype, T => {
                    let d = t.data_mut::<T>();
                    for (ch, &b) in batch.iter().enumerate() {
                        let e = &mut d[(off + ch as isize * stride) as usize];
                        *e = T::from_f64((1.0 - momentum) * e.to_f64() + momentum * b * scale);
                    }
                }, else unreachable!("checked by the op"));
                Ok(())
            })
        };
        if let Err(e) =
            update(running_mean, &mean, 1.0).and_then(|_| update(running_var, &var, unbias))
        {
            engine::close_array(id, at);
            return Err(e);
        }
    }
    let mut rec: SmallVec<[ArrayId; 3]> = smallvec![x.id];
    rec.extend(gamma.map(|a| a.id));
    rec.extend(beta.map(|a| a.id));
    let ndim = stats_shape.ndim();
    autograd::record_custom(&rec, id, || NormRule {
        op: OP,
        axes: (0..ndim as isize).filter(|&d| d != 1).collect(),
        channel: {
            let mut d = Dims::from_elem(1, ndim - 1);
            d[0] = stats_shape.dims()[1];
            Some(Shape(d))
        },
        batch_stats: training,
        has_gamma: gamma.is_some(),
        has_beta: beta.is_some(),
        mean: Saved::new(id, mb, stats_shape.clone(), dtype),
        rstd: Saved::new(id, rb, stats_shape, dtype),
    });
    Ok(NDArray { id })
}

// ---- embedding ----

fn embedding_impl(table: NDArray, ids: NDArray, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "embedding";
    let id = engine::run_op(OP, &[table.id, ids.id], at, |o| {
        let (t, i) = (&o[0], &o[1]);
        float_operands(OP, t, &[])?;
        let td = t.shape().dims();
        if td.len() != 2 {
            return Err(NdError::invalid(
                OP,
                format!("the table must be 2-D [V, D], got shape {}", t.shape()),
            ));
        }
        let (v, d) = (td[0], td[1]);
        let rows = int_ids(OP, i, v, "id")?;
        let mut dims = i.shape().0.clone();
        dims.push(d);
        let shape = Shape(dims);
        let total = shape.checked_size().ok_or_else(|| {
            NdError::shape(OP, format!("the result shape {shape} overflows usize"))
        })?;
        let (s0, s1, off) = (
            t.layout.strides[0],
            t.layout.strides[1],
            t.layout.offset as isize,
        );
        let buf = dispatch_float!(t.dtype, T => {
            let src = t.data::<T>();
            new_overwritten::<T>(total, |out| {
                for (row, &r) in out.chunks_mut(d.max(1)).zip(&rows) {
                    let base = off + r as isize * s0;
                    if s1 == 1 {
                        row.copy_from_slice(&src[base as usize..base as usize + d]);
                    } else {
                        for (j, e) in row.iter_mut().enumerate() {
                            *e = src[(base + j as isize * s1) as usize];
                        }
                    }
                }
            })?
        }, else unreachable!("checked above"));
        Ok(Output::New {
            buf,
            shape,
            dtype: t.dtype,
        })
    })?;
    autograd::record_custom(&[table.id, ids.id], id, || EmbeddingRule);
    Ok(NDArray { id })
}

/// `embedding`'s gradient: the output gradient's rows added into a zero `[V, D]` table
/// at their ids (repeated ids accumulate).
struct EmbeddingRule;

impl Backward for EmbeddingRule {
    fn name(&self) -> &'static str {
        "embedding"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0b10, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        if !cx.need(0) {
            return Ok(smallvec![None, None]);
        }
        const OP: &str = "embedding_grad";
        let shape = cx.shapes[0].clone();
        let (v, d) = (shape.dims()[0], shape.dims()[1]);
        let id = engine::run_op(OP, &[g.id, cx.inputs[1].id], Location::caller(), |o| {
            let rows = int_ids(OP, &o[1], v, "id")?;
            let buf = dispatch_float!(o[0].dtype, T => {
                let gd = cpu::to_vec::<T>(&o[0]);
                new_filled::<T>(v * d, |out| {
                    if d == 0 {
                        return;
                    }
                    for (src, &r) in gd.chunks(d).zip(&rows) {
                        let dst = &mut out[r as usize * d..(r as usize + 1) * d];
                        for (e, &s) in dst.iter_mut().zip(src) {
                            *e = e.add(s);
                        }
                    }
                })?
            }, else return Err(engine::unsupported(OP, &o[0])));
            Ok(Output::New {
                buf,
                shape: shape.clone(),
                dtype: o[0].dtype,
            })
        })?;
        Ok(smallvec![Some(NDArray { id }), None])
    }
}

// ---- losses ----

fn cross_entropy_impl(logits: NDArray, labels: NDArray, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "cross_entropy";
    let mut saved = None;
    let id = engine::run_op(OP, &[logits.id, labels.id], at, |o| {
        let (x, y) = (&o[0], &o[1]);
        float_operands(OP, x, &[])?;
        let xd = x.shape().dims();
        if xd.len() != 2 {
            return Err(NdError::invalid(
                OP,
                format!("the logits must be 2-D [N, C], got shape {}", x.shape()),
            ));
        }
        let (n, c) = (xd[0], xd[1]);
        if y.shape().dims() != [n] {
            return Err(NdError::invalid(
                OP,
                format!(
                    "the labels must have shape [{n}] (one per row of logits shape {}), got \
                     shape {}",
                    x.shape(),
                    y.shape()
                ),
            ));
        }
        let labels = int_ids(OP, y, c, "label")?;
        let (s0, s1, off) = (
            x.layout.strides[0],
            x.layout.strides[1],
            x.layout.offset as isize,
        );
        let (buf, soft) = dispatch_float!(x.dtype, T => {
            let src = x.data::<T>();
            let mut total = 0.0f64;
            let soft = new_overwritten::<T>(n * c, |p| {
                for (i, row) in p.chunks_mut(c.max(1)).enumerate().take(n) {
                    let at = |j: usize| src[(off + i as isize * s0 + j as isize * s1) as usize];
                    let mut mx = T::LOWEST;
                    for j in 0..c {
                        mx = mx.max_of(at(j));
                    }
                    let mut sum = T::ZERO;
                    for (j, e) in row.iter_mut().enumerate() {
                        *e = at(j).sub(mx).exp();
                        sum = sum.add(*e);
                    }
                    let inv = T::ONE.div(sum);
                    for e in row.iter_mut() {
                        *e = e.mul(inv);
                    }
                    // -log softmax[label] = log(sum) - (x[label] - max), exact for any scale.
                    total += sum.ln().to_f64() - at(labels[i] as usize).sub(mx).to_f64();
                }
            })?;
            let loss = total / n as f64;
            (buffer_of::<T>(&[loss])?, soft)
        }, else unreachable!("checked above"));
        saved = Some((soft, Shape::from([n, c]), x.dtype));
        Ok(Output::New {
            buf,
            shape: Shape(Dims::new()),
            dtype: x.dtype,
        })
    })?;
    if let Some((soft, shape, dtype)) = saved {
        autograd::record_custom(&[logits.id, labels.id], id, || CrossEntropyRule {
            softmax: Saved::new(id, soft, shape, dtype),
        });
    }
    Ok(NDArray { id })
}

/// `cross_entropy`'s gradient: `g * (softmax - one_hot(labels)) / N` for the logits.
struct CrossEntropyRule {
    softmax: Saved,
}

impl Backward for CrossEntropyRule {
    fn name(&self) -> &'static str {
        "cross_entropy"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0b10, false)
    }
    fn extra(&self) -> SmallVec<[ArrayId; 2]> {
        self.softmax.ids()
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        if !cx.need(0) {
            return Ok(smallvec![None, None]);
        }
        const OP: &str = "cross_entropy_grad";
        let p = self.softmax.get(OP)?;
        let id = engine::run_op(
            OP,
            &[p.id, g.id, cx.inputs[1].id],
            Location::caller(),
            |o| {
                let (pd, gd) = (o[0].shape().dims(), &o[1]);
                let (n, c) = (pd[0], pd[1]);
                let labels = int_ids(OP, &o[2], c, "label")?;
                let buf = dispatch_float!(o[0].dtype, T => {
                let scale = cpu::to_vec::<T>(gd)[0].to_f64() / n as f64;
                let scale = T::from_f64(scale);
                let src = cpu::to_vec::<T>(&o[0]);
                new_overwritten::<T>(n * c, |out| {
                    for (d, s) in out.iter_mut().zip(&src) {
                        *d = s.mul(scale);
                    }
                    for (i, &l) in labels.iter().enumerate() {
                        let e = &mut out[i * c + l as usize];
                        *e = e.sub(scale);
                    }
                })?
            }, else return Err(engine::unsupported(OP, &o[0])));
                Ok(Output::New {
                    buf,
                    shape: Shape::from([n, c]),
                    dtype: o[0].dtype,
                })
            },
        )?;
        Ok(smallvec![Some(NDArray { id }), None])
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loss {
    Mse,
    Bce,
}

impl Loss {
    fn name(self) -> &'static str {
        match self {
            Loss::Mse => "mse_loss",
            Loss::Bce => "binary_cross_entropy_with_logits",
        }
    }
}

/// The mean over elements of `f(x, t)`, accumulated in f64.
fn mean_of<T: Float>(x: &Operand<'_>, t: &Operand<'_>, f: impl Fn(f64, f64) -> f64) -> f64 {
    let (xd, td) = (x.data::<T>(), t.data::<T>());
    let mut total = 0.0f64;
    for_each_row(
        x.shape().dims(),
        [&x.layout.strides, &t.layout.strides],
        [x.layout.offset, t.layout.offset],
        |off, n, s| {
            for i in 0..n as isize {
                let (a, b) = (
                    xd[(off[0] + i * s[0]) as usize],
                    td[(off[1] + i * s[1]) as usize],
                );
                total += f(a.to_f64(), b.to_f64());
            }
        },
    );
    total / x.shape().size() as f64
}

fn loss_impl(x: NDArray, target: NDArray, kind: Loss, at: SourceLocation) -> Result<NDArray> {
    let op = kind.name();
    let id = engine::run_op(op, &[x.id, target.id], at, |o| {
        let (a, t) = (&o[0], &o[1]);
        float_operands(op, a, &[t])?;
        if a.shape() != t.shape() {
            return Err(NdError::ShapeMismatch {
                op,
                lhs: a.desc(),
                rhs: t.desc(),
            });
        }
        let loss = dispatch_float!(a.dtype, T => match kind {
            Loss::Mse => mean_of::<T>(a, t, |x, t| (x - t) * (x - t)),
            // Stable for any x: never exponentiates a positive number.
            Loss::Bce => mean_of::<T>(a, t, |x, t| x.max(0.0) - x * t + (-x.abs()).exp().ln_1p()),
        }, else unreachable!("checked above"));
        let buf = dispatch_float!(a.dtype, T => buffer_of::<T>(&[loss])?, else unreachable!());
        Ok(Output::New {
            buf,
            shape: Shape(Dims::new()),
            dtype: a.dtype,
        })
    })?;
    autograd::record_custom(&[x.id, target.id], id, || LossRule { kind });
    Ok(NDArray { id })
}

/// The gradients of the elementwise losses (means over `n` elements):
/// mse `dx = 2 (x - t) g / n`, `dt = -dx`; bce with logits `dx = (sigmoid(x) - t) g / n`,
/// `dt = -x g / n`.
struct LossRule {
    kind: Loss,
}

impl Backward for LossRule {
    fn name(&self) -> &'static str {
        self.kind.name()
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0b11, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let (x, t) = (cx.inputs[0], cx.inputs[1]);
        let n = cx.shapes[0].size() as f64;
        Ok(match self.kind {
            Loss::Mse => {
                let d = x.try_sub(t)?.try_mul(g.try_mul(2.0 / n)?)?;
                smallvec![
                    cx.need(0).then_some(d),
                    if cx.need(1) { Some(d.try_neg()?) } else { None }
                ]
            }
            Loss::Bce => {
                let s = g.try_div(n)?;
                smallvec![
                    if cx.need(0) {
                        Some(x.try_sigmoid()?.try_sub(t)?.try_mul(s)?)
                    } else {
                        None
                    },
                    if cx.need(1) {
                        Some(x.try_mul(s)?.try_neg()?)
                    } else {
                        None
                    }
                ]
            }
        })
    }
}

impl NDArray {
    /// Layer normalisation over `axes` (negative counts from the end): every group of
    /// elements that agree on the other axes becomes `(x - mean) / sqrt(var + eps)`,
    /// with the group's mean and biased variance as PyTorch's `layer_norm`, then
    /// `* gamma + beta` where given. `gamma` and `beta` broadcast to `x`'s shape (PyTorch's
    /// `normalized_shape` is the trailing axes, e.g. `axes = [-1]` with gamma `[D]`; for
    /// other axes give them 1s on the kept axes, e.g. `[C, 1]`). Differentiable in `x`,
    /// `gamma` and `beta`. F32/F64 only. Panics on failure.
    ///
    /// ```
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let x = m.create(&[1.0f64, 2.0, 3.0, 5.0, 5.0, 5.0], [2, 3]);
    /// let y = x.layer_norm(&[-1], None, None, 1e-5).to_vec::<f64>()?;
    /// let r = 1.0 / (2.0f64 / 3.0 + 1e-5).sqrt();   // 1 / sqrt(var + eps) of [1, 2, 3]
    /// assert!((y[0] + r).abs() < 1e-12 && y[1].abs() < 1e-12 && (y[2] - r).abs() < 1e-12);
    /// assert_eq!(&y[3..], &[0.0, 0.0, 0.0]);       // a constant row
    /// # m.close();
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn layer_norm(
        self,
        axes: &[isize],
        gamma: Option<NDArray>,
        beta: Option<NDArray>,
        eps: f64,
    ) -> NDArray {
        unwrap(layer_norm_impl(
            self,
            axes,
            gamma,
            beta,
            eps,
            Location::caller(),
        ))
    }

    /// [`NDArray::layer_norm`]. Errors: `UnsupportedDType` (not F32/F64),
    /// `DTypeMismatch`, `AxisOutOfRange`, `InvalidArgument` (no axes, a repeated axis,
    /// a negative or NaN `eps`), `ShapeMismatch` (gamma or beta does not broadcast to
    /// `x`'s shape), `Closed`.
    #[track_caller]
    pub fn try_layer_norm(
        self,
        axes: &[isize],
        gamma: Option<NDArray>,
        beta: Option<NDArray>,
        eps: f64,
    ) -> Result<NDArray> {
        layer_norm_impl(self, axes, gamma, beta, eps, Location::caller())
    }

    /// Batch normalisation of `[N, C]` or `[N, C, ...]` (channels on axis 1), as
    /// PyTorch's `batch_norm`. Training: each channel is normalised with the batch's
    /// mean and biased variance (over every axis but 1), and the running statistics
    /// `[C]` are updated **in place**: `running = (1 - momentum) * running + momentum *
    /// batch`, with the unbiased batch variance for `running_var`. Inference: the
    /// running statistics normalise and are left unchanged. Then `* gamma + beta`
    /// (`[C]` each) where given. Differentiable in `x`, `gamma` and `beta` (the running
    /// statistics get no gradient). F32/F64 only. Panics on failure.
    ///
    /// ```
    /// use ndscope::{DType, NDManager};
    /// let m = NDManager::new();
    /// let x = m.create(&[1.0f64, 10.0, 3.0, 30.0], [2, 2]);   // 2 samples, 2 channels
    /// let (rm, rv) = (m.zeros([2], DType::F64), m.ones([2], DType::F64));
    /// let y = x.batch_norm(rm, rv, None, None, true, 0.1, 0.0);
    /// let close = |a: Vec<f64>, b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
    /// assert!(close(y.to_vec::<f64>()?, &[-1.0, -1.0, 1.0, 1.0]));
    /// assert!(close(rm.to_vec::<f64>()?, &[0.2, 2.0]));    // 0.9 * 0 + 0.1 * batch mean
    /// // 0.9 * 1 + 0.1 * unbiased batch variance (2 and 200)
    /// assert!(close(rv.to_vec::<f64>()?, &[1.1, 20.9]));
    /// # m.close();
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm(
        self,
        running_mean: NDArray,
        running_var: NDArray,
        gamma: Option<NDArray>,
        beta: Option<NDArray>,
        training: bool,
        momentum: f64,
        eps: f64,
    ) -> NDArray {
        unwrap(batch_norm_impl(
            self,
            running_mean,
            running_var,
            gamma,
            beta,
            training,
            momentum,
            eps,
            Location::caller(),
        ))
    }

    /// [`NDArray::batch_norm`]. Errors: `UnsupportedDType` (not F32/F64),
    /// `DTypeMismatch`, `InvalidArgument` (fewer than 2 axes, statistics or gamma/beta
    /// not `[C]`, one value per channel in training, a negative or NaN `eps`, a
    /// non-finite momentum, running statistics the recording tape depends on), `Closed`.
    /// On error nothing is updated.
    #[track_caller]
    #[allow(clippy::too_many_arguments)]
    pub fn try_batch_norm(
        self,
        running_mean: NDArray,
        running_var: NDArray,
        gamma: Option<NDArray>,
        beta: Option<NDArray>,
        training: bool,
        momentum: f64,
        eps: f64,
    ) -> Result<NDArray> {
        batch_norm_impl(
            self,
            running_mean,
            running_var,
            gamma,
            beta,
            training,
            momentum,
            eps,
            Location::caller(),
        )
    }

    /// Rows of this `[V, D]` table (F32/F64) at integer `ids` of any shape: the result
    /// is `ids.shape + [D]`, as PyTorch's `embedding`. Differentiable in the table (the
    /// gradient adds each row's gradient at its id; repeated ids accumulate). Panics on
    /// failure.
    ///
    /// ```
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let table = m.create(&[0.0f32, 1.0, 10.0, 11.0, 20.0, 21.0], [3, 2]);
    /// let ids = m.create(&[2i64, 0, 2], [3]);
    /// assert_eq!(table.embedding(ids).to_vec::<f32>()?, vec![20.0, 21.0, 0.0, 1.0, 20.0, 21.0]);
    /// # m.close();
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn embedding(self, ids: NDArray) -> NDArray {
        unwrap(embedding_impl(self, ids, Location::caller()))
    }

    /// [`NDArray::embedding`]. Errors: `UnsupportedDType` (a table that is not F32/F64,
    /// float or Bool ids), `InvalidArgument` (a table that is not 2-D), `Index` (an id
    /// that is negative or `>= V`), `InvalidShape`, `Closed`.
    #[track_caller]
    pub fn try_embedding(self, ids: NDArray) -> Result<NDArray> {
        embedding_impl(self, ids, Location::caller())
    }

    /// Cross-entropy of logits `[N, C]` (F32/F64) with integer class `labels` `[N]`:
    /// `mean_i(logsumexp(x_i) - x_i[label_i])`, a 0-d array, as PyTorch's
    /// `cross_entropy` with its defaults (mean reduction; an empty batch gives NaN). A
    /// fused, numerically stable log-softmax and negative log-likelihood: finite for
    /// logits of any magnitude. Differentiable in the logits (`(softmax - one_hot) / N`).
    /// No `ignore_index`: every label must be in `0..C`. Panics on failure.
    ///
    /// ```
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let logits = m.create(&[0.0f64, 0.0, 1e4, 0.0], [2, 2]);
    /// let labels = m.create(&[1i64, 0], [2]);
    /// let loss = logits.cross_entropy(labels).to_scalar::<f64>()?;
    /// assert!((loss - 2f64.ln() / 2.0).abs() < 1e-12);  // ln 2 for row 0, 0 for row 1
    /// # m.close();
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn cross_entropy(self, labels: NDArray) -> NDArray {
        unwrap(cross_entropy_impl(self, labels, Location::caller()))
    }

    /// [`NDArray::cross_entropy`]. Errors: `UnsupportedDType` (logits not F32/F64, float
    /// or Bool labels), `InvalidArgument` (logits not 2-D, labels not `[N]`), `Index` (a
    /// label that is negative or `>= C`), `Closed`.
    #[track_caller]
    pub fn try_cross_entropy(self, labels: NDArray) -> Result<NDArray> {
        cross_entropy_impl(self, labels, Location::caller())
    }

    /// Mean squared error `mean((x - target)^2)`, a 0-d array (PyTorch's `mse_loss` with
    /// mean reduction; an empty input gives NaN). `target` must have `x`'s shape and
    /// dtype (PyTorch broadcasts with a warning; here that is an error). F32/F64 only.
    /// Differentiable in both. Panics on failure.
    ///
    /// ```
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let x = m.create(&[1.0f32, 2.0, 3.0], [3]);
    /// let t = m.create(&[1.0f32, 0.0, 0.0], [3]);
    /// assert_eq!(x.mse_loss(t).to_scalar::<f32>()?, 13.0 / 3.0);
    /// # m.close();
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn mse_loss(self, target: NDArray) -> NDArray {
        unwrap(loss_impl(self, target, Loss::Mse, Location::caller()))
    }

    /// [`NDArray::mse_loss`]. Errors: `UnsupportedDType` (not F32/F64), `DTypeMismatch`,
    /// `ShapeMismatch` (shapes differ), `Closed`.
    #[track_caller]
    pub fn try_mse_loss(self, target: NDArray) -> Result<NDArray> {
        loss_impl(self, target, Loss::Mse, Location::caller())
    }

    /// Binary cross-entropy of logits `x` with targets in `[0, 1]`:
    /// `mean(max(x, 0) - x * target + log1p(exp(-|x|)))`, a 0-d array, as PyTorch's
    /// `binary_cross_entropy_with_logits` (mean reduction; no weights). Stable for
    /// logits of any magnitude. `target` must have `x`'s shape and dtype. F32/F64 only.
    /// Differentiable in both. Panics on failure.
    ///
    /// ```
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let x = m.create(&[0.0f64, 1000.0], [2]);
    /// let t = m.create(&[1.0f64, 1.0], [2]);
    /// let loss = x.binary_cross_entropy_with_logits(t).to_scalar::<f64>()?;
    /// assert!((loss - 2f64.ln() / 2.0).abs() < 1e-12);
    /// # m.close();
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn binary_cross_entropy_with_logits(self, target: NDArray) -> NDArray {
        unwrap(loss_impl(self, target, Loss::Bce, Location::caller()))
    }

    /// [`NDArray::binary_cross_entropy_with_logits`]. Errors: as
    /// [`NDArray::try_mse_loss`].
    #[track_caller]
    pub fn try_binary_cross_entropy_with_logits(self, target: NDArray) -> Result<NDArray> {
        loss_impl(self, target, Loss::Bce, Location::caller())
    }
}
