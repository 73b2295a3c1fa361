//! softmax, log_softmax, one_hot, clip and where_.

use ndscope::{DType, NDManager, NdError};

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
}

#[test]
fn softmax_rows_sum_to_one() {
    let m = NDManager::new();
    let x = m.create(&[1.0f64, 2.0, 3.0, 1.0, 1.0, 1.0], [2, 3]);
    let s = x.softmax(-1);
    assert_eq!(s.shape().dims(), &[2, 3]);
    let v = s.to_vec::<f64>().unwrap();
    let e = [1f64.exp(), 2f64.exp(), 3f64.exp()];
    let z: f64 = e.iter().sum();
    let want = [
        e[0] / z,
        e[1] / z,
        e[2] / z,
        1.0 / 3.0,
        1.0 / 3.0,
        1.0 / 3.0,
    ];
    assert!(close(&v, &want, 1e-12), "{v:?}");
    for row in v.chunks(3) {
        assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }
    // Along axis 0: columns sum to one.
    let c = x.softmax(0).to_vec::<f64>().unwrap();
    for j in 0..3 {
        assert!((c[j] + c[3 + j] - 1.0).abs() < 1e-12);
    }
    let e0 = 1.0 / (1.0 + (-1.0f64).exp()); // column 1: [2, 1]
    assert!((c[1] - e0).abs() < 1e-12);
    m.close();
}

#[test]
fn softmax_middle_axis_and_large_f32() {
    let m = NDManager::new();
    let data: Vec<f32> = (0..24).map(|i| (i % 5) as f32).collect();
    let x = m.create(&data, [2, 3, 4]);
    let v = x.softmax(1).to_vec::<f32>().unwrap();
    for i in 0..2 {
        for k in 0..4 {
            let s: f32 = (0..3).map(|j| v[i * 12 + j * 4 + k]).sum();
            assert!((s - 1.0).abs() < 1e-6);
        }
    }
    // Large rows: the multi-threaded path, and big values stay finite.
    let n = 1 << 19;
    let big: Vec<f32> = (0..n).map(|i| 1000.0 + (i % 8) as f32).collect();
    let y = m
        .create(&big, [n / 8, 8])
        .softmax(-1)
        .to_vec::<f32>()
        .unwrap();
    assert!(y.iter().all(|p| p.is_finite()));
    let first: f32 = y[..8].iter().sum();
    assert!((first - 1.0).abs() < 1e-5);
    m.close();
}

#[test]
fn log_softmax_of_large_values_is_finite() {
    let m = NDManager::new();
    let x = m.create(&[1000.0f32, 1001.0, 1002.0, -1000.0, 0.0, 1000.0], [2, 3]);
    let l = x.log_softmax(1).to_vec::<f32>().unwrap();
    assert!(l.iter().all(|v| v.is_finite()), "{l:?}");
    let lse = (1.0f64 + 1f64.exp() + 2f64.exp()).ln();
    let want = [-lse, 1.0 - lse, 2.0 - lse];
    for (g, w) in l[..3].iter().zip(want) {
        assert!((*g as f64 - w).abs() < 1e-5);
    }
    assert!((l[5]).abs() < 1e-6); // exp(-1000) and exp(-2000) vanish next to 1
    assert!((l[3] + 2000.0).abs() < 1e-2);
    // log_softmax equals the log of softmax where both are representable.
    let y = m.create(&[0.5f64, -1.0, 2.0], [3]);
    let a = y.log_softmax(0).to_vec::<f64>().unwrap();
    let b: Vec<f64> = y
        .softmax(0)
        .to_vec::<f64>()
        .unwrap()
        .iter()
        .map(|p| p.ln())
        .collect();
    assert!(close(&a, &b, 1e-12));
    m.close();
}

#[test]
fn softmax_errors() {
    let m = NDManager::new();
    let i = m.create(&[1i32, 2], [2]);
    assert!(matches!(
        i.try_softmax(0),
        Err(NdError::UnsupportedDType { op: "softmax", .. })
    ));
    let f = m.zeros([2, 2], DType::F32);
    assert!(matches!(
        f.try_log_softmax(2),
        Err(NdError::AxisOutOfRange {
            op: "log_softmax",
            axis: 2,
            ..
        })
    ));
    m.close();
}

#[test]
fn one_hot_encodes_indices() {
    let m = NDManager::new();
    let y = m.create(&[0i32, 2, 1, 2], [2, 2]);
    let o = y.one_hot(3, DType::F32);
    assert_eq!(o.dtype(), DType::F32);
    assert_eq!(o.shape().dims(), &[2, 2, 3]);
    assert_eq!(
        o.to_vec::<f32>().unwrap(),
        vec![1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    );
    let u = m.create(&[1u8], [1]).one_hot(2, DType::F32);
    assert_eq!(u.to_vec::<f32>().unwrap(), vec![0.0, 1.0]);
    let bad = m.create(&[0i64, 3], [2]);
    assert!(matches!(
        bad.try_one_hot(3, DType::F32),
        Err(NdError::Index { op: "one_hot", .. })
    ));
    let neg = m.create(&[-1i64], [1]);
    assert!(matches!(
        neg.try_one_hot(3, DType::F32),
        Err(NdError::Index { .. })
    ));
    let f = m.zeros([2], DType::F32);
    assert!(matches!(
        f.try_one_hot(3, DType::F32),
        Err(NdError::UnsupportedDType { .. })
    ));
    m.close();
}

#[test]
fn clip_limits_values() {
    let m = NDManager::new();
    let x = m.create(&[-2.0f32, -0.5, 0.0, 0.7, 3.0, f32::NAN], [6]);
    let c = x.clip(-1.0, 1.0).to_vec::<f32>().unwrap();
    assert_eq!(&c[..5], &[-1.0, -0.5, 0.0, 0.7, 1.0]);
    assert!(c[5].is_nan());
    let i = m.create(&[-5i32, 0, 5, 10], [4]);
    let ci = i.clip(0.0, 6.0);
    assert_eq!(ci.dtype(), DType::I32);
    assert_eq!(ci.to_vec::<i32>().unwrap(), vec![0, 0, 5, 6]);
    // Integer bounds round inward.
    assert_eq!(i.clip(-0.5, 5.5).to_vec::<i32>().unwrap(), vec![0, 0, 5, 5]);
    let u = m.create(&[0u8, 100, 255], [3]);
    assert_eq!(
        u.clip(-10.0, 1000.0).to_vec::<u8>().unwrap(),
        vec![0, 100, 255]
    );
    assert!(matches!(
        x.try_clip(1.0, -1.0),
        Err(NdError::InvalidArgument { op: "clip", .. })
    ));
    assert!(matches!(
        x.try_clip(f64::NAN, 1.0),
        Err(NdError::InvalidArgument { .. })
    ));
    let b = m.create(&[true], [1]);
    assert!(matches!(
        b.try_clip(0.0, 1.0),
        Err(NdError::UnsupportedDType { .. })
    ));
    m.close();
}

#[test]
fn where_selects_with_broadcasting() {
    let m = NDManager::new();
    let cond = m.create(&[true, false, true], [3]);
    let x = m.create(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
    let y = m.create(&[-1.0f64, -2.0], [2, 1]);
    let w = cond.where_(x, y);
    assert_eq!(w.shape().dims(), &[2, 3]);
    assert_eq!(
        w.to_vec::<f64>().unwrap(),
        vec![1.0, -1.0, 3.0, 4.0, -2.0, 6.0]
    );
    // A scalar on either side or both (a masked gradient's zero): each arm of the
    // kernel's row cases, rows of 3 after the condition's broadcast.
    let c = m.create(&[true, false, false, true, true, false], [2, 3]);
    let s = m.create(&[9.0f64], []);
    let t = m.create(&[-9.0f64], []);
    assert_eq!(
        c.where_(x, s).to_vec::<f64>().unwrap(),
        vec![1.0, 9.0, 9.0, 4.0, 5.0, 9.0]
    );
    assert_eq!(
        c.where_(s, x).to_vec::<f64>().unwrap(),
        vec![9.0, 2.0, 3.0, 9.0, 9.0, 6.0]
    );
    assert_eq!(
        c.where_(s, t).to_vec::<f64>().unwrap(),
        vec![9.0, -9.0, -9.0, 9.0, 9.0, -9.0]
    );
    // Same shapes (the contiguous fast path), from a comparison.
    let a = m.create(&[3i32, -1, 4, -1, 5], [5]);
    let zero = m.zeros([5], DType::I32);
    let relu = a.gt(0).where_(a, zero);
    assert_eq!(relu.to_vec::<i32>().unwrap(), vec![3, 0, 4, 0, 5]);
    // Errors.
    assert!(matches!(
        a.try_where_(a, a),
        Err(NdError::UnsupportedDType { op: "where", .. })
    ));
    assert!(matches!(
        cond.try_where_(x, zero),
        Err(NdError::DTypeMismatch { .. })
    ));
    let c4 = m.create(&[true, false, true, false], [4]);
    assert!(matches!(
        c4.try_where_(x, x),
        Err(NdError::ShapeMismatch { .. })
    ));
    m.close();
}

#[test]
fn ops_allocate_only_their_result() {
    let m = NDManager::new();
    let x = m.random_normal(0.0, 1.0, [64, 10], DType::F32);
    let before = m.memory().live_arrays;
    let _ = x.softmax(-1);
    let _ = x.log_softmax(0);
    let _ = x.clip(-0.5, 0.5);
    let _ = x.gt(0.0).where_(x, x);
    let _ = m.create(&[1i64, 2], [2]).one_hot(4, DType::F32);
    // One array per op call (the comparison and `create` included), no temporaries.
    assert_eq!(m.memory().live_arrays, before + 7);
    m.close();
    assert_eq!(m.memory().live_arrays, 0);
}
