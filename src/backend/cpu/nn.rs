//! Kernels of the neural-network ops: softmax and log-softmax, `where` (select),
//! one-hot rows, embedding row lookups and their gradient, the cross-entropy forward
//! and backward loops and the mean of an elementwise loss. The normalisations are in
//! [`norm`](super::norm).

use super::buffer::{Buffer, new_filled, new_overwritten};
use super::fork::{PARALLEL_ELEMS, fork, may_fork};
use super::simd::widest;
use super::strided::Strided;
use crate::dtype::{Float, Native};
use crate::error::Result;
use crate::layout::{for_each_lane, for_each_row};
use crate::shape::Shape;
use rayon::prelude::*;
use std::iter::repeat;

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

/// Softmax (or log-softmax) of `a` along `axis` into a new contiguous buffer.
pub(crate) fn softmax_kernel<T: Float>(
    a: Strided<'_, T>,
    axis: usize,
    log: bool,
) -> Result<Buffer> {
    let Strided {
        data: src,
        layout: l,
    } = a;
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
            if n >= PARALLEL_ELEMS && may_fork() {
                fork(|| {
                    out.par_chunks_mut(len)
                        .zip(src.par_chunks(len))
                        .for_each(row)
                });
            } else {
                out.chunks_mut(len).zip(src.chunks(len)).for_each(row);
            }
            return;
        }
        for_each_lane(l, axis, |s0, ss, d0, ds| {
            softmax_lane(src, s0, ss, out, d0 as usize, ds as usize, len, log)
        });
    })
}

/// `out = cond ? x : y` with broadcasting, into a new contiguous buffer of `shape`.
pub(crate) fn select<T: Native>(
    c: Strided<'_, u8>,
    x: Strided<'_, T>,
    y: Strided<'_, T>,
    shape: &Shape,
) -> Result<Buffer> {
    let (dc, dx, dy) = (c.data, x.data, y.data);
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
                if len == 0 {
                    return;
                }
                let dst = &mut out[off[0] as usize..off[0] as usize + len];
                let (oc, ox, oy) = (off[1] as usize, off[2] as usize, off[3] as usize);
                // A contiguous condition with each value a run or one element repeated
                // (a scalar such as a masked gradient's zero): no index arithmetic.
                let conds = || dc[oc..oc + len].iter().map(|&k| k != 0);
                let (xs, ys) = (&dx[ox..], &dy[oy..]);
                widest(
                    #[inline(always)]
                    || match (s[1], s[2], s[3]) {
                        (1, 1, 1) => pick(dst, conds(), xs[..len].iter(), ys[..len].iter()),
                        (1, 1, 0) => pick(dst, conds(), xs[..len].iter(), repeat(&ys[0])),
                        (1, 0, 1) => pick(dst, conds(), repeat(&xs[0]), ys[..len].iter()),
                        (1, 0, 0) => pick(dst, conds(), repeat(&xs[0]), repeat(&ys[0])),
                        _ => {
                            for (i, o) in dst.iter_mut().enumerate() {
                                let i = i as isize;
                                let at = |k: usize| (off[k] + i * s[k]) as usize;
                                *o = if dc[at(1)] != 0 { dx[at(2)] } else { dy[at(3)] };
                            }
                        }
                    },
                );
            },
        );
    })
}

/// `dst[i] = if cond[i] { x[i] } else { y[i] }` over one row, without a branch
/// ([`Native::pick`]).
#[inline(always)]
fn pick<'a, T: Native>(
    dst: &mut [T],
    cond: impl Iterator<Item = bool>,
    x: impl Iterator<Item = &'a T>,
    y: impl Iterator<Item = &'a T>,
) {
    for (o, ((k, &p), &q)) in dst.iter_mut().zip(cond.zip(x).zip(y)) {
        *o = T::pick(k, p, q);
    }
}

/// A new buffer holding `v` converted to `T`.
pub(crate) fn buffer_of<T: Native>(v: &[f64]) -> Result<Buffer> {
    new_overwritten::<T>(v.len(), |o| {
        for (d, &s) in o.iter_mut().zip(v) {
            *d = T::from_f64(s);
        }
    })
}

/// The mean over elements of `f(x, t)`, accumulated in f64.
pub(crate) fn mean_of<T: Float>(
    x: Strided<'_, T>,
    t: Strided<'_, T>,
    f: impl Fn(f64, f64) -> f64,
) -> f64 {
    let (xd, td) = (x.data, t.data);
    let mut total = 0.0f64;
    for_each_row(
        x.layout.shape.dims(),
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
    total / x.layout.shape.size() as f64
}

/// One-hot rows: `out` (zeroed, `indices.len()` rows of `depth`) gets 1 at
/// `(row, indices[row])`; the indices are already checked to lie in `0..depth`.
pub(crate) fn one_hot_kernel<T: Native>(indices: &[i64], depth: usize, out: &mut [T]) {
    for (row, &i) in indices.iter().enumerate() {
        out[row * depth + i as usize] = T::ONE;
    }
}

/// `embedding`: row `k` of `out` (row-major, `D` wide) is row `rows[k]` of the
/// `[V, D]` table (ids already checked to lie in `0..V`).
pub(crate) fn embedding_kernel<T: Copy>(table: Strided<'_, T>, rows: &[i64], out: &mut [T]) {
    let (src, l) = (table.data, table.layout);
    let d = l.shape.dims()[1];
    let (s0, s1, off) = (l.strides[0], l.strides[1], l.offset as isize);
    for (row, &r) in out.chunks_mut(d.max(1)).zip(rows) {
        let base = off + r as isize * s0;
        if s1 == 1 {
            row.copy_from_slice(&src[base as usize..base as usize + d]);
        } else {
            for (j, e) in row.iter_mut().enumerate() {
                *e = src[(base + j as isize * s1) as usize];
            }
        }
    }
}

/// `embedding`'s gradient: the rows of `g` (row-major, `d` wide) added into the
/// zeroed `[V, d]` table `out` at their ids (repeated ids accumulate).
pub(crate) fn embedding_grad_kernel<T: Native>(g: &[T], rows: &[i64], d: usize, out: &mut [T]) {
    if d == 0 {
        return;
    }
    for (src, &r) in g.chunks(d).zip(rows) {
        let dst = &mut out[r as usize * d..(r as usize + 1) * d];
        for (e, &s) in dst.iter_mut().zip(src) {
            *e = e.add(s);
        }
    }
}

/// `cross_entropy`'s forward pass over logits `[N, C]` and labels already checked to
/// lie in `0..C`: the softmax of every row into `p` (row-major `[N, C]`), and the sum
/// over rows of `-log softmax[label]`.
pub(crate) fn softmax_nll<T: Float>(x: Strided<'_, T>, labels: &[i64], p: &mut [T]) -> f64 {
    let (src, l) = (x.data, x.layout);
    let (n, c) = (l.shape.dims()[0], l.shape.dims()[1]);
    let (s0, s1, off) = (l.strides[0], l.strides[1], l.offset as isize);
    let mut total = 0.0f64;
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
    total
}

/// `cross_entropy`'s gradient for the logits: `out = p * scale`, less `scale` at each
/// row's label (`p` is the saved softmax, row-major `[N, c]`).
pub(crate) fn cross_entropy_grad_kernel<T: Native>(
    p: &[T],
    labels: &[i64],
    c: usize,
    scale: T,
    out: &mut [T],
) {
    for (d, s) in out.iter_mut().zip(p) {
        *d = s.mul(scale);
    }
    for (i, &l) in labels.iter().enumerate() {
        let e = &mut out[i * c + l as usize];
        *e = e.sub(scale);
    }
}
