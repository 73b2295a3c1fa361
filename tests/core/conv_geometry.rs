//! conv2d and pooling geometry as a property: random stride, padding, dilation and
//! groups, wherever PyTorch's shape formula gives at least one output, forward and every
//! gradient against a direct reference loop (f64; the loops below follow PyTorch's
//! definitions index by index). Plus the two cases that used to panic inside
//! `try_conv2d` (a kernel column that only ever lands in the padding, with a W stride
//! of 1).

use ndscope::{DType, GradientCollector, NDArray, NDManager};
use proptest::prelude::*;

fn f64s(a: NDArray) -> Vec<f64> {
    a.to_vec::<f64>().unwrap()
}

fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-9 * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w}\n got {got:?}\nwant {want:?}"
        );
    }
}

/// Output size along one axis (PyTorch's formula), or `None` when it gives no output.
fn out_len(len: usize, k: usize, s: usize, p: usize, d: usize) -> Option<usize> {
    let span = d * (k - 1) + 1;
    (len + 2 * p >= span).then(|| (len + 2 * p - span) / s + 1)
}

/// One conv2d case: sizes, geometry and values.
#[derive(Clone, Debug)]
struct Conv {
    n: usize,
    groups: usize,
    cg: usize, // input channels per group
    og: usize, // output channels per group
    h: usize,
    w: usize,
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
    bias: bool,
    seed: u64,
}

impl Conv {
    fn out(&self) -> Option<[usize; 2]> {
        Some([
            out_len(self.h, self.k[0], self.s[0], self.p[0], self.d[0])?,
            out_len(self.w, self.k[1], self.s[1], self.p[1], self.d[1])?,
        ])
    }
}

/// Small integers / 4: every product and sum below is exact in f64, so the reference
/// and the kernels agree to rounding of the order of summation only.
fn vals(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % 17) as f64 / 4.0 - 2.0
        })
        .collect()
}

/// y, and the gradients of `sum(y * g)` for x, w and b, by direct loops.
fn conv_reference(
    c: &Conv,
    x: &[f64],
    w: &[f64],
    b: &[f64],
    g: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let [oh, ow] = c.out().unwrap();
    let (cin, cout) = (c.groups * c.cg, c.groups * c.og);
    let xi = |n: usize, ch: usize, y: usize, xx: usize| ((n * cin + ch) * c.h + y) * c.w + xx;
    let wi = |o: usize, ch: usize, i: usize, j: usize| ((o * c.cg + ch) * c.k[0] + i) * c.k[1] + j;
    let yi = |n: usize, o: usize, y: usize, xx: usize| ((n * cout + o) * oh + y) * ow + xx;
    let mut y = vec![0.0; c.n * cout * oh * ow];
    let (mut dx, mut dw, mut db) = (vec![0.0; x.len()], vec![0.0; w.len()], vec![0.0; cout]);
    for n in 0..c.n {
        for o in 0..cout {
            let grp = o / c.og;
            for oy in 0..oh {
                for ox in 0..ow {
                    let gy = g[yi(n, o, oy, ox)];
                    let mut acc = if c.bias { b[o] } else { 0.0 };
                    db[o] += gy;
                    for ch in 0..c.cg {
                        for i in 0..c.k[0] {
                            for j in 0..c.k[1] {
                                let iy = (oy * c.s[0] + i * c.d[0]) as isize - c.p[0] as isize;
                                let ix = (ox * c.s[1] + j * c.d[1]) as isize - c.p[1] as isize;
                                if iy < 0 || ix < 0 || iy >= c.h as isize || ix >= c.w as isize {
                                    continue;
                                }
                                let at = xi(n, grp * c.cg + ch, iy as usize, ix as usize);
                                let wt = wi(o, ch, i, j);
                                acc += x[at] * w[wt];
                                dx[at] += gy * w[wt];
                                dw[wt] += gy * x[at];
                            }
                        }
                    }
                    y[yi(n, o, oy, ox)] = acc;
                }
            }
        }
    }
    (y, dx, dw, db)
}

fn run_conv(c: &Conv) {
    let [oh, ow] = c.out().unwrap();
    let (cin, cout) = (c.groups * c.cg, c.groups * c.og);
    let xs = [c.n, cin, c.h, c.w];
    let ws = [cout, c.cg, c.k[0], c.k[1]];
    let ys = [c.n, cout, oh, ow];
    let (xv, wv) = (
        vals(xs.iter().product(), c.seed),
        vals(ws.iter().product(), c.seed + 1),
    );
    let (bv, gv) = (
        vals(cout, c.seed + 2),
        vals(ys.iter().product(), c.seed + 3),
    );
    let (y_ref, dx_ref, dw_ref, db_ref) = conv_reference(c, &xv, &wv, &bv, &gv);

    let m = NDManager::new();
    let x = m.create(&xv, xs.to_vec());
    let w = m.create(&wv, ws.to_vec());
    let b = m.create(&bv, vec![cout]);
    let g = m.create(&gv, ys.to_vec());
    for a in [x, w, b] {
        a.set_requires_gradient(true);
    }
    let y = {
        let gc = GradientCollector::new();
        let y = x
            .try_conv2d(w, c.bias.then_some(b), c.s, c.p, c.d, c.groups)
            .unwrap_or_else(|e| panic!("{c:?}: {e}"));
        gc.backward((y * g).sum()).unwrap();
        y
    };
    assert_eq!(y.shape().dims(), &ys, "{c:?}");
    assert_close("y", &f64s(y), &y_ref);
    assert_close("dx", &f64s(x.gradient()), &dx_ref);
    assert_close("dw", &f64s(w.gradient()), &dw_ref);
    if c.bias {
        assert_close("db", &f64s(b.gradient()), &db_ref);
    }
    // f32 runs the same geometry (another kernel instantiation).
    let y32 = x
        .to_dtype(DType::F32)
        .conv2d(w.to_dtype(DType::F32), None, c.s, c.p, c.d, c.groups);
    let y32: Vec<f64> = y32
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&v| v as f64)
        .collect();
    let shift: Vec<f64> = (0..y_ref.len())
        .map(|i| {
            if c.bias {
                bv[(i / (oh * ow)) % cout]
            } else {
                0.0
            }
        })
        .collect();
    for (i, (a, r)) in y32.iter().zip(&y_ref).enumerate() {
        let want = r - shift[i];
        assert!(
            (a - want).abs() <= 1e-4 * (1.0 + want.abs()),
            "f32 y[{i}]: {a} vs {want}"
        );
    }
    m.close();
}

fn conv_case() -> impl Strategy<Value = Conv> {
    (
        (1usize..=2, 1usize..=3, 1usize..=2, 1usize..=2),
        (1usize..=7, 1usize..=7, 1usize..=4, 1usize..=4),
        (1usize..=3, 1usize..=3, 0usize..=3, 0usize..=3),
        (1usize..=3, 1usize..=3, any::<bool>(), any::<u64>()),
    )
        .prop_map(
            |((n, groups, cg, og), (h, w, kh, kw), (sh, sw, ph, pw), (dh, dw, bias, seed))| Conv {
                n,
                groups,
                cg,
                og,
                h,
                w,
                k: [kh, kw],
                s: [sh, sw],
                p: [ph, pw],
                d: [dh, dw],
                bias,
                seed,
            },
        )
        .prop_filter("PyTorch's formula gives no output", |c| c.out().is_some())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn conv2d_forward_and_gradients_match_a_direct_loop(c in conv_case()) {
        run_conv(&c);
    }
}

/// A batch large enough that conv2d's kernels split it by samples across the kernel
/// threads (2.5M multiply-adds each, more than a product worth splitting): an odd
/// number of samples, so the parts differ in size, with groups, a stride on one axis
/// and bias. Each part writes its own samples of y and dx and sums its own dW: all must
/// land where one thread would have put them.
#[test]
fn a_batch_split_across_threads_matches_a_direct_loop() {
    let c = Conv {
        n: 5,
        groups: 2,
        cg: 4,
        og: 12,
        h: 24,
        w: 48,
        k: [3, 3],
        s: [1, 2],
        p: [1, 1],
        d: [1, 1],
        bias: true,
        seed: 29,
    };
    run_conv(&c);
    // Again, on blocks the first run gave back to the pool (holding its values): the
    // per-part sums must start from zero all the same.
    run_conv(&Conv { seed: 30, ..c });
}

/// "Same" convolutions (unit strides, output as large as the input), which im2col
/// copies as one shifted run per tap, with the wrapped edges zeroed: kernels of 1, 3
/// and 5, dilations 1 and 2, images down to one row or column, groups and bias.
#[test]
fn same_convolutions_match_a_direct_loop() {
    let mut seed = 7;
    for (k, d) in [(1, 1), (3, 1), (3, 2), (5, 1), (2, 2)] {
        let p = d * (k - 1) / 2;
        for (h, w) in [(1, 1), (1, 5), (4, 1), (5, 4), (6, 7)] {
            for (groups, bias) in [(1, true), (2, false)] {
                seed += 1;
                run_conv(&Conv {
                    n: 2,
                    groups,
                    cg: 2,
                    og: 2,
                    h,
                    w,
                    k: [k, k],
                    s: [1, 1],
                    p: [p, p],
                    d: [d, d],
                    bias,
                    seed,
                });
            }
        }
    }
}

#[test]
fn conv2d_tap_only_in_the_padding_forward() {
    // Used to panic in im2col ("range start index 18446744073709551615 out of range"):
    // kernel column 0 reads input column -2, never in range, with a W stride of 1.
    let m = NDManager::new();
    let x = m.create(&[2.0f64], vec![1, 1, 1, 1]);
    let w = m.create(&[1.0f64, 10.0, 100.0], vec![1, 1, 1, 3]);
    let y = x.try_conv2d(w, None, [1, 1], [0, 2], [1, 2], 1).unwrap();
    assert_eq!(y.shape().dims(), &[1, 1, 1, 1]);
    assert_eq!(f64s(y), vec![20.0]); // PyTorch: [[[[20.]]]]
    m.close();
}

#[test]
fn conv2d_tap_only_in_the_padding_backward() {
    // The forward was right; col2im panicked in the backward pass.
    let m = NDManager::new();
    let x = m.create(&[1.0f64, 2.0, 3.0], vec![1, 1, 3, 1]);
    let w = m.create(
        &[1.0f64, 10.0, 100.0, 1000.0, 10000.0, 100000.0],
        vec![1, 1, 2, 3],
    );
    x.set_requires_gradient(true);
    {
        let gc = GradientCollector::new();
        let y = x.try_conv2d(w, None, [2, 1], [1, 2], [2, 2], 1).unwrap();
        gc.backward(y.sum()).unwrap();
    }
    assert_eq!(f64s(x.gradient()), vec![0.0, 10010.0, 0.0]); // PyTorch
    m.close();
}

/// One pooling case.
#[derive(Clone, Debug)]
struct Pool {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    max: bool,
    seed: u64,
}

/// y and the gradient of `sum(y * g)` for x, by direct loops (PyTorch: padding is -inf
/// for max, zeros counted in the divisor for avg; a max's gradient goes to the window's
/// first maximum in row-major order).
fn pool_reference(c: &Pool, x: &[f64], g: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let oh = out_len(c.h, c.k[0], c.s[0], c.p[0], 1).unwrap();
    let ow = out_len(c.w, c.k[1], c.s[1], c.p[1], 1).unwrap();
    let mut y = vec![0.0; c.n * c.c * oh * ow];
    let mut dx = vec![0.0; x.len()];
    for plane in 0..c.n * c.c {
        for oy in 0..oh {
            for ox in 0..ow {
                let o = (plane * oh + oy) * ow + ox;
                let (mut best, mut arg, mut sum) = (f64::NEG_INFINITY, None, 0.0);
                let mut taps = Vec::new();
                for i in 0..c.k[0] {
                    for j in 0..c.k[1] {
                        let iy = (oy * c.s[0] + i) as isize - c.p[0] as isize;
                        let ix = (ox * c.s[1] + j) as isize - c.p[1] as isize;
                        if iy < 0 || ix < 0 || iy >= c.h as isize || ix >= c.w as isize {
                            continue;
                        }
                        let at = (plane * c.h + iy as usize) * c.w + ix as usize;
                        taps.push(at);
                        sum += x[at];
                        if x[at] > best {
                            (best, arg) = (x[at], Some(at));
                        }
                    }
                }
                if c.max {
                    y[o] = best;
                    dx[arg.unwrap()] += g[o];
                } else {
                    let div = (c.k[0] * c.k[1]) as f64;
                    y[o] = sum / div;
                    for at in taps {
                        dx[at] += g[o] / div;
                    }
                }
            }
        }
    }
    (y, dx)
}

fn pool_case() -> impl Strategy<Value = Pool> {
    (
        (1usize..=2, 1usize..=3, 1usize..=7, 1usize..=7),
        (1usize..=4, 1usize..=4, 1usize..=3, 1usize..=3),
        (0usize..=2, 0usize..=2, any::<bool>(), any::<u64>()),
    )
        .prop_map(
            |((n, c, h, w), (kh, kw, sh, sw), (ph, pw, max, seed))| Pool {
                n,
                c,
                h,
                w,
                k: [kh, kw],
                s: [sh, sw],
                p: [ph.min(kh / 2), pw.min(kw / 2)], // PyTorch: padding at most half the kernel
                max,
                seed,
            },
        )
        .prop_filter("no output", |c| {
            out_len(c.h, c.k[0], c.s[0], c.p[0], 1).is_some()
                && out_len(c.w, c.k[1], c.s[1], c.p[1], 1).is_some()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn pooling_forward_and_gradient_match_a_direct_loop(c in pool_case()) {
        let xs = [c.n, c.c, c.h, c.w];
        let xv = vals(xs.iter().product(), c.seed);
        let oh = out_len(c.h, c.k[0], c.s[0], c.p[0], 1).unwrap();
        let ow = out_len(c.w, c.k[1], c.s[1], c.p[1], 1).unwrap();
        let gv = vals(c.n * c.c * oh * ow, c.seed + 1);
        let (y_ref, dx_ref) = pool_reference(&c, &xv, &gv);
        let m = NDManager::new();
        let x = m.create(&xv, xs.to_vec());
        let g = m.create(&gv, vec![c.n, c.c, oh, ow]);
        x.set_requires_gradient(true);
        let y = {
            let gc = GradientCollector::new();
            let y = if c.max {
                x.try_max_pool2d(c.k, c.s, c.p)
            } else {
                x.try_avg_pool2d(c.k, c.s, c.p)
            }
            .unwrap_or_else(|e| panic!("{c:?}: {e}"));
            gc.backward((y * g).sum()).unwrap();
            y
        };
        assert_close("y", &f64s(y), &y_ref);
        assert_close("dx", &f64s(x.gradient()), &dx_ref);
        m.close();
    }
}
