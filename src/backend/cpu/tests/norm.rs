//! The normalisation kernels (`backend/cpu/norm.rs`) against plain loops: split across
//! threads, grouped over transposed views, and summing into reused scratch.

use super::*;
use crate::backend::cpu::buffer::with_scratch;
use crate::backend::cpu::norm::{Affine, SumInto, normalize_grad_kernel, normalize_kernel};

/// The normalisation kernels on arrays big enough to split across threads (and, for
/// `layer_norm`'s gamma, to sum its gradient in several parts) agree with a plain f64
/// loop over every element, for `layer_norm`'s and `batch_norm`'s groupings of a
/// transposed view; and give the same bits on one thread as on the kernel pool.
#[test]
fn normalisations_split_across_threads_match_a_plain_loop() {
    let d = [8usize, 8, 64, 64];
    let n: usize = d.iter().product();
    assert!(n >= PARALLEL_ELEMS); // several parts sum layer_norm's gamma
    let val = |i: usize, s: f32| ((i * 37 % 101) as f32 / 50.0 - 1.0) * s + (i % 7) as f32;
    // x is stored as [64, 64, 8, 8] and viewed as [8, 8, 64, 64] (no axis contiguous).
    let data: Vec<f32> = (0..n).map(|i| val(i, 3.0)).collect();
    let l = layout(&d, &[1, 8, 4096, 64], 0);
    let g: Vec<f32> = (0..n).map(|i| val(i * 13, 1.0)).collect();
    let gl = layout(&d, &[8 * 4096, 4096, 64, 1], 0);
    let eps = 1e-5;
    // (normalised axes, parameter shape, channel parameter)
    for (red, pdims, channel) in [
        ([false, true, true, true], vec![8usize, 64, 64], false),
        ([true, false, true, true], vec![8], true),
    ] {
        let psize: usize = pdims.iter().product();
        let gamma: Vec<f32> = (0..psize).map(|i| val(i * 5, 0.5) - 2.0).collect();
        let beta: Vec<f32> = (0..psize).map(|i| val(i * 3, 0.5)).collect();
        let pl = Layout::contiguous(Shape::from(pdims.clone()));
        let shape = l.shape.clone();
        // Where element (a, b, c, e) finds its parameter, and its group.
        let p_of = |ix: [usize; 4]| -> usize {
            if channel {
                ix[1]
            } else {
                (ix[1] * 64 + ix[2]) * 64 + ix[3]
            }
        };
        let group_of = |ix: [usize; 4]| if channel { ix[1] } else { ix[0] };
        let groups = 8;
        let each = |f: &mut dyn FnMut([usize; 4], usize)| {
            for a in 0..8 {
                for b in 0..8 {
                    for c in 0..64 {
                        for e in 0..64 {
                            f([a, b, c, e], ((a * 8 + b) * 64 + c) * 64 + e);
                        }
                    }
                }
            }
        };
        let at = |ix: [usize; 4]| ix[0] + ix[1] * 8 + ix[2] * 4096 + ix[3] * 64;
        // The reference, in f64.
        let (mut sum, mut cnt) = (vec![0.0f64; groups], vec![0.0f64; groups]);
        each(&mut |ix, _| {
            sum[group_of(ix)] += data[at(ix)] as f64;
            cnt[group_of(ix)] += 1.0;
        });
        let mean: Vec<f64> = sum.iter().zip(&cnt).map(|(s, c)| s / c).collect();
        let mut var = vec![0.0f64; groups];
        each(&mut |ix, _| var[group_of(ix)] += (data[at(ix)] as f64 - mean[group_of(ix)]).powi(2));
        var.iter_mut().zip(&cnt).for_each(|(v, c)| *v /= c);
        let rstd: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
        let xhat = |ix: [usize; 4]| (data[at(ix)] as f64 - mean[group_of(ix)]) * rstd[group_of(ix)];
        let (mut s1, mut s2) = (vec![0.0f64; groups], vec![0.0f64; groups]);
        let (mut dgamma, mut dbeta) = (vec![0.0f64; psize], vec![0.0f64; psize]);
        let (mut want_y, mut want_dx) = (vec![0.0f64; n], vec![0.0f64; n]);
        each(&mut |ix, o| {
            let (p, q, gv) = (p_of(ix), group_of(ix), g[o] as f64);
            want_y[o] = xhat(ix) * gamma[p] as f64 + beta[p] as f64;
            s1[q] += gv * gamma[p] as f64;
            s2[q] += gv * gamma[p] as f64 * xhat(ix);
            dgamma[p] += gv * xhat(ix);
            dbeta[p] += gv;
        });
        each(&mut |ix, o| {
            let (p, q) = (p_of(ix), group_of(ix));
            let dxh = g[o] as f64 * gamma[p] as f64;
            want_dx[o] = rstd[q] * (dxh - s1[q] / cnt[q] - xhat(ix) * s2[q] / cnt[q]);
        });
        let run = || {
            let (gm, bt) = (
                Affine::of(
                    Strided {
                        data: &gamma,
                        layout: &pl,
                    },
                    &shape,
                    channel,
                ),
                Affine::of(
                    Strided {
                        data: &beta,
                        layout: &pl,
                    },
                    &shape,
                    channel,
                ),
            );
            let x = Strided {
                data: &data,
                layout: &l,
            };
            let (y, mu, v) = normalize_kernel::<f32>(x, &red, &gm, &bt, eps, None).unwrap();
            let rs: Vec<f64> = v.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
            let into: crate::layout::Strides = if channel {
                [0, 1, 0, 0].into_iter().collect()
            } else {
                pl.broadcast_strides(&shape)
            };
            let sums = [
                SumInto {
                    strides: &into,
                    size: psize,
                },
                SumInto {
                    strides: &into,
                    size: psize,
                },
            ];
            let gs = Strided {
                data: &g,
                layout: &gl,
            };
            // Old values in the pool where layer_norm's gamma and beta accumulators
            // (4 parts) will be taken from: each part must zero what it adds into.
            with_scratch::<f64, _>(4 * 2 * psize, |s| s.fill(f64::NAN)).unwrap();
            let gr =
                normalize_grad_kernel::<f32>(x, gs, &red, &gm, (&mu, &rs), true, sums).unwrap();
            (
                read::<f32>(&y),
                mu,
                v,
                read::<f32>(&gr.dx),
                gr.dgamma.to_vec(),
                gr.dbeta.to_vec(),
            )
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let (one, many) = (pool.install(run), run());
        // The first element whose bits differ.
        let differ = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .position(|(x, y)| x.to_bits() != y.to_bits())
        };
        assert_eq!(differ(&one.0, &many.0), None, "y, channel {channel}");
        assert_eq!(differ(&one.3, &many.3), None, "dx, channel {channel}");
        assert_eq!(
            (&one.1, &one.2, &one.4, &one.5),
            (&many.1, &many.2, &many.4, &many.5)
        );
        let close = |got: &[f64], want: &[f64], tol: f64, what: &str| {
            for (i, (a, b)) in got.iter().zip(want).enumerate() {
                assert!(
                    (a - b).abs() <= tol * (1.0 + b.abs()),
                    "{what} [{i}]: {a} vs {b}, channel {channel}"
                );
            }
        };
        let wide = |v: &[f32]| v.iter().map(|&e| e as f64).collect::<Vec<_>>();
        close(&many.1, &mean, 1e-12, "mean");
        close(&many.2, &var, 1e-12, "var");
        close(&wide(&many.0), &want_y, 1e-5, "y");
        close(&wide(&many.3), &want_dx, 1e-4, "dx");
        close(&many.4, &dgamma, 1e-9, "dgamma");
        close(&many.5, &dbeta, 1e-9, "dbeta");
    }
}

/// `layer_norm`'s gamma may vary along a kept axis too (gamma `[C,H,W]` normalising
/// `[H,W]` of `[N,C,H,W]`): then each part of the gradient's phase 1 reaches only its
/// own groups' cells of gamma's accumulators, and the cells it never reaches must
/// still read 0, even in scratch the buffer pool hands back holding old values.
#[test]
fn a_gamma_along_a_kept_axis_sums_right_from_reused_scratch() {
    let d = [1usize, 8, 128, 128];
    let n: usize = d.iter().product();
    let val = |i: usize, s: f32| ((i * 37 % 101) as f32 / 50.0 - 1.0) * s + (i % 7) as f32;
    let data: Vec<f32> = (0..n).map(|i| val(i, 3.0)).collect();
    let g: Vec<f32> = (0..n).map(|i| val(i * 13, 1.0)).collect();
    let gamma: Vec<f32> = (0..n).map(|i| val(i * 5, 0.5) - 2.0).collect();
    let l = Layout::contiguous(Shape::from(d.to_vec()));
    let pl = Layout::contiguous(Shape::from(d[1..].to_vec()));
    let red = [false, false, true, true];
    // Per group (a channel): the mean and rstd the forward pass would have saved.
    let m = 128 * 128;
    let (mut mean, mut rstd) = (vec![0.0f64; 8], vec![0.0f64; 8]);
    for c in 0..8 {
        let xs = &data[c * m..(c + 1) * m];
        let mu = xs.iter().map(|&v| v as f64).sum::<f64>() / m as f64;
        let var = xs.iter().map(|&v| (v as f64 - mu).powi(2)).sum::<f64>() / m as f64;
        (mean[c], rstd[c]) = (mu, 1.0 / (var + 1e-5).sqrt());
    }
    // With one sample, gamma's gradient is `g * xhat` and beta's is `g`, element-wise.
    let want_dgamma: Vec<f64> = (0..n)
        .map(|i| g[i] as f64 * (data[i] as f64 - mean[i / m]) * rstd[i / m])
        .collect();
    let into = pl.broadcast_strides(&l.shape);
    // Old values in the pool, of the accumulators' size (2 parts × gamma's and beta's).
    with_scratch::<f64, _>(2 * 2 * n, |s| s.fill(f64::NAN)).unwrap();
    let p = Strided {
        data: &gamma,
        layout: &pl,
    };
    let gm = Affine::of(p, &l.shape, false);
    let x = Strided {
        data: &data,
        layout: &l,
    };
    let gs = Strided {
        data: &g,
        layout: &l,
    };
    let sums = [n, n].map(|size| SumInto {
        strides: &into,
        size,
    });
    let got = normalize_grad_kernel::<f32>(x, gs, &red, &gm, (&mean, &rstd), true, sums).unwrap();
    for i in 0..n {
        let (a, b) = (got.dgamma[i], want_dgamma[i]);
        assert!(
            (a - b).abs() <= 1e-9 * (1.0 + b.abs()),
            "dgamma[{i}]: {a} vs {b}"
        );
        assert_eq!(got.dbeta[i], g[i] as f64, "dbeta[{i}]");
    }
}
