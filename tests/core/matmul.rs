//! matmul / dot against hand-computed values and a naive reference.

use ndscope::{DType, NDManager, NdError};

fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f64;
            for p in 0..k {
                acc += a[i * k + p] as f64 * b[p * n + j] as f64;
            }
            out[i * n + j] = acc as f32;
        }
    }
    out
}

#[test]
fn two_by_two_and_rectangular() {
    let m = NDManager::new();
    let a = m.create(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let b = m.create(&[5.0f32, 6.0, 7.0, 8.0], [2, 2]);
    assert_eq!(
        a.matmul(b).to_vec::<f32>().unwrap(),
        vec![19.0, 22.0, 43.0, 50.0]
    );
    let c = m.create(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
    let d = m.create(&[7.0f64, 8.0, 9.0, 10.0, 11.0, 12.0], [3, 2]);
    let p = c.matmul(d);
    assert_eq!(p.shape().dims(), &[2, 2]);
    assert_eq!(p.to_vec::<f64>().unwrap(), vec![58.0, 64.0, 139.0, 154.0]);
    let q = d.dot(c);
    assert_eq!(q.shape().dims(), &[3, 3]);
    assert_eq!(
        q.to_vec::<f64>().unwrap(),
        vec![39.0, 54.0, 69.0, 49.0, 68.0, 87.0, 59.0, 82.0, 105.0]
    );
    m.close();
}

#[test]
fn integer_matmul() {
    let m = NDManager::new();
    let a = m.create(&[1i64, 2, 3, 4, 5, 6], [2, 3]);
    let b = m.create(&[1i64, 0, 2, 1, 0, 3], [3, 2]);
    let p = a.matmul(b);
    assert_eq!(p.dtype(), DType::I64);
    assert_eq!(p.to_vec::<i64>().unwrap(), vec![5, 11, 14, 23]);
    let u = m.create(&[1u8, 2, 3, 4], [2, 2]);
    assert_eq!(u.matmul(u).to_vec::<u8>().unwrap(), vec![7, 10, 15, 22]);
    m.close();
}

#[test]
fn one_dimensional_cases() {
    let m = NDManager::new();
    let v = m.create(&[1.0f32, 2.0, 3.0], [3]);
    let w = m.create(&[4.0f32, 5.0, 6.0], [3]);
    let s = v.matmul(w);
    assert_eq!(s.shape().dims(), &[] as &[usize]);
    assert_eq!(s.to_scalar::<f32>().unwrap(), 32.0);
    assert_eq!(v.dot(w).to_scalar::<f32>().unwrap(), 32.0);
    let a = m.create(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
    // 2-D x 1-D: [2]
    let av = a.matmul(v);
    assert_eq!(av.shape().dims(), &[2]);
    assert_eq!(av.to_vec::<f32>().unwrap(), vec![14.0, 32.0]);
    // 1-D x 2-D: [3]
    let u = m.create(&[1.0f32, -1.0], [2]);
    let ua = u.matmul(a);
    assert_eq!(ua.shape().dims(), &[3]);
    assert_eq!(ua.to_vec::<f32>().unwrap(), vec![-3.0, -3.0, -3.0]);
    // 1-D x 3-D: batched, the vector is a row in every batch.
    let b3 = m.create(&(0..12).map(|i| i as f32).collect::<Vec<_>>(), [2, 2, 3]);
    let ub = u.matmul(b3);
    assert_eq!(ub.shape().dims(), &[2, 3]);
    assert_eq!(
        ub.to_vec::<f32>().unwrap(),
        vec![-3.0, -3.0, -3.0, -3.0, -3.0, -3.0]
    );
    // 3-D x 1-D
    let bv = b3.matmul(v);
    assert_eq!(bv.shape().dims(), &[2, 2]);
    assert_eq!(bv.to_vec::<f32>().unwrap(), vec![8.0, 26.0, 44.0, 62.0]);
    // dot with a 0-d operand multiplies.
    let two = m.scalar(2.0f32);
    assert_eq!(v.dot(two).to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
    m.close();
}

#[test]
fn batched_with_broadcasting() {
    let m = NDManager::new();
    // a: [2, 1, 2, 2], b: [3, 2, 2] -> [2, 3, 2, 2]
    let a_data: Vec<f32> = vec![1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.0]; // I, 2I
    let b_data: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let a = m.create(&a_data, [2, 1, 2, 2]);
    let b = m.create(&b_data, [3, 2, 2]);
    let p = a.matmul(b);
    assert_eq!(p.shape().dims(), &[2, 3, 2, 2]);
    let got = p.to_vec::<f32>().unwrap();
    let mut want = b_data.clone();
    want.extend(b_data.iter().map(|x| 2.0 * x));
    assert_eq!(got, want);
    // A 2-D right side broadcasts against every batch.
    let r = m.create(&[0.0f32, 1.0, 1.0, 0.0], [2, 2]); // swaps columns
    let q = b.matmul(r).to_vec::<f32>().unwrap();
    let swapped: Vec<f32> = b_data.chunks(2).flat_map(|c| [c[1], c[0]]).collect();
    assert_eq!(q, swapped);
    // Many small batches (takes the multi-threaded batch path).
    let nb = 600;
    let x: Vec<f32> = (0..nb * 16 * 16)
        .map(|i| ((i * 7) % 13) as f32 - 6.0)
        .collect();
    let y: Vec<f32> = (0..16 * 16).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
    let xa = m.create(&x, [nb, 16, 16]);
    let ya = m.create(&y, [16, 16]);
    let z = xa.matmul(ya).to_vec::<f32>().unwrap();
    for bi in [0, 1, 299, 599] {
        let want = naive(&x[bi * 256..(bi + 1) * 256], &y, 16, 16, 16);
        assert_eq!(&z[bi * 256..(bi + 1) * 256], &want[..]);
    }
    m.close();
}

#[test]
fn large_f32_matches_naive() {
    let m = NDManager::new();
    let n = 256;
    let a: Vec<f32> = (0..n * n)
        .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let b: Vec<f32> = (0..n * n)
        .map(|i| ((i * 53) % 97) as f32 / 48.0 - 1.0)
        .collect();
    let (x, y) = (m.create(&a, [n, n]), m.create(&b, [n, n]));
    let before = m.memory();
    let got = x.matmul(y).to_vec::<f32>().unwrap();
    assert_eq!(m.memory().live_arrays, before.live_arrays + 1);
    assert_eq!(m.memory().live_bytes, before.live_bytes + n * n * 4);
    let want = naive(&a, &b, n, n, n);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-3 * (1.0 + w.abs()), "{g} vs {w}");
    }
    m.close();
}

#[test]
fn empty_inner_dimension_gives_zeros() {
    let m = NDManager::new();
    let a = m.zeros([2, 0], DType::F32);
    let b = m.zeros([0, 3], DType::F32);
    let p = a.matmul(b);
    assert_eq!(p.shape().dims(), &[2, 3]);
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![0.0; 6]);
    assert_eq!(
        b.matmul(m.zeros([3, 4], DType::F32)).shape().dims(),
        &[0, 4]
    );
    m.close();
}

#[test]
fn errors_are_typed() {
    let m = NDManager::new();
    let a = m.zeros([2, 3], DType::F32);
    let b = m.zeros([2, 3], DType::F32);
    match a.try_matmul(b) {
        Err(NdError::ShapeMismatch { op, lhs, rhs }) => {
            assert_eq!(op, "matmul");
            assert_eq!(lhs.uid, a.uid());
            assert_eq!(rhs.shape.dims(), &[2, 3]);
        }
        other => panic!("{other:?}"),
    }
    let c = m.zeros([3, 2], DType::F64);
    assert!(matches!(
        a.try_matmul(c),
        Err(NdError::DTypeMismatch { .. })
    ));
    let t = m.create(&[true, false, true, false], [2, 2]);
    assert!(matches!(
        t.try_matmul(t),
        Err(NdError::UnsupportedDType { .. })
    ));
    // Batch dims that do not broadcast.
    let x = m.zeros([2, 2, 2], DType::F32);
    let y = m.zeros([3, 2, 2], DType::F32);
    assert!(matches!(
        x.try_matmul(y),
        Err(NdError::ShapeMismatch { .. })
    ));
    let v = m.zeros([4], DType::F32);
    assert!(matches!(
        a.try_dot(v),
        Err(NdError::ShapeMismatch { op: "dot", .. })
    ));
    let s = m.scalar(1.0f32);
    assert!(matches!(
        s.try_matmul(a),
        Err(NdError::InvalidArgument { .. })
    ));
    let msg = std::panic::catch_unwind(|| a.matmul(b)).unwrap_err();
    let msg = msg.downcast_ref::<String>().unwrap();
    assert!(msg.contains("matmul"), "{msg}");
    m.close();
}
