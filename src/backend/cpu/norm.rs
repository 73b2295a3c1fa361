//! The normalisation kernel behind `layer_norm` and `batch_norm` (group statistics,
//! then `(x - mean) / sqrt(var + eps) * gamma + beta`), and `batch_norm`'s in-place
//! update of its running statistics.

use super::buffer::{Buffer, new_overwritten};
use super::strided::{Strided, StridedMut};
use crate::dtype::{Float, Native};
use crate::error::Result;
use crate::layout::{Strides, for_each_row};
use crate::shape::{Dims, Shape};

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
pub(crate) fn normalize_kernel<T: Float>(
    x: Strided<'_, T>,
    red: &[bool],
    gamma: &Affine<'_, T>,
    beta: &Affine<'_, T>,
    eps: f64,
    given: Option<(Vec<f64>, Vec<f64>)>,
) -> Result<(Buffer, Vec<f64>, Vec<f64>)> {
    let l = x.layout;
    let dims = l.shape.dims();
    let xd = x.data;
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

/// Elements of a row that [`normalize_grad_kernel`] converts to f64 at a time.
const CHUNK: usize = 64;

/// `out[i] = d[p + i*s]` as f64 (a contiguous row converts as one vectorised loop).
#[inline(always)]
fn load<T: Native>(d: &[T], p: isize, s: isize, out: &mut [f64]) {
    match s {
        1 => {
            let src = &d[p as usize..p as usize + out.len()];
            for (o, v) in out.iter_mut().zip(src) {
                *o = v.to_f64();
            }
        }
        0 => out.fill(d[p as usize].to_f64()),
        _ => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = d[(p + i as isize * s) as usize].to_f64();
            }
        }
    }
}

/// `acc[p + i*s] += v_i`.
#[inline(always)]
fn add_strided(acc: &mut [f64], p: isize, s: isize, v: impl Iterator<Item = f64>) {
    if s == 1 {
        for (a, x) in acc[p as usize..].iter_mut().zip(v) {
            *a += x;
        }
    } else {
        for (i, x) in v.enumerate() {
            acc[(p + i as isize * s) as usize] += x;
        }
    }
}

/// What [`normalize_grad_kernel`] gives back: `dx` (contiguous, `x`'s shape) and the
/// sums `Σ g * xhat` and `Σ g` into their accumulators (gamma's and beta's gradients).
pub(crate) struct NormGrad {
    pub dx: Buffer,
    pub dgamma: Vec<f64>,
    pub dbeta: Vec<f64>,
}

/// Where [`normalize_grad_kernel`] sums one parameter's gradient: the strides, one per
/// axis of `x`, of a contiguous array of the parameter's shape broadcast to `x`'s (0 on
/// the axes it is broadcast along), and that array's size.
pub(crate) struct SumInto<'a> {
    pub strides: &'a [isize],
    pub size: usize,
}

/// The gradient of [`normalize_kernel`] in two passes over each group (f64
/// accumulation), in place of a dozen whole-array ops: with `xhat = (x - mean) * rstd`
/// and `dxhat = g * gamma`, `dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat *
/// xhat))` when the statistics came from the group (`batch_stats`), else `dxhat * rstd`;
/// and gamma's and beta's gradients, `g * xhat` and `g` summed into `sums`. `g` has
/// `x`'s shape (any strides, broadcast included); `mean` and `rstd` hold one value per
/// group, in row-major order of the kept axes.
pub(crate) fn normalize_grad_kernel<T: Float>(
    x: Strided<'_, T>,
    g: Strided<'_, T>,
    red: &[bool],
    gamma: &Affine<'_, T>,
    (mean, rstd): (&[f64], &[f64]),
    batch_stats: bool,
    [sg_into, sb_into]: [SumInto<'_>; 2],
) -> Result<NormGrad> {
    let l = x.layout;
    let dims = l.shape.dims();
    let (xd, gd) = (x.data, g.data);
    let gs = g.layout.broadcast_strides(&l.shape);
    let ys = l.shape.contiguous_strides();
    let (mut kd, mut nd) = (Dims::new(), Dims::new());
    for (d, &v) in dims.iter().enumerate() {
        if red[d] { nd.push(v) } else { kd.push(v) }
    }
    let m = nd.iter().product::<usize>() as f64;
    let (xk, xn) = split_axes(&l.strides, red);
    let (gk, gn) = split_axes(&gs, red);
    let (yk, yn) = split_axes(&ys, red);
    let (ck, cn) = split_axes(&gamma.strides, red);
    let (ak, an) = split_axes(sg_into.strides, red);
    let (bk, bn) = split_axes(sb_into.strides, red);
    let (mut dgamma, mut dbeta) = (vec![0.0; sg_into.size], vec![0.0; sb_into.size]);
    // Each group sums into one cell of both (batch_norm's channels, an unwanted
    // parameter's dummy): in registers, then once per group; else element by element.
    let per_element = an.iter().chain(&bn).any(|&s| s != 0);
    let dx = new_overwritten::<T>(l.size(), |out| {
        if l.size() == 0 {
            return;
        }
        let mut gi = 0usize;
        for_each_row(
            &kd,
            [&xk, &gk, &yk, &ck, &ak, &bk],
            [l.offset, g.layout.offset, 0, gamma.offset, 0, 0],
            |off, len, s| {
                for r in 0..len as isize {
                    let o: [usize; 6] = std::array::from_fn(|k| (off[k] + r * s[k]) as usize);
                    let (mu, rs) = (mean[gi], rstd[gi]);
                    gi += 1;
                    // Lanes of Σ dxhat, Σ dxhat*xhat, Σ g*xhat, Σ g (four sums each, so
                    // the loops vectorise).
                    let mut lanes = [[0.0f64; 4]; 4];
                    let base = [o[0], o[1], o[3], o[4], o[5]];
                    let (mut xs, mut gs, mut cs) = ([0.0; CHUNK], [0.0; CHUNK], [0.0; CHUNK]);
                    for_each_row(&nd, [&xn, &gn, &cn, &an, &bn], base, |p, n, st| {
                        for c0 in (0..n).step_by(CHUNK) {
                            let k = CHUNK.min(n - c0);
                            let at = |j: usize| p[j] + c0 as isize * st[j];
                            let (xs, gs, cs) = (&mut xs[..k], &mut gs[..k], &mut cs[..k]);
                            load(xd, at(0), st[0], xs);
                            load(gd, at(1), st[1], gs);
                            load(gamma.data, at(2), st[2], cs);
                            for x in xs.iter_mut() {
                                *x = (*x - mu) * rs; // xhat
                            }
                            let (xq, gq, cq) =
                                (xs.chunks_exact(4), gs.chunks_exact(4), cs.chunks_exact(4));
                            let tail = xq.remainder().len();
                            for ((x4, g4), c4) in xq.zip(gq).zip(cq) {
                                for l in 0..4 {
                                    let dxh = g4[l] * c4[l];
                                    lanes[0][l] += dxh;
                                    lanes[1][l] += dxh * x4[l];
                                    lanes[2][l] += g4[l] * x4[l];
                                    lanes[3][l] += g4[l];
                                }
                            }
                            for i in k - tail..k {
                                let dxh = gs[i] * cs[i];
                                lanes[0][0] += dxh;
                                lanes[1][0] += dxh * xs[i];
                                lanes[2][0] += gs[i] * xs[i];
                                lanes[3][0] += gs[i];
                            }
                            if per_element {
                                add_strided(
                                    &mut dgamma,
                                    at(3),
                                    st[3],
                                    xs.iter().zip(gs.iter()).map(|(x, g)| g * x),
                                );
                                add_strided(&mut dbeta, at(4), st[4], gs.iter().copied());
                            }
                        }
                    });
                    let sum = |l: [f64; 4]| (l[0] + l[1]) + (l[2] + l[3]);
                    let (s1, s2) = (sum(lanes[0]), sum(lanes[1]));
                    if !per_element {
                        dgamma[o[4]] += sum(lanes[2]);
                        dbeta[o[5]] += sum(lanes[3]);
                    }
                    let (m1, m2) = if batch_stats {
                        (s1 / m, s2 / m)
                    } else {
                        (0.0, 0.0)
                    };
                    let base = [o[0], o[1], o[2], o[3]];
                    for_each_row(&nd, [&xn, &gn, &yn, &cn], base, |p, n, st| {
                        for c0 in (0..n).step_by(CHUNK) {
                            let k = CHUNK.min(n - c0);
                            let at = |j: usize| p[j] + c0 as isize * st[j];
                            let (xs, gs, cs) = (&mut xs[..k], &mut gs[..k], &mut cs[..k]);
                            load(xd, at(0), st[0], xs);
                            load(gd, at(1), st[1], gs);
                            load(gamma.data, at(3), st[3], cs);
                            for ((x, g), c) in xs.iter_mut().zip(gs.iter()).zip(cs.iter()) {
                                let xh = (*x - mu) * rs;
                                *x = rs * (g * c - m1 - xh * m2);
                            }
                            let (y0, ys) = (at(2), st[2]);
                            if ys == 1 {
                                let dst = &mut out[y0 as usize..y0 as usize + k];
                                for (d, &v) in dst.iter_mut().zip(xs.iter()) {
                                    *d = T::from_f64(v);
                                }
                            } else {
                                for (i, &v) in xs.iter().enumerate() {
                                    out[(y0 + i as isize * ys) as usize] = T::from_f64(v);
                                }
                            }
                        }
                    });
                }
            },
        );
    })?;
    Ok(NormGrad { dx, dgamma, dbeta })
}
