//! Kernels: loops over strided data. Each is generic over the native element type and
//! built on [`for_each_row`], whose rows are contiguous for contiguous arrays (so the
//! inner loops vectorise) and strided otherwise. Inner loops special-case the stride
//! patterns that matter: 1 (contiguous) and 0 (broadcast).
//!
//! A kernel reads [`Strided`] data (a slice plus the [`Layout`] that maps indices into
//! it) and writes a new buffer or a [`StridedMut`]: it knows nothing of the registry,
//! so it is tested on plain vectors (the tests at the end of this file). An op's
//! [`Operand`]s convert into both (`kernels::map_unary(&o[0], f)`).

use super::layout::{Layout, for_each_row, for_each_row_any_order};
use super::storage::{Buffer, new_overwritten};
use super::{Operand, OperandMut};
use crate::dtype::{Native, dispatch};
use crate::error::{NdError, Result};
use crate::shape::{Dims, Shape};
use rayon::prelude::*;

/// Elements of type `T` in `data`, laid out by `layout`: what a kernel reads.
#[derive(Clone, Copy)]
pub(crate) struct Strided<'a, T> {
    pub data: &'a [T],
    pub layout: &'a Layout,
}

impl<'a, T: Native> From<&'a Operand<'_>> for Strided<'a, T> {
    #[inline]
    fn from(o: &'a Operand<'_>) -> Self {
        Strided {
            data: o.data::<T>(),
            layout: o.layout,
        }
    }
}

/// Elements of type `T` in `data`, laid out by `layout`: what an in-place kernel writes.
pub(crate) struct StridedMut<'a, T> {
    pub data: &'a mut [T],
    pub layout: &'a Layout,
}

impl<'a, T: Native> From<&'a mut OperandMut<'_>> for StridedMut<'a, T> {
    #[inline]
    fn from(o: &'a mut OperandMut<'_>) -> Self {
        let (data, layout) = o.split_mut::<T>();
        StridedMut { data, layout }
    }
}

/// Contiguous element counts above which elementwise loops are split across threads.
const PARALLEL_ELEMS: usize = 1 << 18;

// Large kernels split their work across ndscope's own rayon pool ([`fork`]), never
// rayon's global pool, and only from a thread that holds no shard lock and is not a
// rayon worker. A rayon worker that waits in a join runs other tasks of its pool
// meanwhile (from its own queue, or stolen). Were kernels split on the pool that runs
// user code (data-parallel training in `par_iter`), such a task could run in the middle
// of the interrupted op, on the same thread: its ops would block on a shard lock that
// the thread already holds, it would see that thread's open scopes and recording
// collector, and an in-place write it made to an array the op reads with no lock held
// would wait for the op, which waits for that worker (the stolen-writer deadlock). The
// kernel pool runs nothing but kernel splits, which take no lock and wait for nothing
// but each other. A thread outside any pool waits for `install` without running
// anything else, so it may fork when it holds no lock. A rayon worker may not: waiting
// for another pool, it would run its own pool's tasks meanwhile. Work under a lock is
// small by design (`exec::OUTSIDE_LOCK_WORK`); the exceptions (a broadcast to a big
// result, a mid-size matmul, an in-place update or a gradient sum of a big parameter)
// run on the calling thread alone, as do all kernels called from inside rayon tasks.
thread_local! {
    static LOCKED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Marks the calling thread as holding a shard lock while alive: kernels run meanwhile
/// do not fork ([`may_fork`]). Take it right after locking and keep it until unlocking.
pub(crate) struct NoFork(());

impl NoFork {
    #[inline]
    pub(crate) fn new() -> NoFork {
        LOCKED.with(|c| c.set(c.get() + 1));
        NoFork(())
    }
}

impl Drop for NoFork {
    #[inline]
    fn drop(&mut self) {
        LOCKED.with(|c| c.set(c.get() - 1));
    }
}

/// Whether a kernel may split its work across the kernel pool ([`fork`]): not while
/// this thread holds a shard lock (see [`NoFork`]), and not on a worker thread of any
/// rayon pool (the kernel pool's own, or one that runs user code).
#[inline]
pub(crate) fn may_fork() -> bool {
    LOCKED.with(|c| c.get() == 0) && rayon::current_thread_index().is_none()
}

/// ndscope's kernel pool: the threads that run the splits of large kernels, and only
/// those (see the comment above [`NoFork`]). Started on the first fork; as many threads
/// as rayon's global pool would have (`RAYON_NUM_THREADS`, else one per CPU).
fn kernel_pool() -> &'static rayon::ThreadPool {
    static POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("ndscope-kernel-{i}"))
            .build()
            .expect("ndscope could not start its kernel threads")
    })
}

/// Run `f`, whose parallel loops split across the kernel pool, and wait for it. Call
/// only where [`may_fork`] holds: the calling thread then waits without running
/// anything else.
pub(crate) fn fork<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    debug_assert!(may_fork());
    kernel_pool().install(f)
}

/// The number of threads a forked kernel splits its work across.
pub(crate) fn fork_threads() -> usize {
    kernel_pool().current_num_threads()
}

/// Copy an operand into a new contiguous buffer of the same dtype.
pub(crate) fn materialize(o: &Operand<'_>) -> Result<(Buffer, Layout)> {
    let buf = dispatch!(o.dtype, T => map_unary::<T, T>(o, |x| x)?);
    Ok((buf, Layout::contiguous(o.layout.shape.clone())))
}

/// The operand's elements in row-major order.
pub(crate) fn to_vec<'a, T: Native>(x: impl Into<Strided<'a, T>>) -> Vec<T> {
    let Strided { data, layout: l } = x.into();
    let mut out = Vec::with_capacity(l.size());
    for_each_row(l.shape.dims(), [&l.strides], [l.offset], |off, n, s| {
        let (start, step) = (off[0], s[0]);
        if step == 1 {
            out.extend_from_slice(&data[start as usize..start as usize + n]);
        } else {
            out.extend((0..n as isize).map(|i| data[(start + i * step) as usize]));
        }
    });
    out
}

/// `out[i] = f(x[i])` into a new contiguous buffer.
pub(crate) fn map_unary<'a, T: Native, U: Native>(
    x: impl Into<Strided<'a, T>>,
    f: impl Fn(T) -> U + Sync + Send + Copy,
) -> Result<Buffer> {
    let Strided {
        data: src,
        layout: l,
    } = x.into();
    let n = l.size();
    new_overwritten::<U>(n, |out| {
        // A zero-size view may carry an offset past the end of its (empty) buffer.
        if n == 0 {
            return;
        }
        if l.is_contiguous() {
            let src = &src[l.offset..l.offset + n];
            if n >= PARALLEL_ELEMS && may_fork() {
                fork(|| {
                    out.par_chunks_mut(PARALLEL_ELEMS / 4)
                        .zip(src.par_chunks(PARALLEL_ELEMS / 4))
                        .for_each(|(o, s)| o.iter_mut().zip(s).for_each(|(o, &x)| *o = f(x)))
                });
            } else {
                out.iter_mut().zip(src).for_each(|(o, &x)| *o = f(x));
            }
            return;
        }
        let out_strides = l.shape.contiguous_strides();
        for_each_row_any_order(
            l.shape.dims(),
            [&out_strides, &l.strides],
            [0, l.offset],
            |off, len, s| {
                let (o0, s0) = (off[0] as usize, off[1]);
                if s[0] == 1 && s[1] == 1 {
                    out[o0..o0 + len]
                        .iter_mut()
                        .zip(&src[s0 as usize..s0 as usize + len])
                        .for_each(|(o, &x)| *o = f(x));
                } else {
                    for i in 0..len as isize {
                        out[(off[0] + i * s[0]) as usize] = f(src[(s0 + i * s[1]) as usize]);
                    }
                }
            },
        );
    })
}

/// `out = f(a, b)` with numpy broadcasting into a new contiguous buffer of `shape`.
pub(crate) fn map_binary<'a, 'b, T: Native, U: Native>(
    a: impl Into<Strided<'a, T>>,
    b: impl Into<Strided<'b, T>>,
    shape: &Shape,
    f: impl Fn(T, T) -> U + Sync + Send + Copy,
) -> Result<Buffer> {
    let (
        Strided {
            data: da,
            layout: la,
        },
        Strided {
            data: db,
            layout: lb,
        },
    ) = (a.into(), b.into());
    let n = shape.size();
    new_overwritten::<U>(n, |out| {
        // Zero-size views may carry offsets past the end of their (empty) buffers.
        if n == 0 {
            return;
        }
        if la.shape == *shape && lb.shape == *shape && la.is_contiguous() && lb.is_contiguous() {
            let (sa, sb) = (&da[la.offset..la.offset + n], &db[lb.offset..lb.offset + n]);
            if n >= PARALLEL_ELEMS && may_fork() {
                let c = PARALLEL_ELEMS / 4;
                fork(|| {
                    out.par_chunks_mut(c)
                        .zip(sa.par_chunks(c).zip(sb.par_chunks(c)))
                        .for_each(|(o, (x, y))| zip2(o, x, y, f))
                });
            } else {
                zip2(out, sa, sb, f);
            }
            return;
        }
        // A contiguous array and a single element (`x + b` with a [1] bias): one row
        // with the single element's stride 0.
        let (oa, ob) = (la.offset as isize, lb.offset as isize);
        if la.shape == *shape && la.is_contiguous() && lb.size() == 1 {
            return binary_row(out, da, oa, 1, db, ob, 0, f);
        }
        if lb.shape == *shape && lb.is_contiguous() && la.size() == 1 {
            return binary_row(out, da, oa, 0, db, ob, 1, f);
        }
        let out_strides = shape.contiguous_strides();
        let (sa, sb) = (la.broadcast_strides(shape), lb.broadcast_strides(shape));
        for_each_row_any_order(
            shape.dims(),
            [&out_strides, &sa, &sb],
            [0, la.offset, lb.offset],
            |off, len, s| {
                if s[0] == 1 {
                    let dst = &mut out[off[0] as usize..off[0] as usize + len];
                    binary_row(dst, da, off[1], s[1], db, off[2], s[2], f);
                } else {
                    // A row along another dimension than the output's last.
                    for i in 0..len as isize {
                        out[(off[0] + i * s[0]) as usize] = f(
                            da[(off[1] + i * s[1]) as usize],
                            db[(off[2] + i * s[2]) as usize],
                        );
                    }
                }
            },
        );
    })
}

#[inline(always)]
fn zip2<T: Copy, U>(out: &mut [U], a: &[T], b: &[T], f: impl Fn(T, T) -> U) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

/// One row of a binary op with the stride patterns that matter specialised.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn binary_row<T: Copy, U>(
    dst: &mut [U],
    da: &[T],
    oa: isize,
    sa: isize,
    db: &[T],
    ob: isize,
    sb: isize,
    f: impl Fn(T, T) -> U,
) {
    let n = dst.len();
    match (sa, sb) {
        (1, 1) => zip2(
            dst,
            &da[oa as usize..oa as usize + n],
            &db[ob as usize..ob as usize + n],
            f,
        ),
        (1, 0) => {
            let y = db[ob as usize];
            for (o, &x) in dst.iter_mut().zip(&da[oa as usize..oa as usize + n]) {
                *o = f(x, y);
            }
        }
        (0, 1) => {
            let x = da[oa as usize];
            for (o, &y) in dst.iter_mut().zip(&db[ob as usize..ob as usize + n]) {
                *o = f(x, y);
            }
        }
        _ => {
            for (i, o) in dst.iter_mut().enumerate() {
                let i = i as isize;
                *o = f(da[(oa + i * sa) as usize], db[(ob + i * sb) as usize]);
            }
        }
    }
}

/// In place: `t = f(t, b)`, `b` broadcast to `t`'s shape (checked by the caller).
pub(crate) fn assign_binary<'a, 'b, T: Native>(
    t: impl Into<StridedMut<'a, T>>,
    b: impl Into<Strided<'b, T>>,
    f: impl Fn(T, T) -> T + Copy,
) {
    let StridedMut {
        data: dt,
        layout: lt,
    } = t.into();
    let Strided {
        data: db,
        layout: lb,
    } = b.into();
    if lt.is_contiguous() && lb.shape == lt.shape && lb.is_contiguous() {
        // The common case (`w -= g * lr`): two plain runs.
        let n = lt.size();
        if n > 0 {
            let t = &mut dt[lt.offset..lt.offset + n];
            for (p, &q) in t.iter_mut().zip(&db[lb.offset..lb.offset + n]) {
                *p = f(*p, q);
            }
        }
        return;
    }
    let sb = lb.broadcast_strides(&lt.shape);
    let boff = lb.offset;
    for_each_row_any_order(
        lt.shape.dims(),
        [&lt.strides, &sb],
        [lt.offset, boff],
        |off, len, s| {
            for i in 0..len as isize {
                let ti = (off[0] + i * s[0]) as usize;
                dt[ti] = f(dt[ti], db[(off[1] + i * s[1]) as usize]);
            }
        },
    );
}

/// In place: `t = f(t)`.
pub(crate) fn assign_unary<'a, T: Native>(
    t: impl Into<StridedMut<'a, T>>,
    f: impl Fn(T) -> T + Copy,
) {
    let StridedMut {
        data: dt,
        layout: lt,
    } = t.into();
    if lt.is_contiguous() {
        let n = lt.size();
        if n > 0 {
            dt[lt.offset..lt.offset + n]
                .iter_mut()
                .for_each(|p| *p = f(*p));
        }
        return;
    }
    for_each_row_any_order(
        lt.shape.dims(),
        [&lt.strides],
        [lt.offset],
        |off, len, s| {
            for i in 0..len as isize {
                let ti = (off[0] + i * s[0]) as usize;
                dt[ti] = f(dt[ti]);
            }
        },
    );
}

/// Convert between dtypes (through f64 for floats, i64 for integers).
pub(crate) fn cast(o: &Operand<'_>, to: crate::DType) -> Result<Buffer> {
    use crate::DType;
    let to_bool = to == DType::Bool;
    dispatch!(o.dtype, S => dispatch!(to, D => {
        if to_bool {
            map_unary::<S, D>(o, |x| D::from_i64((x != S::ZERO) as i64))
        } else if o.dtype.is_float() {
            map_unary::<S, D>(o, |x| D::from_f64(x.to_f64()))
        } else {
            map_unary::<S, D>(o, |x| D::from_i64(x.to_i64()))
        }
    }))
}

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

/// Sum of one block, compiled for the widest vector unit the CPU has (checked once at
/// run time; the portable build only assumes SSE2).
fn block_sum<T: Native>(x: &[T]) -> T {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked just above).
            return unsafe { block_sum_avx512(x) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { block_sum_avx2(x) };
        }
    }
    lanes_sum(x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn block_sum_avx512<T: Native>(x: &[T]) -> T {
    lanes_sum(x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn block_sum_avx2<T: Native>(x: &[T]) -> T {
    lanes_sum(x)
}

/// 32 independent accumulators (several vector registers, so the adds pipeline),
/// combined pairwise.
#[inline(always)]
fn lanes_sum<T: Native>(x: &[T]) -> T {
    const LANES: usize = 32;
    let mut lanes = [T::ZERO; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for k in 0..LANES {
            lanes[k] = lanes[k].add(c[k]);
        }
    }
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

/// Products of at most this many multiply-adds skip gemm (see [`matmul_2d`]).
const TINY_MATMUL_FLOPS: usize = 256;

/// A 2-D strided matrix operand: element (i, j) is at `off + i*rs + j*cs`.
pub(crate) struct Mat<'a, T> {
    pub data: &'a [T],
    pub off: isize,
    pub rs: isize,
    pub cs: isize,
}

/// `out[m, n] = a[m, k] @ b[k, n]` into a contiguous `out` (row stride `n`).
pub(crate) fn matmul_2d<T: Native>(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_, T>,
    b: Mat<'_, T>,
    out: &mut [T],
) {
    debug_assert!(out.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out[..m * n].iter_mut().for_each(|o| *o = T::ZERO);
        return;
    }
    // Matrix-vector products with a tiny inner dimension over contiguous rows (e.g.
    // [1000,2] x [2,1]): a fixed-width loop the compiler vectorises beats gemm's setup.
    if n == 1 && k <= 4 && a.cs == 1 && a.rs == k as isize && a.off >= 0 {
        let rows = &a.data[a.off as usize..a.off as usize + m * k];
        let col = |p: usize| b.data[(b.off + p as isize * b.rs) as usize];
        let out = &mut out[..m];
        match k {
            1 => return matvec_small::<T, 1>(rows, [col(0)], out),
            2 => return matvec_small::<T, 2>(rows, [col(0), col(1)], out),
            3 => return matvec_small::<T, 3>(rows, [col(0), col(1), col(2)], out),
            _ => return matvec_small::<T, 4>(rows, [col(0), col(1), col(2), col(3)], out),
        }
    }
    let gemm_type = std::any::TypeId::of::<T>();
    let is_float =
        gemm_type == std::any::TypeId::of::<f32>() || gemm_type == std::any::TypeId::of::<f64>();
    // gemm's setup (dispatch, packing decisions) costs about 3,000 instructions: tiny
    // products (a [2,64] x [64,1] gradient takes 128 multiply-adds) are cheaper as
    // the plain loop below.
    if is_float && m * n * k > TINY_MATMUL_FLOPS {
        // Check that every element gemm will touch is inside the slices: the lowest and
        // highest indices of a strided matrix are at corners (either stride may be
        // negative, so take each dimension's extreme separately).
        let in_bounds = |x: &Mat<'_, T>, rows: usize, cols: usize| {
            let (r, c) = ((rows as isize - 1) * x.rs, (cols as isize - 1) * x.cs);
            let lo = x.off + r.min(0) + c.min(0);
            let hi = x.off + r.max(0) + c.max(0);
            lo >= 0 && hi < x.data.len() as isize
        };
        assert!(in_bounds(&a, m, k));
        assert!(in_bounds(&b, k, n));
        let flops = m * n * k;
        #[cfg(feature = "openblas")]
        if flops >= 1 << 21 && may_fork() && super::blas::matmul(m, n, k, &a, &b, out) {
            return;
        }
        let mut call = |par| {
            // SAFETY: the asserts above keep every lhs/rhs element gemm reads inside
            // `a.data` and `b.data` (index maps are affine, so every visited index lies
            // between the lowest and highest corner, both checked in range), and `out`
            // holds m*n contiguous elements written with row stride n, column stride 1.
            // T is f32 or f64 (checked by TypeId), which gemm supports. `read_dst` is
            // false, so the destination's old contents are not read.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    out.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.data.as_ptr().offset(a.off),
                    a.cs,
                    a.rs,
                    b.data.as_ptr().offset(b.off),
                    b.cs,
                    b.rs,
                    T::ZERO,
                    T::ONE,
                    false,
                    false,
                    false,
                    par,
                );
            }
        };
        if flops >= 1 << 21 && may_fork() {
            // gemm splits its work on the pool it is called in: the kernel pool.
            fork(|| call(gemm::Parallelism::Rayon(fork_threads())));
        } else {
            call(gemm::Parallelism::None);
        }
        return;
    }
    for i in 0..m {
        for j in 0..n {
            let mut acc = T::ZERO;
            for p in 0..k {
                let x = a.data[(a.off + i as isize * a.rs + p as isize * a.cs) as usize];
                let y = b.data[(b.off + p as isize * b.rs + j as isize * b.cs) as usize];
                acc = acc.add(x.mul(y));
            }
            out[i * n + j] = acc;
        }
    }
}

/// `out[i] = rows[i] . col` for rows of constant width `K`.
fn matvec_small<T: Native, const K: usize>(rows: &[T], col: [T; K], out: &mut [T]) {
    for (o, r) in out.iter_mut().zip(rows.chunks_exact(K)) {
        let mut acc = r[0].mul(col[0]);
        for p in 1..K {
            acc = acc.add(r[p].mul(col[p]));
        }
        *o = acc;
    }
}

/// Error for a dtype an op does not support.
pub(crate) fn unsupported(op: &'static str, o: &Operand<'_>) -> NdError {
    NdError::UnsupportedDType {
        op,
        dtype: o.dtype,
        array: o.desc(),
    }
}

#[cfg(test)]
mod tests {
    //! Kernels on plain vectors: no registry, no manager.
    use super::*;

    fn layout(shape: &[usize], strides: &[isize], offset: usize) -> Layout {
        Layout {
            shape: Shape::from(shape.to_vec()),
            strides: strides.iter().copied().collect(),
            offset,
        }
    }

    fn read<T: Native>(b: &Buffer) -> Vec<T> {
        // SAFETY: a fresh buffer no one else holds.
        unsafe { b.slice::<T>() }.to_vec()
    }

    #[test]
    fn unary_over_a_reversed_strided_view() {
        // [[0 1 2] [3 4 5]] transposed and the columns reversed: [[2 5] [1 4] [0 3]].
        let data: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let l = layout(&[3, 2], &[-1, 3], 2);
        let x = Strided {
            data: &data,
            layout: &l,
        };
        assert_eq!(to_vec(x), vec![2.0, 5.0, 1.0, 4.0, 0.0, 3.0]);
        let b = map_unary::<f32, f32>(x, |v| v * 10.0).unwrap();
        assert_eq!(read::<f32>(&b), vec![20.0, 50.0, 10.0, 40.0, 0.0, 30.0]);
    }

    #[test]
    fn binary_broadcasts_a_row_and_a_column() {
        let (a, b) = (vec![1i64, 2, 3], vec![10i64, 20]);
        let (la, lb) = (layout(&[1, 3], &[3, 1], 0), layout(&[2, 1], &[1, 1], 0));
        let shape = Shape::from(vec![2, 3]);
        let out = map_binary::<i64, i64>(
            Strided {
                data: &a,
                layout: &la,
            },
            Strided {
                data: &b,
                layout: &lb,
            },
            &shape,
            |x, y| x + y,
        )
        .unwrap();
        assert_eq!(read::<i64>(&out), vec![11, 12, 13, 21, 22, 23]);
    }

    #[test]
    fn in_place_writes_only_the_view() {
        let mut t = vec![0.0f64; 6];
        let lt = layout(&[3], &[2], 1); // elements 1, 3, 5
        let src = vec![1.0, 2.0, 3.0];
        let ls = layout(&[3], &[1], 0);
        assign_binary::<f64>(
            StridedMut {
                data: &mut t,
                layout: &lt,
            },
            Strided {
                data: &src,
                layout: &ls,
            },
            |a, b| a + b,
        );
        assign_unary::<f64>(
            StridedMut {
                data: &mut t,
                layout: &lt,
            },
            |a| a * 2.0,
        );
        assert_eq!(t, vec![0.0, 2.0, 0.0, 4.0, 0.0, 6.0]);
    }

    #[test]
    fn reduce_over_a_non_last_axis() {
        // [[1 2 3] [4 5 6]] summed over axis 0.
        let data = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let l = layout(&[2, 3], &[3, 1], 0);
        let sums = reduce::<f32, f32>(
            Strided {
                data: &data,
                layout: &l,
            },
            &[0],
            0.0,
            |acc, d, s, n, st| acc + sum_row(d, s, n, st),
        );
        assert_eq!(sums.to_vec(), vec![5.0, 7.0, 9.0]);
    }

    #[test]
    fn outer_reduction_matches_lane_reduction() {
        // [2, 3, 4] reduced over every non-empty set of axes, contiguous and transposed.
        let data: Vec<f64> = (0..24).map(|v| (v * 7 % 11) as f64).collect();
        let layouts = [
            layout(&[2, 3, 4], &[12, 4, 1], 0),
            layout(&[4, 3, 2], &[1, 4, 12], 0),
            layout(&[2, 3, 4], &[12, 4, -1], 3),
        ];
        for l in &layouts {
            for axes in [
                &[0usize][..],
                &[1],
                &[2],
                &[0, 1],
                &[0, 2],
                &[1, 2],
                &[0, 1, 2],
            ] {
                let x = Strided {
                    data: &data,
                    layout: l,
                };
                let lanes =
                    reduce::<f64, f64>(x, axes, 0.0, |acc, d, s, n, st| acc + sum_row(d, s, n, st));
                let outer = reduce_outer::<f64, f64>(x, axes, 0.0, |acc, v| acc + v);
                assert_eq!(
                    lanes.to_vec(),
                    outer,
                    "axes {axes:?} strides {:?}",
                    l.strides
                );
                let maxes = reduce::<f64, f64>(x, axes, f64::MIN, |acc, d, s, n, st| {
                    (0..n as isize).fold(acc, |a, i| a.max(d[(s + i * st) as usize]))
                });
                assert_eq!(
                    maxes.to_vec(),
                    reduce_outer::<f64, f64>(x, axes, f64::MIN, f64::max)
                );
            }
        }
        let rows = layout(&[2, 3, 4], &[12, 4, 1], 0);
        assert!(prefers_outer(&rows, &[0]));
        assert!(!prefers_outer(&rows, &[2]));
        assert!(!prefers_outer(&layouts[1], &[0]));
    }

    /// Reductions big enough to split across threads (by output) give exactly what a
    /// plain loop over every element gives, for every set of axes, on contiguous,
    /// reversed and transposed layouts; and the same bits on one thread as on all of
    /// rayon's.
    #[test]
    fn reductions_split_across_threads_match_a_plain_loop() {
        let dims = [64usize, 72, 80];
        let n: usize = dims.iter().product();
        assert!(n >= PARALLEL_ELEMS);
        // Integer values: sums are exact whatever the order.
        let ints: Vec<f64> = (0..n).map(|v| (v * 7 % 11) as f64).collect();
        let layouts = [
            layout(&[64, 72, 80], &[72 * 80, 80, 1], 0),
            layout(&[80, 72, 64], &[1, 80, 72 * 80], 0),
            layout(&[64, 72, 80], &[72 * 80, 80, -1], 79),
        ];
        for l in &layouts {
            for axes in [&[0usize][..], &[1], &[2], &[0, 1], &[0, 2], &[1, 2]] {
                // The reference: every element added to its output by index.
                let kept: Vec<usize> = (0..3).filter(|d| !axes.contains(d)).collect();
                let d = l.shape.dims();
                let mut want = vec![0.0; kept.iter().map(|&k| d[k]).product()];
                for i in 0..d[0] {
                    for j in 0..d[1] {
                        for k in 0..d[2] {
                            let idx = [i, j, k];
                            let o = kept.iter().fold(0, |o, &q| o * d[q] + idx[q]);
                            let at = l.offset as isize
                                + (0..3)
                                    .map(|q| idx[q] as isize * l.strides[q])
                                    .sum::<isize>();
                            want[o] += ints[at as usize];
                        }
                    }
                }
                let x = Strided {
                    data: &ints,
                    layout: l,
                };
                let lanes =
                    reduce::<f64, f64>(x, axes, 0.0, |acc, d, s, n, st| acc + sum_row(d, s, n, st));
                assert_eq!(
                    lanes.to_vec(),
                    want,
                    "lanes, axes {axes:?} strides {:?}",
                    l.strides
                );
                let outer = reduce_outer::<f64, f64>(x, axes, 0.0, |acc, v| acc + v);
                assert_eq!(outer, want, "outer, axes {axes:?} strides {:?}", l.strides);
            }
        }
        // Fractions: the split keeps each output's order, so the bits do not depend on
        // the number of threads.
        let fracs: Vec<f32> = (0..n)
            .map(|v| ((v * 37 % 101) as f32).sqrt() / 7.0)
            .collect();
        let run = || {
            let x = Strided {
                data: &fracs,
                layout: &layouts[0],
            };
            let outer = reduce_outer::<f32, f32>(x, &[0], 0.0, |acc, v| acc + v);
            let lanes =
                reduce::<f32, f32>(x, &[2], 0.0, |acc, d, s, n, st| acc + sum_row(d, s, n, st));
            (outer, lanes.to_vec())
        };
        // On a rayon worker kernels do not fork; from this thread they use the pool.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let (one, many) = (pool.install(run), run());
        assert_eq!(one, many);
        // ... and an output's elements are added in row order, as a plain loop does.
        let cols = 72 * 80;
        let mut plain = vec![0.0f32; cols];
        for r in 0..64 {
            for (p, &v) in plain.iter_mut().zip(&fracs[r * cols..(r + 1) * cols]) {
                *p += v;
            }
        }
        assert_eq!(one.0, plain);
    }

    /// Under [`NoFork`] (what the engine holds while it computes under a shard lock) a
    /// reduction big enough to split runs entirely on the calling thread; without it,
    /// the kernel pool's threads (and only those) take part, unless the caller is itself
    /// a rayon task. Guards may nest.
    #[test]
    fn kernels_do_not_fork_under_a_shard_lock() {
        use std::collections::HashSet;
        use std::sync::Mutex;
        let n = 64 * 4096;
        assert!(n >= PARALLEL_ELEMS);
        let data: Vec<f32> = (0..n).map(|v| (v % 3) as f32).collect();
        let l = layout(&[64, 4096], &[4096, 1], 0);
        let threads_used = || {
            let seen = Mutex::new(HashSet::new());
            let x = Strided {
                data: &data,
                layout: &l,
            };
            reduce_outer::<f32, f32>(x, &[0], 0.0, |acc, v| {
                seen.lock().unwrap().insert(std::thread::current().id());
                acc + v
            });
            reduce::<f32, f32>(x, &[1], 0.0, |acc, d, s, n, st| {
                seen.lock().unwrap().insert(std::thread::current().id());
                acc + sum_row(d, s, n, st)
            });
            seen.into_inner().unwrap()
        };
        let me = std::thread::current().id();
        {
            let _outer = NoFork::new();
            let _inner = NoFork::new();
            assert!(!may_fork());
            assert_eq!(threads_used(), HashSet::from([me]));
        }
        assert!(may_fork());
        // A split kernel runs on the kernel pool alone: never on rayon's global pool,
        // whose workers may be running user tasks.
        let names = Mutex::new(HashSet::new());
        let x = Strided {
            data: &data,
            layout: &l,
        };
        reduce_outer::<f32, f32>(x, &[0], 0.0, |acc, v| {
            let t = std::thread::current();
            names.lock().unwrap().insert(t.name().map(str::to_owned));
            acc + v
        });
        let names = names.into_inner().unwrap();
        assert!(
            names.iter().all(|n| n
                .as_deref()
                .is_some_and(|n| n.starts_with("ndscope-kernel-"))),
            "{names:?}"
        );
        if fork_threads() > 1 {
            assert!(threads_used().iter().any(|&t| t != me));
        }
        // Called from inside a rayon task, a kernel runs on that task's thread alone.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        pool.install(|| {
            assert!(!may_fork());
            assert_eq!(threads_used(), HashSet::from([std::thread::current().id()]));
        });
    }

    /// The engine computes an op, an in-place update and a read under its locks with
    /// forking off, and turns it back on when it lets go.
    #[test]
    fn the_engine_holds_no_fork_while_it_computes_under_a_lock() {
        let m = crate::NDManager::new();
        let a = m.ones([4], crate::DType::F32);
        assert!(!crate::engine::read(a.id, |_| may_fork()).unwrap());
        let mut seen = None;
        let b = crate::engine::run_op("probe", &[a.id], std::panic::Location::caller(), |o| {
            seen = Some(may_fork());
            Ok(crate::engine::Output::View {
                of: 0,
                layout: o[0].layout.clone(),
            })
        })
        .unwrap();
        assert_eq!(seen, Some(false));
        let mut seen = None;
        crate::engine::run_inplace(a.id, &[], |_, _| {
            seen = Some(may_fork());
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, Some(false));
        assert!(may_fork());
        let _ = b;
        m.close();
    }

    /// Products below and above [`TINY_MATMUL_FLOPS`] (the plain loop and gemm) agree
    /// with an f64 reference, on a transposed left operand read with negative and
    /// positive strides.
    #[test]
    fn tiny_and_gemm_products_agree_with_a_reference() {
        for (m, k, n) in [(2, 64, 1), (4, 16, 4), (3, 7, 5), (4, 64, 2), (8, 40, 8)] {
            // `a` is stored as [k, m] and read transposed, rows reversed.
            let da: Vec<f32> = (0..k * m)
                .map(|v| ((v * 37 % 17) as f32 - 8.0) / 4.0)
                .collect();
            let db: Vec<f32> = (0..k * n)
                .map(|v| ((v * 11 % 13) as f32 - 6.0) / 3.0)
                .collect();
            let a = Mat {
                data: &da,
                off: (m - 1) as isize,
                rs: -1,
                cs: m as isize,
            };
            let b = Mat {
                data: &db,
                off: 0,
                rs: n as isize,
                cs: 1,
            };
            let mut out = vec![0f32; m * n];
            matmul_2d(m, n, k, a, b, &mut out);
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k)
                        .map(|p| da[p * m + (m - 1 - i)] as f64 * db[p * n + j] as f64)
                        .sum();
                    let got = out[i * n + j] as f64;
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "({m},{k},{n}) [{i},{j}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}
