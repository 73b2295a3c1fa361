//! Convolution kernels: im2col and its adjoint col2im, and `conv2d`'s forward pass and
//! its two gradients (input: col2im of `Wᵀ·G`; weight: `G·colᵀ`), each a gemm per group
//! over chunks of samples. The input is read through its strides (a transposed or sliced
//! view is not copied first).
//!
//! Threads: a kernel worth splitting runs its batch as one range of samples per thread
//! of the kernel pool, each range from im2col to the result on one thread
//! ([`sample_parts`]); the forward and the input gradient write disjoint samples, the
//! weight gradient sums each range apart and adds the sums in order. A batch with fewer
//! samples than threads splits each step instead, when large enough ([`big`]).

use super::PARALLEL_WORK;
use super::buffer::{Buffer, new_filled, new_overwritten, with_scratch};
use super::elementwise::to_vec;
use super::fork::{
    CONV_PARALLEL_FLOPS, NoFork, PARALLEL_FLOPS, fork, fork_if, fork_threads, may_fork,
};
use super::matmul::matmul_2d;
use super::simd::widest;
use super::strided::{Mat, Strided};
use crate::backend::window::{Geom, nchw_strides};
use crate::dtype::Native;
use crate::error::Result;
use crate::layout::Layout;
use rayon::prelude::*;

/// Elements of one im2col buffer: the batch is processed in chunks of samples whose
/// column matrix stays under this size (16 MiB of f32).
const COL_LIMIT: usize = 1 << 22;

/// The im2col matrix of samples `n0..n0+nb` and channels `c0..c0+cg` of `x`: row
/// `(c*kh + ki)*kw + kj`, column `b*L + oy*ow + ox` holds the input element under kernel
/// tap `(ki, kj)` of output position `(oy, ox)` of sample `b` (0 in the padding).
#[allow(clippy::too_many_arguments)]
pub(crate) fn im2col<T: Native>(
    x: &[T],
    l: &Layout,
    g: &Geom,
    n0: usize,
    nb: usize,
    c0: usize,
    cg: usize,
    col: &mut [T],
) {
    let (st, off) = nchw_strides(l);
    let lsz = g.l();
    let ncols = nb * lsz;
    let rows = cg * g.kh * g.kw;
    debug_assert!(col.len() >= rows * ncols);
    if ncols == 0 || rows == 0 {
        return;
    }
    // Unit strides, input rows contiguous and as long as the output's (a "same"
    // convolution): output element p of a tap reads input element p + shift, so the
    // valid elements of all its rows are one run of the input.
    let plane_run = g.sw == 1 && g.sh == 1 && st[3] == 1 && st[2] == g.w as isize && g.ow == g.w;
    let fill_row = |r: usize, dst: &mut [T]| {
        let c = r / (g.kh * g.kw);
        let ki = (r / g.kw) % g.kh;
        let kj = r % g.kw;
        let (ylo, yhi) = g.rows(ki);
        let (xlo, xhi) = g.cols(kj);
        for b in 0..nb {
            let base = off + (n0 + b) as isize * st[0] + (c0 + c) as isize * st[1];
            let d = &mut dst[b * lsz..(b + 1) * lsz];
            if plane_run && ylo < yhi && xlo < xhi {
                // One copy from the first valid element to the last, then zeros
                // outside the valid columns (the edges the run wrapped over).
                let (first, last) = (ylo * g.ow + xlo, (yhi - 1) * g.ow + xhi);
                let iy = (ylo + ki * g.dh - g.ph) as isize;
                let ix = (xlo + kj * g.dw - g.pw) as isize;
                let s = (base + iy * st[2] + ix) as usize;
                d[..first].fill(T::ZERO);
                d[first..last].copy_from_slice(&x[s..s + (last - first)]);
                d[last..].fill(T::ZERO);
                zero_gaps(d, g, (ylo, yhi), (xlo, xhi));
                continue;
            }
            for oy in 0..g.oh {
                let drow = &mut d[oy * g.ow..(oy + 1) * g.ow];
                // A tap whose every input column lies in the padding (xlo == xhi) reads
                // nothing: its first input column may be negative, so no start is formed.
                if oy < ylo || oy >= yhi || xlo >= xhi {
                    drow.fill(T::ZERO);
                    continue;
                }
                let iy = (oy * g.sh + ki * g.dh - g.ph) as isize;
                drow[..xlo].fill(T::ZERO);
                drow[xhi..].fill(T::ZERO);
                let x0 = (xlo * g.sw + kj * g.dw - g.pw) as isize;
                let start = base + iy * st[2] + x0 * st[3];
                let step = g.sw as isize * st[3];
                if step == 1 {
                    let s = start as usize;
                    drow[xlo..xhi].copy_from_slice(&x[s..s + (xhi - xlo)]);
                } else {
                    for (i, o) in drow[xlo..xhi].iter_mut().enumerate() {
                        *o = x[(start + i as isize * step) as usize];
                    }
                }
            }
        }
    };
    let col = &mut col[..rows * ncols];
    if rows * ncols >= PARALLEL_WORK && may_fork() {
        fork(|| {
            col.par_chunks_mut(ncols)
                .enumerate()
                .for_each(|(r, d)| fill_row(r, d))
        });
    } else {
        col.chunks_mut(ncols)
            .enumerate()
            .for_each(|(r, d)| fill_row(r, d));
    }
}

/// Zero the output columns outside `xlo..xhi` between valid output rows `ylo..yhi` of
/// one tap's plane `d` (where a plane run wraps from one row's end to the next row's
/// start). Column by column: the runs are a few elements long, and a loop along a row
/// would become a `memset` call per row.
fn zero_gaps<T: Native>(
    d: &mut [T],
    g: &Geom,
    (ylo, yhi): (usize, usize),
    (xlo, xhi): (usize, usize),
) {
    for j in xhi..g.ow + xlo {
        for oy in ylo..yhi.saturating_sub(1) {
            d[oy * g.ow + j] = T::ZERO;
        }
    }
}

/// The adjoint of [`im2col`]: add column matrix `col` (samples `n0..n0+nb`, channels
/// `c0..c0+cg`) back into the contiguous `[N, C, H, W]` gradient `dx`. `col` is
/// scratch: elements that map into the padding may be overwritten with zeros.
#[allow(clippy::too_many_arguments)]
pub(crate) fn col2im<T: Native>(
    col: &mut [T],
    g: &Geom,
    n0: usize,
    nb: usize,
    c0: usize,
    cg: usize,
    dx: &mut [T],
) {
    let (lsz, plane) = (g.l(), g.h * g.w);
    let ncols = nb * lsz;
    if ncols == 0 || cg == 0 || plane == 0 {
        return;
    }
    // Unit strides and output rows as long as the input's (a "same" convolution, as in
    // `im2col`): output element p of a tap adds into input element p + shift, so a
    // tap's valid elements are one run of the plane, less the columns that wrap over an
    // edge. Zero those first; then each tap is one vectorised add per plane.
    let plane_run = g.sw == 1 && g.sh == 1 && g.ow == g.w;
    if plane_run {
        for (r, row) in col.chunks_mut(ncols).take(cg * g.kh * g.kw).enumerate() {
            let (ylo, yhi) = g.rows((r / g.kw) % g.kh);
            let (xlo, xhi) = g.cols(r % g.kw);
            if (xlo == 0 && xhi == g.ow) || xlo >= xhi {
                continue;
            }
            for s in row.chunks_mut(lsz) {
                zero_gaps(s, g, (ylo, yhi), (xlo, xhi));
            }
        }
    }
    let col = &*col;
    // One plane (sample b, channel c) per task: planes are disjoint in `dx`.
    let add_plane = |b: usize, c: usize, dst: &mut [T]| {
        widest(
            #[inline(always)]
            || {
                for ki in 0..g.kh {
                    let (ylo, yhi) = g.rows(ki);
                    for kj in 0..g.kw {
                        let (xlo, xhi) = g.cols(kj);
                        if xlo >= xhi || ylo >= yhi {
                            continue; // the tap lands only in the padding: nothing to add
                        }
                        let r = (c * g.kh + ki) * g.kw + kj;
                        let src = &col[r * ncols + b * lsz..r * ncols + (b + 1) * lsz];
                        if plane_run {
                            let (first, last) = (ylo * g.ow + xlo, (yhi - 1) * g.ow + xhi);
                            let d0 = (ylo + ki * g.dh - g.ph) * g.w + xlo + kj * g.dw - g.pw;
                            let d = &mut dst[d0..d0 + (last - first)];
                            for (o, &v) in d.iter_mut().zip(&src[first..last]) {
                                *o = o.add(v);
                            }
                            continue;
                        }
                        for oy in ylo..yhi {
                            let iy = oy * g.sh + ki * g.dh - g.ph;
                            let srow = &src[oy * g.ow..(oy + 1) * g.ow];
                            let x0 = xlo * g.sw + kj * g.dw - g.pw;
                            let drow = &mut dst[iy * g.w..(iy + 1) * g.w];
                            if g.sw == 1 {
                                let run = drow[x0..x0 + (xhi - xlo)].iter_mut();
                                for (o, &v) in run.zip(&srow[xlo..xhi]) {
                                    *o = o.add(v);
                                }
                            } else {
                                for (i, &v) in srow[xlo..xhi].iter().enumerate() {
                                    let o = &mut drow[x0 + i * g.sw];
                                    *o = o.add(v);
                                }
                            }
                        }
                    }
                }
            },
        )
    };
    let par = nb * cg * plane * g.kh * g.kw >= PARALLEL_WORK && may_fork();
    if par && cg == g.c {
        // One group: the chunk's planes are contiguous in `dx`, split them all at once.
        let planes = &mut dx[n0 * g.c * plane..(n0 + nb) * g.c * plane];
        fork(|| {
            planes
                .par_chunks_mut(plane)
                .enumerate()
                .for_each(|(i, d)| add_plane(i / cg, i % cg, d))
        });
        return;
    }
    if cg * plane * g.kh * g.kw < PARALLEL_WORK || !may_fork() {
        // Channel by channel, then sample by sample: each channel's kh·kw rows of `col`
        // are read front to back, a few streams the prefetcher follows. Sample by
        // sample would jump across all cg·kh·kw rows (8 KB apart for 64 positions and
        // 32 samples) for every sample.
        for c in 0..cg {
            for b in 0..nb {
                let start = ((n0 + b) * g.c + c0 + c) * plane;
                add_plane(b, c, &mut dx[start..start + plane]);
            }
        }
        return;
    }
    for b in 0..nb {
        let start = ((n0 + b) * g.c + c0) * plane;
        let planes = &mut dx[start..start + cg * plane];
        fork(|| {
            planes
                .par_chunks_mut(plane)
                .enumerate()
                .for_each(|(c, d)| add_plane(b, c, d))
        });
    }
}

/// A convolution's (or one of its gradients') multiply-adds: `N·O·L·k`, k =
/// C/groups·kh·kw.
fn macs(g: &Geom, o_count: usize, k: usize) -> usize {
    g.n.saturating_mul(o_count)
        .saturating_mul(g.l())
        .saturating_mul(k)
}

/// How many parts conv2d's kernels split the batch into, each part a range of samples
/// run from start to end (im2col, gemm, col2im) by one thread of the kernel pool: one
/// per thread when the convolution has [`PARALLEL_FLOPS`] multiply-adds (a product
/// worth splitting), a sample per thread at least, and this thread may fork; else 1.
///
/// Split by samples, a kernel forks once, and each thread runs its steps back to back
/// on its own scratch, with nothing to wait for until its part is done; split step by
/// step it would wait for the slowest thread after every step. On the Zen 4 machine
/// (2 vCPUs) `bench --only conv2d` ([32,16,8,8], 32 filters of 3×3, forward and both
/// gradients) went from 813/814/788 µs on one thread to 502/498/507 µs split by samples
/// (see BENCHMARKS.md). A batch with fewer samples than threads is split step by step
/// when [`big`] ([`fork_if`]).
pub(super) fn sample_parts(g: &Geom, o_count: usize, k: usize) -> usize {
    if macs(g, o_count, k) < PARALLEL_FLOPS || !may_fork() {
        return 1;
    }
    let threads = fork_threads();
    if g.n >= threads { threads } else { 1 }
}

/// Samples of part `i` of `parts` (as even as can be).
pub(super) fn part_samples(n: usize, parts: usize, i: usize) -> std::ops::Range<usize> {
    i * n / parts..(i + 1) * n / parts
}

/// Runs `f(i, piece)` for each of `parts` parts, `piece` being the `i`-th of
/// consecutive pieces of `out`, `len(i)` elements each. One part runs on this thread,
/// its steps split across the kernel pool if the convolution is `big`; several run one
/// per thread of the kernel pool, their steps unsplit.
fn run_parts<T: Native>(
    parts: usize,
    big: bool,
    out: &mut [T],
    len: impl Fn(usize) -> usize,
    f: impl Fn(usize, &mut [T]) -> Result<()> + Sync,
) -> Result<()> {
    if parts <= 1 {
        return fork_if(big, || f(0, out));
    }
    let mut pieces = Vec::with_capacity(parts);
    let mut rest = out;
    for i in 0..parts {
        let (piece, tail) = rest.split_at_mut(len(i));
        pieces.push(piece);
        rest = tail;
    }
    fork(|| {
        pieces
            .into_par_iter()
            .enumerate()
            .try_for_each(|(i, piece)| {
                let _whole = NoFork::new();
                f(i, piece)
            })
    })
}

/// [`run_parts`] over `out` holding `per` elements a sample: `part(samples, piece)`
/// with `piece` those samples' elements.
fn run_samples<T: Native>(
    g: &Geom,
    parts: usize,
    big: bool,
    per: usize,
    out: &mut [T],
    part: impl Fn(std::ops::Range<usize>, &mut [T]) -> Result<()> + Sync,
) -> Result<()> {
    let samples = |i| part_samples(g.n, parts, i);
    run_parts(
        parts,
        big,
        out,
        |i| samples(i).len() * per,
        |i, piece| part(samples(i), piece),
    )
}

/// Whether a convolution (or one of its gradients) that runs as one part is worth
/// splitting step by step: its multiply-adds reach [`CONV_PARALLEL_FLOPS`]. Its kernel
/// then forks once around all its steps (im2col, gemm, col2im), which split on the
/// pool they run on; otherwise none of them forks.
fn big(g: &Geom, o_count: usize, k: usize) -> bool {
    macs(g, o_count, k) >= CONV_PARALLEL_FLOPS
}

/// Samples per im2col chunk when the batch runs as `parts` parts at once (their
/// column matrices together stay under [`COL_LIMIT`]).
fn chunk(g: &Geom, k: usize, parts: usize) -> usize {
    (COL_LIMIT / parts / (k * g.l()).max(1)).clamp(1, g.n.max(1))
}

/// `[N, O, oh, ow]` rows `n0..n0+nb` of `g` (read through its layout) as a contiguous
/// `[O, nb*L]` matrix.
fn gather_grad<T: Native>(g: Strided<'_, T>, n0: usize, nb: usize, lsz: usize, out: &mut [T]) {
    let (st, off) = nchw_strides(g.layout);
    let data = g.data;
    let d = g.layout.shape.dims();
    let (o_count, oh, ow) = (d[1], d[2], d[3]);
    let ncols = nb * lsz;
    for o in 0..o_count {
        for b in 0..nb {
            let dst = &mut out[o * ncols + b * lsz..o * ncols + (b + 1) * lsz];
            let base = off + (n0 + b) as isize * st[0] + o as isize * st[1];
            if st[3] == 1 && st[2] == ow as isize {
                // A contiguous plane: one copy.
                dst.copy_from_slice(&data[base as usize..base as usize + lsz]);
                continue;
            }
            for (y, row) in dst.chunks_mut(ow.max(1)).enumerate().take(oh) {
                let start = base + y as isize * st[2];
                if st[3] == 1 {
                    row.copy_from_slice(&data[start as usize..start as usize + ow]);
                } else {
                    for (x, e) in row.iter_mut().enumerate() {
                        *e = data[(start + x as isize * st[3]) as usize];
                    }
                }
            }
        }
    }
}

/// `[N, O, oh, ow]` rows `n0..n0+nb` of `g` (read through its layout) as a contiguous
/// `[nb*L, O]` matrix: [`gather_grad`] transposed, so that gemm reads the weight
/// gradient's left operand down its contiguous axis (see [`conv2d_grad_weight_kernel`]).
fn gather_grad_t<T: Native>(g: Strided<'_, T>, n0: usize, nb: usize, lsz: usize, out: &mut [T]) {
    let (st, off) = nchw_strides(g.layout);
    let data = g.data;
    let d = g.layout.shape.dims();
    let (o_count, oh, ow) = (d[1], d[2], d[3]);
    if o_count == 0 {
        return;
    }
    // Sample by sample, plane by plane: one sample's [L, O] block (8 KB for 64
    // positions and 32 channels) stays in L1 while each of its O planes is read in
    // order and written down one column of the block.
    for (b, blk) in out.chunks_exact_mut(lsz * o_count).take(nb).enumerate() {
        for o in 0..o_count {
            let base = off + (n0 + b) as isize * st[0] + o as isize * st[1];
            let mut rows = blk.chunks_exact_mut(o_count);
            if st[3] == 1 && st[2] == ow as isize {
                // A contiguous plane.
                let plane = &data[base as usize..base as usize + lsz];
                for (row, &v) in rows.zip(plane) {
                    row[o] = v;
                }
                continue;
            }
            for y in 0..oh {
                let start = base + y as isize * st[2];
                for (x, row) in rows.by_ref().take(ow).enumerate() {
                    row[o] = data[(start + x as isize * st[3]) as usize];
                }
            }
        }
    }
}

/// A weight `[O, C/groups, kh, kw]` as a contiguous slice and its start offset (copied
/// only if the operand is not contiguous).
fn weight_slice<'a, T: Native>(w: Strided<'a, T>, owned: &'a mut Vec<T>) -> (&'a [T], usize) {
    if w.layout.is_contiguous() {
        (w.data, w.layout.offset)
    } else {
        *owned = to_vec::<T>(w);
        (owned.as_slice(), 0)
    }
}

/// `conv2d`: per chunk of samples and per group, `W · im2col(x)` plus the bias, into a
/// new `[N, O, oh, ow]` buffer.
pub(crate) fn conv2d_kernel<T: Native>(
    x: Strided<'_, T>,
    w: Strided<'_, T>,
    bias: Option<Strided<'_, T>>,
    g: &Geom,
    o_count: usize,
    groups: usize,
) -> Result<Buffer> {
    let (cg, og) = (g.c / groups, o_count / groups);
    let k = cg * g.kh * g.kw;
    let lsz = g.l();
    let per = o_count * lsz;
    let mut owned = Vec::new();
    let (wd, woff) = weight_slice::<T>(w, &mut owned);
    let bias: Option<Vec<T>> = bias.map(|b| to_vec::<T>(b));
    let xd = x.data;
    let parts = sample_parts(g, o_count, k);
    let nb_max = chunk(g, k, parts);
    // Samples `r` into `out`, their rows of the result.
    let part = |r: std::ops::Range<usize>, out: &mut [T]| {
        with_scratch::<T, _>(k * nb_max * lsz, |col| {
            with_scratch::<T, _>(og * nb_max * lsz, |tmp| {
                for n0 in r.clone().step_by(nb_max) {
                    let nb = nb_max.min(r.end - n0);
                    let ncols = nb * lsz;
                    for gi in 0..groups {
                        im2col(xd, x.layout, g, n0, nb, gi * cg, cg, col);
                        let a = Mat {
                            data: wd,
                            off: (woff + gi * og * k) as isize,
                            rs: k as isize,
                            cs: 1,
                        };
                        let b = Mat {
                            data: col,
                            off: 0,
                            rs: ncols as isize,
                            cs: 1,
                        };
                        matmul_2d(og, ncols, k, a, b, tmp);
                        for o in 0..og {
                            let oc = gi * og + o;
                            let add = bias.as_ref().map_or(T::ZERO, |b| b[oc]);
                            for bb in 0..nb {
                                let dst = &mut out[((n0 - r.start + bb) * o_count + oc) * lsz..];
                                let src = &tmp[o * ncols + bb * lsz..][..lsz];
                                for (d, &s) in dst[..lsz].iter_mut().zip(src) {
                                    *d = s.add(add);
                                }
                            }
                        }
                    }
                }
            })
        })
        .and_then(|r| r)
    };
    let mut result = Ok(());
    let buf = new_overwritten::<T>(g.n * per, |out| {
        if out.is_empty() {
            return;
        }
        result = run_samples(g, parts, big(g, o_count, k), per, out, part);
    })?;
    result.map(|()| buf)
}

/// `dx = col2im(Wᵀ · G)` per group and chunk of samples.
pub(crate) fn conv2d_grad_input_kernel<T: Native>(
    gr: Strided<'_, T>,
    w: Strided<'_, T>,
    g: &Geom,
    groups: usize,
) -> Result<Buffer> {
    let o_count = gr.layout.shape.dims()[1];
    let (cg, og) = (g.c / groups, o_count / groups);
    let k = cg * g.kh * g.kw;
    let lsz = g.l();
    let per = g.c * g.h * g.w;
    let mut owned = Vec::new();
    let (wd, woff) = weight_slice::<T>(w, &mut owned);
    let parts = sample_parts(g, o_count, k);
    let nb_max = chunk(g, k.max(o_count), parts);
    // Samples `r` into `dx`, their (zeroed) planes of the gradient.
    let part = |r: std::ops::Range<usize>, dx: &mut [T]| {
        with_scratch::<T, _>(o_count * nb_max * lsz, |gt| {
            with_scratch::<T, _>(k * nb_max * lsz, |dcol| {
                for n0 in r.clone().step_by(nb_max) {
                    let nb = nb_max.min(r.end - n0);
                    let ncols = nb * lsz;
                    gather_grad(gr, n0, nb, lsz, gt);
                    for gi in 0..groups {
                        let a = Mat {
                            data: wd,
                            off: (woff + gi * og * k) as isize,
                            rs: 1,
                            cs: k as isize,
                        };
                        let b = Mat {
                            data: gt,
                            off: (gi * og * ncols) as isize,
                            rs: ncols as isize,
                            cs: 1,
                        };
                        matmul_2d(k, ncols, og, a, b, dcol);
                        col2im(dcol, g, n0 - r.start, nb, gi * cg, cg, dx);
                    }
                }
            })
        })
        .and_then(|r| r)
    };
    let mut result = Ok(());
    let buf = new_filled::<T>(g.n * per, |dx| {
        if lsz == 0 || k == 0 || dx.is_empty() {
            return;
        }
        result = run_samples(g, parts, big(g, o_count, k), per, dx, part);
    })?;
    result.map(|()| buf)
}

/// `dW = G · colᵀ` per group, summed over chunks of samples (over parts of the batch
/// run at once, each into a sum of its own, then those sums in order).
pub(crate) fn conv2d_grad_weight_kernel<T: Native>(
    x: Strided<'_, T>,
    gr: Strided<'_, T>,
    g: &Geom,
    groups: usize,
) -> Result<Buffer> {
    let o_count = gr.layout.shape.dims()[1];
    let (cg, og) = (g.c / groups, o_count / groups);
    let k = cg * g.kh * g.kw;
    let lsz = g.l();
    let xd = x.data;
    let parts = sample_parts(g, o_count, k);
    let nb_max = chunk(g, k.max(o_count), parts);
    let per = o_count * k;
    // Samples `r`, their `dW` added into `dw`.
    let part = |r: std::ops::Range<usize>, dw: &mut [T]| {
        with_scratch::<T, _>(o_count * nb_max * lsz, |gt| {
            with_scratch::<T, _>(k * nb_max * lsz, |col| {
                with_scratch::<T, _>(og * k, |tmp| {
                    for n0 in r.clone().step_by(nb_max) {
                        let nb = nb_max.min(r.end - n0);
                        let ncols = nb * lsz;
                        gather_grad_t(gr, n0, nb, lsz, gt);
                        for gi in 0..groups {
                            im2col(xd, x.layout, g, n0, nb, gi * cg, cg, col);
                            // `dWᵀ = col · Gᵀ` ([k, og], row-major, which gemm
                            // computes as `dW` column-major: `G · colᵀ` with G its left
                            // operand). gemm's microkernel reads its left operand down
                            // columns; G gathered transposed ([nb*L, O]) has those
                            // columns contiguous, where G as [O, nb*L] would be packed
                            // one element at a time (the gemm of [32,16,8,8] with 32
                            // 3x3 filters took 277 µs that way, 182 µs this way).
                            let a = Mat {
                                data: col,
                                off: 0,
                                rs: ncols as isize,
                                cs: 1,
                            };
                            let b = Mat {
                                data: gt,
                                off: (gi * og) as isize,
                                rs: o_count as isize,
                                cs: 1,
                            };
                            matmul_2d(k, og, ncols, a, b, tmp);
                            let dst = &mut dw[gi * og * k..(gi + 1) * og * k];
                            for (o, row) in dst.chunks_exact_mut(k).enumerate() {
                                for (r, d) in row.iter_mut().enumerate() {
                                    *d = d.add(tmp[r * og + o]);
                                }
                            }
                        }
                    }
                })
            })
            .and_then(|r| r)
        })
        .and_then(|r| r)
    };
    let mut result = Ok(());
    let buf = new_filled::<T>(per, |dw| {
        if lsz == 0 || k == 0 || og == 0 {
            return;
        }
        if parts <= 1 {
            result = fork_if(big(g, o_count, k), || part(0..g.n, dw));
            return;
        }
        // One zeroed sum per part, then the sums added in part order (the same bits
        // however the parts were scheduled); dropped once added up.
        let mut parts_done = Ok(());
        let sums = new_filled::<T>(parts * per, |sums| {
            parts_done = run_parts(
                parts,
                false,
                sums,
                |_| per,
                |i, sum| part(part_samples(g.n, parts, i), sum),
            );
            for sum in sums.chunks_exact(per) {
                for (d, &s) in dw.iter_mut().zip(sum) {
                    *d = d.add(s);
                }
            }
        });
        result = sums.and(parts_done);
    })?;
    result.map(|()| buf)
}
