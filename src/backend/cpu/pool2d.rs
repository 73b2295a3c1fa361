//! Pooling kernels over NCHW planes: `max_pool2d` (with each output's argmax) and
//! `avg_pool2d` (padding counted in the divisor), and their gradients.

use super::PARALLEL_WORK;
use super::fork::{fork, may_fork};
use crate::backend::window::{Geom, nchw_strides};
use crate::dtype::Native;
use crate::layout::Layout;
use rayon::prelude::*;

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
    if out.len() * g.kh * g.kw >= PARALLEL_WORK && may_fork() {
        fork(|| {
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
    if out.len() * g.kh * g.kw >= PARALLEL_WORK && may_fork() {
        fork(|| {
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

/// `max_pool2d`'s gradient: each output's gradient `g[p]` added into the zeroed `dx`
/// (contiguous planes of `H*W`) at its argmax `arg[p]` within the plane.
pub(crate) fn max_pool_grad_kernel<T: Native>(g: &[T], arg: &[i64], geom: &Geom, dx: &mut [T]) {
    let (plane, lsz) = (geom.h * geom.w, geom.l());
    if plane == 0 || lsz == 0 {
        return;
    }
    for (p, d) in dx.chunks_mut(plane).enumerate() {
        let (gs, a) = (&g[p * lsz..][..lsz], &arg[p * lsz..][..lsz]);
        for (&v, &i) in gs.iter().zip(a) {
            d[i as usize] = d[i as usize].add(v);
        }
    }
}

/// `avg_pool2d`'s gradient: each output's gradient spread evenly over its window
/// (padding included in the divisor) into the zeroed `dx`.
pub(crate) fn avg_pool_grad_kernel<T: Native>(gd: &[T], g: &Geom, dx: &mut [T]) {
    let (plane, lsz) = (g.h * g.w, g.l());
    if plane == 0 || lsz == 0 {
        return;
    }
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
