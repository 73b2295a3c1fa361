//! Reductions against hand-computed values and a naive reference (proptest).

use ndscope::{DType, NDArray, NDManager, NdError};
use proptest::prelude::*;

fn arange_234(m: &NDManager) -> NDArray {
    let data: Vec<f32> = (0..24).map(|i| i as f32).collect();
    m.create(&data, [2, 3, 4])
}

#[test]
fn sum_over_axes_of_arange() {
    let m = NDManager::new();
    let a = arange_234(&m);
    assert_eq!(a.sum().shape().dims(), &[] as &[usize]);
    assert_eq!(a.sum().to_scalar::<f32>().unwrap(), 276.0);
    let s0 = a.sum_axes(&[0], false);
    assert_eq!(s0.shape().dims(), &[3, 4]);
    assert_eq!(
        s0.to_vec::<f32>().unwrap(),
        (0..12).map(|i| (2 * i + 12) as f32).collect::<Vec<_>>()
    );
    let s1 = a.sum_axes(&[1], false);
    assert_eq!(
        s1.to_vec::<f32>().unwrap(),
        vec![12.0, 15.0, 18.0, 21.0, 48.0, 51.0, 54.0, 57.0]
    );
    let s2 = a.sum_axes(&[-1], true);
    assert_eq!(s2.shape().dims(), &[2, 3, 1]);
    assert_eq!(
        s2.to_vec::<f32>().unwrap(),
        vec![6.0, 22.0, 38.0, 54.0, 70.0, 86.0]
    );
    let s02 = a.sum_axes(&[2, 0], false);
    assert_eq!(s02.shape().dims(), &[3]);
    assert_eq!(s02.to_vec::<f32>().unwrap(), vec![60.0, 92.0, 124.0]);
    let s02k = a.sum_axes(&[0, -1], true);
    assert_eq!(s02k.shape().dims(), &[1, 3, 1]);
    let all = a.sum_axes(&[0, 1, 2], false);
    assert_eq!(all.to_scalar::<f32>().unwrap(), 276.0);
    // No axes: nothing is reduced.
    assert_eq!(a.sum_axes(&[], false).shape().dims(), &[2, 3, 4]);
    m.close();
}

#[test]
fn other_reductions_keep_dtype() {
    let m = NDManager::new();
    let a = m.create(&[3i32, -1, 4, 1, -5, 9], [2, 3]);
    let s = a.sum();
    assert_eq!(s.dtype(), DType::I32);
    assert_eq!(s.to_scalar::<i32>().unwrap(), 11);
    assert_eq!(a.max().to_scalar::<i32>().unwrap(), 9);
    assert_eq!(a.min().to_scalar::<i32>().unwrap(), -5);
    assert_eq!(a.prod().to_scalar::<i32>().unwrap(), 540);
    assert_eq!(a.max_axes(&[1], false).to_vec::<i32>().unwrap(), vec![4, 9]);
    assert_eq!(
        a.min_axes(&[0], false).to_vec::<i32>().unwrap(),
        vec![1, -5, 4]
    );
    assert_eq!(
        a.prod_axes(&[1], true).to_vec::<i32>().unwrap(),
        vec![-12, -45]
    );
    let b = m.create(&[1.5f64, 2.5], [2]);
    assert_eq!(b.prod().to_scalar::<f64>().unwrap(), 3.75);
    let bools = m.create(&[false, true, false], [3]);
    assert!(bools.max().to_scalar::<bool>().unwrap());
    assert!(!bools.min().to_scalar::<bool>().unwrap());
    m.close();
}

#[test]
fn mean_of_ints_is_f64_and_of_floats_keeps_dtype() {
    let m = NDManager::new();
    let a = m.create(&[1i64, 2, 3, 4], [2, 2]);
    let mu = a.mean();
    assert_eq!(mu.dtype(), DType::F64);
    assert_eq!(mu.to_scalar::<f64>().unwrap(), 2.5);
    assert_eq!(
        a.mean_axes(&[0], false).to_vec::<f64>().unwrap(),
        vec![2.0, 3.0]
    );
    let i = m.create(&[1i32, 2], [2]);
    assert_eq!(i.mean().to_scalar::<f64>().unwrap(), 1.5);
    let f = m.create(&[1.0f32, 2.0, 4.0], [3]);
    assert_eq!(f.mean().dtype(), DType::F32);
    assert!((f.mean().to_scalar::<f32>().unwrap() - 7.0 / 3.0).abs() < 1e-6);
    m.close();
}

#[test]
fn empty_reductions() {
    let m = NDManager::new();
    let e = m.zeros([0, 3], DType::F32);
    assert_eq!(e.sum().to_scalar::<f32>().unwrap(), 0.0);
    assert_eq!(e.prod().to_scalar::<f32>().unwrap(), 1.0);
    assert!(e.mean().to_scalar::<f32>().unwrap().is_nan());
    assert_eq!(
        e.sum_axes(&[0], false).to_vec::<f32>().unwrap(),
        vec![0.0; 3]
    );
    let err = e.try_max().unwrap_err();
    assert!(
        matches!(err, NdError::InvalidArgument { op: "max", .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("zero-size array to reduction operation max")
    );
    assert!(matches!(
        e.try_min_axes(&[0], false),
        Err(NdError::InvalidArgument { op: "min", .. })
    ));
    // Reducing a non-empty axis of an empty array is fine: the result is empty.
    assert_eq!(e.max_axes(&[1], false).shape().dims(), &[0]);
    assert!(matches!(
        e.try_argmax(),
        Err(NdError::InvalidArgument { .. })
    ));
    m.close();
}

#[test]
fn nan_propagates_in_max_and_min() {
    let m = NDManager::new();
    let data: Vec<f64> = (0..20)
        .map(|i| if i == 13 { f64::NAN } else { i as f64 })
        .collect();
    let a = m.create(&data, [20]);
    assert!(a.max().to_scalar::<f64>().unwrap().is_nan());
    assert!(a.min().to_scalar::<f64>().unwrap().is_nan());
    let b = m.create(&data, [4, 5]);
    let r = b.max_axes(&[1], false).to_vec::<f64>().unwrap();
    assert_eq!(r[0], 4.0);
    assert!(r[2].is_nan());
    assert_eq!(b.argmax().to_scalar::<i64>().unwrap(), 13);
    m.close();
}

#[test]
fn argmax_and_argmin() {
    let m = NDManager::new();
    let a = m.create(&[1.0f32, 7.0, 7.0, 0.0, 0.0, 3.0], [2, 3]);
    let am = a.argmax();
    assert_eq!(am.dtype(), DType::I64);
    assert_eq!(am.shape().dims(), &[] as &[usize]);
    assert_eq!(am.to_scalar::<i64>().unwrap(), 1); // ties: first
    assert_eq!(a.argmin().to_scalar::<i64>().unwrap(), 3);
    assert_eq!(a.argmax_axis(1, false).to_vec::<i64>().unwrap(), vec![1, 2]);
    assert_eq!(
        a.argmin_axis(-1, false).to_vec::<i64>().unwrap(),
        vec![0, 0]
    );
    assert_eq!(
        a.argmax_axis(0, false).to_vec::<i64>().unwrap(),
        vec![0, 0, 0]
    );
    let k = a.argmin_axis(0, true);
    assert_eq!(k.shape().dims(), &[1, 3]);
    assert_eq!(k.to_vec::<i64>().unwrap(), vec![1, 1, 1]);
    let i = m.create(&[5i32, 5, 5], [3]);
    assert_eq!(i.argmax().to_scalar::<i64>().unwrap(), 0);
    assert_eq!(i.argmin().to_scalar::<i64>().unwrap(), 0);
    m.close();
}

#[test]
fn errors_are_typed() {
    let m = NDManager::new();
    let a = m.zeros([2, 3], DType::F32);
    assert!(matches!(
        a.try_sum_axes(&[2], false),
        Err(NdError::AxisOutOfRange {
            op: "sum",
            axis: 2,
            ..
        })
    ));
    assert!(matches!(
        a.try_max_axes(&[-3], false),
        Err(NdError::AxisOutOfRange { axis: -3, .. })
    ));
    assert!(matches!(
        a.try_sum_axes(&[1, -1], false),
        Err(NdError::InvalidArgument { op: "sum", .. })
    ));
    assert!(matches!(
        a.try_argmax_axis(5, false),
        Err(NdError::AxisOutOfRange { .. })
    ));
    let b = m.create(&[true, false], [2]);
    for r in [b.try_sum(), b.try_mean(), b.try_prod()] {
        assert!(matches!(
            r,
            Err(NdError::UnsupportedDType {
                dtype: DType::Bool,
                ..
            })
        ));
    }
    let c = m.zeros([2], DType::F32);
    c.close();
    assert!(matches!(c.try_sum(), Err(NdError::Closed(_))));
    m.close();
}

#[test]
fn large_sum_is_accurate_and_counted() {
    let m = NDManager::new();
    let n = 1 << 20;
    let a = m.ones([n], DType::F32);
    let before = m.memory();
    let s = a.sum();
    // Pairwise summation: exact for 2^20 ones (a naive f32 running sum is too).
    assert_eq!(s.to_scalar::<f32>().unwrap(), n as f32);
    let after = m.memory();
    assert_eq!(after.live_arrays, before.live_arrays + 1);
    assert_eq!(after.live_bytes, before.live_bytes + 4);
    // 0.1 summed 2^20 times: pairwise stays close to the f64 value.
    let t = m.full([n], 0.1, DType::F32);
    let got = t.sum().to_scalar::<f32>().unwrap() as f64;
    let exact = (0.1f32 as f64) * n as f64;
    assert!((got - exact).abs() / exact < 1e-5, "{got} vs {exact}");
    m.close();
    assert_eq!(m.memory().live_arrays, 0);
}

// ------------------------------------------------------------- proptest reference

/// Naive reduction of row-major `data` of `dims` over `axes` with `f`.
fn naive<T: Copy>(
    data: &[T],
    dims: &[usize],
    axes: &[usize],
    init: T,
    f: impl Fn(T, T) -> T,
) -> Vec<T> {
    let out_dims: Vec<usize> = (0..dims.len())
        .map(|d| if axes.contains(&d) { 1 } else { dims[d] })
        .collect();
    let n_out: usize = out_dims.iter().product();
    let mut out = vec![init; n_out];
    let mut idx = vec![0usize; dims.len()];
    for &v in data {
        let mut o = 0;
        for d in 0..dims.len() {
            o = o * out_dims[d] + if axes.contains(&d) { 0 } else { idx[d] };
        }
        out[o] = f(out[o], v);
        for d in (0..dims.len()).rev() {
            idx[d] += 1;
            if idx[d] < dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

fn case() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, Vec<i32>)> {
    prop::collection::vec(1usize..5, 0..4).prop_flat_map(|dims| {
        let n: usize = dims.iter().product();
        let nd = dims.len();
        (
            Just(dims),
            prop::sample::subsequence((0..nd).collect::<Vec<_>>(), 0..=nd),
            prop::collection::vec(-1000i32..1000, n),
        )
    })
}

fn check<T>(
    m: &NDManager,
    dims: &[usize],
    axes: &[usize],
    vals: &[i32],
    conv: fn(i32) -> T,
    to_f: fn(T) -> f64,
    tol: f64,
) where
    T: ndscope::Element + Copy + PartialOrd + std::ops::Add<Output = T> + std::fmt::Debug,
{
    let data: Vec<T> = vals.iter().map(|&v| conv(v)).collect();
    let a = m.create(&data, dims);
    let ax: Vec<isize> = axes.iter().map(|&d| d as isize).collect();
    let got_sum: Vec<T> = a.sum_axes(&ax, false).to_vec().unwrap();
    let want_sum = naive(&data, dims, axes, conv(0), |x, y| x + y);
    assert_eq!(got_sum.len(), want_sum.len());
    for (g, w) in got_sum.iter().zip(&want_sum) {
        let (g, w) = (to_f(*g), to_f(*w));
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "sum {g} vs {w}");
    }
    let got_max: Vec<T> = a.max_axes(&ax, true).to_vec().unwrap();
    let want_max = naive(
        &data,
        dims,
        axes,
        conv(i32::MIN),
        |x, y| if y > x { y } else { x },
    );
    assert_eq!(got_max, want_max);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn sum_and_max_match_naive((dims, axes, vals) in case()) {
        let m = NDManager::new();
        check::<f32>(&m, &dims, &axes, &vals, |v| v as f32, |x| x as f64, 1e-5);
        check::<f64>(&m, &dims, &axes, &vals, |v| v as f64, |x| x, 1e-12);
        check::<i32>(&m, &dims, &axes, &vals, |v| v, |x| x as f64, 0.0);
        check::<i64>(&m, &dims, &axes, &vals, |v| v as i64, |x| x as f64, 0.0);
        m.close();
    }
}
