//! Convolution and pooling over NCHW arrays: `conv2d` (im2col + gemm, with groups,
//! stride, padding and dilation), `max_pool2d` and `avg_pool2d`. Each is one fused
//! kernel with its gradient rule beside it; the backward passes are internal ops of
//! their own (`conv2d_grad_input` is col2im over `Wᵀ·G`, `conv2d_grad_weight` is
//! `G·colᵀ`), run unrecorded by the tape.
//!
//! The kernels are plain functions over slices and a [`Layout`]; the input is read
//! through its strides (a transposed or sliced view is not copied first).

use super::NDArray;
use super::nn::{Saved, float_operands};
use crate::DType;
use crate::autograd::{self, Backward, BackwardCtx, Grads};
use crate::backend::cpu;
use crate::backend::cpu::{Mat, matmul_2d};
use crate::backend::cpu::{new_filled, new_overwritten};
use crate::dtype::{Native, dispatch_float};
use crate::engine::{self, ArrayId, Buffer, Operand, Output};
use crate::error::{NdError, Result, SourceLocation, unwrap};
use crate::layout::Layout;
use crate::shape::Shape;
use rayon::prelude::*;
use smallvec::{SmallVec, smallvec};
use std::panic::Location;

/// Elements of one im2col buffer: the batch is processed in chunks of samples whose
/// column matrix stays under this size (16 MiB of f32).
const COL_LIMIT: usize = 1 << 22;

/// Work (elements) above which the im2col/col2im and pooling loops run on several
/// threads.
const PARALLEL_WORK: usize = 1 << 15;

/// The geometry of a 2-D sliding window over `[N, C, H, W]` (pools also accept
/// `[C, H, W]`, seen as `N = 1`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Geom {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    ph: usize,
    pw: usize,
    dh: usize,
    dw: usize,
    oh: usize,
    ow: usize,
}

impl Geom {
    /// Output positions per plane.
    fn l(&self) -> usize {
        self.oh * self.ow
    }

    /// The valid output columns `ox` for kernel column `kj`: those whose input column
    /// `ox*sw + kj*dw - pw` lies in `0..w`.
    fn cols(&self, kj: usize) -> (usize, usize) {
        span(self.ow, self.sw, kj * self.dw, self.pw, self.w)
    }

    /// The valid output rows `oy` for kernel row `ki`.
    fn rows(&self, ki: usize) -> (usize, usize) {
        span(self.oh, self.sh, ki * self.dh, self.ph, self.h)
    }
}

/// `lo..hi`: the `o < out` with `0 <= o*s + k - p < len`.
fn span(out: usize, s: usize, k: usize, p: usize, len: usize) -> (usize, usize) {
    let lo = if p > k { (p - k).div_ceil(s) } else { 0 };
    let hi = if len + p > k {
        ((len + p - k - 1) / s + 1).min(out)
    } else {
        0
    };
    (lo.min(hi), hi)
}

/// One output size: `(len + 2p - d(k-1) - 1) / s + 1`, or `None` if the (dilated)
/// window does not fit in the padded input.
fn out_len(len: usize, k: usize, s: usize, p: usize, d: usize) -> Option<usize> {
    let span = d.checked_mul(k - 1)?.checked_add(1)?;
    let padded = len.checked_add(p.checked_mul(2)?)?;
    (padded >= span).then(|| (padded - span) / s + 1)
}

/// Sliding-window parameters as given by the caller.
#[derive(Clone, Copy)]
struct Window {
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
}

impl Window {
    /// Validate the parameters against the spatial size `[h, w]` and build the geometry.
    fn geom(&self, op: &'static str, n: usize, c: usize, hw: [usize; 2]) -> Result<Geom> {
        let Window {
            kernel,
            stride,
            padding,
            dilation,
        } = *self;
        for (what, v) in [
            ("kernel", kernel),
            ("stride", stride),
            ("dilation", dilation),
        ] {
            if v.contains(&0) {
                return Err(NdError::invalid(
                    op,
                    format!("{what} {v:?} must be positive"),
                ));
            }
        }
        let oh = out_len(hw[0], kernel[0], stride[0], padding[0], dilation[0]);
        let ow = out_len(hw[1], kernel[1], stride[1], padding[1], dilation[1]);
        let (Some(oh), Some(ow)) = (oh, ow) else {
            return Err(NdError::invalid(
                op,
                format!(
                    "the window (kernel {kernel:?}, dilation {dilation:?}) is larger than the \
                     padded input (spatial size {hw:?}, padding {padding:?})"
                ),
            ));
        };
        Ok(Geom {
            n,
            c,
            h: hw[0],
            w: hw[1],
            kh: kernel[0],
            kw: kernel[1],
            sh: stride[0],
            sw: stride[1],
            ph: padding[0],
            pw: padding[1],
            dh: dilation[0],
            dw: dilation[1],
            oh,
            ow,
        })
    }
}

/// Element strides `[n, c, h, w]` and offset of a 4-D (or 3-D, `n` stride 0) layout.
fn nchw_strides(l: &Layout) -> ([isize; 4], isize) {
    let s = &l.strides;
    let st = if s.len() == 4 {
        [s[0], s[1], s[2], s[3]]
    } else {
        [0, s[0], s[1], s[2]]
    };
    (st, l.offset as isize)
}

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
    let fill_row = |r: usize, dst: &mut [T]| {
        let c = r / (g.kh * g.kw);
        let ki = (r / g.kw) % g.kh;
        let kj = r % g.kw;
        let (ylo, yhi) = g.rows(ki);
        let (xlo, xhi) = g.cols(kj);
        for b in 0..nb {
            let base = off + (n0 + b) as isize * st[0] + (c0 + c) as isize * st[1];
            let d = &mut dst[b * lsz..(b + 1) * lsz];
            for oy in 0..g.oh {
                let drow = &mut d[oy * g.ow..(oy + 1) * g.ow];
                if oy < ylo || oy >= yhi {
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
    if rows * ncols >= PARALLEL_WORK && cpu::may_fork() {
        cpu::fork(|| {
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

/// The adjoint of [`im2col`]: add column matrix `col` (samples `n0..n0+nb`, channels
/// `c0..c0+cg`) back into the contiguous `[N, C, H, W]` gradient `dx`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn col2im<T: Native>(
    col: &[T],
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
    // One plane (sample b, channel c) per task: planes are disjoint in `dx`.
    let add_plane = |b: usize, c: usize, dst: &mut [T]| {
        for ki in 0..g.kh {
            let (ylo, yhi) = g.rows(ki);
            for kj in 0..g.kw {
                let (xlo, xhi) = g.cols(kj);
                let r = (c * g.kh + ki) * g.kw + kj;
                let src = &col[r * ncols + b * lsz..r * ncols + (b + 1) * lsz];
                for oy in ylo..yhi {
                    let iy = oy * g.sh + ki * g.dh - g.ph;
                    let srow = &src[oy * g.ow..(oy + 1) * g.ow];
                    let x0 = xlo * g.sw + kj * g.dw - g.pw;
                    let drow = &mut dst[iy * g.w..(iy + 1) * g.w];
                    if g.sw == 1 {
                        for (o, &v) in drow[x0..x0 + (xhi - xlo)].iter_mut().zip(&srow[xlo..xhi]) {
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
    };
    for b in 0..nb {
        let start = ((n0 + b) * g.c + c0) * plane;
        let planes = &mut dx[start..start + cg * plane];
        if cg * plane * g.kh * g.kw >= PARALLEL_WORK && cpu::may_fork() {
            cpu::fork(|| {
                planes
                    .par_chunks_mut(plane)
                    .enumerate()
                    .for_each(|(c, d)| add_plane(b, c, d))
            });
        } else {
            planes
                .chunks_mut(plane)
                .enumerate()
                .for_each(|(c, d)| add_plane(b, c, d));
        }
    }
}

/// Samples per im2col chunk.
fn chunk(g: &Geom, k: usize) -> usize {
    (COL_LIMIT / (k * g.l()).max(1)).clamp(1, g.n.max(1))
}

/// `[N, O, oh, ow]` rows `n0..n0+nb` of `g` (read through its layout) as a contiguous
/// `[O, nb*L]` matrix.
fn gather_grad<T: Native>(g: &Operand<'_>, n0: usize, nb: usize, lsz: usize, out: &mut [T]) {
    let (st, off) = nchw_strides(g.layout);
    let data = g.data::<T>();
    let d = g.shape().dims();
    let (o_count, oh, ow) = (d[1], d[2], d[3]);
    let ncols = nb * lsz;
    for o in 0..o_count {
        for b in 0..nb {
            let dst = &mut out[o * ncols + b * lsz..o * ncols + (b + 1) * lsz];
            let base = off + (n0 + b) as isize * st[0] + o as isize * st[1];
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

/// Run `f` on a scratch slice of `len` elements taken from the buffer pool (not
/// zeroed: `f` must write before it reads) and return its result; the memory goes
/// back to the pool, so repeated calls neither zero nor fault in fresh pages.
fn with_scratch<T: Native, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
    let mut r = None;
    let _buf = new_overwritten::<T>(len, |s| r = Some(f(s)))?;
    Ok(r.expect("new_overwritten calls its closure"))
}

/// A weight `[O, C/groups, kh, kw]` as a contiguous slice and its start offset (copied
/// only if the operand is not contiguous).
fn weight_slice<'a, T: Native>(w: &'a Operand<'_>, owned: &'a mut Vec<T>) -> (&'a [T], usize) {
    if w.layout.is_contiguous() {
        (w.data::<T>(), w.layout.offset)
    } else {
        *owned = cpu::to_vec::<T>(w);
        (owned.as_slice(), 0)
    }
}

fn conv2d_kernel<T: Native>(
    x: &Operand<'_>,
    w: &Operand<'_>,
    bias: Option<&Operand<'_>>,
    g: &Geom,
    o_count: usize,
    groups: usize,
) -> Result<Buffer> {
    let (cg, og) = (g.c / groups, o_count / groups);
    let k = cg * g.kh * g.kw;
    let lsz = g.l();
    let total = g.n * o_count * lsz;
    let mut owned = Vec::new();
    let (wd, woff) = weight_slice::<T>(w, &mut owned);
    let bias: Option<Vec<T>> = bias.map(|b| cpu::to_vec::<T>(b));
    let xd = x.data::<T>();
    let nb_max = chunk(g, k);
    with_scratch::<T, _>(k * nb_max * lsz, |col| {
        with_scratch::<T, _>(og * nb_max * lsz, |tmp| {
            new_overwritten::<T>(total, |out| {
                if total == 0 {
                    return;
                }
                for n0 in (0..g.n).step_by(nb_max) {
                    let nb = nb_max.min(g.n - n0);
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
                                let dst = &mut out[((n0 + bb) * o_count + oc) * lsz..][..lsz];
                                let src = &tmp[o * ncols + bb * lsz..][..lsz];
                                for (d, &s) in dst.iter_mut().zip(src) {
                                    *d = s.add(add);
                                }
                            }
                        }
                    }
                }
            })
        })
    })??
}

/// `dx = col2im(Wᵀ · G)` per group and chunk of samples.
fn conv2d_grad_input_kernel<T: Native>(
    gr: &Operand<'_>,
    w: &Operand<'_>,
    g: &Geom,
    groups: usize,
) -> Result<Buffer> {
    let o_count = gr.shape().dims()[1];
    let (cg, og) = (g.c / groups, o_count / groups);
    let k = cg * g.kh * g.kw;
    let lsz = g.l();
    let mut owned = Vec::new();
    let (wd, woff) = weight_slice::<T>(w, &mut owned);
    let nb_max = chunk(g, k.max(o_count));
    with_scratch::<T, _>(o_count * nb_max * lsz, |gt| {
        with_scratch::<T, _>(k * nb_max * lsz, |dcol| {
            new_filled::<T>(g.n * g.c * g.h * g.w, |dx| {
                if lsz == 0 || k == 0 {
                    return;
                }
                for n0 in (0..g.n).step_by(nb_max) {
                    let nb = nb_max.min(g.n - n0);
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
                        col2im(dcol, g, n0, nb, gi * cg, cg, dx);
                    }
                }
            })
        })
    })??
}

/// `dW = G · colᵀ` per group, summed over chunks of samples.
fn conv2d_grad_weight_kernel<T: Native>(
    x: &Operand<'_>,
    gr: &Operand<'_>,
    g: &Geom,
    groups: usize,
) -> Result<Buffer> {
    let o_count = gr.shape().dims()[1];
    let (cg, og) = (g.c / groups, o_count / groups);
    let k = cg * g.kh * g.kw;
    let lsz = g.l();
    let xd = x.data::<T>();
    let nb_max = chunk(g, k.max(o_count));
    let mut tmp = vec![T::ZERO; og * k];
    with_scratch::<T, _>(o_count * nb_max * lsz, |gt| {
        with_scratch::<T, _>(k * nb_max * lsz, |col| {
            new_filled::<T>(o_count * k, |dw| {
                if lsz == 0 || k == 0 || og == 0 {
                    return;
                }
                for n0 in (0..g.n).step_by(nb_max) {
                    let nb = nb_max.min(g.n - n0);
                    let ncols = nb * lsz;
                    gather_grad(gr, n0, nb, lsz, gt);
                    for gi in 0..groups {
                        im2col(xd, x.layout, g, n0, nb, gi * cg, cg, col);
                        let a = Mat {
                            data: gt,
                            off: (gi * og * ncols) as isize,
                            rs: ncols as isize,
                            cs: 1,
                        };
                        let b = Mat {
                            data: col,
                            off: 0,
                            rs: 1,
                            cs: ncols as isize,
                        };
                        matmul_2d(og, k, ncols, a, b, &mut tmp);
                        let dst = &mut dw[gi * og * k..(gi + 1) * og * k];
                        for (d, &s) in dst.iter_mut().zip(&tmp) {
                            *d = d.add(s);
                        }
                    }
                }
            })
        })
    })??
}

/// Validate conv2d's operands and build the geometry.
fn conv2d_geom(
    x: &Operand<'_>,
    w: &Operand<'_>,
    bias: Option<&Operand<'_>>,
    win: &Window,
    groups: usize,
) -> Result<Geom> {
    const OP: &str = "conv2d";
    let mut others: SmallVec<[&Operand<'_>; 2]> = smallvec![w];
    others.extend(bias);
    float_operands(OP, x, &others)?;
    let (xs, ws) = (x.shape().dims(), w.shape().dims());
    if xs.len() != 4 {
        return Err(NdError::invalid(
            OP,
            format!(
                "the input must be 4-D [N, C, H, W], got shape {}",
                x.shape()
            ),
        ));
    }
    if ws.len() != 4 {
        return Err(NdError::invalid(
            OP,
            format!(
                "the weight must be 4-D [O, C/groups, kh, kw], got shape {}",
                w.shape()
            ),
        ));
    }
    if groups == 0 || xs[1] % groups != 0 || ws[0] % groups != 0 {
        return Err(NdError::invalid(
            OP,
            format!(
                "groups = {groups} must be positive and divide both the input channels \
                 (input shape {}) and the output channels (weight shape {})",
                x.shape(),
                w.shape()
            ),
        ));
    }
    if ws[1] != xs[1] / groups {
        return Err(NdError::invalid(
            OP,
            format!(
                "the weight shape {} needs C/groups = {} input channels per group, but the \
                 input shape {} has C = {} and groups = {groups}",
                w.shape(),
                ws[1],
                x.shape(),
                xs[1]
            ),
        ));
    }
    if let Some(b) = bias
        && b.shape().dims() != [ws[0]]
    {
        return Err(NdError::invalid(
            OP,
            format!(
                "the bias must have shape [{}] (one per output channel of weight shape {}), \
                 got shape {}",
                ws[0],
                w.shape(),
                b.shape()
            ),
        ));
    }
    let win = Window {
        kernel: [ws[2], ws[3]],
        ..*win
    };
    if win.kernel.contains(&0) {
        return Err(NdError::invalid(
            OP,
            format!("the weight shape {} has an empty kernel", w.shape()),
        ));
    }
    let g = win.geom(OP, xs[0], xs[1], [xs[2], xs[3]])?;
    let shape = Shape::from([g.n, ws[0], g.oh, g.ow]);
    if shape.checked_size().is_none() {
        return Err(NdError::shape(
            OP,
            format!("the result shape {shape} overflows usize"),
        ));
    }
    Ok(g)
}

#[allow(clippy::too_many_arguments)]
fn conv2d_impl(
    x: NDArray,
    weight: NDArray,
    bias: Option<NDArray>,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    at: SourceLocation,
) -> Result<NDArray> {
    const OP: &str = "conv2d";
    let win = Window {
        kernel: [1, 1],
        stride,
        padding,
        dilation,
    };
    let mut ids: SmallVec<[ArrayId; 3]> = smallvec![x.id, weight.id];
    ids.extend(bias.map(|b| b.id));
    let mut geom = None;
    let id = engine::run_op(OP, &ids, at, |o| {
        let (xo, wo, bo) = (&o[0], &o[1], o.get(2));
        let g = conv2d_geom(xo, wo, bo, &win, groups)?;
        let o_count = wo.shape().dims()[0];
        let buf = dispatch_float!(xo.dtype, T => conv2d_kernel::<T>(xo, wo, bo, &g, o_count, groups)?,
            else return Err(engine::unsupported(OP, xo)));
        geom = Some(g);
        Ok(Output::New {
            buf,
            shape: Shape::from([g.n, o_count, g.oh, g.ow]),
            dtype: xo.dtype,
        })
    })?;
    if let Some(g) = geom {
        autograd::record_custom(&ids, id, || Conv2dRule { g, groups });
    }
    Ok(NDArray { id })
}

/// `conv2d`'s gradient: input `col2im(Wᵀ·G)`, weight `G·colᵀ`, bias `sum(G)` over
/// N, H, W.
struct Conv2dRule {
    g: Geom,
    groups: usize,
}

impl Backward for Conv2dRule {
    fn name(&self) -> &'static str {
        "conv2d"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0b011, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, gr: NDArray) -> Result<Grads> {
        let (g, groups) = (self.g, self.groups);
        let here = Location::caller();
        let (x, w) = (cx.inputs[0], cx.inputs[1]);
        let dx = if cx.need(0) {
            let id = engine::run_op("conv2d_grad_input", &[gr.id, w.id], here, |o| {
                let buf = dispatch_float!(o[0].dtype,
                    T => conv2d_grad_input_kernel::<T>(&o[0], &o[1], &g, groups)?,
                    else return Err(engine::unsupported("conv2d_grad_input", &o[0])));
                Ok(Output::New {
                    buf,
                    shape: Shape::from([g.n, g.c, g.h, g.w]),
                    dtype: o[0].dtype,
                })
            })?;
            Some(NDArray { id })
        } else {
            None
        };
        let dw = if cx.need(1) {
            let shape = cx.shapes[1].clone();
            let id = engine::run_op("conv2d_grad_weight", &[x.id, gr.id], here, |o| {
                let buf = dispatch_float!(o[0].dtype,
                    T => conv2d_grad_weight_kernel::<T>(&o[0], &o[1], &g, groups)?,
                    else return Err(engine::unsupported("conv2d_grad_weight", &o[0])));
                Ok(Output::New {
                    buf,
                    shape,
                    dtype: o[0].dtype,
                })
            })?;
            Some(NDArray { id })
        } else {
            None
        };
        let db = if cx.inputs.len() > 2 && cx.need(2) {
            Some(gr.try_sum_axes(&[0, 2, 3], false)?)
        } else {
            None
        };
        Ok(smallvec![dx, dw, db])
    }
}

// ---- pooling ----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pool {
    Max,
    Avg,
}

impl Pool {
    fn name(self) -> &'static str {
        match self {
            Pool::Max => "max_pool2d",
            Pool::Avg => "avg_pool2d",
        }
    }
}

/// Max pooling of every plane of `x` into `out`, with the argmax (`iy*W + ix` within
/// the plane) of each output element into `arg`. NaN wins, as in PyTorch.
pub(crate) fn max_pool_kernel<T: Native>(
    x: &[T],
    l: &Layout,
    g: &Geom,
    out: &mut [T],
    arg: &mut [i64],
) {
    let (st, off) = nchw_strides(l);
    let lsz = g.l();
    let plane = |p: usize, o: &mut [T], a: &mut [i64]| {
        let base = off + (p / g.c) as isize * st[0] + (p % g.c) as isize * st[1];
        for oy in 0..g.oh {
            let y0 = (oy * g.sh) as isize - g.ph as isize;
            let (ylo, yhi) = (y0.max(0), (y0 + g.kh as isize).min(g.h as isize));
            for ox in 0..g.ow {
                let x0 = (ox * g.sw) as isize - g.pw as isize;
                let (xlo, xhi) = (x0.max(0), (x0 + g.kw as isize).min(g.w as isize));
                let mut best = T::LOWEST;
                let mut at = ylo * g.w as isize + xlo;
                for iy in ylo..yhi {
                    for ix in xlo..xhi {
                        let v = x[(base + iy * st[2] + ix * st[3]) as usize];
                        if v > best || v.is_nan() {
                            best = v;
                            at = iy * g.w as isize + ix;
                            if v.is_nan() {
                                break;
                            }
                        }
                    }
                    if best.is_nan() {
                        break;
                    }
                }
                o[oy * g.ow + ox] = best;
                a[oy * g.ow + ox] = at as i64;
            }
        }
    };
    if lsz == 0 {
        return;
    }
    if out.len() * g.kh * g.kw >= PARALLEL_WORK && cpu::may_fork() {
        cpu::fork(|| {
            out.par_chunks_mut(lsz)
                .zip(arg.par_chunks_mut(lsz))
                .enumerate()
                .for_each(|(p, (o, a))| plane(p, o, a))
        });
    } else {
        out.chunks_mut(lsz)
            .zip(arg.chunks_mut(lsz))
            .enumerate()
            .for_each(|(p, (o, a))| plane(p, o, a));
    }
}

/// Average pooling (padding counted in the divisor, PyTorch's `count_include_pad`).
pub(crate) fn avg_pool_kernel<T: Native>(x: &[T], l: &Layout, g: &Geom, out: &mut [T]) {
    let (st, off) = nchw_strides(l);
    let lsz = g.l();
    let div = T::from_f64((g.kh * g.kw) as f64);
    let plane = |p: usize, o: &mut [T]| {
        let base = off + (p / g.c) as isize * st[0] + (p % g.c) as isize * st[1];
        for oy in 0..g.oh {
            let y0 = (oy * g.sh) as isize - g.ph as isize;
            let (ylo, yhi) = (y0.max(0), (y0 + g.kh as isize).min(g.h as isize));
            for ox in 0..g.ow {
                let x0 = (ox * g.sw) as isize - g.pw as isize;
                let (xlo, xhi) = (x0.max(0), (x0 + g.kw as isize).min(g.w as isize));
                let mut sum = T::ZERO;
                for iy in ylo..yhi {
                    for ix in xlo..xhi {
                        sum = sum.add(x[(base + iy * st[2] + ix * st[3]) as usize]);
                    }
                }
                o[oy * g.ow + ox] = sum.div(div);
            }
        }
    };
    if lsz == 0 {
        return;
    }
    if out.len() * g.kh * g.kw >= PARALLEL_WORK && cpu::may_fork() {
        cpu::fork(|| {
            out.par_chunks_mut(lsz)
                .enumerate()
                .for_each(|(p, o)| plane(p, o))
        });
    } else {
        out.chunks_mut(lsz)
            .enumerate()
            .for_each(|(p, o)| plane(p, o));
    }
}

/// Validate a pool's input and window; returns the geometry and the output shape.
fn pool_geom(op: &'static str, x: &Operand<'_>, win: &Window) -> Result<(Geom, Shape)> {
    float_operands(op, x, &[])?;
    let d = x.shape().dims();
    let (n, c, h, w) = match *d {
        [n, c, h, w] => (n, c, h, w),
        [c, h, w] => (1, c, h, w),
        _ => {
            return Err(NdError::invalid(
                op,
                format!(
                    "the input must be 3-D [C, H, W] or 4-D [N, C, H, W], got shape {}",
                    x.shape()
                ),
            ));
        }
    };
    if win.kernel.contains(&0) {
        return Err(NdError::invalid(
            op,
            format!("kernel {:?} must be positive", win.kernel),
        ));
    }
    if win.padding[0] > win.kernel[0] / 2 || win.padding[1] > win.kernel[1] / 2 {
        return Err(NdError::invalid(
            op,
            format!(
                "padding {:?} must be at most half the kernel {:?} (as in PyTorch)",
                win.padding, win.kernel
            ),
        ));
    }
    let g = win.geom(op, n, c, [h, w])?;
    let mut dims = d.to_vec();
    let nd = dims.len();
    dims[nd - 2] = g.oh;
    dims[nd - 1] = g.ow;
    let shape = Shape::from(&dims[..]);
    if shape.checked_size().is_none() {
        return Err(NdError::shape(
            op,
            format!("the result shape {shape} overflows usize"),
        ));
    }
    Ok((g, shape))
}

fn pool_impl(
    x: NDArray,
    kind: Pool,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    at: SourceLocation,
) -> Result<NDArray> {
    let op = kind.name();
    let win = Window {
        kernel,
        stride,
        padding,
        dilation: [1, 1],
    };
    let mut saved: Option<(Geom, Shape, Option<Buffer>)> = None;
    let id = engine::run_op(op, &[x.id], at, |o| {
        let a = &o[0];
        let (g, shape) = pool_geom(op, a, &win)?;
        let total = shape.size();
        let mut arg = None;
        let buf = dispatch_float!(a.dtype, T => match kind {
            Pool::Max => {
                let mut out = None;
                let idx = new_overwritten::<i64>(total, |idx| {
                    out = Some(new_overwritten::<T>(total, |out| {
                        max_pool_kernel::<T>(a.data::<T>(), a.layout, &g, out, idx)
                    }));
                })?;
                arg = Some(idx);
                out.expect("filled above")?
            }
            Pool::Avg => new_overwritten::<T>(total, |out| {
                avg_pool_kernel::<T>(a.data::<T>(), a.layout, &g, out)
            })?,
        }, else return Err(engine::unsupported(op, a)));
        saved = Some((g, shape.clone(), arg));
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    if let Some((g, shape, arg)) = saved {
        autograd::record_custom(&[x.id], id, || PoolRule {
            kind,
            g,
            argmax: arg.map(|b| Saved::new(id, b, shape, DType::I64)),
        });
    }
    Ok(NDArray { id })
}

/// The gradient of a pool: max routes each output's gradient to its argmax, avg
/// spreads it evenly over the window (padding included in the divisor).
struct PoolRule {
    kind: Pool,
    g: Geom,
    argmax: Option<Saved>,
}

impl Backward for PoolRule {
    fn name(&self) -> &'static str {
        self.kind.name()
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn extra(&self) -> SmallVec<[ArrayId; 2]> {
        self.argmax.iter().flat_map(|s| s.ids()).collect()
    }
    fn backward(&self, cx: &BackwardCtx<'_>, gr: NDArray) -> Result<Grads> {
        let g = self.g;
        let shape = cx.shapes[0].clone();
        let op = match self.kind {
            Pool::Max => "max_pool2d_grad",
            Pool::Avg => "avg_pool2d_grad",
        };
        let mut ids: SmallVec<[ArrayId; 2]> = smallvec![gr.id];
        if let Some(s) = &self.argmax {
            ids.push(s.get(op)?.id);
        }
        let kind = self.kind;
        let id = engine::run_op(op, &ids, Location::caller(), |o| {
            let gv = &o[0];
            let buf = dispatch_float!(gv.dtype, T => {
                let gd = cpu::to_vec::<T>(gv);
                let plane = g.h * g.w;
                let lsz = g.l();
                new_filled::<T>(shape.size(), |dx| {
                    if plane == 0 || lsz == 0 {
                        return;
                    }
                    match kind {
                        Pool::Max => {
                            let arg = cpu::to_vec::<i64>(&o[1]);
                            for (p, d) in dx.chunks_mut(plane).enumerate() {
                                let (gs, a) = (&gd[p * lsz..][..lsz], &arg[p * lsz..][..lsz]);
                                for (&v, &i) in gs.iter().zip(a) {
                                    d[i as usize] = d[i as usize].add(v);
                                }
                            }
                        }
                        Pool::Avg => {
                            let div = T::from_f64((g.kh * g.kw) as f64);
                            for (p, d) in dx.chunks_mut(plane).enumerate() {
                                let gs = &gd[p * lsz..][..lsz];
                                for oy in 0..g.oh {
                                    let y0 = (oy * g.sh) as isize - g.ph as isize;
                                    let (ylo, yhi) = (y0.max(0), (y0 + g.kh as isize).min(g.h as isize));
                                    for ox in 0..g.ow {
                                        let x0 = (ox * g.sw) as isize - g.pw as isize;
                                        let (xlo, xhi) = (x0.max(0), (x0 + g.kw as isize).min(g.w as isize));
                                        let v = gs[oy * g.ow + ox].div(div);
                                        for iy in ylo..yhi {
                                            for ix in xlo..xhi {
                                                let e = &mut d[(iy * g.w as isize + ix) as usize];
                                                *e = e.add(v);
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                })?
            }, else return Err(engine::unsupported(op, gv)));
            Ok(Output::New {
                buf,
                shape: shape.clone(),
                dtype: gv.dtype,
            })
        })?;
        Ok(smallvec![Some(NDArray { id })])
    }
}

impl NDArray {
    /// 2-D convolution (cross-correlation, as PyTorch's `conv2d`) of an NCHW input
    /// `[N, C, H, W]` with OIHW weights `[O, C/groups, kh, kw]` and an optional bias
    /// `[O]`: the result is `[N, O, oh, ow]` with `oh = (H + 2*padding[0] -
    /// dilation[0]*(kh-1) - 1) / stride[0] + 1` (likewise `ow`). Zero padding; `groups`
    /// splits the channels into independent groups. Computed as im2col + gemm;
    /// differentiable in the input, the weight and the bias. F32/F64 only. Panics on
    /// failure.
    ///
    /// ```
    /// use ndscope::{DType, NDManager};
    /// let m = NDManager::new();
    /// let x = m.arange(0.0, 16.0, 1.0, DType::F32).reshape([1, 1, 4, 4]);
    /// let w = m.ones([2, 1, 3, 3], DType::F32);          // two 3x3 box filters
    /// let b = m.create(&[0.0f32, 100.0], [2]);
    /// let y = x.conv2d(w, Some(b), [1, 1], [0, 0], [1, 1], 1);
    /// assert_eq!(y.shape().dims(), &[1, 2, 2, 2]);
    /// assert_eq!(y.to_vec::<f32>()?, vec![45.0, 54.0, 81.0, 90.0, 145.0, 154.0, 181.0, 190.0]);
    /// # m.close();
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    #[allow(clippy::too_many_arguments)]
    pub fn conv2d(
        self,
        weight: NDArray,
        bias: Option<NDArray>,
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> NDArray {
        unwrap(conv2d_impl(
            self,
            weight,
            bias,
            stride,
            padding,
            dilation,
            groups,
            Location::caller(),
        ))
    }

    /// [`NDArray::conv2d`]. Errors: `UnsupportedDType` (not F32/F64), `DTypeMismatch`
    /// (weight or bias), `InvalidArgument` (not 4-D, channels or groups that do not
    /// match, a bias that is not `[O]`, a zero stride/dilation/groups, a window larger
    /// than the padded input; the message names the shapes), `InvalidShape`, `Closed`.
    #[track_caller]
    #[allow(clippy::too_many_arguments)]
    pub fn try_conv2d(
        self,
        weight: NDArray,
        bias: Option<NDArray>,
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Result<NDArray> {
        conv2d_impl(
            self,
            weight,
            bias,
            stride,
            padding,
            dilation,
            groups,
            Location::caller(),
        )
    }

    /// 2-D max pooling over the last two axes of `[N, C, H, W]` (or `[C, H, W]`), as
    /// PyTorch's `max_pool2d` (padding acts as -inf, so a window's maximum is over its
    /// real elements; NaN propagates; `padding` at most half the kernel; floor output
    /// size). The gradient goes to each window's first maximum. F32/F64 only. Panics on
    /// failure.
    ///
    /// ```
    /// use ndscope::{DType, NDManager};
    /// let m = NDManager::new();
    /// let x = m.arange(0.0, 16.0, 1.0, DType::F32).reshape([1, 1, 4, 4]);
    /// let y = x.max_pool2d([2, 2], [2, 2], [0, 0]);
    /// assert_eq!(y.to_vec::<f32>()?, vec![5.0, 7.0, 13.0, 15.0]);
    /// # m.close();
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn max_pool2d(
        self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> NDArray {
        unwrap(pool_impl(
            self,
            Pool::Max,
            kernel,
            stride,
            padding,
            Location::caller(),
        ))
    }

    /// [`NDArray::max_pool2d`]. Errors: `UnsupportedDType` (not F32/F64),
    /// `InvalidArgument` (not 3-D/4-D, a zero kernel or stride, padding over half the
    /// kernel, a window larger than the padded input), `Closed`.
    #[track_caller]
    pub fn try_max_pool2d(
        self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<NDArray> {
        pool_impl(self, Pool::Max, kernel, stride, padding, Location::caller())
    }

    /// 2-D average pooling over the last two axes of `[N, C, H, W]` (or `[C, H, W]`), as
    /// PyTorch's `avg_pool2d` with its default `count_include_pad=True`: every window
    /// sums its real elements and divides by `kernel[0] * kernel[1]`, padding counted as
    /// zeros. F32/F64 only. Panics on failure.
    ///
    /// ```
    /// use ndscope::{DType, NDManager};
    /// let m = NDManager::new();
    /// let x = m.arange(0.0, 16.0, 1.0, DType::F32).reshape([1, 1, 4, 4]);
    /// let y = x.avg_pool2d([2, 2], [2, 2], [0, 0]);
    /// assert_eq!(y.to_vec::<f32>()?, vec![2.5, 4.5, 10.5, 12.5]);
    /// # m.close();
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn avg_pool2d(
        self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> NDArray {
        unwrap(pool_impl(
            self,
            Pool::Avg,
            kernel,
            stride,
            padding,
            Location::caller(),
        ))
    }

    /// [`NDArray::avg_pool2d`]. Errors: as [`NDArray::try_max_pool2d`].
    #[track_caller]
    pub fn try_avg_pool2d(
        self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<NDArray> {
        pool_impl(self, Pool::Avg, kernel, stride, padding, Location::caller())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom(h: usize, w: usize, k: usize, s: usize, p: usize, d: usize) -> Geom {
        Window {
            kernel: [k, k],
            stride: [s, s],
            padding: [p, p],
            dilation: [d, d],
        }
        .geom("t", 1, 1, [h, w])
        .unwrap()
    }

    #[test]
    fn spans_match_a_brute_force_scan() {
        for (out, s, k, p, len) in [
            (4, 1, 0, 1, 4),
            (3, 2, 2, 1, 5),
            (2, 3, 4, 2, 3),
            (5, 1, 9, 0, 3),
        ] {
            let ok: Vec<usize> = (0..out)
                .filter(|&o| {
                    let i = (o * s + k) as isize - p as isize;
                    i >= 0 && i < len as isize
                })
                .collect();
            let (lo, hi) = span(out, s, k, p, len);
            assert_eq!((lo..hi).collect::<Vec<_>>(), ok, "{out} {s} {k} {p} {len}");
        }
    }

    #[test]
    fn im2col_then_col2im_is_the_adjoint() {
        // <im2col(x), c> == <x, col2im(c)> for random x and c.
        let g = geom(5, 4, 3, 2, 1, 2);
        let x: Vec<f64> = (0..20).map(|i| (i as f64 * 0.37).sin()).collect();
        let l = Layout::contiguous(Shape::from([1, 1, 5, 4]));
        let rows = 9;
        let mut col = vec![0.0; rows * g.l()];
        im2col(&x, &l, &g, 0, 1, 0, 1, &mut col);
        let c: Vec<f64> = (0..col.len()).map(|i| (i as f64 * 0.71).cos()).collect();
        let mut dx = vec![0.0; 20];
        col2im(&c, &g, 0, 1, 0, 1, &mut dx);
        let lhs: f64 = col.iter().zip(&c).map(|(a, b)| a * b).sum();
        let rhs: f64 = x.iter().zip(&dx).map(|(a, b)| a * b).sum();
        assert!((lhs - rhs).abs() < 1e-12, "{lhs} vs {rhs}");
    }
}
