//! The normalisation kernels behind `layer_norm` and `batch_norm` (group statistics,
//! then `(x - mean) / sqrt(var + eps) * gamma + beta`, and its gradient), and
//! `batch_norm`'s in-place update of its running statistics.
//!
//! # How the work is split
//! A *group* is the set of elements that agree on the kept axes (a sample for
//! `layer_norm`, a channel for `batch_norm`); the statistics are per group. Each kernel
//! runs in two phases, each split across threads when large (see `fork`):
//! 1. **Per group**, reading only: the statistics (forward) or the gradient's group sums
//!    (backward). Groups are independent, so they run in parallel; parameter gradients
//!    summed element by element (`layer_norm`'s gamma) go into one accumulator per
//!    *part*, a fixed run of groups, added in part order at the end. The parts depend on
//!    the sizes only, never on the thread count, so the bits do not either. The
//!    gradient walks a part's groups box by box (`for_each_box`: about 1,024 elements
//!    of every group, then the next box), so a box's accumulators stay in the L1 cache
//!    while each group adds into them.
//! 2. **Per element**, writing: an elementwise pass over the result in row-major order
//!    that reads each element's group values through a *group index* (a stride per axis:
//!    the kept axes' row-major strides, 0 on the normalised ones). The result is
//!    contiguous, so it splits into disjoint runs along its first long axis.
//!
//! Rows are processed in chunks of [`CHUNK`] elements, so the arithmetic is straight
//! loops over slices, which vectorise whatever the operands' strides: the write passes
//! read a contiguous operand in place and copy a strided one into a small array (a
//! broadcast one is a fill, see `view`); the sums load the group's elements as f64
//! into chunk arrays (`in_chunks`), so a view and its contiguous copy sum in the same
//! lanes. The sums (statistics, gradient group sums, gamma's and beta's) are f64 (an
//! f32 group's mean and variance in one pass, see `group_stats`); the
//! write passes compute in the input's dtype from per-group values rounded once.

use super::buffer::{Buffer, PoolVec, new_overwritten, with_scratch};
use super::fork::{PARALLEL_ELEMS, fork, may_fork};
use super::simd::widest;
use super::strided::{Strided, StridedMut};
use crate::dtype::{Float, Native};
use crate::error::Result;
use crate::layout::{Strides, for_each_row};
use crate::shape::{Dims, Shape};
use rayon::prelude::*;

/// A per-element affine operand (`gamma`, `beta`) seen with one stride per axis of the
/// normalised array.
pub(crate) struct Affine<'a, T> {
    data: &'a [T],
    strides: Strides,
    offset: usize,
}

impl<'a, T: Native> Affine<'a, T> {
    /// `o` broadcast to `shape` (`channel`: `o` is `[C]` along axis 1 of `shape`).
    pub(crate) fn of(o: Strided<'a, T>, shape: &Shape, channel: bool) -> Affine<'a, T> {
        let strides = if channel {
            let mut s = Strides::from_elem(0, shape.ndim());
            s[1] = o.layout.strides[0];
            s
        } else {
            o.layout.broadcast_strides(shape)
        };
        Affine {
            data: o.data,
            strides,
            offset: o.layout.offset,
        }
    }

    /// The constant `v` everywhere.
    pub(crate) fn constant(v: &'a [T], ndim: usize) -> Affine<'a, T> {
        Affine {
            data: v,
            strides: Strides::from_elem(0, ndim),
            offset: 0,
        }
    }
}

/// Elements of a row loaded into the chunk arrays at a time.
const CHUNK: usize = 64;

/// Independent f64 sums a group's statistics keep (so the loops vectorise).
const LANES: usize = 8;

/// At most this many parts sum a gradient per element (each has its own accumulator).
const MAX_PARTS: usize = 4;

/// The groups of a normalisation of an array of shape `dims` over the axes `red`.
struct Groups<'a> {
    dims: &'a [usize],
    red: &'a [bool],
    /// The normalised axes' sizes.
    nd: Dims,
    /// How many groups, and elements per group.
    count: usize,
    m: usize,
    /// One stride per axis of `x`: a group's row-major index over the kept axes (0 on
    /// the normalised ones).
    index: Strides,
}

impl<'a> Groups<'a> {
    fn new(dims: &'a [usize], red: &'a [bool]) -> Groups<'a> {
        let mut index = Strides::from_elem(0, dims.len());
        let (mut count, mut nd) = (1usize, Dims::new());
        for d in (0..dims.len()).rev() {
            if red[d] {
                nd.insert(0, dims[d]);
            } else {
                index[d] = count as isize;
                count *= dims[d];
            }
        }
        let m = nd.iter().product();
        Groups {
            dims,
            red,
            nd,
            count,
            m,
            index,
        }
    }

    /// Where group `gi` starts through strides `s` (one per axis) from `base`.
    fn start(&self, gi: usize, s: &[isize], base: usize) -> usize {
        let (mut rest, mut off) = (gi, base as isize);
        for d in (0..self.dims.len()).rev().filter(|&d| !self.red[d]) {
            off += (rest % self.dims[d]) as isize * s[d];
            rest /= self.dims[d];
        }
        off as usize
    }

    /// The normalised axes' entries of `s`.
    fn inner(&self, s: &[isize]) -> Strides {
        s.iter()
            .zip(self.red)
            .filter_map(|(&v, &r)| r.then_some(v))
            .collect()
    }
}

/// Elements above which a normalisation splits its phases across threads (the digits
/// CNN's [32,16,8,8] activations run faster on one).
const PARALLEL_NORM: usize = PARALLEL_ELEMS / 4;

/// Whether `work` elements are worth splitting across threads, and this thread may.
fn parallel(work: usize) -> bool {
    work >= PARALLEL_NORM && may_fork()
}

/// `f(i)` for `i` in `0..n`, in parallel when `par`.
fn map_range<R: Send>(n: usize, par: bool, f: impl Fn(usize) -> R + Sync + Send) -> Vec<R> {
    map_each(vec![(); n], par, |i, ()| f(i))
}

/// `f(i, item)` for each of `items` in order, in parallel when `par`.
fn map_each<A: Send, R: Send>(
    items: Vec<A>,
    par: bool,
    f: impl Fn(usize, A) -> R + Sync + Send,
) -> Vec<R> {
    if par && items.len() > 1 {
        fork(|| {
            let each = items.into_par_iter().enumerate();
            each.map(|(i, a)| f(i, a)).collect()
        })
    } else {
        items
            .into_iter()
            .enumerate()
            .map(|(i, a)| f(i, a))
            .collect()
    }
}

/// Write the contiguous `out` (shape `dims`) row by row: `f(offsets, len, steps, dst)`
/// for each row of the walk over `dims` of operands `strides` (one entry per axis each)
/// from `base`, `dst` being that row's `len` elements of `out`, compiled for the widest
/// vector unit (mark `f` `#[inline(always)]`). When `par`, the runs along the first axis
/// longer than 1 are written in parallel.
fn write_rows<T: Native, const K: usize>(
    dims: &[usize],
    strides: [&[isize]; K],
    base: [usize; K],
    out: &mut [T],
    par: bool,
    f: impl Fn([isize; K], usize, [isize; K], &mut [T]) + Sync,
) {
    let run = |dims: &[usize], strides: [&[isize]; K], base: [usize; K], out: &mut [T]| {
        let mut pos = 0;
        for_each_row(dims, strides, base, |o, len, st| {
            let dst = &mut out[pos..pos + len];
            widest(
                #[inline(always)]
                || f(o, len, st, dst),
            );
            pos += len;
        });
    };
    let axis = dims.iter().position(|&d| d > 1).unwrap_or(0);
    let inner: usize = dims.iter().skip(axis + 1).product();
    if !par || inner < CHUNK || out.is_empty() {
        return run(dims, strides, base, out);
    }
    let sub = strides.map(|s| &s[axis + 1..]);
    fork(|| {
        out.par_chunks_mut(inner)
            .with_min_len((PARALLEL_NORM / 8 / inner).max(1))
            .enumerate()
            .for_each(|(i, dst)| {
                let at = std::array::from_fn(|k| {
                    (base[k] as isize + i as isize * strides[k][axis]) as usize
                });
                run(&dims[axis + 1..], sub, at, dst)
            })
    });
}

/// `out[i] = f(d[p + i*s])` (a contiguous run is one vectorised loop, a broadcast one a
/// fill).
#[inline(always)]
fn load<S: Copy, D: Copy>(d: &[S], p: isize, s: isize, out: &mut [D], f: impl Fn(S) -> D) {
    match s {
        1 => {
            let src = &d[p as usize..p as usize + out.len()];
            for (o, &v) in out.iter_mut().zip(src) {
                *o = f(v);
            }
        }
        0 => out.fill(f(d[p as usize])),
        _ => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = f(d[(p + i as isize * s) as usize]);
            }
        }
    }
}

/// The `k` elements `d[p + i*s]`: the slice itself when contiguous, else copied into
/// `buf` (a broadcast one filled), so the arithmetic after it reads plain slices either
/// way and a contiguous operand costs no copy.
#[inline(always)]
fn view<'a, T: Copy>(d: &'a [T], p: isize, s: isize, k: usize, buf: &'a mut [T]) -> &'a [T] {
    if s == 1 {
        &d[p as usize..p as usize + k]
    } else {
        load(d, p, s, &mut buf[..k], |v| v);
        &buf[..k]
    }
}

/// `lanes[j % LANES] += f(v[j])`.
#[inline(always)]
fn add_lanes(lanes: &mut [f64; LANES], v: &[f64], f: impl Fn(f64) -> f64) {
    // A local copy: the sums stay in a register (through `lanes` they would be stored
    // back at every element, one lane at a time, as it may alias `v`).
    let mut l = *lanes;
    let quads = v.chunks_exact(LANES);
    let rest = quads.remainder();
    for q in quads {
        for j in 0..LANES {
            l[j] += f(q[j]);
        }
    }
    for (j, &e) in rest.iter().enumerate() {
        l[j] += f(e);
    }
    *lanes = l;
}

/// The sum of the lanes, pairwise.
fn lanes_total(l: &[f64; LANES]) -> f64 {
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

/// One step of [`in_chunks`]: load elements `range` of the chunk buffers from the
/// operands at these offsets and steps, or use the first `k` elements (`Flush`).
enum Step<const K: usize> {
    Load([isize; K], [isize; K], std::ops::Range<usize>),
    Flush(usize),
}

/// Walk one group (the normalised axes `nd`, each operand's strides along them, from
/// `at`) in chunks of [`CHUNK`] elements, whatever rows the walk takes: the group's
/// element `i` sits at position `i % CHUNK` of its chunk, so its lane in a sum is the
/// same for a view as for its contiguous copy, and so are the bits of the sum.
/// `step(Load(..))` fills part of the chunk, `step(Flush(k))` uses a chunk of `k`; a
/// row's steps run as one loop compiled for the widest vector unit (mark `step`
/// `#[inline(always)]`), so a long row pays for one dispatch, not one per chunk.
fn in_chunks<const K: usize>(
    nd: &[usize],
    inner: [&[isize]; K],
    at: [usize; K],
    mut step: impl FnMut(Step<K>),
) {
    let mut fill = 0;
    for_each_row(nd, inner, at, |o, n, st| {
        widest(
            #[inline(always)]
            || {
                let mut done = 0;
                while done < n {
                    let take = (CHUNK - fill).min(n - done);
                    let p = std::array::from_fn(|j| o[j] + done as isize * st[j]);
                    step(Step::Load(p, st, fill..fill + take));
                    (fill, done) = (fill + take, done + take);
                    if fill == CHUNK {
                        step(Step::Flush(CHUNK));
                        fill = 0;
                    }
                }
            },
        )
    });
    if fill > 0 {
        widest(
            #[inline(always)]
            || step(Step::Flush(fill)),
        );
    }
}

/// Elements in a box of [`for_each_box`] (gamma's and beta's accumulators of a box,
/// 16 KB in f64, stay in the L1 cache).
const BOX: usize = 1024;

/// Cut a group's normalised axes `nd` (each operand's strides along them `inner`) into
/// boxes of about [`BOX`] elements, and call `f(dims, strides, offsets)` for each in
/// the group's element order: `dims` the box's extents along axes `s..` of `nd`,
/// `strides` the operands' strides along them, `offsets` where the box starts relative
/// to the group's start. A box is a run of whole inner axes `s+1..` over a range of
/// axis `s`, the deepest axis such that those inner axes hold at most `BOX` elements
/// (one axis longer than `BOX` is cut into ranges of `BOX`), so boxes depend on the
/// shape alone: a view and its contiguous copy are cut alike. Where the boxes' sizes
/// are multiples of [`CHUNK`] (any power-of-two shape), walking a group box by box
/// puts each element in the same chunk position, so the same lane, as walking it whole.
fn for_each_box<const K: usize>(
    nd: &[usize],
    inner: [&[isize]; K],
    mut f: impl FnMut(&[usize], [&[isize]; K], [isize; K]),
) {
    let Some(mut s) = nd.len().checked_sub(1) else {
        return f(&[], inner, [0; K]);
    };
    if nd.contains(&0) {
        return;
    }
    let mut below = 1usize;
    while s > 0 && below.saturating_mul(nd[s]) <= BOX {
        below *= nd[s];
        s -= 1;
    }
    let run = (BOX / below).clamp(1, nd[s].max(1));
    let mut dims: Dims = nd[s..].iter().copied().collect();
    let sub = inner.map(|st| &st[s..]);
    let outer = inner.map(|st| &st[..s]);
    for_each_row(&nd[..s], outer, [0; K], |o, n, st| {
        for i in 0..n as isize {
            for start in (0..nd[s]).step_by(run) {
                dims[0] = run.min(nd[s] - start);
                let at = std::array::from_fn(|k| o[k] + i * st[k] + start as isize * sub[k][0]);
                f(&dims, sub, at);
            }
        }
    });
}

/// `Σ f(x)` over one group (f64 lanes).
fn group_sum<T: Native>(
    xd: &[T],
    start: usize,
    nd: &[usize],
    xn: &[isize],
    f: impl Fn(f64) -> f64,
) -> f64 {
    let (mut buf, mut lanes) = ([0.0f64; CHUNK], [0.0; LANES]);
    in_chunks(
        nd,
        [xn],
        [start],
        #[inline(always)]
        |step| match step {
            Step::Load(p, st, r) => load(xd, p[0], st[0], &mut buf[r], |v| v.to_f64()),
            Step::Flush(k) => add_lanes(&mut lanes, &buf[..k], &f),
        },
    );
    lanes_total(&lanes)
}

/// One group's mean and biased variance, accumulated in f64.
///
/// Inputs narrower than f64 (f32) take one pass: the sums of `d = x - k` and `d²`
/// with `k` the group's first element, then `var = Σd²/m - (Σd/m)²`. The subtraction
/// cancels at most a factor `(k - mean)² / var + 1 ≤ m` (no element lies farther than
/// `sqrt(m - 1)` standard deviations from the mean: Samuelson's inequality), a few
/// units unless the first element is an outlier. With the lane sums' own error (about
/// `m / 8` roundings of f64) that bounds the variance's relative error by roughly
/// `m² / 8 · 2⁻⁵³`: within f32's rounding (2⁻²⁴) for groups up to 2¹⁶ elements even in
/// the worst case, and far below it on ordinary data. f64 inputs have no spare bits
/// and keep two passes (the mean, then `Σ(x - mean)²`).
fn group_stats<T: Native>(
    xd: &[T],
    start: usize,
    nd: &[usize],
    xn: &[isize],
    m: usize,
) -> (f64, f64) {
    let mf = m as f64;
    if std::mem::size_of::<T>() >= 8 || m == 0 {
        let mean = group_sum(xd, start, nd, xn, |v| v) / mf;
        let var = group_sum(xd, start, nd, xn, |v| (v - mean) * (v - mean)) / mf;
        return (mean, var);
    }
    let k = xd[start].to_f64();
    let (mut buf, mut s1, mut s2) = ([0.0f64; CHUNK], [0.0; LANES], [0.0; LANES]);
    in_chunks(
        nd,
        [xn],
        [start],
        #[inline(always)]
        |step| match step {
            Step::Load(p, st, r) => load(xd, p[0], st[0], &mut buf[r], |v| v.to_f64() - k),
            Step::Flush(n) => {
                // Local copies, as in `add_lanes`.
                let (mut a, mut b) = (s1, s2);
                let quads = buf[..n].chunks_exact(LANES);
                let rest = quads.remainder();
                for q in quads {
                    for j in 0..LANES {
                        a[j] += q[j];
                        b[j] += q[j] * q[j];
                    }
                }
                for (j, &d) in rest.iter().enumerate() {
                    a[j] += d;
                    b[j] += d * d;
                }
                (s1, s2) = (a, b);
            }
        },
    );
    let d = lanes_total(&s1) / mf;
    (k + d, (lanes_total(&s2) / mf - d * d).max(0.0))
}

/// The normalisation kernel: for every group of elements that agree on the kept axes
/// (`!red`), `y = (x - mean) / sqrt(var + eps) * gamma + beta`, with the group's mean and
/// biased variance (f64 accumulation, [`group_stats`]), or the `given` per-group statistics.
/// Returns `y` (contiguous, `x`'s shape) and the per-group mean and variance in
/// row-major order of the kept axes.
pub(crate) fn normalize_kernel<T: Float>(
    x: Strided<'_, T>,
    red: &[bool],
    gamma: &Affine<'_, T>,
    beta: &Affine<'_, T>,
    eps: f64,
    given: Option<(Vec<f64>, Vec<f64>)>,
) -> Result<(Buffer, Vec<f64>, Vec<f64>)> {
    let (l, xd) = (x.layout, x.data);
    let gr = Groups::new(l.shape.dims(), red);
    let par = parallel(l.size());
    let (means, vars): (Vec<f64>, Vec<f64>) = match given {
        Some(stats) => stats,
        None => {
            let xn = gr.inner(&l.strides);
            map_range(gr.count, par && gr.m >= CHUNK, |gi| {
                let start = gr.start(gi, &l.strides, l.offset);
                group_stats(xd, start, &gr.nd, &xn, gr.m)
            })
            .into_iter()
            .unzip()
        }
    };
    // The write pass's per-group values, in `T` (`(x - mean) * rstd * gamma + beta`).
    let mu: Vec<T> = means.iter().map(|&v| T::from_f64(v)).collect();
    let rs: Vec<T> = vars
        .iter()
        .map(|&v| T::from_f64(1.0 / (v + eps).sqrt()))
        .collect();
    let strides = [&l.strides[..], &gamma.strides, &beta.strides, &gr.index];
    let base = [l.offset, gamma.offset, beta.offset, 0];
    let buf = new_overwritten::<T>(l.size(), |out| {
        write_rows(
            gr.dims,
            strides,
            base,
            out,
            par,
            #[inline(always)]
            |o, len, st, dst| {
                let [mut xb, mut gb, mut bb, mut mb, mut sb] = [[T::ZERO; CHUNK]; 5];
                for c0 in (0..len).step_by(CHUNK) {
                    let k = CHUNK.min(len - c0);
                    let at = |j: usize| o[j] + c0 as isize * st[j];
                    let xs = view(xd, at(0), st[0], k, &mut xb);
                    let gs = view(gamma.data, at(1), st[1], k, &mut gb);
                    let bs = view(beta.data, at(2), st[2], k, &mut bb);
                    let dst = &mut dst[c0..c0 + k];
                    if st[3] == 0 {
                        // One group along the row (the usual case).
                        let (m, r) = (mu[at(3) as usize], rs[at(3) as usize]);
                        for i in 0..k {
                            dst[i] = xs[i].sub(m).mul(r).mul(gs[i]).add(bs[i]);
                        }
                    } else {
                        let ms = view(&mu, at(3), st[3], k, &mut mb);
                        let ss = view(&rs, at(3), st[3], k, &mut sb);
                        for i in 0..k {
                            dst[i] = xs[i].sub(ms[i]).mul(ss[i]).mul(gs[i]).add(bs[i]);
                        }
                    }
                }
            },
        );
    })?;
    Ok((buf, means, vars))
}

/// `batch_norm`'s running-statistics update, in place on a `[C]` target:
/// `running[ch] = (1 - momentum) * running[ch] + momentum * batch[ch] * scale`.
pub(crate) fn update_running<T: Native>(
    t: StridedMut<'_, T>,
    batch: &[f64],
    momentum: f64,
    scale: f64,
) {
    let (off, stride) = (t.layout.offset as isize, t.layout.strides[0]);
    let d = t.data;
    for (ch, &b) in batch.iter().enumerate() {
        let e = &mut d[(off + ch as isize * stride) as usize];
        *e = T::from_f64((1.0 - momentum) * e.to_f64() + momentum * b * scale);
    }
}

/// `put(&mut acc[p + i*s], v_i)` (a write or an add, inlined).
#[inline(always)]
fn put_strided(
    acc: &mut [f64],
    p: isize,
    s: isize,
    v: impl Iterator<Item = f64>,
    put: impl Fn(&mut f64, f64),
) {
    if s == 1 {
        for (a, x) in acc[p as usize..].iter_mut().zip(v) {
            put(a, x);
        }
    } else {
        for (i, x) in v.enumerate() {
            put(&mut acc[(p + i as isize * s) as usize], x);
        }
    }
}

/// What [`normalize_grad_kernel`] gives back: `dx` (contiguous, `x`'s shape) and the
/// sums `Σ g * xhat` and `Σ g` into their accumulators (gamma's and beta's gradients).
pub(crate) struct NormGrad {
    pub dx: Buffer,
    pub dgamma: PoolVec<f64>,
    pub dbeta: PoolVec<f64>,
}

/// Where [`normalize_grad_kernel`] sums one parameter's gradient: the strides, one per
/// axis of `x`, of a contiguous array of the parameter's shape broadcast to `x`'s (0 on
/// the axes it is broadcast along), and that array's size.
pub(crate) struct SumInto<'a> {
    pub strides: &'a [isize],
    pub size: usize,
}

/// The gradient of [`normalize_kernel`] in two phases (f64 accumulation), in place of a
/// dozen whole-array ops: with `xhat = (x - mean) * rstd` and `dxhat = g * gamma`,
/// `dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))` when the statistics
/// came from the group (`batch_stats`), else `dxhat * rstd`; and gamma's and beta's
/// gradients, `g * xhat` and `g` summed into `sums`. `g` has `x`'s shape (any strides,
/// broadcast included); `mean` and `rstd` hold one value per group, in row-major order
/// of the kept axes.
pub(crate) fn normalize_grad_kernel<T: Float>(
    x: Strided<'_, T>,
    g: Strided<'_, T>,
    red: &[bool],
    gamma: &Affine<'_, T>,
    (mean, rstd): (&[f64], &[f64]),
    batch_stats: bool,
    [sg_into, sb_into]: [SumInto<'_>; 2],
) -> Result<NormGrad> {
    let (l, xd, gd) = (x.layout, x.data, g.data);
    let gs = g.layout.broadcast_strides(&l.shape);
    let gr = Groups::new(l.shape.dims(), red);
    let m = gr.m as f64;
    let strides = [
        &l.strides[..],
        &gs,
        &gamma.strides,
        sg_into.strides,
        sb_into.strides,
    ];
    let base = [l.offset, g.layout.offset, gamma.offset, 0, 0];
    let inner = strides.map(|s| gr.inner(s));
    let inner = [&inner[0][..], &inner[1], &inner[2], &inner[3], &inner[4]];
    // A parameter summed element by element (layer_norm's gamma) gets an accumulator per
    // part; else each group sums into one cell of both (batch_norm's channels, or an
    // unwanted parameter's dummy), added in group order below.
    let per_element = inner[3].iter().chain(inner[4]).any(|&s| s != 0);
    let par = parallel(l.size());
    let parts = if per_element {
        (l.size() / PARALLEL_NORM)
            .clamp(1, MAX_PARTS)
            .min(gr.count.max(1))
    } else {
        gr.count
    };
    let part = |p: usize| (p * gr.count / parts)..((p + 1) * gr.count / parts);
    // Phase 1: per group, Σ dxhat, Σ dxhat*xhat, Σ g*xhat and Σ g, each part's groups
    // walked box by box (`for_each_box`): one box of every group of the part, then the
    // next box, so the element-by-element accumulators of a box stay in the L1 cache
    // while the part's groups add into them (walked group by group, a part's
    // accumulators, 1 MB for a [64,32,32] gamma and beta in f64, came back from the L3
    // cache for every group, and all of them were zeroed first: `layernorm_big` took
    // 3-9% longer).
    // The parts' element-by-element accumulators (gamma's, then beta's, per part) are
    // scratch from the buffer pool: no fresh pages to fault in at every call. In each box
    // the part's first group writes the cells the others add into (`first_writes`).
    let (gn, bn) = match per_element {
        true => (sg_into.size, sb_into.size),
        false => (0, 0),
    };
    // Whether a part's first group writes each cell once, before the others add into
    // it: every group reaches every cell (none moves along a kept axis, and `x` has
    // elements: an empty `x` reaches no cell, and its parameters' gradients are zeros),
    // and no two elements of a group share a cell (no parameter is broadcast along a
    // normalised axis). Else the scratch is zeroed first and every group adds.
    let first_writes = per_element
        && l.size() > 0
        && (0..red.len()).all(|d| {
            let (g, b) = (strides[3][d], strides[4][d]);
            match red[d] {
                true => l.shape.dims()[d] == 1 || (g != 0 && b != 0),
                false => g == 0 && b == 0,
            }
        });
    let (mut dgamma, mut dbeta, partial) = with_scratch::<f64, _>(parts * (gn + bn), |acc| {
        if !first_writes {
            acc.fill(0.0);
        }
        let accs: Vec<&mut [f64]> = match gn + bn {
            0 => (0..parts).map(|_| &mut [][..]).collect(),
            n => acc.chunks_mut(n).collect(),
        };
        let partial = map_each(accs, par && l.size() >= parts * CHUNK, |p, acc| {
            let (dg, db) = acc.split_at_mut(gn);
            let (mut xs, mut ys, mut cs) = ([0.0; CHUNK], [0.0; CHUNK], [0.0; CHUNK]);
            let groups = part(p);
            let starts: Vec<([usize; 5], f64, f64)> = groups
                .map(|gi| {
                    let at = std::array::from_fn(|k| gr.start(gi, strides[k], base[k]));
                    (at, mean[gi], rstd[gi])
                })
                .collect();
            let mut lanes = vec![[[0.0f64; LANES]; 4]; starts.len()];
            for_each_box(&gr.nd, inner, |dims, inner, delta| {
                let at =
                    |a: &[usize; 5]| std::array::from_fn(|k| (a[k] as isize + delta[k]) as usize);
                for (i, ((a, mu, rs), lanes)) in starts.iter().zip(lanes.iter_mut()).enumerate() {
                    let (mu, rs, write) = (*mu, *rs, first_writes && i == 0);
                    in_chunks(
                        dims,
                        inner,
                        at(a),
                        #[inline(always)]
                        |step| match step {
                            Step::Load(p, st, r) => {
                                let (xs, ys) = (&mut xs[r.clone()], &mut ys[r.clone()]);
                                load(xd, p[0], st[0], xs, |v| (v.to_f64() - mu) * rs); // xhat
                                load(gd, p[1], st[1], ys, |v| v.to_f64());
                                load(gamma.data, p[2], st[2], &mut cs[r], |v| v.to_f64());
                                if per_element {
                                    let gx = xs.iter().zip(ys.iter()).map(|(x, g)| g * x);
                                    let gs = ys.iter().copied();
                                    if write {
                                        let set = |a: &mut f64, x| *a = x;
                                        put_strided(dg, p[3], st[3], gx, set);
                                        put_strided(db, p[4], st[4], gs, set);
                                    } else {
                                        let add = |a: &mut f64, x| *a += x;
                                        put_strided(dg, p[3], st[3], gx, add);
                                        put_strided(db, p[4], st[4], gs, add);
                                    }
                                }
                            }
                            Step::Flush(k) => {
                                // A local copy, as in `add_lanes`.
                                let mut l = *lanes;
                                let (xs, ys, cs) = (&xs[..k], &ys[..k], &cs[..k]);
                                let q = xs.chunks_exact(LANES).zip(ys.chunks_exact(LANES));
                                for ((x8, g8), c8) in q.zip(cs.chunks_exact(LANES)) {
                                    for j in 0..LANES {
                                        let dxh = g8[j] * c8[j];
                                        l[0][j] += dxh;
                                        l[1][j] += dxh * x8[j];
                                        l[2][j] += g8[j] * x8[j];
                                        l[3][j] += g8[j];
                                    }
                                }
                                for (j, i) in (k - k % LANES..k).enumerate() {
                                    let dxh = ys[i] * cs[i];
                                    l[0][j] += dxh;
                                    l[1][j] += dxh * xs[i];
                                    l[2][j] += ys[i] * xs[i];
                                    l[3][j] += ys[i];
                                }
                                *lanes = l;
                            }
                        },
                    );
                }
            });
            let sums: Vec<[f64; 4]> = lanes.iter().map(|l| l.map(|l| lanes_total(&l))).collect();
            (sums, &*dg, &*db)
        });
        // The parts' accumulators, added in part order (into blocks from the pool: a
        // fresh `Vec` of `layernorm_big`'s 512 KB faulted in its pages at every call).
        let zeros = |n: usize| PoolVec::new(n, |out: &mut [f64]| out.fill(0.0));
        let (mut dgamma, mut dbeta) = (zeros(sg_into.size)?, zeros(sb_into.size)?);
        let sums: Vec<_> = partial
            .into_iter()
            .map(|(sums, dg, db)| {
                dgamma.iter_mut().zip(dg).for_each(|(a, v)| *a += v);
                dbeta.iter_mut().zip(db).for_each(|(a, v)| *a += v);
                sums
            })
            .collect();
        Ok::<_, crate::error::NdError>((dgamma, dbeta, sums))
    })??;
    // Per group: mean(dxhat) and mean(dxhat * xhat), 0 with fixed statistics.
    let (mut m1, mut m2) = (Vec::with_capacity(gr.count), Vec::with_capacity(gr.count));
    for (p, sums) in partial.into_iter().enumerate() {
        for (gi, s) in part(p).zip(sums) {
            if !per_element {
                dgamma[gr.start(gi, strides[3], 0)] += s[2];
                dbeta[gr.start(gi, strides[4], 0)] += s[3];
            }
            let (a, b) = if batch_stats {
                (s[0] / m, s[1] / m)
            } else {
                (0.0, 0.0)
            };
            m1.push(a);
            m2.push(b);
        }
    }
    // Phase 2: dx, element by element, in `T` (as the forward's write): the per-group
    // values rounded once, `rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))`.
    let in_t = |v: &[f64]| -> Vec<T> { v.iter().map(|&e| T::from_f64(e)).collect() };
    let (mean, rstd, m1, m2) = (in_t(mean), in_t(rstd), in_t(&m1), in_t(&m2));
    let strides = [strides[0], strides[1], strides[2], &gr.index];
    let base = [base[0], base[1], base[2], 0];
    let dx = new_overwritten::<T>(l.size(), |out| {
        write_rows(
            gr.dims,
            strides,
            base,
            out,
            par,
            #[inline(always)]
            |o, len, st, dst| {
                let [mut xb, mut yb, mut cb, mut mb, mut rb, mut ab, mut bb] =
                    [[T::ZERO; CHUNK]; 7];
                for c0 in (0..len).step_by(CHUNK) {
                    let k = CHUNK.min(len - c0);
                    let at = |j: usize| o[j] + c0 as isize * st[j];
                    let xs = view(xd, at(0), st[0], k, &mut xb);
                    let ys = view(gd, at(1), st[1], k, &mut yb);
                    let cs = view(gamma.data, at(2), st[2], k, &mut cb);
                    let dst = &mut dst[c0..c0 + k];
                    #[inline(always)]
                    fn dx<T: Native>(x: T, g: T, c: T, mu: T, rs: T, a: T, b: T) -> T {
                        rs.mul(g.mul(c).sub(a).sub(x.sub(mu).mul(rs).mul(b)))
                    }
                    if st[3] == 0 {
                        // One group along the row (the usual case).
                        let q = at(3) as usize;
                        let (mu, rs, a, b) = (mean[q], rstd[q], m1[q], m2[q]);
                        for i in 0..k {
                            dst[i] = dx(xs[i], ys[i], cs[i], mu, rs, a, b);
                        }
                    } else {
                        let q = (at(3), st[3]);
                        let mus = view(&mean, q.0, q.1, k, &mut mb);
                        let rss = view(&rstd, q.0, q.1, k, &mut rb);
                        let a = view(&m1, q.0, q.1, k, &mut ab);
                        let b = view(&m2, q.0, q.1, k, &mut bb);
                        for i in 0..k {
                            dst[i] = dx(xs[i], ys[i], cs[i], mus[i], rss[i], a[i], b[i]);
                        }
                    }
                }
            },
        );
    })?;
    Ok(NormGrad { dx, dgamma, dbeta })
}
