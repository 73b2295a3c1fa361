//! Tests of the nn operations: conv2d, max/avg pooling, layer_norm, batch_norm,
//! embedding, cross_entropy, mse_loss, binary_cross_entropy_with_logits, one_hot.
//!
//! Expected values marked "numpy" were computed with numpy 2.4 by a direct (loop)
//! implementation of PyTorch's definitions, from inputs built by `vals` (the same
//! formula in Python), and pasted here.

#[allow(unused_imports)]
use crate::common::*;
use crate::fails;
use ndscope::{DType, GradientCollector, NDArray, NDManager, NdError};

/// `((i*37 + seed*11) % 17 - 8) / 4` for `i` in row-major order: exact in f64, the same
/// in the numpy script.
fn vals(m: &NDManager, shape: &[usize], seed: usize) -> NDArray {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| (((i * 37 + seed * 11) % 17) as f64 - 8.0) / 4.0)
        .collect();
    m.create(&v, shape.to_vec())
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "length: got {got:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: got {g}, want {w}\n got {got:?}"
        );
    }
}

fn f64s(a: NDArray) -> Vec<f64> {
    a.to_vec::<f64>().unwrap()
}

// ---- conv2d ----

#[test]
fn conv2d_matches_numpy_with_stride_padding_dilation_and_groups() {
    let m = NDManager::new();
    let x = vals(&m, &[2, 4, 5, 5], 1);
    let w = vals(&m, &[4, 2, 3, 3], 2);
    let b = vals(&m, &[4], 3);
    let y = x.conv2d(w, Some(b), [2, 2], [1, 1], [2, 2], 2);
    assert_eq!(y.shape().dims(), &[2, 4, 2, 2]);
    // numpy
    let want = [
        1.0625, 12.75, 1.0625, -5.3125, -2.4375, -2.4375, -2.4375, -2.4375, 0.75, -1.125, 0.4375,
        -1.4375, -1.9375, 1.5, -2.25, 1.1875, -1.5625, -3.1875, 7.375, 5.75, -4.5, -5.0625, 4.4375,
        3.875, 3.5, 6.375, -5.9375, -3.0625, -3.9375, 4.25, 4.6875, -5.1875,
    ];
    assert_close(&f64s(y), &want, 1e-12);
    // F32 gives the same (the values are exact in f32).
    let y32 = x.to_dtype(DType::F32).conv2d(
        w.to_dtype(DType::F32),
        Some(b.to_dtype(DType::F32)),
        [2, 2],
        [1, 1],
        [2, 2],
        2,
    );
    assert_eq!(y32.dtype(), DType::F32);
    let got: Vec<f64> = y32
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&v| v as f64)
        .collect();
    assert_close(&got, &want, 1e-6);
    m.close();
}

#[test]
fn conv2d_matches_numpy_with_uneven_stride_and_padding() {
    let m = NDManager::new();
    let x = vals(&m, &[1, 3, 6, 5], 4);
    let w = vals(&m, &[2, 3, 2, 3], 5);
    let y = x.conv2d(w, None, [1, 2], [0, 1], [1, 1], 1);
    assert_eq!(y.shape().dims(), &[1, 2, 5, 3]);
    // numpy
    let want = [
        -3.6875, 12.0, -5.625, -6.3125, 2.9375, -0.5625, -3.625, -2.9375, 3.4375, -6.25, -0.3125,
        8.5, -0.375, -6.1875, 5.0625, -2.75, 0.4375, -0.375, -1.375, -2.625, 9.75, 2.125, -2.5,
        3.9375, 0.3125, -8.75, -0.8125, 7.0, -5.4375, 0.8125,
    ];
    assert_close(&f64s(y), &want, 1e-12);
    m.close();
}

#[test]
fn conv2d_reads_non_contiguous_inputs_and_weights() {
    let m = NDManager::new();
    let x = vals(&m, &[2, 4, 5, 5], 1);
    let w = vals(&m, &[4, 2, 3, 3], 2);
    let want = f64s(x.conv2d(w, None, [1, 2], [2, 1], [1, 2], 2));
    // The same data laid out [N, W, H, C] and permuted back: strided reads.
    let xt = x.permute(&[0, 3, 2, 1]).to_dtype(DType::F64); // a contiguous copy [N,W,H,C]
    let xv = xt.permute(&[0, 3, 2, 1]);
    let wt = w
        .permute(&[3, 2, 1, 0])
        .to_dtype(DType::F64)
        .permute(&[3, 2, 1, 0]);
    let got = f64s(xv.conv2d(wt, None, [1, 2], [2, 1], [1, 2], 2));
    assert_eq!(got, want);
    // A sliced view (every other sample, offset 1).
    let big = vals(&m, &[4, 4, 5, 5], 1);
    let sl = big.get("1::2");
    let dense = sl.to_dtype(DType::F64).reshape([2, 4, 5, 5]);
    assert_eq!(
        f64s(sl.conv2d(w, None, [1, 1], [1, 1], [1, 1], 2)),
        f64s(dense.conv2d(w, None, [1, 1], [1, 1], [1, 1], 2))
    );
    m.close();
}

/// The gradient that reaches conv2d's backward may be a strided view (here the
/// permute's backward of a contiguous [N, oh, ow, O] gradient): both gradient kernels
/// read it through its strides, with two groups, the same as a contiguous one.
#[test]
fn conv2d_gradients_read_a_strided_upstream_gradient() {
    let m = NDManager::new();
    let g = vals(&m, &[3, 6, 5, 6], 3);
    let grads = |strided: bool| {
        let x = vals(&m, &[3, 4, 5, 6], 1);
        let w = vals(&m, &[6, 2, 3, 3], 2);
        for p in [x, w] {
            p.set_requires_gradient(true);
        }
        let gc = GradientCollector::new();
        let y = x.conv2d(w, None, [1, 1], [1, 1], [1, 1], 2);
        let loss = if strided {
            // A contiguous [N, oh, ow, O] copy: y's gradient is its permuted view.
            let gp = g.permute(&[0, 2, 3, 1]).to_dtype(DType::F64);
            (y.permute(&[0, 2, 3, 1]) * gp).sum()
        } else {
            (y * g).sum()
        };
        gc.backward(loss).unwrap();
        (f64s(x.gradient()), f64s(w.gradient()))
    };
    let (dx, dw) = grads(false);
    let (sdx, sdw) = grads(true);
    assert_close(&sdx, &dx, 1e-12);
    assert_close(&sdw, &dw, 1e-12);
    m.close();
}

#[test]
fn conv2d_zero_size_and_depthwise() {
    let m = NDManager::new();
    let w = vals(&m, &[3, 1, 3, 3], 2);
    let empty = m.zeros([0, 3, 4, 4], DType::F64);
    let y = empty.conv2d(w, None, [1, 1], [1, 1], [1, 1], 3);
    assert_eq!(y.shape().dims(), &[0, 3, 4, 4]);
    // Depthwise (groups = C) equals three single-channel convolutions.
    let x = vals(&m, &[1, 3, 4, 4], 6);
    let y = f64s(x.conv2d(w, None, [1, 1], [1, 1], [1, 1], 3));
    for c in 0..3 {
        let xc = x.get(&format!(":, {c}:{}", c + 1));
        let wc = w.get(&format!("{c}:{}", c + 1));
        let yc = f64s(xc.conv2d(wc, None, [1, 1], [1, 1], [1, 1], 1));
        assert_eq!(&y[c * 16..(c + 1) * 16], &yc[..]);
    }
    // No input channels: the bias alone.
    let x0 = m.zeros([1, 0, 3, 3], DType::F64);
    let w0 = m.zeros([2, 0, 2, 2], DType::F64);
    let b = m.create(&[1.5f64, -2.0], [2]);
    assert_eq!(
        f64s(x0.conv2d(w0, Some(b), [1, 1], [0, 0], [1, 1], 1)),
        vec![1.5, 1.5, 1.5, 1.5, -2.0, -2.0, -2.0, -2.0]
    );
    m.close();
}

#[test]
fn conv2d_large_batches_are_chunked_exactly() {
    // [8, 64, 32, 32] with 3x3 kernels: the im2col matrix of the whole batch (576 rows x
    // 8192 columns) exceeds the kernel's chunk limit, so samples go in chunks (7 + 1 on
    // one thread; with two kernel threads, two parts of 4 samples, each in chunks of 3 +
    // 1). Every sample must match its own convolution, in value and gradient.
    let m = NDManager::new();
    let x = vals(&m, &[8, 64, 32, 32], 1).set_requires_gradient(true);
    let w = vals(&m, &[2, 64, 3, 3], 2).set_requires_gradient(true);
    let r = vals(&m, &[8, 2, 32, 32], 3);
    let y = {
        let gc = GradientCollector::new();
        let y = x.conv2d(w, None, [1, 1], [1, 1], [1, 1], 1);
        gc.backward((y * r).sum()).unwrap();
        y
    };
    let (gx, gw) = (f64s(x.gradient()), f64s(w.gradient()));
    let (ys, mut gw_sum) = (f64s(y), vec![0.0; gw.len()]);
    let per = 64 * 32 * 32;
    for i in 0..8 {
        let xi = x.get(&format!("{i}:{}", i + 1)).to_dtype(DType::F64);
        xi.set_requires_gradient(true);
        let ri = r.get(&format!("{i}:{}", i + 1));
        let yi = {
            let gc = GradientCollector::new();
            let yi = xi.conv2d(w, None, [1, 1], [1, 1], [1, 1], 1);
            gc.backward((yi * ri).sum()).unwrap();
            yi
        };
        assert_close(&f64s(yi), &ys[i * 2048..(i + 1) * 2048], 1e-12);
        assert_close(&f64s(xi.gradient()), &gx[i * per..(i + 1) * per], 1e-12);
        for (s, g) in gw_sum.iter_mut().zip(f64s(w.gradient())) {
            *s += g;
        }
    }
    assert_close(&gw_sum, &gw, 1e-12);
    m.close();
}

#[test]
fn conv2d_gradients() {
    // Input, weight and bias with groups, stride, padding and dilation.
    gradcheck(&[&[2, 4, 5, 5], &[4, 2, 2, 2], &[4]], -1.0, 1.0, |a| {
        a[0].conv2d(a[1], Some(a[2]), [2, 1], [1, 2], [2, 1], 2)
    });
    // Plain 3x3 with padding, no bias.
    gradcheck(&[&[1, 2, 4, 4], &[3, 2, 3, 3]], -1.0, 1.0, |a| {
        a[0].conv2d(a[1], None, [1, 1], [1, 1], [1, 1], 1)
    });
    // Stride larger than the kernel (some inputs get no gradient).
    gradcheck(&[&[1, 1, 5, 5], &[1, 1, 2, 2]], -1.0, 1.0, |a| {
        a[0].conv2d(a[1], None, [3, 3], [0, 0], [1, 1], 1)
    });
}

#[test]
fn conv2d_gradient_of_the_weight_only() {
    // A data input (not a parameter): only the weight and bias get gradients.
    let m = NDManager::new();
    let x = vals(&m, &[2, 2, 4, 4], 1);
    let w = vals(&m, &[2, 2, 3, 3], 2).set_requires_gradient(true);
    let b = m.zeros([2], DType::F64).set_requires_gradient(true);
    {
        let gc = GradientCollector::new();
        let y = x.conv2d(w, Some(b), [1, 1], [1, 1], [1, 1], 1);
        gc.backward(y.sum()).unwrap();
    }
    // d sum / d bias = number of output positions per channel (N * 4 * 4).
    assert_eq!(f64s(b.gradient()), vec![32.0, 32.0]);
    // d sum / d w[o, c, i, j] = sum of the inputs the tap sees: the same for both o.
    let gw = f64s(w.gradient());
    assert_eq!(&gw[..18], &gw[18..]);
    m.close();
}

#[test]
fn conv2d_errors() {
    let m = NDManager::new();
    let x = vals(&m, &[1, 4, 5, 5], 1);
    let w = vals(&m, &[4, 2, 3, 3], 2);
    let b = vals(&m, &[4], 3);
    use NdError::*;
    fails!(
        m,
        x.try_conv2d(w, None, [1, 1], [0, 0], [1, 1], 1),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_conv2d(w, None, [1, 1], [0, 0], [1, 1], 3),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_conv2d(w, None, [1, 1], [0, 0], [1, 1], 0),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_conv2d(w, None, [0, 1], [0, 0], [1, 1], 2),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_conv2d(w, None, [1, 1], [0, 0], [0, 1], 2),
        InvalidArgument { .. }
    );
    // The dilated window (5x5 with dilation 2... 9x9 with 4) exceeds 5 + 2*1.
    fails!(
        m,
        x.try_conv2d(w, None, [1, 1], [1, 1], [4, 4], 2),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_conv2d(w, Some(w), [1, 1], [0, 0], [1, 1], 2),
        InvalidArgument { .. }
    );
    let b5 = vals(&m, &[5], 3);
    fails!(
        m,
        x.try_conv2d(w, Some(b5), [1, 1], [0, 0], [1, 1], 2),
        InvalidArgument { .. }
    );
    let x3 = vals(&m, &[4, 5, 5], 1);
    fails!(
        m,
        x3.try_conv2d(w, None, [1, 1], [0, 0], [1, 1], 2),
        InvalidArgument { .. }
    );
    let w3 = vals(&m, &[4, 2, 3], 1);
    fails!(
        m,
        x.try_conv2d(w3, None, [1, 1], [0, 0], [1, 1], 2),
        InvalidArgument { .. }
    );
    let w32 = w.to_dtype(DType::F32);
    fails!(
        m,
        x.try_conv2d(w32, None, [1, 1], [0, 0], [1, 1], 2),
        DTypeMismatch { .. }
    );
    let arg1 = b.to_dtype(DType::F32);
    fails!(
        m,
        x.try_conv2d(w, Some(arg1), [1, 1], [0, 0], [1, 1], 2),
        DTypeMismatch { .. }
    );
    let xi = x.to_dtype(DType::I32);
    let wi = w.to_dtype(DType::I32);
    fails!(
        m,
        xi.try_conv2d(wi, None, [1, 1], [0, 0], [1, 1], 2),
        UnsupportedDType { .. }
    );
    // The message names both shapes.
    let e = x
        .try_conv2d(w, None, [1, 1], [0, 0], [1, 1], 1)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("[4, 2, 3, 3]") && e.contains("[1, 4, 5, 5]"),
        "{e}"
    );
    let p = expect_panic(|| {
        x.conv2d(w, None, [1, 1], [0, 0], [1, 1], 1);
    });
    assert_eq!(p, e);
    m.close();
}

// ---- pooling ----

#[test]
fn pools_match_numpy() {
    let m = NDManager::new();
    let x = vals(&m, &[1, 2, 5, 5], 6);
    // numpy
    let max = [
        2.0, 2.0, 0.5, 2.0, 2.0, 0.0, 1.0, 2.0, 2.0, 0.0, 1.5, 1.75, 2.0, 1.0, 1.75, 2.0, 0.0, 0.75,
    ];
    let y = x.max_pool2d([3, 3], [2, 2], [1, 1]);
    assert_eq!(y.shape().dims(), &[1, 2, 3, 3]);
    assert_eq!(f64s(y), max);
    // numpy, padding counted in the divisor (count_include_pad=True)
    let avg = [
        0.3611111111111111,
        -0.3611111111111111,
        -0.05555555555555555,
        0.75,
        -0.1111111111111111,
        -0.5833333333333334,
        0.16666666666666666,
        0.5277777777777778,
        -0.25,
        -0.2777777777777778,
        0.3333333333333333,
        0.25,
        -0.4444444444444444,
        -0.25,
        0.5833333333333334,
        0.0,
        -0.6666666666666666,
        0.05555555555555555,
    ];
    assert_close(&f64s(x.avg_pool2d([3, 3], [2, 2], [1, 1])), &avg, 1e-15);
    // numpy: a 2x3 kernel, stride [1, 2], padding [1, 0].
    let avg2 = [
        -0.16666666666666666,
        -0.125,
        0.125,
        -0.5,
        0.3333333333333333,
        -1.0,
        0.5416666666666666,
        -0.7916666666666666,
        0.75,
        0.125,
        0.25,
        0.2916666666666667,
        0.0,
        0.041666666666666664,
        -0.25,
        0.5416666666666666,
        -0.75,
        0.75,
        -0.5416666666666666,
        0.25,
        -0.3333333333333333,
        -0.25,
        -0.2916666666666667,
        -0.25,
    ];
    let y2 = x.avg_pool2d([2, 3], [1, 2], [1, 0]);
    assert_eq!(y2.shape().dims(), &[1, 2, 6, 2]);
    assert_close(&f64s(y2), &avg2, 1e-15);
    // 3-D input [C, H, W] and F32 give the same.
    let x3 = x.reshape([2, 5, 5]).to_dtype(DType::F32);
    let y3 = x3.max_pool2d([3, 3], [2, 2], [1, 1]);
    assert_eq!(y3.shape().dims(), &[2, 3, 3]);
    let got: Vec<f64> = y3
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&v| v as f64)
        .collect();
    assert_eq!(got, max);
    // A transposed view pools its own (transposed) values.
    let xt = x.permute(&[0, 1, 3, 2]);
    let dense = xt.to_dtype(DType::F64).reshape([1, 2, 5, 5]);
    assert_eq!(
        f64s(xt.max_pool2d([2, 2], [1, 1], [1, 1])),
        f64s(dense.max_pool2d([2, 2], [1, 1], [1, 1]))
    );
    assert_eq!(
        f64s(xt.avg_pool2d([3, 2], [2, 1], [0, 1])),
        f64s(dense.avg_pool2d([3, 2], [2, 1], [0, 1]))
    );
    m.close();
}

#[test]
fn max_pool_pads_with_minus_infinity_and_propagates_nan() {
    let m = NDManager::new();
    let x = m.create(&[-5.0f64, -6.0, -7.0, -8.0], [1, 1, 2, 2]);
    // Every window holds real elements only (never the padding's 0).
    assert_eq!(
        f64s(x.max_pool2d([2, 2], [1, 1], [1, 1])),
        vec![-5.0, -5.0, -6.0, -5.0, -5.0, -6.0, -7.0, -7.0, -8.0]
    );
    // Zero-size batches and channels.
    let e = m.zeros([0, 2, 4, 4], DType::F32);
    assert_eq!(
        e.max_pool2d([2, 2], [2, 2], [0, 0]).shape().dims(),
        &[0, 2, 2, 2]
    );
    let e = m.zeros([2, 0, 4, 4], DType::F64);
    assert_eq!(
        e.avg_pool2d([3, 3], [1, 1], [1, 1]).shape().dims(),
        &[2, 0, 4, 4]
    );
    let n = m.create(&[1.0f64, f64::NAN, 3.0, 2.0], [1, 1, 2, 2]);
    assert!(f64s(n.max_pool2d([2, 2], [2, 2], [0, 0]))[0].is_nan());
    assert!(f64s(n.avg_pool2d([2, 2], [2, 2], [0, 0]))[0].is_nan());
    m.close();
}

/// The first NaN of a window wins (value and gradient), and a later larger number does
/// not displace it; an all -inf window picks its first element; ties go to the first.
/// f32, random order of the cases across windows (the kernel selects without branches).
#[test]
fn max_pool_argmax_follows_scan_order_with_nan_and_infinities() {
    let m = NDManager::new();
    let inf = f32::INFINITY;
    #[rustfmt::skip]
    let v = [
        1.0, f32::NAN, 5.0, f32::NAN,   // first NaN at 1
        -inf, -inf, -inf, -inf,         // all -inf: the first
        2.0, 7.0, 7.0, 1.0,             // tie: the first 7
        f32::NAN, 9.0, 3.0, 4.0,        // NaN first of all
    ];
    // Each row of four is one 2x2 window: lay them out as a [1,1,2,8] input.
    let mut x = vec![0.0f32; 16];
    for w in 0..4 {
        for (k, &e) in v[w * 4..w * 4 + 4].iter().enumerate() {
            x[(k / 2) * 8 + w * 2 + k % 2] = e;
        }
    }
    let x = m.create(&x, [1, 1, 2, 8]).set_requires_gradient(true);
    let y;
    {
        let gc = GradientCollector::new();
        y = x.max_pool2d([2, 2], [2, 2], [0, 0]);
        gc.backward(y.sum()).unwrap();
    }
    let out: Vec<f32> = y.to_vec().unwrap();
    assert!(out[0].is_nan() && out[3].is_nan(), "{out:?}");
    assert_eq!((out[1], out[2]), (-inf, 7.0));
    let g: Vec<f32> = x.gradient().to_vec().unwrap();
    let mut want = vec![0.0f32; 16];
    for (w, k) in [(0, 1), (1, 0), (2, 1), (3, 0)] {
        want[(k / 2) * 8 + w * 2 + k % 2] = 1.0;
    }
    assert_eq!(g, want);
    m.close();
}

#[test]
fn pool_gradients() {
    // Distinct values (no ties), windows overlapping (stride < kernel) and padded.
    let shape: &[usize] = &[2, 2, 5, 4];
    let n: usize = shape.iter().product();
    let data: Vec<f64> = (0..n)
        .map(|i| ((i * 7919) % 101) as f64 / 10.0 - 5.0)
        .collect();
    gradcheck_at(&[shape], vec![data.clone()], |a| {
        a[0].max_pool2d([3, 2], [2, 1], [1, 1])
    });
    gradcheck_at(&[shape], vec![data], |a| {
        a[0].max_pool2d([2, 2], [2, 2], [0, 0])
    });
    gradcheck(&[&[2, 2, 5, 4]], -1.0, 1.0, |a| {
        a[0].avg_pool2d([3, 2], [2, 1], [1, 1])
    });
    gradcheck(&[&[3, 4, 5]], -1.0, 1.0, |a| {
        a[0].avg_pool2d([2, 3], [1, 2], [1, 0])
    });
}

#[test]
fn max_pool_gradient_goes_to_the_first_maximum() {
    let m = NDManager::new();
    let x = m
        .create(&[1.0f64, 3.0, 3.0, 0.0], [1, 1, 2, 2])
        .set_requires_gradient(true);
    {
        let gc = GradientCollector::new();
        let y = x.max_pool2d([2, 2], [1, 1], [0, 0]);
        gc.backward(y.sum()).unwrap();
    }
    assert_eq!(f64s(x.gradient()), vec![0.0, 1.0, 0.0, 0.0]);
    m.close();
}

#[test]
fn pool_errors() {
    let m = NDManager::new();
    let x = vals(&m, &[1, 2, 5, 5], 6);
    use NdError::*;
    fails!(
        m,
        x.try_max_pool2d([0, 2], [1, 1], [0, 0]),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_max_pool2d([2, 2], [1, 0], [0, 0]),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_avg_pool2d([2, 2], [1, 1], [2, 0]),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_avg_pool2d([6, 2], [1, 1], [0, 0]),
        InvalidArgument { .. }
    );
    let x2 = vals(&m, &[5, 5], 6);
    fails!(
        m,
        x2.try_max_pool2d([2, 2], [1, 1], [0, 0]),
        InvalidArgument { .. }
    );
    let xi = x.to_dtype(DType::I64);
    fails!(
        m,
        xi.try_max_pool2d([2, 2], [1, 1], [0, 0]),
        UnsupportedDType { .. }
    );
    fails!(
        m,
        xi.try_avg_pool2d([2, 2], [1, 1], [0, 0]),
        UnsupportedDType { .. }
    );
    let e = x
        .try_max_pool2d([2, 2], [1, 1], [3, 3])
        .unwrap_err()
        .to_string();
    assert_eq!(
        expect_panic(|| {
            x.max_pool2d([2, 2], [1, 1], [3, 3]);
        }),
        e
    );
    m.close();
}

// ---- layer_norm ----

#[test]
fn layer_norm_matches_numpy() {
    let m = NDManager::new();
    let x = vals(&m, &[2, 3, 4], 7);
    let g = vals(&m, &[4], 8);
    let b = vals(&m, &[4], 9);
    // numpy: (x - mean) / sqrt(var + 1e-5) * g + b over the last axis
    let want = [
        1.5599327363321336,
        -2.2637040398613877,
        -0.9743094128721854,
        -2.0822242391683274,
        3.1770390575561684,
        -1.7763947923258443,
        -1.1381973961629221,
        0.8416312460449347,
        -0.4777802989604094,
        -1.4486188257443708,
        -1.3818520199306938,
        -0.4520538109342931,
        0.6229441395970469,
        -2.613939102282067,
        -1.5569695511410335,
        -1.2016446883223626,
        3.1770390575561684,
        -1.7763947923258443,
        -1.1381973961629221,
        0.8416312460449347,
        3.1770390575561684,
        -1.7763947923258443,
        -1.1381973961629221,
        0.8416312460449347,
    ];
    assert_close(
        &f64s(x.layer_norm(&[-1], Some(g), Some(b), 1e-5)),
        &want,
        1e-13,
    );
    // numpy: over axis 0 (not trailing) with gamma [2, 1, 1].
    let g0 = vals(&m, &[2, 1, 1], 3);
    let want0 = [
        -1.9998400191974406,
        -1.9998400191974406,
        1.9999971555616238,
        -1.9998400191974406,
        -1.9998400191974406,
        -1.9998400191974406,
        -1.9998400191974406,
        -1.9998400191974406,
        1.9999971555616238,
        -1.9998400191974406,
        -1.9998400191974406,
        -1.9998400191974406,
        -1.4998800143980804,
        -1.4998800143980804,
        1.499997866671218,
        -1.4998800143980804,
        -1.4998800143980804,
        -1.4998800143980804,
        -1.4998800143980804,
        -1.4998800143980804,
        1.499997866671218,
        -1.4998800143980804,
        -1.4998800143980804,
        -1.4998800143980804,
    ];
    assert_close(
        &f64s(x.layer_norm(&[0], Some(g0), None, 1e-5)),
        &want0,
        1e-13,
    );
    // A transposed view normalises its own rows; F32 agrees with F64.
    let xt = x.permute(&[2, 1, 0]);
    let dense = xt.to_dtype(DType::F64).reshape([4, 3, 2]);
    assert_eq!(
        f64s(xt.layer_norm(&[1, 2], None, None, 1e-5)),
        f64s(dense.layer_norm(&[-2, -1], None, None, 1e-5))
    );
    let y32 = x.to_dtype(DType::F32).layer_norm(
        &[-1],
        Some(g.to_dtype(DType::F32)),
        Some(b.to_dtype(DType::F32)),
        1e-5,
    );
    let got: Vec<f64> = y32
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&v| v as f64)
        .collect();
    assert_close(&got, &want, 1e-5);
    // Zero-size kept axes: an empty result.
    let e = m.zeros([0, 4], DType::F64);
    assert_eq!(
        e.layer_norm(&[-1], None, None, 1e-5).shape().dims(),
        &[0, 4]
    );
    m.close();
}

#[test]
fn layer_norm_gradients() {
    gradcheck(&[&[3, 4], &[4], &[4]], -2.0, 2.0, |a| {
        a[0].layer_norm(&[-1], Some(a[1]), Some(a[2]), 1e-5)
    });
    gradcheck(&[&[2, 3, 4], &[3, 1]], -2.0, 2.0, |a| {
        a[0].layer_norm(&[0, 2], Some(a[1]), None, 1e-3)
    });
    gradcheck(&[&[2, 3, 2]], -2.0, 2.0, |a| {
        a[0].layer_norm(&[1, 2], None, None, 1e-5)
    });
    // The fused backward reads a permuted input and a broadcast gamma through strides.
    gradcheck(&[&[4, 3, 2], &[3, 1]], -2.0, 2.0, |a| {
        a[0].permute(&[2, 1, 0])
            .layer_norm(&[-1], Some(a[1]), None, 1e-5)
    });
}

/// The f32 kernels (their elementwise passes run in f32, the sums in f64) agree with
/// f64 within f32's precision, with rows longer than a chunk of the kernel (70 > 64), a
/// mean far from zero and a weighted loss; and a permuted view (loaded element by
/// element) gives the same bits as its contiguous copy, forward and backward.
#[test]
fn layer_norm_f32_agrees_with_f64_and_views_with_copies() {
    let m = NDManager::new();
    let x = vals(&m, &[3, 4, 70], 1) + 5.0;
    let (g, b, w) = (
        vals(&m, &[4, 70], 2),
        vals(&m, &[4, 70], 3),
        vals(&m, &[3, 4, 70], 4),
    );
    // y, then the gradients of sum(y * w) for the leaf `x` (through `view`), gamma and
    // beta, in dtype `dt`.
    let run = |x: NDArray, view: &dyn Fn(NDArray) -> NDArray, dt: DType| -> Vec<Vec<f64>> {
        let (gs, bs) = (g.to_dtype(dt), b.to_dtype(dt));
        for a in [x, gs, bs] {
            a.set_requires_gradient(true);
        }
        let gc = GradientCollector::new();
        let y = view(x).layer_norm(&[1, 2], Some(gs), Some(bs), 1e-5);
        gc.backward((y * w.to_dtype(dt)).sum()).unwrap();
        drop(gc);
        let out = [y, view(x.gradient()), gs.gradient(), bs.gradient()];
        out.iter().map(|a| f64s(a.to_dtype(DType::F64))).collect()
    };
    let same = |a: NDArray| a;
    let (want, got) = (
        run(x, &same, DType::F64),
        run(x.to_dtype(DType::F32), &same, DType::F32),
    );
    let names = ["y", "dx", "dgamma", "dbeta"];
    for (what, (g, w)) in names.iter().zip(got.iter().zip(&want)) {
        let scale = w.iter().fold(0.0f64, |a, v| a.max(v.abs()));
        for (i, (a, e)) in g.iter().zip(w).enumerate() {
            assert!(
                (a - e).abs() <= 1e-5 * scale,
                "{what}[{i}]: f32 {a}, f64 {e}"
            );
        }
    }
    // The normalised axes strided ([3, 70, 4] seen as [3, 4, 70]), against a copy.
    let xt = x.reshape([3, 70, 4]).to_dtype(DType::F32);
    let permuted = |a: NDArray| a.permute(&[0, 2, 1]);
    let dense = permuted(xt).to_dtype(DType::F64).to_dtype(DType::F32);
    let (view, copy) = (
        run(xt, &permuted, DType::F32),
        run(dense, &same, DType::F32),
    );
    for (what, (v, c)) in names.iter().zip(view.iter().zip(&copy)) {
        let bits = |v: &[f64]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(v), bits(c), "{what}: a view and its copy differ");
    }
    m.close();
}

#[test]
fn layer_norm_errors() {
    let m = NDManager::new();
    let x = vals(&m, &[2, 3], 1);
    let g3 = vals(&m, &[3], 1);
    let g2 = vals(&m, &[2], 1);
    use NdError::*;
    fails!(
        m,
        x.try_layer_norm(&[2], None, None, 1e-5),
        AxisOutOfRange { .. }
    );
    fails!(
        m,
        x.try_layer_norm(&[1, -1], None, None, 1e-5),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_layer_norm(&[], None, None, 1e-5),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_layer_norm(&[-1], None, None, -1.0),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_layer_norm(&[-1], None, None, f64::NAN),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_layer_norm(&[-1], Some(g2), None, 1e-5),
        ShapeMismatch { .. }
    );
    let arg2 = vals(&m, &[2, 2, 3], 1);
    fails!(
        m,
        x.try_layer_norm(&[-1], None, Some(arg2), 1e-5),
        ShapeMismatch { .. }
    );
    let arg3 = g3.to_dtype(DType::F32);
    fails!(
        m,
        x.try_layer_norm(&[-1], Some(arg3), None, 1e-5),
        DTypeMismatch { .. }
    );
    let xi = x.to_dtype(DType::I32);
    fails!(
        m,
        xi.try_layer_norm(&[-1], None, None, 1e-5),
        UnsupportedDType { .. }
    );
    let e = x
        .try_layer_norm(&[-1], Some(g2), None, 1e-5)
        .unwrap_err()
        .to_string();
    assert_eq!(
        expect_panic(|| {
            x.layer_norm(&[-1], Some(g2), None, 1e-5);
        }),
        e
    );
    m.close();
}

// ---- batch_norm ----

#[test]
fn batch_norm_training_matches_numpy_and_updates_running_stats() {
    let m = NDManager::new();
    let x = vals(&m, &[3, 2, 2, 2], 10);
    let g = m.create(&[1.5f64, -0.5], [2]);
    let b = m.create(&[0.25f64, 2.0], [2]);
    let rm = m.create(&[0.5f64, -0.5], [2]);
    let rv = m.create(&[1.0f64, 2.0], [2]);
    let y = x.batch_norm(rm, rv, Some(g), Some(b), true, 0.1, 1e-5);
    // numpy
    let want = [
        0.19802826003525442,
        1.1335195794006752,
        2.069010898766096,
        -2.296615258272534,
        2.470001275133762,
        2.1507551259863007,
        1.8315089768388402,
        1.5122628276913794,
        2.3808413385545695,
        -1.9847848184840609,
        -1.04929349911864,
        -0.11380217975321921,
        1.7250935937896865,
        1.4058474446422258,
        1.086601295494765,
        2.5764166581829153,
        -0.7374630593301663,
        0.19802826003525442,
        1.1335195794006752,
        2.069010898766096,
        2.7892474242812226,
        2.470001275133762,
        2.1507551259863007,
        1.8315089768388402,
    ];
    assert_close(&f64s(y), &want, 1e-13);
    // PyTorch's rule, computed here from the batch: running = 0.9 * running + 0.1 * batch,
    // unbiased variance (n = 12 values per channel) for running_var.
    let xs = f64s(x);
    let chan = |c: usize| -> Vec<f64> {
        (0..3)
            .flat_map(|n| (0..4).map(move |i| (n, i)))
            .map(|(n, i)| xs[n * 8 + c * 4 + i])
            .collect()
    };
    for (c, (m0, v0)) in [(0.5, 1.0), (-0.5, 2.0)].into_iter().enumerate() {
        let v = chan(c);
        let mean = v.iter().sum::<f64>() / 12.0;
        let unbiased = v.iter().map(|a| (a - mean) * (a - mean)).sum::<f64>() / 11.0;
        assert_close(&[f64s(rm)[c]], &[0.9 * m0 + 0.1 * mean], 1e-15);
        assert_close(&[f64s(rv)[c]], &[0.9 * v0 + 0.1 * unbiased], 1e-15);
    }
    // numpy's figures for the same.
    assert_close(
        &f64s(rm),
        &[0.45416666666666666, -0.46458333333333335],
        1e-15,
    );
    assert_close(&f64s(rv), &[1.0577651515151516, 1.9505208333333335], 1e-15);
    m.close();
}

/// An f32 batch's variance is exact to f32 rounding when the values sit far from zero
/// (mean 1e6, spread about 1: a sum of squares about the origin would lose ~12 of f64's
/// digits) and each channel's first element, where the one-pass sums are shifted to,
/// is an outlier: the running variance (momentum 1, so the batch's unbiased variance)
/// against two passes in f64 over the same f32 values.
#[test]
fn batch_norm_f32_variance_survives_a_large_mean() {
    let m = NDManager::new();
    let shape = [2, 2, 16, 64];
    let mut v = f64s(vals(&m, &shape, 5));
    for c in 0..2 {
        v[c * 1024] = 40.0; // the first element of channel c
    }
    let v: Vec<f32> = v.iter().map(|e| (e + 1e6) as f32).collect();
    let x = m.create(&v, shape.to_vec());
    let (rm, rv) = (m.zeros([2], DType::F32), m.zeros([2], DType::F32));
    x.batch_norm(rm, rv, None, None, true, 1.0, 1e-5);
    let got = f64s(rv.to_dtype(DType::F64));
    for (c, got) in got.iter().enumerate() {
        let e: Vec<f64> = (0..2)
            .flat_map(|n| (0..1024).map(move |i| n * 2048 + c * 1024 + i))
            .map(|i| v[i] as f64)
            .collect();
        let mean = e.iter().sum::<f64>() / 2048.0;
        let want = e.iter().map(|a| (a - mean) * (a - mean)).sum::<f64>() / 2047.0;
        assert!(
            ((got - want) / want).abs() <= 1e-6,
            "channel {c}: variance {got}, want {want}"
        );
    }
    m.close();
}

#[test]
fn batch_norm_inference_uses_and_keeps_running_stats() {
    let m = NDManager::new();
    let x = vals(&m, &[3, 2, 2, 2], 10);
    let g = m.create(&[1.5f64, -0.5], [2]);
    let b = m.create(&[0.25f64, 2.0], [2]);
    let rm = m.create(&[0.5f64, -0.5], [2]);
    let rv = m.create(&[1.0f64, 2.0], [2]);
    let y = x.batch_norm(rm, rv, Some(g), Some(b), false, 0.1, 1e-5);
    // numpy
    let want = [
        -0.49999625002812476,
        0.6249981250140624,
        1.7499925000562495,
        -3.4999812501406242,
        2.265164380034834,
        2.0,
        1.7348356199651662,
        1.4696712399303324,
        2.1249906250703123,
        -3.1249831251265614,
        -1.9999887500843743,
        -0.8749943750421871,
        1.6464474932868882,
        1.3812831132520542,
        1.1161187332172204,
        2.353552506713112,
        -1.6249906250703121,
        -0.49999625002812476,
        0.6249981250140624,
        1.7499925000562495,
        2.5303287600696676,
        2.265164380034834,
        2.0,
        1.7348356199651662,
    ];
    assert_close(&f64s(y), &want, 1e-13);
    assert_eq!(f64s(rm), vec![0.5, -0.5]);
    assert_eq!(f64s(rv), vec![1.0, 2.0]);
    // [N, C] input, F32, a strided running_mean view.
    let x2 = m.create(&[1.0f32, 10.0, 3.0, 30.0], [2, 2]);
    let stats = m.create(&[0.0f32, 9.0, 0.0, 9.0], [4]);
    let (rm2, rv2) = (stats.get("0::2"), m.ones([2], DType::F32));
    x2.batch_norm(rm2, rv2, None, None, true, 0.5, 0.0);
    assert_eq!(stats.to_vec::<f32>().unwrap(), vec![1.0, 9.0, 10.0, 9.0]);
    assert_eq!(rv2.to_vec::<f32>().unwrap(), vec![1.5, 100.5]);
    m.close();
}

#[test]
fn batch_norm_gradients() {
    gradcheck(&[&[3, 2, 2, 2], &[2], &[2]], -2.0, 2.0, |a| {
        let m = a[0].manager();
        let (rm, rv) = (m.zeros([2], DType::F64), m.ones([2], DType::F64));
        a[0].batch_norm(rm, rv, Some(a[1]), Some(a[2]), true, 0.1, 1e-5)
    });
    gradcheck(&[&[4, 3]], -2.0, 2.0, |a| {
        let m = a[0].manager();
        let (rm, rv) = (m.zeros([3], DType::F64), m.ones([3], DType::F64));
        a[0].batch_norm(rm, rv, None, None, true, 0.1, 1e-5)
    });
    // Inference: fixed statistics.
    gradcheck(&[&[2, 2, 3], &[2], &[2]], -2.0, 2.0, |a| {
        let m = a[0].manager();
        let rm = m.create(&[0.5f64, -0.25], [2]);
        let rv = m.create(&[2.0f64, 0.5], [2]);
        a[0].batch_norm(rm, rv, Some(a[1]), Some(a[2]), false, 0.1, 1e-5)
    });
    // A permuted input (channels not in memory order), gamma only, then beta only.
    gradcheck(&[&[2, 2, 3, 3], &[3]], -2.0, 2.0, |a| {
        let m = a[0].manager();
        let (rm, rv) = (m.zeros([3], DType::F64), m.ones([3], DType::F64));
        a[0].permute(&[1, 3, 2, 0])
            .batch_norm(rm, rv, Some(a[1]), None, true, 0.1, 1e-5)
    });
    gradcheck(&[&[3, 2, 4], &[2]], -2.0, 2.0, |a| {
        let m = a[0].manager();
        let (rm, rv) = (m.zeros([2], DType::F64), m.ones([2], DType::F64));
        a[0].batch_norm(rm, rv, None, Some(a[1]), true, 0.1, 1e-5)
    });
}

#[test]
fn batch_norm_errors_change_nothing() {
    let m = NDManager::new();
    let x = vals(&m, &[3, 2, 2], 1);
    let rm = m.create(&[0.5f64, -0.5], [2]);
    let rv = m.create(&[1.0f64, 2.0], [2]);
    let r3 = m.zeros([3], DType::F64);
    use NdError::*;
    fails!(
        m,
        x.try_batch_norm(r3, rv, None, None, true, 0.1, 1e-5),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_batch_norm(rm, r3, None, None, true, 0.1, 1e-5),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_batch_norm(rm, rv, Some(r3), None, true, 0.1, 1e-5),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_batch_norm(rm, rv, None, Some(r3), false, 0.1, 1e-5),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_batch_norm(rm, rv, None, None, true, 0.1, -1.0),
        InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_batch_norm(rm, rv, None, None, true, f64::NAN, 1e-5),
        InvalidArgument { .. }
    );
    let one = vals(&m, &[1, 2], 1);
    fails!(
        m,
        one.try_batch_norm(rm, rv, None, None, true, 0.1, 1e-5),
        InvalidArgument { .. }
    );
    let flat = vals(&m, &[4], 1);
    fails!(
        m,
        flat.try_batch_norm(rm, rv, None, None, true, 0.1, 1e-5),
        InvalidArgument { .. }
    );
    let rm32 = rm.to_dtype(DType::F32);
    fails!(
        m,
        x.try_batch_norm(rm32, rv, None, None, true, 0.1, 1e-5),
        DTypeMismatch { .. }
    );
    let xi = x.to_dtype(DType::I64);
    let (rmi, rvi) = (rm.to_dtype(DType::I64), rv.to_dtype(DType::I64));
    fails!(
        m,
        xi.try_batch_norm(rmi, rvi, None, None, true, 0.1, 1e-5),
        UnsupportedDType { .. }
    );
    // Nothing was updated by the failures; one value per channel is fine in inference.
    assert_eq!(f64s(rm), vec![0.5, -0.5]);
    assert_eq!(f64s(rv), vec![1.0, 2.0]);
    one.batch_norm(rm, rv, None, None, false, 0.1, 1e-5);
    let e = x
        .try_batch_norm(r3, rv, None, None, true, 0.1, 1e-5)
        .unwrap_err()
        .to_string();
    assert!(e.contains("[3, 2, 2]") && e.contains("[3]"), "{e}");
    assert_eq!(
        expect_panic(|| {
            x.batch_norm(r3, rv, None, None, true, 0.1, 1e-5);
        }),
        e
    );
    m.close();
}

#[test]
fn batch_norm_refuses_running_stats_the_tape_depends_on() {
    let m = NDManager::new();
    let x = vals(&m, &[3, 2], 1).set_requires_gradient(true);
    let rm = m.zeros([2], DType::F64).set_requires_gradient(true);
    let rv = m.ones([2], DType::F64);
    let gc = GradientCollector::new();
    let _y = x.square();
    fails!(
        m,
        x.try_batch_norm(rm, rv, None, None, true, 0.1, 1e-5),
        NdError::InvalidArgument { .. }
    );
    assert_eq!(f64s(rm), vec![0.0, 0.0]);
    drop(gc);
    m.close();
}

// ---- embedding ----

#[test]
fn embedding_gathers_rows() {
    let m = NDManager::new();
    let table = m.create(&[0.0f32, 1.0, 10.0, 11.0, 20.0, 21.0], [3, 2]);
    let ids = m.create(&[2i32, 0, 1, 2], [2, 2]);
    let y = table.embedding(ids);
    assert_eq!(y.shape().dims(), &[2, 2, 2]);
    assert_eq!(
        y.to_vec::<f32>().unwrap(),
        vec![20.0, 21.0, 0.0, 1.0, 10.0, 11.0, 20.0, 21.0]
    );
    // 0-d ids, u8 ids, a transposed table, empty ids.
    assert_eq!(
        table
            .embedding(m.create(&[1i64], [0usize; 0]))
            .shape()
            .dims(),
        &[2]
    );
    assert_eq!(
        table
            .embedding(m.create(&[2u8], [1]))
            .to_vec::<f32>()
            .unwrap(),
        vec![20.0, 21.0]
    );
    let tt = m
        .create(&[0.0f64, 10.0, 20.0, 1.0, 11.0, 21.0], [2, 3])
        .transpose();
    assert_eq!(
        f64s(tt.embedding(m.create(&[1i64, 1], [2]))),
        vec![10.0, 11.0, 10.0, 11.0]
    );
    let none = table.embedding(m.zeros([0, 4], DType::I64));
    assert_eq!(none.shape().dims(), &[0, 4, 2]);
    m.close();
}

#[test]
fn embedding_gradient_scatter_adds() {
    let m = NDManager::new();
    let ids = m.create(&[2i64, 0, 2, 2, 1, 0], [2, 3]);
    gradcheck(&[&[4, 3]], -1.0, 1.0, |a| a[0].embedding(ids));
    let table = m.zeros([3, 2], DType::F64).set_requires_gradient(true);
    {
        let gc = GradientCollector::new();
        gc.backward(table.embedding(ids).sum()).unwrap();
    }
    // Each row's gradient counts its id's occurrences.
    assert_eq!(f64s(table.gradient()), vec![2.0, 2.0, 1.0, 1.0, 3.0, 3.0]);
    m.close();
}

#[test]
fn embedding_errors() {
    let m = NDManager::new();
    let table = vals(&m, &[3, 2], 1);
    use NdError::*;
    let arg4 = m.create(&[0i64, 3], [2]);
    fails!(m, table.try_embedding(arg4), Index { .. });
    let arg5 = m.create(&[-1i32], [1]);
    fails!(m, table.try_embedding(arg5), Index { .. });
    let arg6 = m.create(&[0.0f64], [1]);
    fails!(m, table.try_embedding(arg6), UnsupportedDType { .. });
    let arg7 = m.create(&[true], [1]);
    fails!(m, table.try_embedding(arg7), UnsupportedDType { .. });
    let t3 = vals(&m, &[3, 2, 1], 1);
    let arg8 = m.create(&[0i64], [1]);
    fails!(m, t3.try_embedding(arg8), InvalidArgument { .. });
    let ti = table.to_dtype(DType::I64);
    let arg9 = m.create(&[0i64], [1]);
    fails!(m, ti.try_embedding(arg9), UnsupportedDType { .. });
    let bad = m.create(&[0i64, 7], [2]);
    let e = table.try_embedding(bad).unwrap_err().to_string();
    assert!(e.contains('7') && e.contains("0..3"), "{e}");
    assert_eq!(
        expect_panic(|| {
            table.embedding(bad);
        }),
        e
    );
    m.close();
}

// ---- losses ----

#[test]
fn cross_entropy_matches_numpy() {
    let m = NDManager::new();
    let x = vals(&m, &[3, 4], 11);
    let labels = m.create(&[3i64, 0, 2], [3]);
    let loss = x.cross_entropy(labels);
    assert_eq!(loss.shape().dims(), &[] as &[usize]);
    // numpy
    assert_close(
        &[loss.to_scalar::<f64>().unwrap()],
        &[0.4468297020885328],
        1e-15,
    );
    let x32 = x.to_dtype(DType::F32);
    let l32 = x32
        .cross_entropy(labels.to_dtype(DType::I32))
        .to_scalar::<f32>()
        .unwrap();
    assert!((l32 as f64 - 0.4468297020885328).abs() < 1e-6);
    // numpy: (softmax - one_hot) / N
    let want = [
        0.019508664617055187,
        0.04129984331839693,
        0.08743176899114717,
        -0.14824027692659925,
        -0.062211710655454576,
        0.008187163594085068,
        0.01733222546468877,
        0.03669232159668075,
        0.04309959697285754,
        0.09124184750753901,
        -0.14017434064410209,
        0.0058328961637055315,
    ];
    let p = x.set_requires_gradient(true);
    {
        let gc = GradientCollector::new();
        gc.backward(p.cross_entropy(labels)).unwrap();
    }
    assert_close(&f64s(p.gradient()), &want, 1e-14);
    // A transposed view of the logits.
    let xt = x.transpose().to_dtype(DType::F64).transpose();
    assert_eq!(
        xt.cross_entropy(labels).to_scalar::<f64>().unwrap(),
        loss.to_scalar::<f64>().unwrap()
    );
    // An empty batch: NaN, as PyTorch's mean over nothing.
    let e = m
        .zeros([0, 4], DType::F64)
        .cross_entropy(m.zeros([0], DType::I64));
    assert!(e.to_scalar::<f64>().unwrap().is_nan());
    m.close();
}

#[test]
fn cross_entropy_is_stable_for_huge_logits() {
    let m = NDManager::new();
    for dt in [DType::F32, DType::F64] {
        let x = m
            .create(&[1e4f64, 0.0, -1e4, 1e4, 1e4, 0.0], [2, 3])
            .to_dtype(dt);
        let labels = m.create(&[0i64, 2], [2]);
        let loss = x
            .cross_entropy(labels)
            .to_dtype(DType::F64)
            .to_scalar::<f64>()
            .unwrap();
        // Row 0: ~0. Row 1: ln(2 e^1e4 + 1) - 0 = 1e4 + ln 2.
        let want = (1e4 + 2f64.ln()) / 2.0;
        assert!((loss - want).abs() < 1e-3, "{dt}: {loss}");
        let p = m
            .create(&[1e4f64, 0.0, -1e4, 1e4, 1e4, 0.0], [2, 3])
            .to_dtype(dt);
        p.set_requires_gradient(true);
        {
            let gc = GradientCollector::new();
            gc.backward(p.cross_entropy(labels)).unwrap();
        }
        let g = p.gradient().to_dtype(DType::F64);
        let gv = f64s(g);
        assert!(gv.iter().all(|v| v.is_finite()), "{gv:?}");
        assert_close(&gv, &[0.0, 0.0, 0.0, 0.25, 0.25, -0.5], 1e-6);
    }
    m.close();
}

#[test]
fn cross_entropy_gradient() {
    let m = NDManager::new();
    let labels = m.create(&[1i64, 0, 3, 3, 2], [5]);
    gradcheck(&[&[5, 4]], -3.0, 3.0, |a| a[0].cross_entropy(labels));
    gradcheck(&[&[2, 6]], -3.0, 3.0, |a| {
        a[0].cross_entropy(labels.get("1:3")) * 3.0
    });
    m.close();
}

#[test]
fn cross_entropy_errors() {
    let m = NDManager::new();
    let x = vals(&m, &[2, 3], 1);
    use NdError::*;
    let arg10 = m.create(&[0i64, 3], [2]);
    fails!(m, x.try_cross_entropy(arg10), Index { .. });
    let arg11 = m.create(&[-1i64, 0], [2]);
    fails!(m, x.try_cross_entropy(arg11), Index { .. });
    let arg12 = m.create(&[0i64], [1]);
    fails!(m, x.try_cross_entropy(arg12), InvalidArgument { .. });
    let arg13 = m.create(&[0i64, 1], [1, 2]);
    fails!(m, x.try_cross_entropy(arg13), InvalidArgument { .. });
    let arg14 = m.create(&[0.0f64, 1.0], [2]);
    fails!(m, x.try_cross_entropy(arg14), UnsupportedDType { .. });
    let x1 = vals(&m, &[3], 1);
    let arg15 = m.create(&[0i64], [0usize; 0]);
    fails!(m, x1.try_cross_entropy(arg15), InvalidArgument { .. });
    let xi = x.to_dtype(DType::I32);
    let arg16 = m.create(&[0i64, 1], [2]);
    fails!(m, xi.try_cross_entropy(arg16), UnsupportedDType { .. });
    let bad = m.create(&[0i64, 5], [2]);
    let e = x.try_cross_entropy(bad).unwrap_err().to_string();
    assert!(e.contains("label 5"), "{e}");
    assert_eq!(
        expect_panic(|| {
            x.cross_entropy(bad);
        }),
        e
    );
    m.close();
}

#[test]
fn mse_and_bce_match_numpy() {
    let m = NDManager::new();
    let x = vals(&m, &[5], 12);
    assert_eq!(f64s(x), vec![1.25, 2.0, -1.5, -0.75, 0.0]);
    let t = m.create(&[0.0f64, 1.0, 0.25, 0.5, 1.0], [5]);
    // numpy
    assert_close(
        &[x.mse_loss(t).to_scalar::<f64>().unwrap()],
        &[1.6375],
        1e-15,
    );
    assert_close(
        &[x.binary_cross_entropy_with_logits(t)
            .to_scalar::<f64>()
            .unwrap()],
        &[0.7320577114091886],
        1e-15,
    );
    // Stable for huge logits: max(x,0) - x t + log1p(exp(-|x|)).
    let big = m.create(&[1e4f32, -1e4, 1e4], [3]);
    let tb = m.create(&[1.0f32, 0.0, 0.0], [3]);
    let l = big
        .binary_cross_entropy_with_logits(tb)
        .to_scalar::<f32>()
        .unwrap();
    assert!((l - 1e4 / 3.0).abs() < 1e-2, "{l}");
    // Non-contiguous operands; empty input is NaN.
    let a = vals(&m, &[3, 2], 1);
    let b = vals(&m, &[2, 3], 2);
    let (at, bd) = (a.transpose(), b);
    let dense = at.to_dtype(DType::F64);
    assert_eq!(
        at.mse_loss(bd).to_scalar::<f64>().unwrap(),
        dense.mse_loss(bd).to_scalar::<f64>().unwrap()
    );
    let e = m.zeros([0], DType::F64);
    assert!(e.mse_loss(e).to_scalar::<f64>().unwrap().is_nan());
    m.close();
}

#[test]
fn mse_and_bce_gradients() {
    gradcheck(&[&[2, 3], &[2, 3]], -2.0, 2.0, |a| a[0].mse_loss(a[1]));
    gradcheck(&[&[2, 3], &[2, 3]], -3.0, 3.0, |a| {
        a[0].binary_cross_entropy_with_logits(a[1])
    });
}

#[test]
fn loss_errors() {
    let m = NDManager::new();
    let x = vals(&m, &[2, 3], 1);
    let t = vals(&m, &[3], 1);
    use NdError::*;
    fails!(m, x.try_mse_loss(t), ShapeMismatch { .. });
    fails!(
        m,
        x.try_binary_cross_entropy_with_logits(t),
        ShapeMismatch { .. }
    );
    let t32 = x.to_dtype(DType::F32);
    fails!(m, x.try_mse_loss(t32), DTypeMismatch { .. });
    let xi = x.to_dtype(DType::I32);
    fails!(m, xi.try_mse_loss(xi), UnsupportedDType { .. });
    fails!(
        m,
        xi.try_binary_cross_entropy_with_logits(xi),
        UnsupportedDType { .. }
    );
    let e = x.try_mse_loss(t).unwrap_err().to_string();
    assert_eq!(
        expect_panic(|| {
            x.mse_loss(t);
        }),
        e
    );
    m.close();
}

// ---- one_hot ----

#[test]
fn one_hot_in_every_dtype() {
    let m = NDManager::new();
    let y = m.create(&[2i64, 0], [2]);
    assert_eq!(
        y.one_hot(3, DType::F64).to_vec::<f64>().unwrap(),
        vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    );
    assert_eq!(
        y.one_hot(3, DType::I32).to_vec::<i32>().unwrap(),
        vec![0, 0, 1, 1, 0, 0]
    );
    assert_eq!(
        y.one_hot(3, DType::I64).to_vec::<i64>().unwrap(),
        vec![0, 0, 1, 1, 0, 0]
    );
    assert_eq!(
        y.one_hot(3, DType::U8).to_vec::<u8>().unwrap(),
        vec![0, 0, 1, 1, 0, 0]
    );
    assert_eq!(
        y.one_hot(3, DType::Bool).to_vec::<bool>().unwrap(),
        vec![false, false, true, true, false, false]
    );
    let z = m.zeros([0], DType::I64).one_hot(4, DType::Bool);
    assert_eq!(z.shape().dims(), &[0, 4]);
    use NdError::*;
    fails!(m, y.try_one_hot(2, DType::F32), Index { .. });
    m.close();
}

// ---- memory ----

#[test]
fn saved_arrays_live_only_while_recorded() {
    let m = NDManager::new();
    let x = vals(&m, &[2, 2, 4, 4], 1);
    let w = vals(&m, &[2, 2, 3, 3], 2);
    let labels = m.create(&[0i64, 1], [2]);
    let (rm, rv) = (m.zeros([2], DType::F64), m.ones([2], DType::F64));
    let base = m.memory().live_arrays;
    // Outside a collector: one array per op, nothing saved.
    let y = x.max_pool2d([2, 2], [2, 2], [0, 0]);
    let _ = x.layer_norm(&[-1], None, None, 1e-5);
    let _ = x.batch_norm(rm, rv, None, None, true, 0.1, 1e-5);
    let _ = y.reshape([2, 8]).cross_entropy(labels);
    assert_eq!(m.memory().live_arrays, base + 5);
    // Inside one, with untracked inputs: the rules are dropped at once.
    {
        let _gc = GradientCollector::new();
        let before = m.memory().live_arrays;
        let _ = x.max_pool2d([2, 2], [2, 2], [0, 0]);
        let _ = x.layer_norm(&[-1], None, None, 1e-5);
        assert_eq!(m.memory().live_arrays, before + 2);
    }
    // Tracked: the saved arrays live until backward, then go.
    let p = w.set_requires_gradient(true);
    let before = m.memory().live_arrays;
    {
        let _s = ndscope::NDScope::new();
        let gc = GradientCollector::new();
        let h = x.conv2d(p, None, [1, 1], [1, 1], [1, 1], 1);
        let h = h
            .max_pool2d([2, 2], [2, 2], [0, 0])
            .layer_norm(&[1, 2, 3], None, None, 1e-5);
        let h = h.batch_norm(rm, rv, None, None, true, 0.1, 1e-5);
        let loss = h.reshape([2, 8]).cross_entropy(labels);
        gc.backward(loss).unwrap();
    }
    assert_eq!(m.memory().live_arrays, before);
    // Dropping the collector without backward releases them too.
    {
        let _s = ndscope::NDScope::new();
        let _gc = GradientCollector::new();
        let h = x.conv2d(p, None, [1, 1], [1, 1], [1, 1], 1);
        let _ = h
            .max_pool2d([2, 2], [2, 2], [0, 0])
            .reshape([2, 8])
            .cross_entropy(labels);
    }
    assert_eq!(m.memory().live_arrays, before);
    m.close();
}
