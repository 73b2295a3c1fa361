//! Pooling kernels over NCHW planes: `max_pool2d` (with each output's argmax) and
//! `avg_pool2d` (padding counted in the divisor), and their gradients.

use super::PARALLEL_WORK;
use super::fork::{fork, may_fork};
use crate::backend::window::{Geom, nchw_strides};
use crate::dtype::Native;
use crate::layout::Layout;
use rayon::prelude::*;
use std::hint::select_unpredictable;

/// The running maximum of one window and where it is, updated without a branch: a max
/// over random data mispredicts half its branches (this kernel was 30% of the digits
/// CNN's step with an `if` per tap). The taps come in scan order (rows, then columns),
/// so the first maximum wins ties and the first NaN wins outright, as in PyTorch: once a
/// NaN is seen nothing is taken. `best` ignores NaN (`max_num`, a max instruction); the
/// value written out is the input at `pos`, the winner, NaN included.
#[derive(Clone, Copy)]
struct RunningMax<T> {
    best: T,
    nan: bool,
    /// The winner's index within its plane (`iy*W + ix`): the saved argmax.
    at: i64,
    /// The winner's index in the input slice.
    pos: usize,
}

impl<T: Native> RunningMax<T> {
    #[inline(always)]
    fn see(&mut self, v: T, at: i64, pos: usize) {
        let nan = v.is_nan();
        let take = ((v > self.best) | nan) & !self.nan;
        self.nan |= nan;
        self.best = self.best.max_num(v);
        self.at = select_unpredictable(take, at, self.at);
        self.pos = select_unpredictable(take, pos, self.pos);
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
            let orow = o[oy * g.ow..][..g.ow].iter_mut();
            let arow = a[oy * g.ow..][..g.ow].iter_mut();
            for (ox, (b, at)) in orow.zip(arow).enumerate() {
                let x0 = (ox * g.sw) as isize - g.pw as isize;
                let (xlo, xhi) = (x0.max(0), (x0 + g.kw as isize).min(g.w as isize));
                // Padding keeps at most half a window out, so every window has an
                // element; `pos` starts at its first (the winner if all are -inf).
                let mut m = RunningMax {
                    best: T::LOWEST,
                    nan: false,
                    at: (ylo * g.w as isize + xlo) as i64,
                    pos: (base + ylo * st[2] + xlo * st[3]) as usize,
                };
                for iy in ylo..yhi {
                    let row = base + iy * st[2];
                    for ix in xlo..xhi {
                        let pos = (row + ix * st[3]) as usize;
                        m.see(x[pos], (iy * g.w as isize + ix) as i64, pos);
                    }
                }
                *b = x[m.pos];
                *at = m.at;
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
