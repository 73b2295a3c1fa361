//! Reductions over strided data: along any set of axes, with a pairwise (and, when
//! large, split) sum for whole contiguous rows.

use super::buffer::{Buffer, new_overwritten};
use super::fork::{PARALLEL_ELEMS, fork, fork_threads, may_fork};
use super::simd::widest;
use super::strided::Strided;
use crate::dtype::Native;
use crate::error::Result;
use crate::layout::{Layout, for_each_lane, for_each_row};
use crate::shape::Dims;
use rayon::prelude::*;

/// Accumulators of a reduction: inline (no allocation) for up to 4 outputs.
pub(crate) type Accs<A> = smallvec::SmallVec<[A; 4]>;

/// Reduce over `axes` (sorted, unique, in range). Returns one accumulator per output
/// element (row-major over the kept axes). `row(acc, data, start, len, stride)` folds one
/// strided row; rows of one output element arrive in row-major order.
///
/// A large input with several outputs is split across threads by output (each output's
/// rows still arrive in order, so results do not depend on the thread count).
pub(crate) fn reduce<'a, T: Native, A: Copy + Send + Sync>(
    x: impl Into<Strided<'a, T>>,
    axes: &[usize],
    init: A,
    row: impl Fn(A, &[T], isize, usize, isize) -> A + Sync,
) -> Accs<A> {
    let Strided { data, layout: l } = x.into();
    let nd = l.shape.ndim();
    let (mut kept_dims, mut kept_strides) = (Dims::new(), smallvec::SmallVec::<[isize; 4]>::new());
    let (mut red_dims, mut red_strides) = (Dims::new(), smallvec::SmallVec::<[isize; 4]>::new());
    for d in 0..nd {
        if axes.contains(&d) {
            red_dims.push(l.shape.0[d]);
            red_strides.push(l.strides[d]);
        } else {
            kept_dims.push(l.shape.0[d]);
            kept_strides.push(l.strides[d]);
        }
    }
    let n_out: usize = kept_dims.iter().product();
    if n_out == 0 {
        return Accs::new();
    }
    let lane = |base: isize| {
        let mut acc = init;
        for_each_row(&red_dims, [&red_strides], [base as usize], |off, len, s| {
            acc = row(acc, data, off[0], len, s[0]);
        });
        acc
    };
    if n_out > 1 && l.size() >= PARALLEL_ELEMS && may_fork() {
        // Whole lanes per task, about PARALLEL_ELEMS / 4 elements each; a task finds its
        // lanes' bases from their indices.
        let per_lane = (l.size() / n_out).max(1);
        let v: Vec<A> = fork(|| {
            (0..n_out)
                .into_par_iter()
                .with_min_len((PARALLEL_ELEMS / 4).div_ceil(per_lane))
                .map(|j| {
                    let (mut rest, mut base) = (j, l.offset as isize);
                    for (&d, &st) in kept_dims.iter().zip(&kept_strides).rev() {
                        base += (rest % d) as isize * st;
                        rest /= d;
                    }
                    lane(base)
                })
                .collect()
        });
        return Accs::from_vec(v);
    }
    let mut out = Accs::with_capacity(n_out);
    // Iterate the kept axes as "rows of length 1" so each call is one output element
    // (no list of bases: a full reduction allocates nothing).
    for_each_row(&kept_dims, [&kept_strides], [l.offset], |off, len, s| {
        for i in 0..len as isize {
            out.push(lane(off[0] + i * s[0]));
        }
    });
    out
}

/// Whether reducing `axes` of `l` should stream the input in memory order
/// ([`reduce_outer`]) rather than fold one strided lane per output ([`reduce`]): the
/// input's innermost axis (stride ±1) is kept and a reduced axis is longer than 1. So
/// `sum_axes(&[0])` of a row-major matrix adds whole rows into the accumulators
/// (numpy's order) instead of walking columns a cache line per element.
pub(crate) fn prefers_outer(l: &Layout, axes: &[usize]) -> bool {
    let dims = l.shape.dims();
    let Some(inner) = (0..dims.len()).rev().find(|&d| dims[d] > 1) else {
        return false;
    };
    l.strides[inner].abs() == 1 && !axes.contains(&inner) && axes.iter().any(|&a| dims[a] > 1)
}

/// Reduce over `axes` (sorted, unique, in range) visiting the input once in memory
/// order: one accumulator per output element (row-major over the kept axes, as
/// [`reduce`] returns them), `elem(acc, x)` folds one element. Each output receives its
/// elements in the order of its reduced indices, so sums add row by row as numpy does.
///
/// A large input is split across threads by output: each thread owns a contiguous
/// range of the accumulators and streams only its part of each row, so every output
/// still receives its elements in order (the result does not depend on the thread
/// count) and the threads never write the same cache line twice over.
pub(crate) fn reduce_outer<'a, T: Native, A: Copy + Send>(
    x: impl Into<Strided<'a, T>>,
    axes: &[usize],
    init: A,
    elem: impl Fn(A, T) -> A + Sync,
) -> Vec<A> {
    let Strided { data, layout: l } = x.into();
    let nd = l.shape.ndim();
    // Visit the reduced axes outermost, then the kept ones; the output's strides are 0
    // along reduced axes and row-major along kept ones.
    let kept: Dims = (0..nd).filter(|d| !axes.contains(d)).collect();
    let mut out_stride_of = smallvec::SmallVec::<[isize; 4]>::from_elem(0, nd);
    let mut n_out = 1usize;
    for &d in kept.iter().rev() {
        out_stride_of[d] = n_out as isize;
        n_out *= l.shape.0[d];
    }
    let order: Dims = axes.iter().copied().chain(kept.iter().copied()).collect();
    let dims: Dims = order.iter().map(|&d| l.shape.0[d]).collect();
    let in_strides: smallvec::SmallVec<[isize; 4]> = order.iter().map(|&d| l.strides[d]).collect();
    let out_strides: smallvec::SmallVec<[isize; 4]> =
        order.iter().map(|&d| out_stride_of[d]).collect();
    let mut acc = vec![init; n_out];
    if l.size() == 0 {
        return acc;
    }
    // A row-major input reduced over its leading axes is a matrix of `rows` rows of
    // `n_out` elements: fold four rows per pass over a block of accumulators (in row
    // order, so the same result as one row at a time) to load and store each
    // accumulator a quarter as often.
    let leading = axes.iter().enumerate().all(|(i, &a)| a == i) && l.is_contiguous();
    let rows = l.size() / n_out;
    // Fold the part of the input that lands in accumulators `lo..lo + part.len()`.
    let fill = |lo: usize, part: &mut [A]| {
        let hi = lo + part.len();
        if leading {
            const BLOCK: usize = 2048;
            for (b, block) in part.chunks_mut(BLOCK).enumerate() {
                let (start, w) = (l.offset + lo + b * BLOCK, block.len());
                let row = |r: usize| &data[start + r * n_out..start + r * n_out + w];
                let mut r = 0;
                while r + 4 <= rows {
                    let (x0, x1, x2, x3) = (row(r), row(r + 1), row(r + 2), row(r + 3));
                    for ((((a, &v0), &v1), &v2), &v3) in
                        block.iter_mut().zip(x0).zip(x1).zip(x2).zip(x3)
                    {
                        *a = elem(elem(elem(elem(*a, v0), v1), v2), v3);
                    }
                    r += 4;
                }
                for r in r..rows {
                    for (a, &v) in block.iter_mut().zip(row(r)) {
                        *a = elem(*a, v);
                    }
                }
            }
            return;
        }
        for_each_row(
            &dims,
            [&out_strides, &in_strides],
            [0, l.offset],
            |off, len, s| {
                let (o0, i0) = (off[0] as usize, off[1]);
                if s[0] == 1 && s[1] == 1 {
                    // A run of consecutive outputs: clip it to this part.
                    let (a, b) = (o0.max(lo), (o0 + len).min(hi));
                    if a >= b {
                        return;
                    }
                    let src = &data[(i0 as usize + a - o0)..(i0 as usize + b - o0)];
                    for (x, &v) in part[a - lo..b - lo].iter_mut().zip(src) {
                        *x = elem(*x, v);
                    }
                } else {
                    for i in 0..len as isize {
                        let o = (off[0] + i * s[0]) as usize;
                        if (lo..hi).contains(&o) {
                            part[o - lo] = elem(part[o - lo], data[(i0 + i * s[1]) as usize]);
                        }
                    }
                }
            },
        );
    };
    // Parts of at least 1,024 accumulators (whole cache lines, long runs per row).
    // (The pool is asked for its size only when the work would fork: that starts it.)
    let big = l.size() >= PARALLEL_ELEMS && n_out >= 2 * 1024 && may_fork();
    if big && fork_threads() > 1 {
        let part = n_out.div_ceil(fork_threads()).next_multiple_of(1024);
        fork(|| {
            acc.par_chunks_mut(part)
                .enumerate()
                .for_each(|(k, p)| fill(k * part, p))
        });
    } else {
        fill(0, &mut acc);
    }
    acc
}

/// Sum of a strided row with 8 independent accumulators (vectorises; more accurate than
/// one running sum) and pairwise combination of blocks.
#[inline]
pub(crate) fn sum_row<T: Native>(data: &[T], start: isize, len: usize, stride: isize) -> T {
    if stride == 1 {
        return pairwise_sum(&data[start as usize..start as usize + len]);
    }
    let mut acc = T::ZERO;
    for i in 0..len as isize {
        acc = acc.add(data[(start + i * stride) as usize]);
    }
    acc
}

fn pairwise_sum<T: Native>(x: &[T]) -> T {
    if x.len() >= PARALLEL_ELEMS && may_fork() {
        fork(|| pairwise(x, true))
    } else {
        pairwise(x, false)
    }
}

/// [`pairwise_sum`]; `fork`, decided once at the top, splits large halves across
/// threads (the halves are the same either way, so are the bits).
fn pairwise<T: Native>(x: &[T], fork: bool) -> T {
    const BLOCK: usize = 4096;
    if x.len() <= BLOCK {
        return block_sum(x);
    }
    let mid = (x.len() / 2).next_multiple_of(32);
    if x.len() >= PARALLEL_ELEMS && fork {
        let (a, b) = rayon::join(|| pairwise(&x[..mid], true), || pairwise(&x[mid..], true));
        a.add(b)
    } else {
        pairwise(&x[..mid], fork).add(pairwise(&x[mid..], fork))
    }
}

/// Sum of one block, compiled for the widest vector unit the CPU has.
fn block_sum<T: Native>(x: &[T]) -> T {
    widest(
        #[inline(always)]
        || lanes_sum(x),
    )
}

/// Accumulators of [`lanes_sum`].
const LANES: usize = 32;

/// 32 independent accumulators (several vector registers, so the adds pipeline),
/// combined pairwise by [`combine_lanes`].
#[inline(always)]
fn lanes_sum<T: Native>(x: &[T]) -> T {
    let mut lanes = [T::ZERO; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for k in 0..LANES {
            lanes[k] = lanes[k].add(c[k]);
        }
    }
    combine_lanes(lanes, rest)
}

/// The pairwise combination of [`lanes_sum`]'s accumulators, then its remainder: out of
/// line on purpose. Inlined, LLVM's SLP vectoriser paired the lanes up for this tree
/// and then ran the main loop two floats to a register, with register shuffles and
/// spills (0.7x a plain loop's bandwidth); apart, the loop keeps whole vector
/// registers. Once per block, so the call costs nothing measurable; the bits are the
/// same either way.
#[inline(never)]
fn combine_lanes<T: Native>(mut lanes: [T; LANES], rest: &[T]) -> T {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for k in 0..width {
            lanes[k] = lanes[k].add(lanes[k + width]);
        }
    }
    let mut s = T::ZERO;
    for v in rest {
        s = s.add(*v);
    }
    lanes[0].add(s)
}

/// Running sums of `a` along `axis` (from the end when `reverse`) into a new contiguous
/// buffer.
pub(crate) fn cumsum<T: Native>(a: Strided<'_, T>, axis: usize, reverse: bool) -> Result<Buffer> {
    let Strided {
        data: src,
        layout: l,
    } = a;
    let n = l.size();
    new_overwritten::<T>(n, |out| {
        // A zero-size view may carry an offset past the end of its buffer.
        if n == 0 {
            return;
        }
        let len = l.shape.dims()[axis] as isize;
        for_each_lane(l, axis, |s0, ss, d0, ds| {
            let mut acc = T::ZERO;
            for i in 0..len {
                let k = if reverse { len - 1 - i } else { i };
                acc = acc.add(src[(s0 + k * ss) as usize]);
                out[(d0 + k * ds) as usize] = acc;
            }
        });
    })
}
