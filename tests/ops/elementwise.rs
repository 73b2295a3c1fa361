//! Tests of the elementwise operations, the statistical reductions and scans, the
//! logical ops, `stop_gradient` and `no_grad` (issue 11, items 2, 3, 4 and 8).
//!
//! Expected values were computed with numpy 2.4 and, for the special functions, with
//! mpmath at 40 digits (then rounded to f64), and pasted here.

use crate::common::*;
use crate::fails;
use ndscope::{DType, GradientCollector, NDArray, NDManager, NdError};

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

/// The elements as f64 (any dtype).
fn f64s(a: NDArray) -> Vec<f64> {
    a.to_dtype(DType::F64).to_vec::<f64>().unwrap()
}

/// `got` equals `want` within relative tolerance `rtol`; NaN matches NaN, infinities
/// and zeros must match exactly (zeros up to sign).
fn assert_close(got: &[f64], want: &[f64], rtol: f64) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() || w == 0.0 {
            g == w
        } else {
            (g - w).abs() <= rtol * w.abs()
        };
        assert!(
            ok,
            "element {i}: got {g:e}, want {w:e} (rtol {rtol:e})\n{got:?}\n{want:?}"
        );
    }
}

/// The try form fails with some error and the panicking form panics with its message.
fn same_panic(try_form: impl FnOnce() -> ndscope::Result<NDArray>, panicking: impl FnOnce()) {
    let msg = try_form().unwrap_err().to_string();
    assert_eq!(expect_panic(panicking), msg);
}

/// The gradient of `f(x)` for a parameter `x` with `data` (f64), after backward of
/// `sum(f(x))`.
fn grad_of(shape: &[usize], data: &[f64], f: impl Fn(NDArray) -> NDArray) -> Vec<f64> {
    let m = NDManager::new();
    let x = m.create(data, shape.to_vec()).set_requires_gradient(true);
    {
        let gc = GradientCollector::new();
        gc.backward(f(x).sum()).unwrap();
    }
    let g = x.gradient().to_vec::<f64>().unwrap();
    m.close();
    g
}

// ---------------------------------------------------------------------------------
// Unary math
// ---------------------------------------------------------------------------------

const XS: [f64; 8] = [-3.5, -1.0, -0.25, 0.0, 1e-10, 0.5, 2.0, 7.0];

/// (name, op, expected f(XS)) from mpmath.
#[allow(clippy::type_complexity)]
fn smooth_cases() -> Vec<(&'static str, fn(NDArray) -> NDArray, [f64; 8])> {
    vec![
        (
            "erf",
            |x| x.erf(),
            [
                -0.9999992569016276,
                -0.8427007929497149,
                -0.27632639016823696,
                0.0,
                1.1283791670955126e-10,
                0.5204998778130465,
                0.9953222650189527,
                1.0,
            ],
        ),
        (
            "gelu",
            |x| x.gelu(),
            [
                -0.0008142017766243376,
                -0.15865525393145705,
                -0.10032341857926907,
                0.0,
                5.000000000398942e-11,
                0.34573123063700656,
                1.9544997361036416,
                6.999999999991041,
            ],
        ),
        (
            "silu",
            |x| x.silu(),
            [
                -0.10259280762974711,
                -0.2689414213699951,
                -0.10945587477855047,
                0.0,
                5.00000000025e-11,
                0.3112296656009273,
                1.7615941559557649,
                6.993622641639195,
            ],
        ),
        (
            "softplus",
            |x| x.softplus(),
            [
                0.029750418272620566,
                0.3132616875182228,
                0.5759394198788436,
                std::f64::consts::LN_2,
                0.6931471806099453,
                0.9740769841801067,
                2.1269280110429727,
                7.000911466453775,
            ],
        ),
        (
            "expm1",
            |x| x.expm1(),
            [
                -0.9698026165776815,
                -0.6321205588285577,
                -0.22119921692859512,
                0.0,
                1.00000000005e-10,
                0.6487212707001282,
                6.38905609893065,
                1095.6331584284585,
            ],
        ),
    ]
}

#[test]
fn smooth_unary_values_f64_and_f32() {
    let m = NDManager::new();
    for (name, f, want) in smooth_cases() {
        let x = m.create(&XS, [8]);
        let y = f(x);
        assert_eq!(y.dtype(), DType::F64, "{name}");
        assert_close(&y.to_vec::<f64>().unwrap(), &want, 4e-16);
        // f32: the f32 inputs are the same numbers (all exact in f32 but 1e-10).
        let x32 = x.to_dtype(DType::F32);
        let y32 = f(x32);
        assert_eq!(y32.dtype(), DType::F32, "{name}");
        let want32: Vec<f64> = XS
            .iter()
            .zip(&want)
            .map(|(&x, &w)| if x == 1e-10 { f64::NAN } else { w })
            .collect();
        let got32: Vec<f64> = f64s(y32)
            .into_iter()
            .zip(&XS)
            .map(|(g, &x)| if x == 1e-10 { f64::NAN } else { g })
            .collect();
        assert_close(&got32, &want32, 1e-6);
    }
    m.close();
}

#[test]
fn smooth_unary_edge_cases() {
    let m = NDManager::new();
    let edges = m.create(&[-INF, INF, NAN, -0.0], [4]);
    // erf: ±1 at ±inf, NaN stays NaN, -0 stays -0.
    let e = edges.erf().to_vec::<f64>().unwrap();
    assert_close(&e, &[-1.0, 1.0, NAN, 0.0], 0.0);
    assert!(e[3].is_sign_negative());
    // gelu and silu: the limits 0 at -inf (not NaN) and inf at inf.
    assert_close(&f64s(edges.gelu()), &[0.0, INF, NAN, 0.0], 0.0);
    assert_close(&f64s(edges.silu()), &[0.0, INF, NAN, 0.0], 0.0);
    assert_close(
        &f64s(edges.to_dtype(DType::F32).gelu()),
        &[0.0, INF, NAN, 0.0],
        0.0,
    );
    assert_close(
        &f64s(edges.to_dtype(DType::F32).silu()),
        &[0.0, INF, NAN, 0.0],
        0.0,
    );
    // gelu keeps the precision of tiny negative values (the erfc form; mpmath).
    let g = m
        .create(&[-6.0f64, -10.0], [2])
        .gelu()
        .to_vec::<f64>()
        .unwrap();
    assert_close(
        &g,
        &[-5.9195258702261885e-09, -7.619853024160526e-23],
        1e-13,
    );
    // silu far left underflows to -0, no NaN.
    assert_eq!(
        m.create(&[-800.0f64], [1]).silu().to_vec::<f64>().unwrap(),
        vec![-0.0]
    );
    // softplus: stable for large |x|; exact tiny values (mpmath).
    let sp = m
        .create(&[-INF, INF, NAN, 1000.0, -1000.0, -50.0, 50.0, 30.0], [8])
        .softplus();
    assert_close(
        &f64s(sp),
        &[
            0.0,
            INF,
            NAN,
            1000.0,
            0.0,
            1.9287498479639178e-22,
            50.0,
            30.000000000000092,
        ],
        4e-16,
    );
    let sp32 = m.create(&[100.0f32, -100.0, 1e30], [3]).softplus();
    assert_eq!(sp32.to_vec::<f32>().unwrap()[0], 100.0);
    assert_eq!(sp32.to_vec::<f32>().unwrap()[2], 1e30);
    // expm1 and log1p: limits and domain.
    assert_close(&f64s(edges.expm1()), &[-1.0, INF, NAN, 0.0], 0.0);
    let l = m.create(&[-1.0f64, -2.0, INF, NAN], [4]).log1p();
    assert_close(&f64s(l), &[-INF, NAN, INF, NAN], 0.0);
    m.close();
}

#[test]
fn reciprocal_rsqrt_log1p_values() {
    let m = NDManager::new();
    let pos = [1e-10, 0.25, 1.0, 2.0, 9.0, 1e6];
    let x = m.create(&pos, [6]);
    assert_close(
        &f64s(x.reciprocal()),
        &[10000000000.0, 4.0, 1.0, 0.5, 0.1111111111111111, 1e-06],
        2e-16,
    );
    assert_close(
        &f64s(x.rsqrt()),
        &[
            100000.0,
            2.0,
            1.0,
            std::f64::consts::FRAC_1_SQRT_2,
            0.3333333333333333,
            0.001,
        ],
        2e-16,
    );
    assert_close(
        &f64s(x.to_dtype(DType::F32).rsqrt()),
        &[
            100000.0,
            2.0,
            1.0,
            std::f64::consts::FRAC_1_SQRT_2,
            0.3333333333333333,
            0.001,
        ],
        2e-7,
    );
    let lp = m.create(&[-0.5f64, 1e-10, 0.25, 1.0, 1e6], [5]).log1p();
    assert_close(
        &f64s(lp),
        &[
            -std::f64::consts::LN_2,
            9.999999999500001e-11,
            0.22314355131420976,
            std::f64::consts::LN_2,
            13.815511557963774,
        ],
        2e-16,
    );
    // Edge cases.
    let r = m.create(&[0.0f64, -0.0, INF, -INF, NAN], [5]).reciprocal();
    assert_close(&f64s(r), &[INF, -INF, 0.0, 0.0, NAN], 0.0);
    let s = m.create(&[0.0f64, -1.0, INF, NAN], [4]).rsqrt();
    assert_close(&f64s(s), &[INF, NAN, 0.0, NAN], 0.0);
    m.close();
}

#[test]
fn leaky_relu_values_and_bad_alpha() {
    let m = NDManager::new();
    let x = m.create(&[-2.0f64, -0.0, 0.0, 3.0, NAN, -INF, INF], [7]);
    assert_close(
        &f64s(x.leaky_relu(0.1)),
        &[-0.2, 0.0, 0.0, 3.0, NAN, -INF, INF],
        1e-16,
    );
    assert_close(
        &f64s(x.to_dtype(DType::F32).leaky_relu(0.01)),
        &[-0.02, 0.0, 0.0, 3.0, NAN, -INF, INF],
        1e-7,
    );
    // alpha = 0 is relu (NaN still propagates); a negative slope is allowed (PyTorch).
    assert_close(
        &f64s(x.leaky_relu(0.0)),
        &[0.0, 0.0, 0.0, 3.0, NAN, NAN, INF],
        0.0,
    );
    fails!(
        m,
        x.try_leaky_relu(f64::NAN),
        NdError::InvalidArgument { .. }
    );
    fails!(m, x.try_leaky_relu(INF), NdError::InvalidArgument { .. });
    let i = m.create(&[1i32, -1], [2]);
    fails!(m, i.try_leaky_relu(0.1), NdError::UnsupportedDType { .. });
    same_panic(
        || x.try_leaky_relu(f64::NAN),
        || {
            let _ = x.leaky_relu(f64::NAN);
        },
    );
    m.close();
}

#[test]
fn floor_ceil_round_sign_values() {
    let m = NDManager::new();
    let x = m.create(
        &[
            0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.6, -2.4, -0.0, INF, -INF, NAN,
        ],
        [12],
    );
    // numpy: np.round (half to even), np.floor, np.ceil, np.sign
    assert_close(
        &f64s(x.round()),
        &[
            0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 3.0, -2.0, -0.0, INF, -INF, NAN,
        ],
        0.0,
    );
    assert!(x.round().to_vec::<f64>().unwrap()[3].is_sign_negative());
    assert_close(
        &f64s(x.floor()),
        &[
            0.0, 1.0, 2.0, -1.0, -2.0, -3.0, 2.0, -3.0, -0.0, INF, -INF, NAN,
        ],
        0.0,
    );
    assert_close(
        &f64s(x.ceil()),
        &[
            1.0, 2.0, 3.0, -0.0, -1.0, -2.0, 3.0, -2.0, -0.0, INF, -INF, NAN,
        ],
        0.0,
    );
    assert_close(
        &f64s(x.sign()),
        &[
            1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 1.0, -1.0, 0.0, 1.0, -1.0, NAN,
        ],
        0.0,
    );
    let x32 = x.to_dtype(DType::F32);
    assert_eq!(x32.round().dtype(), DType::F32);
    assert_close(&f64s(x32.round()), &f64s(x.round()), 0.0);
    assert_close(&f64s(x32.sign()), &f64s(x.sign()), 0.0);
    // Integers: floor/ceil/round are the identity (same dtype, as numpy); sign works.
    let i = m.create(&[-3i32, 0, 7, i32::MIN], [4]);
    for y in [i.floor(), i.ceil(), i.round()] {
        assert_eq!(y.dtype(), DType::I32);
        assert_eq!(y.to_vec::<i32>().unwrap(), vec![-3, 0, 7, i32::MIN]);
    }
    assert_eq!(i.sign().to_vec::<i32>().unwrap(), vec![-1, 0, 1, -1]);
    let l = m.create(&[-3i64, 0, i64::MAX], [3]);
    assert_eq!(l.sign().to_vec::<i64>().unwrap(), vec![-1, 0, 1]);
    let u = m.create(&[0u8, 9, 255], [3]);
    assert_eq!(u.sign().to_vec::<u8>().unwrap(), vec![0, 1, 1]);
    assert_eq!(u.round().to_vec::<u8>().unwrap(), vec![0, 9, 255]);
    m.close();
}

#[test]
fn unary_dtype_errors_leave_counters_unchanged() {
    let m = NDManager::new();
    let b = m.create(&[true, false], [2]);
    let i = m.create(&[1i64, 2], [2]);
    type Op = fn(NDArray) -> ndscope::Result<NDArray>;
    let float_only: [(&str, Op); 9] = [
        ("erf", |x| x.try_erf()),
        ("gelu", |x| x.try_gelu()),
        ("silu", |x| x.try_silu()),
        ("softplus", |x| x.try_softplus()),
        ("reciprocal", |x| x.try_reciprocal()),
        ("rsqrt", |x| x.try_rsqrt()),
        ("log1p", |x| x.try_log1p()),
        ("expm1", |x| x.try_expm1()),
        ("leaky_relu", |x| x.try_leaky_relu(0.1)),
    ];
    for (name, f) in float_only {
        for a in [b, i] {
            fails!(m, f(a), NdError::UnsupportedDType { .. });
            assert!(f(a).unwrap_err().to_string().starts_with(name));
        }
    }
    let numeric: [Op; 4] = [
        |x| x.try_floor(),
        |x| x.try_ceil(),
        |x| x.try_round(),
        |x| x.try_sign(),
    ];
    for f in numeric {
        fails!(m, f(b), NdError::UnsupportedDType { .. });
    }
    // The panicking forms panic with exactly the error's message.
    same_panic(
        || b.try_erf(),
        || {
            let _ = b.erf();
        },
    );
    same_panic(
        || i.try_gelu(),
        || {
            let _ = i.gelu();
        },
    );
    same_panic(
        || b.try_silu(),
        || {
            let _ = b.silu();
        },
    );
    same_panic(
        || b.try_softplus(),
        || {
            let _ = b.softplus();
        },
    );
    same_panic(
        || i.try_reciprocal(),
        || {
            let _ = i.reciprocal();
        },
    );
    same_panic(
        || i.try_rsqrt(),
        || {
            let _ = i.rsqrt();
        },
    );
    same_panic(
        || i.try_log1p(),
        || {
            let _ = i.log1p();
        },
    );
    same_panic(
        || i.try_expm1(),
        || {
            let _ = i.expm1();
        },
    );
    same_panic(
        || b.try_floor(),
        || {
            let _ = b.floor();
        },
    );
    same_panic(
        || b.try_ceil(),
        || {
            let _ = b.ceil();
        },
    );
    same_panic(
        || b.try_round(),
        || {
            let _ = b.round();
        },
    );
    same_panic(
        || b.try_sign(),
        || {
            let _ = b.sign();
        },
    );
    // A closed array is reported as such (before the slope is checked).
    let c = m.create(&[1.0f64], [1]);
    c.close();
    fails!(m, c.try_leaky_relu(f64::NAN), NdError::Closed(_));
    fails!(m, c.try_erf(), NdError::Closed(_));
    m.close();
}

#[test]
fn unary_on_views_and_zero_size() {
    let m = NDManager::new();
    let data = [-3.0, -1.5, -0.25, 0.5, 1.25, 2.5];
    let x = m.create(&data, [2, 3]);
    let t = x.transpose(); // [3, 2], not contiguous
    let r = x.get("::-1, ::-1"); // negative strides
    type Op = fn(NDArray) -> NDArray;
    let ops: [Op; 13] = [
        |x| x.erf(),
        |x| x.gelu(),
        |x| x.silu(),
        |x| x.softplus(),
        |x| x.leaky_relu(0.2),
        |x| x.reciprocal(),
        |x| x.rsqrt(),
        |x| x.log1p(),
        |x| x.expm1(),
        |x| x.floor(),
        |x| x.ceil(),
        |x| x.round(),
        |x| x.sign(),
    ];
    for f in ops {
        // A view gives the same as the op on its contiguous copy.
        let tc = t * 1.0;
        let rc = r * 1.0;
        assert_eq!(f(t).shape().dims(), &[3, 2]);
        assert_close(&f64s(f(t)), &f64s(f(tc)), 0.0);
        assert_close(&f64s(f(r)), &f64s(f(rc)), 0.0);
        // Zero-size, also a zero-size view with a nonzero offset (issue 11).
        let z = m.zeros([2, 0], DType::F64);
        assert_eq!(f(z).shape().dims(), &[2, 0]);
        let zv = z.get("1");
        assert_eq!(f(zv).shape().dims(), &[0]);
        let zi = m.zeros([0, 3], DType::F32).get("::-1");
        assert_eq!(f(zi).shape().dims(), &[0, 3]);
    }
    for y in [
        x.try_stop_gradient().unwrap(),
        m.zeros([2, 0], DType::F64).get("1").stop_gradient(),
    ] {
        let _ = y.shape();
    }
    m.close();
}

#[test]
fn unary_gradients() {
    gradcheck(&[&[2, 3]], -2.5, 2.5, |x| x[0].erf());
    gradcheck(&[&[2, 3]], -3.0, 3.0, |x| x[0].gelu());
    gradcheck(&[&[2, 3]], -3.0, 3.0, |x| x[0].silu());
    gradcheck(&[&[2, 3]], -5.0, 5.0, |x| x[0].softplus());
    gradcheck(&[&[2, 3]], -2.0, 2.0, |x| x[0].leaky_relu(0.1));
    gradcheck(&[&[2, 3]], -2.0, 2.0, |x| x[0].leaky_relu(-0.5));
    gradcheck(&[&[2, 3]], 0.5, 2.0, |x| x[0].reciprocal());
    gradcheck(&[&[2, 3]], -2.0, -0.5, |x| x[0].reciprocal());
    gradcheck(&[&[2, 3]], 0.5, 3.0, |x| x[0].rsqrt());
    gradcheck(&[&[2, 3]], -0.5, 3.0, |x| x[0].log1p());
    gradcheck(&[&[2, 3]], -2.0, 2.0, |x| x[0].expm1());
    // Through a transposed view and a broadcast.
    gradcheck(&[&[2, 3]], -2.0, 2.0, |x| x[0].transpose().gelu());
    gradcheck(&[&[2, 3], &[3]], -2.0, 2.0, |x| (x[0] * x[1]).softplus());
    // Far tails: the derivative formulas stay finite (limits 0 and 1).
    let g = grad_of(&[6], &[-INF, -40.0, 40.0, INF, -800.0, 800.0], |x| x.gelu());
    assert_close(&g, &[0.0, 0.0, 1.0, 1.0, 0.0, 1.0], 0.0);
    let g = grad_of(&[4], &[-INF, INF, -800.0, 800.0], |x| x.silu());
    assert_close(&g, &[0.0, 1.0, 0.0, 1.0], 0.0);
    let g = grad_of(&[4], &[-INF, INF, -800.0, 800.0], |x| x.softplus());
    assert_close(&g, &[0.0, 1.0, 0.0, 1.0], 0.0);
    // leaky_relu's slope at 0 is alpha (PyTorch).
    assert_close(&grad_of(&[1], &[0.0], |x| x.leaky_relu(0.3)), &[0.3], 0.0);
    // f32 gradients have the input's dtype.
    let m = NDManager::new();
    let x = m.create(&[0.5f32, -1.0], [2]).set_requires_gradient(true);
    {
        let gc = GradientCollector::new();
        gc.backward(x.gelu().sum()).unwrap();
    }
    let g = f64s(x.gradient());
    // Phi(x) + x phi(x) (mpmath)
    assert_close(&g, &[0.8674951246561629, -0.0833154705876863], 1e-6);
    m.close();
}

#[test]
fn piecewise_constant_ops_are_not_recorded() {
    let m = NDManager::new();
    let x = m.create(&[0.4f64, 1.6], [2]).set_requires_gradient(true);
    type Op = fn(NDArray) -> NDArray;
    let ops: [Op; 4] = [|x| x.floor(), |x| x.ceil(), |x| x.round(), |x| x.sign()];
    for f in ops {
        let gc = GradientCollector::new();
        let y = f(x);
        assert_eq!(gc.tape_len(), 0, "a non-differentiable op was recorded");
        let err = gc.backward(y.sum()).unwrap_err().to_string();
        assert!(err.contains("not computed from an array that requires a gradient"));
        // Mixed with a differentiable path: only that path carries the gradient.
        let gc2 = {
            drop(gc);
            GradientCollector::new()
        };
        gc2.backward((f(x) * x).sum()).unwrap();
        assert_eq!(x.gradient().to_vec::<f64>().unwrap(), f64s(f(x)));
    }
    m.close();
}

// ---------------------------------------------------------------------------------
// Logical ops and any/all
// ---------------------------------------------------------------------------------

#[test]
fn logical_ops_values_broadcasting_and_views() {
    let m = NDManager::new();
    let a = m.create(&[true, true, false, false], [4]);
    let b = m.create(&[true, false, true, false], [4]);
    let v = |x: NDArray| x.to_vec::<bool>().unwrap();
    assert_eq!(v(a.logical_and(b)), vec![true, false, false, false]);
    assert_eq!(v(a.logical_or(b)), vec![true, true, true, false]);
    assert_eq!(v(a.logical_xor(b)), vec![false, true, true, false]);
    assert_eq!(v(a.logical_not()), vec![false, false, true, true]);
    assert_eq!(a.logical_and(b).dtype(), DType::Bool);
    // Broadcasting [2, 1] with [3] (numpy: np.logical_and(c[:, None], r)).
    let c = m.create(&[true, false], [2, 1]);
    let r = m.create(&[true, false, true], [3]);
    let y = c.logical_and(r);
    assert_eq!(y.shape().dims(), &[2, 3]);
    assert_eq!(v(y), vec![true, false, true, false, false, false]);
    assert_eq!(
        v(c.logical_xor(r)),
        vec![false, true, false, true, false, true]
    );
    assert_eq!(
        v(c.logical_or(r)),
        vec![true, true, true, true, false, true]
    );
    // Non-contiguous: a transposed view and a reversed slice.
    let g = m.create(&[true, false, false, true, true, false], [2, 3]);
    let t = g.transpose();
    assert_eq!(
        v(t.logical_not()),
        vec![false, false, true, false, true, true]
    );
    assert_eq!(
        v(t.logical_and(m.create(&[true, true], [2]))),
        vec![true, true, false, true, false, false]
    );
    let rev = a.get("::-1");
    assert_eq!(v(rev.logical_xor(b)), vec![true, false, false, true]);
    // Zero-size, including a zero-size view with an offset.
    let z = m.zeros([2, 0], DType::Bool);
    assert_eq!(z.logical_and(z).shape().dims(), &[2, 0]);
    assert_eq!(z.get("1").logical_not().shape().dims(), &[0]);
    assert_eq!(z.logical_or(m.create(&[true], [1])).shape().dims(), &[2, 0]);
    m.close();
}

#[test]
fn logical_ops_errors() {
    let m = NDManager::new();
    let a = m.create(&[true, false], [2]);
    let f = m.create(&[1.0f32, 0.0], [2]);
    let i = m.create(&[1i32, 0], [2]);
    let u = m.create(&[1u8, 0], [2]);
    for x in [f, i, u] {
        fails!(m, a.try_logical_and(x), NdError::UnsupportedDType { .. });
        fails!(m, x.try_logical_or(a), NdError::UnsupportedDType { .. });
        fails!(m, x.try_logical_xor(x), NdError::UnsupportedDType { .. });
        fails!(m, x.try_logical_not(), NdError::UnsupportedDType { .. });
    }
    let three = m.create(&[true, false, true], [3]);
    fails!(m, a.try_logical_and(three), NdError::ShapeMismatch { .. });
    same_panic(
        || a.try_logical_and(f),
        || {
            let _ = a.logical_and(f);
        },
    );
    same_panic(
        || a.try_logical_or(three),
        || {
            let _ = a.logical_or(three);
        },
    );
    same_panic(
        || i.try_logical_xor(a),
        || {
            let _ = i.logical_xor(a);
        },
    );
    same_panic(
        || u.try_logical_not(),
        || {
            let _ = u.logical_not();
        },
    );
    m.close();
}

#[test]
fn any_all_every_dtype() {
    let m = NDManager::new();
    let b = |x: NDArray| x.to_scalar::<bool>().unwrap();
    // numpy: NaN is true, -0.0 is false.
    assert!(b(m.create(&[0.0f64, NAN], [2]).any()));
    assert!(!b(m.create(&[0.0f64, -0.0], [2]).any()));
    assert!(b(m
        .create(&[1.0f32, f32::NAN, f32::NEG_INFINITY], [3])
        .all()));
    assert!(!b(m.create(&[1.0f32, -0.0], [2]).all()));
    assert!(b(m.create(&[0i32, -5], [2]).any()));
    assert!(!b(m.create(&[0i64, 3], [2]).all()));
    assert!(b(m.create(&[i64::MIN, 3], [2]).all()));
    assert!(b(m.create(&[0u8, 0, 128], [3]).any()));
    assert!(!b(m.create(&[false, false], [2]).any()));
    assert!(b(m.create(&[true, true], [2]).all()));
    // Empty: any false, all true; a 0-d array.
    let e = m.zeros([0], DType::F32);
    assert!(!b(e.any()) && b(e.all()));
    assert!(b(m.create(&[2.0f64], []).all()));
    assert_eq!(e.any().dtype(), DType::Bool);
    assert_eq!(e.all().shape().ndim(), 0);
    m.close();
}

#[test]
fn any_all_axes_keep_dims_views_and_zero_size() {
    let m = NDManager::new();
    let v = |x: NDArray| x.to_vec::<bool>().unwrap();
    // [[0, 1, 0], [0, 0, 0]]: numpy np.any(x, axis=..., keepdims=...)
    let x = m.create(&[0i32, 1, 0, 0, 0, 0], [2, 3]);
    assert_eq!(v(x.any_axes(&[-1], false)), vec![true, false]);
    assert_eq!(v(x.all_axes(&[-1], false)), vec![false, false]);
    assert_eq!(v(x.any_axes(&[0], false)), vec![false, true, false]);
    let k = x.any_axes(&[-2], true);
    assert_eq!(k.shape().dims(), &[1, 3]);
    assert_eq!(v(k), vec![false, true, false]);
    assert_eq!(x.all_axes(&[0, -1], true).shape().dims(), &[1, 1]);
    assert_eq!(v(x.any_axes(&[1, 0], false)), vec![true]);
    // No axes: elementwise truth.
    assert_eq!(
        v(x.any_axes(&[], false)),
        vec![false, true, false, false, false, false]
    );
    // 3-d, middle axis, on a transposed view (strided rows).
    let y = m.create(&[1.0f64, 2.0, 0.0, 4.0, 5.0, 6.0, 7.0, 0.0], [2, 2, 2]);
    let yt = y.transpose(); // [2, 2, 2] reversed axes
    // numpy: np.all(y.T, axis=1) -> [[True, False], [False, False]] flattened... computed:
    let yc = yt * 1.0;
    assert_eq!(v(yt.all_axes(&[1], false)), v(yc.all_axes(&[1], false)));
    assert_eq!(v(yt.all_axes(&[1], false)), vec![false, true, true, false]);
    assert_eq!(v(yt.any_axes(&[0, 2], true)), vec![true, true]);
    let r = x.get(":, ::-1");
    assert_eq!(v(r.any_axes(&[1], false)), vec![true, false]);
    assert_eq!(v(r.get("0").all()), vec![false]);
    // Zero-size: reducing an empty axis gives the identities; keeping an empty axis
    // gives an empty result; a zero-size view with an offset.
    let z = m.zeros([2, 0], DType::F64);
    assert_eq!(v(z.any_axes(&[1], false)), vec![false, false]);
    assert_eq!(v(z.all_axes(&[-1], true)), vec![true, true]);
    assert_eq!(z.all_axes(&[-1], true).shape().dims(), &[2, 1]);
    assert_eq!(z.any_axes(&[0], false).shape().dims(), &[0]);
    assert!(!z.get("1").any().to_scalar::<bool>().unwrap());
    assert!(z.get("1").all().to_scalar::<bool>().unwrap());
    m.close();
}

#[test]
fn any_all_bad_axes() {
    let m = NDManager::new();
    let x = m.create(&[1.0f32, 0.0], [2, 1]);
    fails!(
        m,
        x.try_any_axes(&[2], false),
        NdError::AxisOutOfRange { .. }
    );
    fails!(
        m,
        x.try_all_axes(&[-3], true),
        NdError::AxisOutOfRange { .. }
    );
    fails!(
        m,
        x.try_any_axes(&[0, -2], false),
        NdError::InvalidArgument { .. }
    );
    same_panic(
        || x.try_any_axes(&[2], false),
        || {
            let _ = x.any_axes(&[2], false);
        },
    );
    same_panic(
        || x.try_all_axes(&[0, 0], false),
        || {
            let _ = x.all_axes(&[0, 0], false);
        },
    );
    let c = m.create(&[true], [1]);
    c.close();
    fails!(m, c.try_any(), NdError::Closed(_));
    same_panic(
        || c.try_all(),
        || {
            let _ = c.all();
        },
    );
    m.close();
}

// ---------------------------------------------------------------------------------
// var / std / logsumexp / norm / cumsum
// ---------------------------------------------------------------------------------

const X34: [f64; 12] = [
    0.5, -1.25, 3.0, 2.0, 10.0, 9.5, 11.25, -4.0, 1e-3, 2e-3, -7.5, 0.0,
];

#[test]
fn var_std_values() {
    let m = NDManager::new();
    let x = m.create(&X34, [3, 4]);
    // numpy: np.var / np.std (ddof=0)
    assert_close(&f64s(x.var()), &[29.82020174305556], 1e-15);
    assert_eq!(x.var().shape().ndim(), 0);
    assert_close(
        &f64s(x.var_axes(&[-1], false)),
        &[2.57421875, 38.48046875, 10.549688187500001],
        1e-15,
    );
    let k = x.var_axes(&[0], true);
    assert_eq!(k.shape().dims(), &[1, 4]);
    assert_close(
        &f64s(k),
        &[
            21.164333555555555,
            23.038000888888888,
            58.875,
            6.222222222222221,
        ],
        1e-15,
    );
    assert_close(
        &f64s(x.var_axes(&[-2, 1], true)),
        &[29.82020174305556],
        1e-15,
    );
    assert_eq!(x.var_axes(&[-2, 1], true).shape().dims(), &[1, 1]);
    assert_close(&f64s(x.std()), &[5.460787648595719], 1e-15);
    assert_close(
        &f64s(x.std_axes(&[1], false)),
        &[1.6044372066241794, 6.203262750359685, 3.2480283538633095],
        1e-15,
    );
    assert_eq!(x.std_axes(&[-1], true).shape().dims(), &[3, 1]);
    // f32 keeps its dtype (numpy float32 results).
    let x32 = x.to_dtype(DType::F32);
    let v32 = x32.var_axes(&[-1], false);
    assert_eq!(v32.dtype(), DType::F32);
    assert_close(
        &f64s(v32),
        &[2.57421875, 38.48046875, 10.549688339233398],
        1e-7,
    );
    assert_eq!(x32.std().dtype(), DType::F32);
    // Non-contiguous: transposed and reversed views give the same as numpy on them.
    let t = x.transpose();
    assert_close(
        &f64s(t.var_axes(&[0], false)),
        &[2.57421875, 38.48046875, 10.549688187500001],
        1e-15,
    );
    assert_close(&f64s(t.std()), &[5.460787648595719], 1e-15);
    assert_close(
        &f64s(x.get("::-1, ::-1").var_axes(&[1], false)),
        &[10.549688187500001, 38.48046875, 2.57421875],
        1e-15,
    );
    // No axes: every element's own variance, 0.
    assert_eq!(f64s(x.var_axes(&[], false)), vec![0.0; 12]);
    m.close();
}

#[test]
fn var_std_edge_cases() {
    let m = NDManager::new();
    // A constant gives exactly 0 (numpy's two-pass gives 1.9e-34 for [0.1; 3]).
    for n in [1, 3, 7, 1000] {
        let c = m.full([n], 0.1, DType::F64);
        assert_eq!(c.var().to_scalar::<f64>().unwrap(), 0.0);
        assert_eq!(c.std().to_scalar::<f64>().unwrap(), 0.0);
        let c32 = m.full([n], 0.3, DType::F32);
        assert_eq!(c32.var().to_scalar::<f32>().unwrap(), 0.0);
    }
    // Large offset: no catastrophic cancellation (numpy: np.var([1e9+1, 1e9+2, 1e9+3])).
    let big = m.create(&[1e9 + 1.0, 1e9 + 2.0, 1e9 + 3.0], [3]);
    assert_close(&f64s(big.var()), &[0.6666666666666666], 1e-9);
    // NaN and inf propagate to NaN (numpy).
    let n = m.create(&[1.0f64, NAN, 2.0, INF, 1.0, 2.0], [3, 2]);
    assert_close(&f64s(n.var_axes(&[1], false)), &[NAN, NAN, 0.25], 0.0);
    // Empty: NaN (numpy warns and gives nan); empty lanes too; an empty result.
    let z = m.zeros([2, 0], DType::F64);
    assert!(z.var().to_scalar::<f64>().unwrap().is_nan());
    assert_close(&f64s(z.std_axes(&[1], false)), &[NAN, NAN], 0.0);
    assert_eq!(z.var_axes(&[0], false).shape().dims(), &[0]);
    assert!(z.get("1").var().to_scalar::<f64>().unwrap().is_nan());
    m.close();
}

#[test]
fn var_std_errors() {
    let m = NDManager::new();
    let b = m.create(&[true, false], [2]);
    let i = m.create(&[1i32, 2], [2]);
    let x = m.create(&[1.0f64, 2.0], [2]);
    for a in [b, i] {
        fails!(m, a.try_var(), NdError::UnsupportedDType { .. });
        fails!(m, a.try_std(), NdError::UnsupportedDType { .. });
        fails!(
            m,
            a.try_var_axes(&[0], true),
            NdError::UnsupportedDType { .. }
        );
        fails!(
            m,
            a.try_std_axes(&[0], false),
            NdError::UnsupportedDType { .. }
        );
        fails!(m, a.try_logsumexp(), NdError::UnsupportedDType { .. });
        fails!(
            m,
            a.try_logsumexp_axes(&[0], false),
            NdError::UnsupportedDType { .. }
        );
        fails!(m, a.try_norm(), NdError::UnsupportedDType { .. });
    }
    fails!(
        m,
        x.try_var_axes(&[1], false),
        NdError::AxisOutOfRange { .. }
    );
    fails!(
        m,
        x.try_std_axes(&[-2], true),
        NdError::AxisOutOfRange { .. }
    );
    fails!(
        m,
        x.try_logsumexp_axes(&[0, -1], false),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_logsumexp_axes(&[5], false),
        NdError::AxisOutOfRange { .. }
    );
    same_panic(
        || b.try_var(),
        || {
            let _ = b.var();
        },
    );
    same_panic(
        || i.try_std(),
        || {
            let _ = i.std();
        },
    );
    same_panic(
        || x.try_var_axes(&[1], false),
        || {
            let _ = x.var_axes(&[1], false);
        },
    );
    same_panic(
        || x.try_std_axes(&[3], true),
        || {
            let _ = x.std_axes(&[3], true);
        },
    );
    same_panic(
        || b.try_logsumexp(),
        || {
            let _ = b.logsumexp();
        },
    );
    same_panic(
        || x.try_logsumexp_axes(&[0, 0], true),
        || {
            let _ = x.logsumexp_axes(&[0, 0], true);
        },
    );
    same_panic(
        || i.try_norm(),
        || {
            let _ = i.norm();
        },
    );
    m.close();
}

#[test]
fn logsumexp_values() {
    let m = NDManager::new();
    let x = m.create(&X34, [3, 4]);
    // mpmath: log(sum(exp(x))) at 40 digits
    assert_close(&f64s(x.logsumexp()), &[11.628916176078476], 1e-15);
    assert_close(
        &f64s(x.logsumexp_axes(&[-1], false)),
        &[3.3813286012269788, 11.628627498663546, 1.0997967821689074],
        1e-15,
    );
    let k = x.logsumexp_axes(&[0], true);
    assert_eq!(k.shape().dims(), &[1, 4]);
    assert_close(
        &f64s(k),
        &[
            10.000120289947162,
            9.500096442440945,
            11.250261231627482,
            2.1291089088298505,
        ],
        1e-15,
    );
    // Views.
    assert_close(
        &f64s(x.transpose().logsumexp_axes(&[0], false)),
        &[3.3813286012269788, 11.628627498663546, 1.0997967821689074],
        1e-15,
    );
    assert_close(
        &f64s(x.get("::-1").logsumexp_axes(&[1], true)),
        &[1.0997967821689074, 11.628627498663546, 3.3813286012269788],
        1e-15,
    );
    // f32
    let l32 = x.to_dtype(DType::F32).logsumexp_axes(&[-1], false);
    assert_eq!(l32.dtype(), DType::F32);
    assert_close(
        &f64s(l32),
        &[3.3813286012269788, 11.628627498663546, 1.0997967821689074],
        2e-7,
    );
    m.close();
}

#[test]
fn logsumexp_huge_and_infinite_values() {
    let m = NDManager::new();
    // Huge values do not overflow; tiny ones do not underflow (mpmath).
    let h = m.create(&[1000.0f64, 1000.0, 1e308, 1e308, -1000.0, -1001.0], [3, 2]);
    assert_close(
        &f64s(h.logsumexp_axes(&[1], false)),
        &[1000.0 + std::f64::consts::LN_2, 1e308, -999.6867383124818],
        1e-15,
    );
    let h32 = m.create(&[88.0f32, 89.0, 1e38, 1e38], [2, 2]);
    let got = f64s(h32.logsumexp_axes(&[1], false));
    assert_close(&got, &[89.31326168751822, 1e38], 1e-7);
    // Lanes: all -inf -> -inf (not NaN); -inf with finite; +inf; NaN; +inf and -inf.
    let e = m.create(
        &[
            -INF, -INF, -INF, 0.0, INF, 1.0, NAN, 1.0, INF, -INF, INF, INF,
        ],
        [6, 2],
    );
    assert_close(
        &f64s(e.logsumexp_axes(&[-1], false)),
        &[-INF, 0.0, INF, NAN, INF, INF],
        0.0,
    );
    // Empty: -inf (log of an empty sum).
    let z = m.zeros([2, 0], DType::F32);
    assert_close(&f64s(z.logsumexp_axes(&[1], false)), &[-INF, -INF], 0.0);
    assert_eq!(z.logsumexp().to_scalar::<f32>().unwrap(), f32::NEG_INFINITY);
    assert_eq!(
        z.get("1").logsumexp().to_scalar::<f32>().unwrap(),
        f32::NEG_INFINITY
    );
    assert_eq!(z.logsumexp_axes(&[0], true).shape().dims(), &[1, 0]);
    m.close();
}

#[test]
fn logsumexp_gradient_is_stable() {
    gradcheck(&[&[3, 4]], -3.0, 3.0, |x| x[0].logsumexp());
    gradcheck(&[&[3, 4]], -3.0, 3.0, |x| x[0].logsumexp_axes(&[-1], false));
    gradcheck(&[&[3, 4]], -3.0, 3.0, |x| x[0].logsumexp_axes(&[0], true));
    gradcheck(&[&[2, 3, 2]], -3.0, 3.0, |x| {
        x[0].transpose().logsumexp_axes(&[0, 2], false)
    });
    // Huge values: the gradient is the softmax weights, finite.
    let g = grad_of(&[2, 2], &[1000.0, 1000.0, 1e308, 0.0], |x| {
        x.logsumexp_axes(&[1], false)
    });
    assert_close(&g, &[0.5, 0.5, 1.0, 0.0], 1e-15);
    // A lane of -inf gets a zero gradient, not NaN; -inf next to finite gets 0.
    let g = grad_of(&[2, 2], &[-INF, -INF, -INF, 3.0], |x| {
        x.logsumexp_axes(&[-1], true)
    });
    assert_close(&g, &[0.0, 0.0, 0.0, 1.0], 0.0);
}

#[test]
fn var_std_gradients() {
    gradcheck(&[&[3, 4]], -2.0, 2.0, |x| x[0].var());
    gradcheck(&[&[3, 4]], -2.0, 2.0, |x| x[0].var_axes(&[-1], false));
    gradcheck(&[&[3, 4]], -2.0, 2.0, |x| x[0].var_axes(&[0], true));
    gradcheck(&[&[3, 4]], -2.0, 2.0, |x| x[0].std());
    gradcheck(&[&[3, 4]], -2.0, 2.0, |x| x[0].std_axes(&[1], true));
    gradcheck(&[&[2, 3, 2]], -2.0, 2.0, |x| {
        x[0].transpose().std_axes(&[-1, 0], false)
    });
    gradcheck(&[&[3, 4]], -2.0, 2.0, |x| {
        x[0].get("::-1").var_axes(&[0], false)
    });
    // std of a constant lane: gradient defined as 0 (not NaN).
    let g = grad_of(&[2, 2], &[5.0, 5.0, 1.0, 3.0], |x| x.std_axes(&[1], false));
    assert_close(&g, &[0.0, 0.0, -0.5, 0.5], 1e-15);
}

#[test]
fn norm_values_and_gradient() {
    let m = NDManager::new();
    let x = m.create(&X34, [3, 4]);
    // numpy: np.linalg.norm(x)
    assert_close(&f64s(x.norm()), &[20.096641634860287], 1e-15);
    assert_eq!(x.norm().shape().ndim(), 0);
    assert_close(&f64s(x.transpose().norm()), &[20.096641634860287], 1e-15);
    assert_close(
        &f64s(x.get("::-1, 1:").norm()),
        &f64s(x.get("::-1, 1:").square().sum().sqrt()),
        1e-15,
    );
    let x32 = x.to_dtype(DType::F32).norm();
    assert_eq!(x32.dtype(), DType::F32);
    assert_close(&f64s(x32), &[20.096641634860287], 1e-7);
    // No overflow or underflow (numpy gives inf and 0 here).
    let big = m.create(&[1e200f64, 1e200], [2]).norm();
    assert_close(&f64s(big), &[std::f64::consts::SQRT_2 * 1e200], 1e-15);
    let small = m.create(&[3e-200f64, 4e-200], [2]).norm();
    assert_close(&f64s(small), &[5e-200], 1e-15);
    assert_close(&f64s(m.create(&[3e38f32, 3e38], [2]).norm()), &[INF], 0.0); // 4.2e38 is not an f32
    assert_close(&f64s(m.create(&[1.0f64, -INF], [2]).norm()), &[INF], 0.0);
    assert_close(&f64s(m.create(&[1.0f64, NAN], [2]).norm()), &[NAN], 0.0);
    assert_close(&f64s(m.create(&[INF, NAN], [2]).norm()), &[NAN], 0.0);
    // Empty and zeros: 0.
    assert_eq!(
        m.zeros([0, 3], DType::F64)
            .norm()
            .to_scalar::<f64>()
            .unwrap(),
        0.0
    );
    assert_eq!(
        m.zeros([2, 0], DType::F64)
            .get("1")
            .norm()
            .to_scalar::<f64>()
            .unwrap(),
        0.0
    );
    assert_eq!(
        m.zeros([3], DType::F32).norm().to_scalar::<f32>().unwrap(),
        0.0
    );
    m.close();
    gradcheck(&[&[3, 4]], -2.0, 2.0, |x| x[0].norm());
    gradcheck(&[&[3, 4]], -2.0, 2.0, |x| {
        x[0].transpose().get("::-1").norm()
    });
    // At 0 the gradient is defined as 0; elsewhere x / norm.
    assert_close(
        &grad_of(&[3], &[0.0, 0.0, 0.0], |x| x.norm()),
        &[0.0, 0.0, 0.0],
        0.0,
    );
    assert_close(
        &grad_of(&[2], &[3.0, -4.0], |x| x.norm()),
        &[0.6, -0.8],
        1e-15,
    );
}

#[test]
fn cumsum_values_every_dtype() {
    let m = NDManager::new();
    let x = m.create(&X34, [3, 4]);
    // numpy: np.cumsum(x, axis=...)
    assert_close(
        &f64s(x.cumsum(-1)),
        &[
            0.5, -0.75, 2.25, 4.25, 10.0, 19.5, 30.75, 26.75, 0.001, 0.003, -7.497, -7.497,
        ],
        1e-15,
    );
    assert_close(
        &f64s(x.cumsum(0)),
        &[
            0.5, -1.25, 3.0, 2.0, 10.5, 8.25, 14.25, -2.0, 10.501, 8.252, 6.75, -2.0,
        ],
        1e-15,
    );
    // Views: np.cumsum(x.T, axis=0), np.cumsum(x[:, ::-1], axis=-1)
    let t = x.transpose().cumsum(0);
    assert_eq!(t.shape().dims(), &[4, 3]);
    assert_close(
        &f64s(t),
        &[
            0.5, 10.0, 0.001, -0.75, 19.5, 0.003, 2.25, 30.75, -7.497, 4.25, 26.75, -7.497,
        ],
        1e-15,
    );
    assert_close(
        &f64s(x.get(":, ::-1").cumsum(-1)),
        &[
            2.0, 5.0, 3.75, 4.25, -4.0, 7.25, 16.75, 26.75, 0.0, -7.5, -7.498, -7.497,
        ],
        1e-15,
    );
    let c32 = x.to_dtype(DType::F32).cumsum(1);
    assert_eq!(c32.dtype(), DType::F32);
    assert_close(&f64s(c32), &f64s(x.cumsum(1)), 1e-6);
    // Integers keep their dtype and wrap (numpy widens to 64 bits instead).
    let i = m.create(&[1i32, 2, 3, 4, 5, 6], [2, 3]);
    let ci = i.cumsum(-1);
    assert_eq!(ci.dtype(), DType::I32);
    assert_eq!(ci.to_vec::<i32>().unwrap(), vec![1, 3, 6, 4, 9, 15]);
    assert_eq!(
        i.cumsum(-2).to_vec::<i32>().unwrap(),
        vec![1, 2, 3, 5, 7, 9]
    );
    assert_eq!(
        m.create(&[i32::MAX, 1], [2])
            .cumsum(0)
            .to_vec::<i32>()
            .unwrap(),
        vec![i32::MAX, i32::MIN]
    );
    assert_eq!(
        m.create(&[100u8, 100, 100], [3])
            .cumsum(0)
            .to_vec::<u8>()
            .unwrap(),
        vec![100, 200, 44]
    );
    assert_eq!(
        m.create(&[-5i64, 7, 1 << 40], [3])
            .cumsum(0)
            .to_vec::<i64>()
            .unwrap(),
        vec![-5, 2, (1 << 40) + 2]
    );
    // NaN / inf propagate along the lane.
    assert_close(
        &f64s(
            m.create(&[1.0f64, NAN, 2.0, INF, -INF, 1.0], [2, 3])
                .cumsum(1),
        ),
        &[1.0, NAN, NAN, INF, NAN, NAN],
        0.0,
    );
    // 3-d middle axis.
    let y = m.create(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [2, 2, 2]);
    assert_eq!(
        f64s(y.cumsum(1)),
        vec![1.0, 2.0, 4.0, 6.0, 5.0, 6.0, 12.0, 14.0]
    );
    // Zero-size (also a view with an offset); a 1-element array.
    let z = m.zeros([2, 0], DType::F64);
    assert_eq!(z.cumsum(1).shape().dims(), &[2, 0]);
    assert_eq!(z.cumsum(0).shape().dims(), &[2, 0]);
    assert_eq!(z.get("1").cumsum(0).shape().dims(), &[0]);
    assert_eq!(
        m.create(&[4.5f32], [1]).cumsum(0).to_vec::<f32>().unwrap(),
        vec![4.5]
    );
    m.close();
}

#[test]
fn cumsum_errors_and_gradient() {
    let m = NDManager::new();
    let x = m.create(&[1.0f64, 2.0], [2]);
    let b = m.create(&[true, false], [2]);
    let s = m.create(&[1.0f64], []);
    fails!(m, x.try_cumsum(1), NdError::AxisOutOfRange { .. });
    fails!(m, x.try_cumsum(-2), NdError::AxisOutOfRange { .. });
    fails!(m, s.try_cumsum(0), NdError::AxisOutOfRange { .. });
    fails!(m, b.try_cumsum(0), NdError::UnsupportedDType { .. });
    same_panic(
        || x.try_cumsum(1),
        || {
            let _ = x.cumsum(1);
        },
    );
    same_panic(
        || b.try_cumsum(0),
        || {
            let _ = b.cumsum(0);
        },
    );
    m.close();
    gradcheck(&[&[3, 4]], -2.0, 2.0, |x| x[0].cumsum(-1));
    gradcheck(&[&[3, 4]], -2.0, 2.0, |x| x[0].cumsum(0));
    gradcheck(&[&[2, 3, 2]], -2.0, 2.0, |x| x[0].transpose().cumsum(1));
    gradcheck(&[&[3, 4]], -2.0, 2.0, |x| x[0].get("::-1, ::2").cumsum(1));
    // The gradient of sum(cumsum(x)) is the reverse cumsum of ones: [n, n-1, ..., 1].
    assert_close(
        &grad_of(&[4], &[0.0; 4], |x| x.cumsum(0)),
        &[4.0, 3.0, 2.0, 1.0],
        0.0,
    );
}

// ---------------------------------------------------------------------------------
// stop_gradient and no_grad
// ---------------------------------------------------------------------------------

#[test]
fn stop_gradient_blocks_the_gradient() {
    let m = NDManager::new();
    let x = m
        .create(&[1.5f64, -2.0, 3.0], [3])
        .set_requires_gradient(true);
    {
        let gc = GradientCollector::new();
        let s = x.stop_gradient();
        assert_eq!(s.to_vec::<f64>().unwrap(), vec![1.5, -2.0, 3.0]);
        assert_ne!(s, x);
        assert!(!s.requires_gradient());
        let before = gc.tape_len();
        gc.backward((s * x).sum()).unwrap();
        assert_eq!(before, 0, "stop_gradient was recorded");
    }
    // d/dx (stop(x) * x) = x, not 2x.
    assert_eq!(x.gradient().to_vec::<f64>().unwrap(), vec![1.5, -2.0, 3.0]);
    {
        let gc = GradientCollector::new();
        let err = gc.backward(x.stop_gradient().square().sum()).unwrap_err();
        assert!(
            err.to_string()
                .contains("not computed from an array that requires a gradient")
        );
    }
    // A copy: writing into it does not change x; views and other dtypes work.
    let s = x.stop_gradient();
    s.try_addi(1.0).unwrap();
    assert_eq!(x.to_vec::<f64>().unwrap(), vec![1.5, -2.0, 3.0]);
    let v = m
        .create(&[1i32, 2, 3, 4], [2, 2])
        .transpose()
        .stop_gradient();
    assert_eq!(v.to_vec::<i32>().unwrap(), vec![1, 3, 2, 4]);
    assert_eq!(v.dtype(), DType::I32);
    let c = m.create(&[1.0f32], [1]);
    c.close();
    fails!(m, c.try_stop_gradient(), NdError::Closed(_));
    same_panic(
        || c.try_stop_gradient(),
        || {
            let _ = c.stop_gradient();
        },
    );
    m.close();
}

#[test]
fn no_grad_records_nothing() {
    let m = NDManager::new();
    let x = m.create(&[2.0f64, 3.0], [2]).set_requires_gradient(true);
    let gc = GradientCollector::new();
    let loss = ndscope::no_grad(|| (x * x).sum());
    assert_eq!(gc.tape_len(), 0);
    let err = gc.backward(loss).unwrap_err().to_string();
    assert!(
        err.contains("not computed from an array that requires a gradient"),
        "{err}"
    );
    // Mixed: only the recorded part carries a gradient.
    let frozen = ndscope::no_grad(|| x * 10.0);
    let y = (frozen * x).sum();
    assert_eq!(gc.tape_len(), 2);
    gc.backward(y).unwrap();
    assert_eq!(x.gradient().to_vec::<f64>().unwrap(), vec![20.0, 30.0]);
    drop(gc);
    m.close();
}

#[test]
fn no_grad_nests_and_restores_recording() {
    let m = NDManager::new();
    let x = m.create(&[1.0f64], [1]).set_requires_gradient(true);
    let gc = GradientCollector::new();
    let out = ndscope::no_grad(|| {
        let a = ndscope::no_grad(|| x * 2.0);
        let b = x * 3.0; // still inside the outer no_grad
        (a, b, 7)
    });
    assert_eq!(out.2, 7);
    assert_eq!(gc.tape_len(), 0);
    let _c = x * 4.0; // recording resumed
    assert_eq!(gc.tape_len(), 1);
    // After a panic inside no_grad, recording resumes too.
    let msg = expect_panic(|| {
        ndscope::no_grad(|| {
            let _ = x * 5.0;
            panic!("boom");
        })
    });
    assert_eq!(msg, "boom");
    assert_eq!(gc.tape_len(), 1);
    let _d = x * 6.0;
    assert_eq!(gc.tape_len(), 2);
    // An op panicking inside no_grad (a panicking twin) restores it as well.
    let b = m.create(&[true], [1]);
    let _ = expect_panic(|| {
        ndscope::no_grad(|| {
            let _ = b.erf();
        })
    });
    let _e = x.gelu();
    assert_eq!(gc.tape_len(), 3);
    // backward inside no_grad leaves recording off until no_grad returns.
    ndscope::no_grad(|| {
        gc.backward((x * 2.0).sum()).unwrap_err();
        let _ = x * 2.0;
    });
    assert_eq!(gc.tape_len(), 0, "backward consumed the tape");
    let _f = x * 2.0;
    assert_eq!(gc.tape_len(), 1);
    drop(gc);
    // Without a collector no_grad changes nothing and ops stay unrecorded after.
    ndscope::no_grad(|| x * 2.0);
    let gc = GradientCollector::new();
    assert_eq!(gc.tape_len(), 0);
    let _g = x * 2.0;
    assert_eq!(gc.tape_len(), 1);
    drop(gc);
    m.close();
}

#[test]
fn no_grad_and_collectors_started_or_dropped_inside() {
    let m = NDManager::new();
    let x = m.create(&[1.0f64], [1]).set_requires_gradient(true);
    // A collector created inside records only after no_grad returns.
    let gc = ndscope::no_grad(|| {
        let gc = GradientCollector::new();
        let _ = x * 2.0;
        assert_eq!(gc.tape_len(), 0);
        gc
    });
    let _a = x * 2.0;
    assert_eq!(gc.tape_len(), 1);
    // A collector dropped inside: recording stays off after.
    ndscope::no_grad(move || drop(gc));
    let gc2 = GradientCollector::new();
    let _b = x * 2.0;
    assert_eq!(gc2.tape_len(), 1);
    drop(gc2);
    m.close();
}

#[test]
fn no_grad_allows_updates_but_not_of_arrays_the_tape_reads() {
    let m = NDManager::new();
    let w = m.create(&[1.0f64, 2.0], [2]).set_requires_gradient(true);
    let gc = GradientCollector::new();
    let loss = (w * w).sum();
    // The tape reads w: an update now would corrupt the gradient, inside no_grad too.
    let err = ndscope::no_grad(|| w.try_subi(0.5)).unwrap_err();
    assert!(matches!(err, NdError::InvalidArgument { .. }), "{err}");
    assert_eq!(w.to_vec::<f64>().unwrap(), vec![1.0, 2.0]);
    gc.backward(loss).unwrap();
    // After backward the tape is empty: the optimizer step works inside no_grad.
    ndscope::no_grad(|| {
        let mut w = w;
        w -= w.gradient() * 0.25;
    });
    assert_eq!(w.to_vec::<f64>().unwrap(), vec![0.5, 1.0]);
    drop(gc);
    m.close();
}

#[test]
fn new_ops_register_in_scopes_and_leak_nothing() {
    let m = NDManager::new();
    let x = m.create(&X34, [3, 4]);
    let b = x.gt(0.0);
    let before = counts(&m);
    {
        let _s = ndscope::NDScope::new();
        let _ = (
            x.erf(),
            x.gelu(),
            x.var_axes(&[0], false),
            x.logsumexp(),
            x.cumsum(1),
            x.norm(),
            x.round(),
            b.logical_not(),
            x.any_axes(&[1], true),
            x.stop_gradient(),
        );
        assert!(counts(&m).0 > before.0);
    }
    assert_eq!(counts(&m), before);
    // Gradients computed inside a scope free their temporaries too.
    let w = m.create(&X34, [3, 4]).set_requires_gradient(true);
    let before = counts(&m);
    {
        let _s = ndscope::NDScope::new();
        let gc = GradientCollector::new();
        let loss = w.gelu().logsumexp_axes(&[1], false).sum()
            + w.std_axes(&[0], true).sum()
            + w.cumsum(0).norm()
            + w.softplus().var();
        gc.backward(loss).unwrap();
    }
    assert_eq!(counts(&m), before);
    m.close();
}
