//! Shape ops: values against hand-computed results, view/copy behaviour, errors.

use crate::common::{f32s, iota};
use ndscope::{DType, NDArray, NDManager, NdError};

fn i32s(a: NDArray) -> Vec<i32> {
    a.to_vec::<i32>().unwrap()
}

/// Rule 6 (docs/ownership.md): reshaping a contiguous array makes a view (no new buffer).
#[test]
fn reshape_contiguous_is_a_view() {
    let m = NDManager::new();
    let a = iota(&m, &[2, 3]);
    let before = m.memory();
    let b = a.reshape([3, 2]);
    assert_eq!(b.shape().dims(), &[3, 2]);
    assert_eq!(f32s(b), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let after = m.memory();
    assert_eq!(after.live_buffers, before.live_buffers);
    assert_eq!(after.live_bytes, before.live_bytes);
    assert_eq!(after.live_arrays, before.live_arrays + 1);
    assert_eq!(a.reshape([6]).shape().dims(), &[6]);
    assert_eq!(a.reshape([1, 6, 1]).shape().dims(), &[1, 6, 1]);
    assert_eq!(a.flatten().shape().dims(), &[6]);
    m.close();
}

/// Rule 6 (docs/ownership.md): reshaping a non-contiguous array copies.
#[test]
fn reshape_non_contiguous_copies() {
    let m = NDManager::new();
    let a = iota(&m, &[2, 3]);
    let t = a.transpose();
    let buffers = m.memory().live_buffers;
    let r = t.reshape([6]);
    assert_eq!(f32s(r), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    assert_eq!(m.memory().live_buffers, buffers + 1);
    // A copy: writing the base does not change it.
    a.set("0, 0", 100.0);
    assert_eq!(f32s(r)[0], 0.0);
    assert_eq!(f32s(t.flatten())[0], 100.0);
    m.close();
}

#[test]
fn reshape_infer_and_errors() {
    let m = NDManager::new();
    let a = iota(&m, &[2, 6]);
    assert_eq!(a.reshape_infer(&[-1, 4]).shape().dims(), &[3, 4]);
    assert_eq!(a.reshape_infer(&[2, -1, 3]).shape().dims(), &[2, 2, 3]);
    assert!(matches!(
        a.try_reshape([5]),
        Err(NdError::InvalidShape { op: "reshape", .. })
    ));
    assert!(matches!(
        a.try_reshape_infer(&[-1, 5]),
        Err(NdError::InvalidShape { .. })
    ));
    assert!(matches!(
        a.try_reshape_infer(&[-1, -1]),
        Err(NdError::InvalidShape { .. })
    ));
    assert!(matches!(
        a.try_reshape_infer(&[-2, 6]),
        Err(NdError::InvalidShape { .. })
    ));
    assert!(matches!(
        a.try_reshape([usize::MAX, 2]),
        Err(NdError::InvalidShape { .. })
    ));
    m.close();
}

#[test]
fn transpose_and_permute() {
    let m = NDManager::new();
    let a = iota(&m, &[2, 3]);
    let t = a.transpose();
    assert_eq!(t.shape().dims(), &[3, 2]);
    assert_eq!(f32s(t), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    assert_eq!(f32s(t.transpose()), f32s(a));

    let b = iota(&m, &[2, 3, 4]);
    let p = b.permute(&[2, 0, 1]);
    assert_eq!(p.shape().dims(), &[4, 2, 3]);
    // p[k, i, j] = b[i, j, k] = 12i + 4j + k
    let v = f32s(p);
    for k in 0..4 {
        for i in 0..2 {
            for j in 0..3 {
                assert_eq!(v[k * 6 + i * 3 + j], (12 * i + 4 * j + k) as f32);
            }
        }
    }
    assert_eq!(
        b.transpose().shape().dims(),
        b.permute(&[2, 1, 0]).shape().dims()
    );
    assert_eq!(m.memory().live_buffers, 2); // arange buffers only
    assert!(matches!(
        b.try_permute(&[0, 1]),
        Err(NdError::InvalidArgument { op: "permute", .. })
    ));
    assert!(matches!(
        b.try_permute(&[0, 1, 1]),
        Err(NdError::InvalidArgument { op: "permute", .. })
    ));
    assert!(matches!(
        b.try_permute(&[0, 1, 3]),
        Err(NdError::AxisOutOfRange { axis: 3, .. })
    ));
    // 0-d and 1-d transposes are the identity.
    let s = m.scalar(5i32);
    assert_eq!(s.transpose().shape().ndim(), 0);
    assert_eq!(i32s(s.transpose()), vec![5]);
    m.close();
}

#[test]
fn expand_dims_and_squeeze() {
    let m = NDManager::new();
    let a = iota(&m, &[2, 3]);
    assert_eq!(a.expand_dims(0).shape().dims(), &[1, 2, 3]);
    assert_eq!(a.expand_dims(1).shape().dims(), &[2, 1, 3]);
    assert_eq!(a.expand_dims(2).shape().dims(), &[2, 3, 1]);
    assert_eq!(a.expand_dims(-1).shape().dims(), &[2, 3, 1]);
    assert_eq!(a.expand_dims(-3).shape().dims(), &[1, 2, 3]);
    assert_eq!(f32s(a.expand_dims(1)), f32s(a));
    assert!(matches!(
        a.try_expand_dims(3),
        Err(NdError::AxisOutOfRange { axis: 3, .. })
    ));
    assert!(matches!(
        a.try_expand_dims(-4),
        Err(NdError::AxisOutOfRange { axis: -4, .. })
    ));

    let b = iota(&m, &[1, 3, 1]);
    assert_eq!(b.squeeze().shape().dims(), &[3]);
    assert_eq!(b.squeeze_axis(0).shape().dims(), &[3, 1]);
    assert_eq!(b.squeeze_axis(-1).shape().dims(), &[1, 3]);
    assert_eq!(f32s(b.squeeze()), vec![0.0, 1.0, 2.0]);
    assert!(matches!(
        b.try_squeeze_axis(1),
        Err(NdError::InvalidShape { .. })
    ));
    assert!(matches!(
        b.try_squeeze_axis(3),
        Err(NdError::AxisOutOfRange { .. })
    ));
    assert_eq!(m.scalar(1.0f32).reshape([1, 1]).squeeze().shape().ndim(), 0);
    // Views: still one buffer per base.
    assert_eq!(m.memory().live_buffers, 3);
    // An expanded transposed view still reads right.
    let t = a.transpose().expand_dims(1);
    assert_eq!(t.shape().dims(), &[3, 1, 2]);
    assert_eq!(f32s(t), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    m.close();
}

#[test]
fn broadcast_to_copies() {
    let m = NDManager::new();
    let a = m.create(&[1, 2, 3], [3]);
    let b = a.broadcast_to([2, 3]);
    assert_eq!(b.shape().dims(), &[2, 3]);
    assert_eq!(i32s(b), vec![1, 2, 3, 1, 2, 3]);
    let c = m.create(&[1, 2], [2, 1]).broadcast_to([2, 3]);
    assert_eq!(i32s(c), vec![1, 1, 1, 2, 2, 2]);
    // In-place writes into the result touch one element only.
    b.set("0, 0", 9);
    assert_eq!(i32s(b), vec![9, 2, 3, 1, 2, 3]);
    assert_eq!(i32s(a), vec![1, 2, 3]);
    // Of a transposed view.
    let t = m.create(&[1, 2, 3, 4], [2, 2]).transpose();
    assert_eq!(
        i32s(t.broadcast_to([2, 2, 2])),
        vec![1, 3, 2, 4, 1, 3, 2, 4]
    );
    assert!(matches!(
        a.try_broadcast_to([2, 4]),
        Err(NdError::InvalidShape {
            op: "broadcast_to",
            ..
        })
    ));
    assert!(matches!(
        a.try_broadcast_to(()),
        Err(NdError::InvalidShape { .. })
    ));
    m.close();
}

#[test]
fn concat_values() {
    let m = NDManager::new();
    let a = m.create(&[1, 2, 3, 4], [2, 2]);
    let b = m.create(&[5, 6], [1, 2]);
    let c = NDArray::concat(&[a, b], 0);
    assert_eq!(c.shape().dims(), &[3, 2]);
    assert_eq!(i32s(c), vec![1, 2, 3, 4, 5, 6]);
    let d = m.create(&[7, 8, 9, 10], [2, 2]);
    let e = NDArray::concat(&[a, d, a], -1);
    assert_eq!(e.shape().dims(), &[2, 6]);
    assert_eq!(i32s(e), vec![1, 2, 7, 8, 1, 2, 3, 4, 9, 10, 3, 4]);
    // Non-contiguous inputs.
    let f = NDArray::concat(&[a.transpose(), d.get("::-1")], 1);
    assert_eq!(i32s(f), vec![1, 3, 9, 10, 2, 4, 7, 8]);
    // One input is a copy.
    let g = NDArray::concat(&[a], 0);
    assert_eq!(i32s(g), vec![1, 2, 3, 4]);
    assert_ne!(g, a);
    // Empty pieces.
    let z = m.zeros([0, 2], DType::I32);
    assert_eq!(i32s(NDArray::concat(&[z, a, z], 0)), vec![1, 2, 3, 4]);
    m.close();
}

#[test]
fn concat_errors() {
    let m = NDManager::new();
    let a = m.create(&[1, 2, 3, 4], [2, 2]);
    assert!(matches!(
        NDArray::try_concat(&[], 0),
        Err(NdError::InvalidArgument { op: "concat", .. })
    ));
    let f = m.create(&[1.0f32, 2.0], [1, 2]);
    assert!(matches!(
        NDArray::try_concat(&[a, f], 0),
        Err(NdError::DTypeMismatch { op: "concat", .. })
    ));
    let b = m.create(&[1, 2, 3], [1, 3]);
    assert!(matches!(
        NDArray::try_concat(&[a, b], 0),
        Err(NdError::InvalidShape { op: "concat", .. })
    ));
    let c = m.create(&[1, 2], [2]);
    assert!(matches!(
        NDArray::try_concat(&[a, c], 0),
        Err(NdError::InvalidShape { op: "concat", .. })
    ));
    assert!(matches!(
        NDArray::try_concat(&[a, a], 2),
        Err(NdError::AxisOutOfRange { axis: 2, .. })
    ));
    let s = m.scalar(1i32);
    assert!(matches!(
        NDArray::try_concat(&[s, s], 0),
        Err(NdError::InvalidShape { .. })
    ));
    m.close();
}

#[test]
fn stack_values_and_errors() {
    let m = NDManager::new();
    let a = m.create(&[1, 2, 3], [3]);
    let b = m.create(&[4, 5, 6], [3]);
    let s0 = NDArray::stack(&[a, b], 0);
    assert_eq!(s0.shape().dims(), &[2, 3]);
    assert_eq!(i32s(s0), vec![1, 2, 3, 4, 5, 6]);
    let s1 = NDArray::stack(&[a, b], 1);
    assert_eq!(s1.shape().dims(), &[3, 2]);
    assert_eq!(i32s(s1), vec![1, 4, 2, 5, 3, 6]);
    assert_eq!(i32s(NDArray::stack(&[a, b], -1)), i32s(s1));
    let m2 = m.create(&[1, 2, 3, 4], [2, 2]);
    let s = NDArray::stack(&[m2, m2.transpose(), m2], 1);
    assert_eq!(s.shape().dims(), &[2, 3, 2]);
    assert_eq!(i32s(s), vec![1, 2, 1, 3, 1, 2, 3, 4, 2, 4, 3, 4]);
    let sc = NDArray::stack(&[m.scalar(1i32), m.scalar(2i32)], 0);
    assert_eq!((sc.shape().dims(), i32s(sc)), (&[2usize][..], vec![1, 2]));

    assert!(matches!(
        NDArray::try_stack(&[], 0),
        Err(NdError::InvalidArgument { op: "stack", .. })
    ));
    assert!(matches!(
        NDArray::try_stack(&[a, m2], 0),
        Err(NdError::InvalidShape { op: "stack", .. })
    ));
    assert!(matches!(
        NDArray::try_stack(&[a, a.to_dtype(DType::F64)], 0),
        Err(NdError::DTypeMismatch { op: "stack", .. })
    ));
    assert!(matches!(
        NDArray::try_stack(&[a, b], 2),
        Err(NdError::AxisOutOfRange { axis: 2, .. })
    ));
    assert!(matches!(
        NDArray::try_stack(&[a, b], -3),
        Err(NdError::AxisOutOfRange { axis: -3, .. })
    ));
    m.close();
}

/// Rule 1 (docs/ownership.md): results, views included, belong to the first input's
/// manager.
#[test]
fn results_belong_to_the_first_inputs_manager() {
    let m1 = NDManager::new();
    let m2 = NDManager::new();
    let a = m1.create(&[1, 2], [2]);
    let b = m2.create(&[3, 4], [2]);
    assert_eq!(NDArray::concat(&[a, b], 0).manager(), m1);
    assert_eq!(NDArray::stack(&[b, a], 0).manager(), m2);
    assert_eq!(a.reshape([1, 2]).manager(), m1);
    m1.close();
    assert_eq!(m1.memory().live_arrays, 0);
    assert_eq!(m2.memory().live_arrays, 2);
    m2.close();
}

#[test]
fn to_dtype_converts() {
    let m = NDManager::new();
    let a = m.create(&[1.7f32, -2.5, 0.0, 3.0], [2, 2]);
    let i = a.to_dtype(DType::I32);
    assert_eq!(i.dtype(), DType::I32);
    assert_eq!(i.shape().dims(), &[2, 2]);
    assert_eq!(i32s(i), vec![1, -2, 0, 3]);
    assert_eq!(
        a.to_dtype(DType::Bool).to_vec::<bool>().unwrap(),
        vec![true, true, false, true]
    );
    assert_eq!(
        a.to_dtype(DType::F64).to_vec::<f64>().unwrap(),
        vec![1.7f32 as f64, -2.5, 0.0, 3.0]
    );
    let big = m.create(&[i64::MAX - 1, -3], [2]);
    assert_eq!(
        big.to_dtype(DType::I64).to_vec::<i64>().unwrap(),
        vec![i64::MAX - 1, -3]
    );
    // Of a view, and the same dtype still copies.
    let t = a.transpose().to_dtype(DType::F32);
    assert_eq!(f32s(t), vec![1.7, 0.0, -2.5, 3.0]);
    let buffers = m.memory().live_buffers;
    let _ = a.to_dtype(DType::F32);
    assert_eq!(m.memory().live_buffers, buffers + 1);
    let b = m.create(&[true, false], [2]).to_dtype(DType::U8);
    assert_eq!(b.to_vec::<u8>().unwrap(), vec![1, 0]);
    m.close();
}

#[test]
fn panicking_form_panics_with_the_error_text() {
    let m = NDManager::new();
    let a = m.create(&[1, 2, 3], [3]);
    let err = std::panic::catch_unwind(|| a.reshape([2])).unwrap_err();
    let msg = err.downcast_ref::<String>().unwrap();
    assert!(msg.contains("reshape"), "{msg}");
    assert!(msg.contains("[3]"), "{msg}");
    m.close();
}
