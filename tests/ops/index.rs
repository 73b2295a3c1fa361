//! Tests of the index operations (`index_select`, `gather`, `scatter_add`, `take`,
//! `boolean_mask`, `masked_fill`), the shape operations of issue 11 (`split`, `repeat`,
//! `tile`, `pad`, `swap_axes`, `flip`, `tril`, `triu`, `*_like`) and the random ones
//! (`random_permutation`, `random_bernoulli`, `dropout`).
//!
//! Expected values were computed with numpy 2.4 (`np.take`, `np.take_along_axis`-style
//! loops for PyTorch's `gather`/`scatter_add`, `x[mask]`, `np.where`, `np.split`,
//! `np.repeat`, `np.tile`, `np.pad`, `np.swapaxes`, `np.flip`, `np.tril`, `np.triu`) on
//! `x = np.arange(12).reshape(3, 4)` and `y = np.arange(24).reshape(2, 3, 4)`, and
//! pasted.

#[allow(unused_imports)]
use crate::common::*;
use crate::fails;
use ndscope::{DType, GradientCollector, NDArray, NDManager, NDScope, NdError, random};
use std::sync::Mutex;

const VALUE_DTYPES: [DType; 6] = [
    DType::F32,
    DType::F64,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::Bool,
];
const INDEX_DTYPES: [DType; 3] = [DType::I32, DType::I64, DType::U8];

/// Serialises this module's tests that seed and draw from the process-wide generator.
static RNG: Mutex<()> = Mutex::new(());

fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

/// The elements as f64 (any dtype).
fn f64s(a: NDArray) -> Vec<f64> {
    a.to_dtype(DType::F64).to_vec::<f64>().unwrap()
}

/// `np.arange(12).reshape(3, 4)` as I64.
fn grid(m: &NDManager) -> NDArray {
    m.arange(0.0, 12.0, 1.0, DType::I64).reshape([3, 4])
}

fn y24(m: &NDManager) -> NDArray {
    m.arange(0.0, 24.0, 1.0, DType::I64).reshape([2, 3, 4])
}

fn idx(m: &NDManager, v: &[i64], shape: &[usize], dtype: DType) -> NDArray {
    m.create(v, shape.to_vec()).to_dtype(dtype)
}

/// Expected integer values as f64 the way `dtype` holds them (Bool: `v != 0`).
fn as_dtype(expected: &[i64], dtype: DType) -> Vec<f64> {
    expected
        .iter()
        .map(|&v| {
            if dtype == DType::Bool {
                (v != 0) as i64 as f64
            } else {
                v as f64
            }
        })
        .collect()
}

/// Run `op` on `x` converted to every value dtype and compare with `expected`.
fn every_dtype(x: NDArray, expected: &[i64], op: impl Fn(NDArray) -> NDArray) {
    for dt in VALUE_DTYPES {
        let r = op(x.to_dtype(dt));
        assert_eq!(r.dtype(), dt);
        assert_eq!(f64s(r), as_dtype(expected, dt), "dtype {dt}");
    }
}

/// `f` fails with the same message as its panicking twin `g`.
fn same_panic<T: std::fmt::Debug>(
    f: impl FnOnce() -> Result<T, NdError>,
    g: impl FnOnce(),
) -> String {
    let err = f().unwrap_err().to_string();
    assert_eq!(expect_panic(g), err);
    err
}

// ------------------------------------------------------------------ index_select

#[test]
fn index_select_values_every_dtype() {
    let m = NDManager::new();
    let x = grid(&m);
    for it in INDEX_DTYPES {
        let i = idx(&m, &[2, 0, 2], &[3], it);
        every_dtype(x, &[8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11], |a| {
            a.index_select(0, i)
        });
        let j = idx(&m, &[3, 1], &[2], it);
        every_dtype(x, &[3, 1, 7, 5, 11, 9], |a| a.index_select(-1, j));
        assert_eq!(x.index_select(1, j).shape().dims(), &[3, 2]);
    }
    m.close();
}

#[test]
fn index_select_nd_and_0d_indices() {
    let m = NDManager::new();
    let x = grid(&m);
    let i = idx(&m, &[0, 1, 2, 0], &[2, 2], DType::I64);
    let r = x.index_select(0, i);
    assert_eq!(r.shape().dims(), &[2, 2, 4]);
    assert_eq!(
        f64s(r),
        as_dtype(
            &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3],
            DType::I64
        )
    );
    // A 0-d index removes the axis (numpy's take).
    let r = x.index_select(1, m.create(&[1i32], ()));
    assert_eq!(r.shape().dims(), &[3]);
    assert_eq!(r.to_vec::<i64>().unwrap(), vec![1, 5, 9]);
    m.close();
}

#[test]
fn index_select_non_contiguous() {
    let m = NDManager::new();
    let x = grid(&m);
    let i = idx(&m, &[2, 0], &[2], DType::I32);
    // x.T is [4, 3]
    every_dtype(x.transpose(), &[8, 0, 9, 1, 10, 2, 11, 3], |a| {
        a.index_select(1, i)
    });
    // x[::-1, 1:]
    every_dtype(x.get("::-1, 1:"), &[11, 9, 7, 5, 3, 1], |a| {
        a.index_select(1, i)
    });
    // non-contiguous index array: [[0, 2], [1, 0]].T = [[0, 1], [2, 0]]
    let it = idx(&m, &[0, 2, 1, 0], &[2, 2], DType::I64).transpose();
    assert_eq!(
        x.index_select(0, it)
            .get(":, :, 0")
            .to_vec::<i64>()
            .unwrap(),
        vec![0, 4, 8, 0]
    );
    m.close();
}

#[test]
fn index_select_zero_size() {
    let m = NDManager::new();
    let empty = m.create::<i64>(&[], [0]);
    let x = grid(&m);
    assert_eq!(x.index_select(0, empty).shape().dims(), &[0, 4]);
    assert_eq!(x.index_select(-1, empty).shape().dims(), &[3, 0]);
    let z = m.zeros([0, 3], DType::F32);
    let r = z.index_select(1, idx(&m, &[2, 0], &[2], DType::I64));
    assert_eq!(r.shape().dims(), &[0, 2]);
    // A zero-size view with a non-zero offset.
    let v = m.zeros([2, 0], DType::F64).get("1");
    assert_eq!(v.index_select(0, empty).shape().dims(), &[0]);
    // Any index into an empty axis is out of range.
    let zero = idx(&m, &[0], &[1], DType::I64);
    fails!(m, v.try_index_select(0, zero), NdError::Index { .. });
    m.close();
}

#[test]
fn index_select_errors() {
    let m = NDManager::new();
    let x = grid(&m).to_dtype(DType::F32);
    let big = idx(&m, &[0, 3], &[2], DType::I64);
    let neg = idx(&m, &[0, 1, -1], &[3], DType::I32);
    let float = m.create(&[0.0f32], [1]);
    let boolean = m.create(&[true], [1]);
    fails!(m, x.try_index_select(0, big), NdError::Index { .. });
    fails!(m, x.try_index_select(0, neg), NdError::Index { .. });
    fails!(
        m,
        x.try_index_select(0, float),
        NdError::UnsupportedDType { .. }
    );
    fails!(
        m,
        x.try_index_select(0, boolean),
        NdError::UnsupportedDType { .. }
    );
    fails!(
        m,
        x.try_index_select(2, big),
        NdError::AxisOutOfRange { .. }
    );
    fails!(
        m,
        x.try_index_select(-3, big),
        NdError::AxisOutOfRange { .. }
    );
    let msg = same_panic(
        || x.try_index_select(0, big),
        || {
            x.index_select(0, big);
        },
    );
    assert!(
        msg.contains(
            "index 3 (position 1 of the index array) is out of bounds for axis 0 with size 3"
        ),
        "{msg}"
    );
    let msg = same_panic(
        || x.try_index_select(0, neg),
        || {
            x.index_select(0, neg);
        },
    );
    assert!(
        msg.contains("index -1 (position 2") && msg.contains("negative"),
        "{msg}"
    );
    let closed = idx(&m, &[0], &[1], DType::I64);
    closed.close();
    fails!(m, x.try_index_select(0, closed), NdError::Closed(_));
    m.close();
}

#[test]
fn index_select_gradient() {
    let m = NDManager::new();
    let i = idx(&m, &[2, 0, 2, 1], &[2, 2], DType::I64);
    gradcheck(&[&[3, 4]], -1.0, 1.0, |xs| xs[0].index_select(0, i));
    gradcheck(&[&[3, 4]], -1.0, 1.0, |xs| xs[0].index_select(-1, i));
    // Through a transposed view.
    gradcheck(&[&[4, 3]], -1.0, 1.0, |xs| {
        xs[0].transpose().index_select(1, i.to_dtype(DType::I32))
    });
    m.close();
}

// ------------------------------------------------------------------ gather

#[test]
fn gather_values_every_dtype() {
    let m = NDManager::new();
    let x = grid(&m);
    for it in INDEX_DTYPES {
        let i = idx(&m, &[3, 0, 1, 1, 2, 2], &[3, 2], it);
        every_dtype(x, &[3, 0, 5, 5, 10, 10], |a| a.gather(1, i));
        every_dtype(x, &[3, 0, 5, 5, 10, 10], |a| a.gather(-1, i));
        // An index smaller than x off the axis (PyTorch semantics).
        let j = idx(&m, &[2, 1, 0, 0], &[1, 4], it);
        every_dtype(x, &[8, 5, 2, 3], |a| a.gather(0, j));
    }
    m.close();
}

#[test]
fn gather_non_contiguous_and_zero_size() {
    let m = NDManager::new();
    let x = grid(&m);
    let i = idx(&m, &[3, 2, 1, 0, 0, 0], &[2, 3], DType::I32);
    every_dtype(x.transpose(), &[3, 6, 9, 0, 4, 8], |a| a.gather(0, i));
    let empty = m.create::<i64>(&[], [3, 0]);
    assert_eq!(x.gather(1, empty).shape().dims(), &[3, 0]);
    let z = m.zeros([2, 0], DType::F32).get("1:");
    assert_eq!(
        z.gather(0, m.create::<i64>(&[], [1, 0])).shape().dims(),
        &[1, 0]
    );
    m.close();
}

#[test]
fn gather_errors() {
    let m = NDManager::new();
    let x = grid(&m).to_dtype(DType::F64);
    let big = idx(&m, &[0, 4], &[1, 2], DType::I64);
    let neg = idx(&m, &[-2], &[1, 1], DType::I64);
    let flat = idx(&m, &[0, 1], &[2], DType::I64);
    let wide = idx(&m, &[0; 5], &[1, 5], DType::I64);
    fails!(m, x.try_gather(1, big), NdError::Index { .. });
    fails!(m, x.try_gather(0, neg), NdError::Index { .. });
    fails!(m, x.try_gather(0, flat), NdError::InvalidShape { .. });
    fails!(m, x.try_gather(0, wide), NdError::InvalidShape { .. });
    fails!(m, x.try_gather(2, big), NdError::AxisOutOfRange { .. });
    let float = big.to_dtype(DType::F32);
    fails!(m, x.try_gather(0, float), NdError::UnsupportedDType { .. });
    let msg = same_panic(
        || x.try_gather(1, big),
        || {
            x.gather(1, big);
        },
    );
    assert!(msg.contains("index 4") && msg.contains("size 4"), "{msg}");
    // Along the gathered axis the index may be longer than x (rows repeat).
    let long = idx(&m, &[0, 2, 1, 2, 0], &[5, 1], DType::I64);
    assert_eq!(x.gather(0, long).shape().dims(), &[5, 1]);
    m.close();
}

#[test]
fn gather_gradient() {
    let m = NDManager::new();
    // Repeated indices, an index smaller than x, a sliced index array.
    let i = idx(&m, &[3, 0, 1, 1, 2, 2, 0, 0], &[4, 2], DType::I64);
    gradcheck(&[&[3, 4]], -1.0, 1.0, |xs| xs[0].gather(1, i.get(":3, :1")));
    gradcheck(&[&[4, 4]], -1.0, 1.0, |xs| xs[0].gather(1, i));
    // Through a transposed input, with a transposed index: [[2, 1], [0, 2]].T.
    let j = idx(&m, &[2, 1, 0, 2], &[2, 2], DType::I32).transpose();
    gradcheck(&[&[4, 3]], -1.0, 1.0, |xs| xs[0].transpose().gather(0, j));
    m.close();
}

// ------------------------------------------------------------------ scatter_add

#[test]
fn scatter_add_values() {
    let m = NDManager::new();
    let x = grid(&m);
    let src = (m.arange(1.0, 13.0, 1.0, DType::I64) * 10).reshape([3, 4]);
    for it in INDEX_DTYPES {
        let i = idx(&m, &[2, 0, 1, 2, 2, 2, 0, 0], &[2, 4], it);
        let expected = [0, 21, 72, 83, 4, 5, 36, 7, 68, 69, 10, 51];
        for dt in [DType::F32, DType::F64, DType::I32, DType::I64, DType::U8] {
            let r = x.to_dtype(dt).scatter_add(0, i, src.to_dtype(dt));
            assert_eq!((r.dtype(), f64s(r)), (dt, as_dtype(&expected, dt)));
        }
        let j = idx(&m, &[0, 0, 3, 3, 1, 2], &[3, 2], it);
        let r = x.scatter_add(-1, j, src);
        assert_eq!(
            r.to_vec::<i64>().unwrap(),
            vec![30, 1, 2, 3, 4, 5, 6, 117, 8, 99, 110, 11]
        );
    }
    // x unchanged (out of place).
    assert_eq!(x.to_vec::<i64>().unwrap(), (0..12).collect::<Vec<_>>());
    m.close();
}

#[test]
fn scatter_add_non_contiguous_and_zero_size() {
    let m = NDManager::new();
    let x = grid(&m).to_dtype(DType::F64);
    // Into the transpose [4, 3], from a reversed source.
    let src = m
        .arange(0.0, 6.0, 1.0, DType::F64)
        .reshape([2, 3])
        .get("::-1");
    let i = idx(&m, &[3, 0, 0, 1, 1, 3], &[2, 3], DType::I32);
    let r = x.transpose().scatter_add(0, i, src);
    // x.T = [[0,4,8],[1,5,9],[2,6,10],[3,7,11]]; src = [[3,4,5],[0,1,2]]
    assert_eq!(
        r.to_vec::<f64>().unwrap(),
        vec![
            0.0, 8.0, 13.0, 1.0, 6.0, 9.0, 2.0, 6.0, 10.0, 6.0, 7.0, 13.0
        ]
    );
    let empty = m.create::<i64>(&[], [0, 4]);
    let r = x.scatter_add(0, empty, x);
    assert_eq!(r.to_vec::<f64>().unwrap(), f64s(x));
    let z = m.zeros([0, 2], DType::F32);
    assert_eq!(
        z.scatter_add(1, m.create::<i64>(&[], [0, 1]), z)
            .shape()
            .dims(),
        &[0, 2]
    );
    m.close();
}

#[test]
fn scatter_add_errors() {
    let m = NDManager::new();
    let x = m.zeros([3, 4], DType::F32);
    let src = m.ones([3, 4], DType::F32);
    let ok = idx(&m, &[0, 1], &[1, 2], DType::I64);
    let big = idx(&m, &[0, 3], &[1, 2], DType::I64);
    fails!(m, x.try_scatter_add(0, big, src), NdError::Index { .. });
    let neg = idx(&m, &[-1], &[1, 1], DType::I64);
    let (src64, xb, srcb) = (
        src.to_dtype(DType::F64),
        x.to_dtype(DType::Bool),
        src.to_dtype(DType::Bool),
    );
    let (ok_f, small, flat) = (
        ok.to_dtype(DType::F64),
        m.ones([1, 1], DType::F32),
        ok.reshape([2]),
    );
    let (tall, tall_src) = (
        idx(&m, &[0; 4], &[4, 1], DType::I64),
        m.ones([4, 1], DType::F32),
    );
    fails!(m, x.try_scatter_add(0, neg, src), NdError::Index { .. });
    fails!(
        m,
        x.try_scatter_add(0, ok, src64),
        NdError::DTypeMismatch { .. }
    );
    fails!(
        m,
        xb.try_scatter_add(0, ok, srcb),
        NdError::UnsupportedDType { .. }
    );
    fails!(
        m,
        x.try_scatter_add(0, ok_f, src),
        NdError::UnsupportedDType { .. }
    );
    fails!(
        m,
        x.try_scatter_add(0, ok, small),
        NdError::InvalidShape { .. }
    );
    fails!(
        m,
        x.try_scatter_add(0, flat, src),
        NdError::InvalidShape { .. }
    );
    fails!(
        m,
        x.try_scatter_add(1, tall, tall_src),
        NdError::InvalidShape { .. }
    );
    fails!(
        m,
        x.try_scatter_add(-3, ok, src),
        NdError::AxisOutOfRange { .. }
    );
    same_panic(
        || x.try_scatter_add(0, big, src),
        || {
            x.scatter_add(0, big, src);
        },
    );
    m.close();
}

#[test]
fn scatter_add_gradient() {
    let m = NDManager::new();
    // The index is smaller than src: src's other elements get no gradient.
    let i = idx(&m, &[2, 0, 1, 2, 2, 2, 0, 0], &[2, 4], DType::I64);
    gradcheck(&[&[3, 4], &[3, 5]], -1.0, 1.0, |xs| {
        xs[0].scatter_add(0, i, xs[1])
    });
    let j = idx(&m, &[0, 0, 3, 3, 1, 2], &[3, 2], DType::I32);
    gradcheck(&[&[3, 4], &[3, 2]], -1.0, 1.0, |xs| {
        xs[0].scatter_add(-1, j, xs[1])
    });
    // Only src tracked; x a constant.
    let x = m.ones([3, 4], DType::F64);
    gradcheck(&[&[3, 2]], -1.0, 1.0, |xs| x.scatter_add(1, j, xs[0]));
    m.close();
}

// ------------------------------------------------------------------ take

#[test]
fn take_values() {
    let m = NDManager::new();
    let x = grid(&m);
    for it in INDEX_DTYPES {
        let i = idx(&m, &[11, 0, 5, 5], &[2, 2], it);
        every_dtype(x, &[11, 0, 5, 5], |a| {
            let r = a.take(i);
            assert_eq!(r.shape().dims(), &[2, 2]);
            r
        });
        let j = idx(&m, &[1, 4, 11], &[3], it);
        every_dtype(x.transpose(), &[4, 5, 11], |a| a.take(j));
    }
    // Reversed view; 0-d input; empty indices.
    let r = m.arange(0.0, 5.0, 1.0, DType::I32).get("::-1");
    assert_eq!(
        r.take(idx(&m, &[0, 4], &[2], DType::I64))
            .to_vec::<i32>()
            .unwrap(),
        vec![4, 0]
    );
    let s = m.scalar(7.5f32);
    assert_eq!(
        s.take(idx(&m, &[0, 0], &[2], DType::I64))
            .to_vec::<f32>()
            .unwrap(),
        vec![7.5, 7.5]
    );
    assert_eq!(x.take(m.create::<i32>(&[], [0, 3])).shape().dims(), &[0, 3]);
    m.close();
}

#[test]
fn take_errors_and_gradient() {
    let m = NDManager::new();
    let x = grid(&m);
    let big = idx(&m, &[12], &[1], DType::I64);
    fails!(m, x.try_take(big), NdError::Index { .. });
    let (neg, float) = (idx(&m, &[-12], &[1], DType::I64), m.create(&[1.0f64], [1]));
    let (empty, zero) = (m.zeros([0], DType::F32), idx(&m, &[0], &[1], DType::I64));
    fails!(m, x.try_take(neg), NdError::Index { .. });
    fails!(m, x.try_take(float), NdError::UnsupportedDType { .. });
    fails!(m, empty.try_take(zero), NdError::Index { .. });
    let msg = same_panic(
        || x.try_take(big),
        || {
            x.take(big);
        },
    );
    assert!(msg.contains("index 12") && msg.contains("size 12"), "{msg}");
    let i = idx(&m, &[11, 0, 5, 5, 3, 3], &[3, 2], DType::I64);
    gradcheck(&[&[3, 4]], -1.0, 1.0, |xs| xs[0].take(i));
    gradcheck(&[&[4, 3]], -1.0, 1.0, |xs| xs[0].transpose().take(i));
    m.close();
}

// ------------------------------------------------------------------ boolean_mask

#[test]
fn boolean_mask_values() {
    let m = NDManager::new();
    let x = grid(&m);
    let every_third: Vec<bool> = (0..12).map(|v| v % 3 == 0).collect();
    let mask = m.create(&every_third, [3, 4]);
    every_dtype(x, &[0, 3, 6, 9], |a| a.boolean_mask(mask));
    // A leading-prefix mask selects rows.
    let rows = m.create(&[true, false, true], [3]);
    every_dtype(x, &[0, 1, 2, 3, 8, 9, 10, 11], |a| {
        let r = a.boolean_mask(rows);
        assert_eq!(r.shape().dims(), &[2, 4]);
        r
    });
    // Non-contiguous input and mask: x.T[x.T % 2 == 1].
    let xt = x.transpose();
    let odd = m
        .create(
            &[
                false, true, false, true, false, true, false, true, false, true, false, true,
            ],
            [3, 4],
        )
        .transpose();
    assert_eq!(
        xt.boolean_mask(odd).to_vec::<i64>().unwrap(),
        vec![1, 5, 9, 3, 7, 11]
    );
    // Nothing selected; zero-size input.
    let none = m.zeros([3, 4], DType::Bool);
    assert_eq!(x.boolean_mask(none).shape().dims(), &[0]);
    let z = m.zeros([0, 2], DType::F32);
    assert_eq!(
        z.boolean_mask(m.zeros([0], DType::Bool)).shape().dims(),
        &[0, 2]
    );
    m.close();
}

#[test]
fn boolean_mask_errors_and_gradient() {
    let m = NDManager::new();
    let x = grid(&m).to_dtype(DType::F64);
    let bytes = m.ones([3, 4], DType::U8);
    let (short, long, scalar) = (
        m.ones([4], DType::Bool),
        m.ones([3, 4, 1], DType::Bool),
        m.ones([], DType::Bool),
    );
    fails!(
        m,
        x.try_boolean_mask(bytes),
        NdError::UnsupportedDType { .. }
    );
    fails!(m, x.try_boolean_mask(short), NdError::InvalidShape { .. });
    fails!(m, x.try_boolean_mask(long), NdError::InvalidShape { .. });
    fails!(m, x.try_boolean_mask(scalar), NdError::InvalidShape { .. });
    let bad = m.ones([4, 3], DType::Bool);
    same_panic(
        || x.try_boolean_mask(bad),
        || {
            x.boolean_mask(bad);
        },
    );
    let mask = m.create(
        &[
            true, false, true, true, false, false, true, false, true, true, true, false,
        ],
        [3, 4],
    );
    gradcheck(&[&[3, 4]], -1.0, 1.0, |xs| xs[0].boolean_mask(mask));
    let rows = m.create(&[false, true, true], [3]);
    gradcheck(&[&[3, 2, 2]], -1.0, 1.0, |xs| xs[0].boolean_mask(rows));
    gradcheck(&[&[4, 3]], -1.0, 1.0, |xs| {
        xs[0].transpose().boolean_mask(mask)
    });
    m.close();
}

// ------------------------------------------------------------------ masked_fill

#[test]
fn masked_fill_values() {
    let m = NDManager::new();
    let x = grid(&m);
    let cols = m.create(&[true, false, false, true], [4]);
    for dt in [DType::F32, DType::F64, DType::I32, DType::I64] {
        let r = x.to_dtype(dt).masked_fill(cols, -1.0);
        assert_eq!(
            (r.dtype(), f64s(r)),
            (
                dt,
                as_dtype(&[-1, 1, 2, -1, -1, 5, 6, -1, -1, 9, 10, -1], dt)
            )
        );
    }
    let rows = m.create(&[true, false, true], [3, 1]);
    every_dtype(x, &[7, 7, 7, 7, 4, 5, 6, 7, 7, 7, 7, 7], |a| {
        a.masked_fill(rows, 7.0)
    });
    // Bool: value != 0; U8 and I32 truncate like to_dtype.
    let b = x.to_dtype(DType::Bool).masked_fill(cols, 0.0);
    assert_eq!(
        b.to_vec::<bool>().unwrap(),
        vec![
            false, true, true, false, false, true, true, false, false, true, true, false
        ]
    );
    assert_eq!(
        x.to_dtype(DType::I32)
            .masked_fill(cols, 2.9)
            .get("0")
            .to_vec::<i32>()
            .unwrap(),
        vec![2, 1, 2, 2]
    );
    // Non-contiguous input and mask; NaN into floats.
    let mt = m.create(
        &[
            true, false, false, false, false, false, false, false, false, false, false, true,
        ],
        [4, 3],
    );
    let r = x.to_dtype(DType::F64).transpose().masked_fill(mt, f64::NAN);
    let v = r.to_vec::<f64>().unwrap();
    assert!(v[0].is_nan() && v[11].is_nan());
    assert_eq!(
        &v[1..11],
        &[4.0, 8.0, 1.0, 5.0, 9.0, 2.0, 6.0, 10.0, 3.0, 7.0]
    );
    let z = m
        .zeros([0, 3], DType::F32)
        .masked_fill(m.ones([3], DType::Bool), 1.0);
    assert_eq!(z.shape().dims(), &[0, 3]);
    m.close();
}

#[test]
fn masked_fill_errors_and_gradient() {
    let m = NDManager::new();
    let x = grid(&m).to_dtype(DType::F32);
    let (floats, three, big) = (
        m.ones([4], DType::F32),
        m.ones([3], DType::Bool),
        m.ones([2, 3, 4], DType::Bool),
    );
    let (xi, four) = (grid(&m), m.ones([4], DType::Bool));
    fails!(
        m,
        x.try_masked_fill(floats, 0.0),
        NdError::UnsupportedDType { .. }
    );
    fails!(
        m,
        x.try_masked_fill(three, 0.0),
        NdError::ShapeMismatch { .. }
    );
    // The mask may not enlarge x.
    fails!(
        m,
        x.try_masked_fill(big, 0.0),
        NdError::ShapeMismatch { .. }
    );
    fails!(
        m,
        xi.try_masked_fill(four, f64::NAN),
        NdError::InvalidArgument { .. }
    );
    let bad = m.ones([3], DType::Bool);
    same_panic(
        || x.try_masked_fill(bad, 0.0),
        || {
            x.masked_fill(bad, 0.0);
        },
    );
    let mask = m.create(&[true, false, false, true], [4]);
    gradcheck(&[&[3, 4]], -1.0, 1.0, |xs| xs[0].masked_fill(mask, 3.0));
    gradcheck(&[&[4, 3]], -1.0, 1.0, |xs| {
        xs[0].transpose().masked_fill(mask, 0.0)
    });
    m.close();
}

// ------------------------------------------------------------------ split

#[test]
fn split_values_and_views() {
    let m = NDManager::new();
    let x = grid(&m);
    for dt in VALUE_DTYPES {
        let parts = x.to_dtype(dt).split(2, -1);
        assert_eq!(parts.len(), 2);
        assert_eq!(f64s(parts[0]), as_dtype(&[0, 1, 4, 5, 8, 9], dt));
        assert_eq!(f64s(parts[1]), as_dtype(&[2, 3, 6, 7, 10, 11], dt));
    }
    let parts = x.transpose().split(2, 0);
    assert_eq!(parts[0].to_vec::<i64>().unwrap(), vec![0, 4, 8, 1, 5, 9]);
    assert_eq!(parts[1].to_vec::<i64>().unwrap(), vec![2, 6, 10, 3, 7, 11]);
    // Views: no new buffer.
    let before = m.memory().live_buffers;
    let rows = x.split(3, 0);
    assert_eq!(m.memory().live_buffers, before);
    assert_eq!(rows[2].to_vec::<i64>().unwrap(), vec![8, 9, 10, 11]);
    // One section: the whole array; reversed views; empty axes.
    assert_eq!(x.split(1, 1)[0].shape().dims(), &[3, 4]);
    let rev = x.get("::-1").split(3, 0);
    assert_eq!(rev[0].to_vec::<i64>().unwrap(), vec![8, 9, 10, 11]);
    let z = m.zeros([2, 0], DType::F32);
    let zp = z.split(2, 1);
    assert_eq!((zp.len(), zp[0].shape().dims()), (2, &[2usize, 0][..]));
    assert_eq!(z.split(2, 0)[1].shape().dims(), &[1, 0]);
    m.close();
}

#[test]
fn split_errors_and_gradient() {
    let m = NDManager::new();
    let x = grid(&m);
    fails!(m, x.try_split(3, 1), NdError::InvalidArgument { .. });
    fails!(m, x.try_split(0, 1), NdError::InvalidArgument { .. });
    fails!(m, x.try_split(2, 2), NdError::AxisOutOfRange { .. });
    let s = m.scalar(1.0f32);
    fails!(m, s.try_split(1, 0), NdError::AxisOutOfRange { .. });
    let msg = same_panic(
        || x.try_split(3, 1),
        || {
            x.split(3, 1);
        },
    );
    assert!(
        msg.contains("size 4") && msg.contains("3 equal sections"),
        "{msg}"
    );
    gradcheck(&[&[3, 4]], -1.0, 1.0, |xs| {
        let p = xs[0].split(2, -1);
        p[0] * 2.0 + p[1].square()
    });
    gradcheck(&[&[4, 3]], -1.0, 1.0, |xs| {
        let p = xs[0].transpose().split(3, 0);
        p[0] - p[2] * p[1]
    });
    m.close();
}

// ------------------------------------------------------------------ repeat, tile, pad

#[test]
fn repeat_values() {
    let m = NDManager::new();
    let x = grid(&m);
    every_dtype(x, &[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7], |a| {
        a.repeat(2, 0).get(":3")
    });
    assert_eq!(x.repeat(2, 0).shape().dims(), &[6, 4]);
    // x[:, ::-2] repeated 3 times along axis 1 (non-contiguous).
    every_dtype(
        x.get(":, ::-2"),
        &[3, 3, 3, 1, 1, 1, 7, 7, 7, 5, 5, 5, 11, 11, 11, 9, 9, 9],
        |a| a.repeat(3, -1),
    );
    assert_eq!(x.repeat(0, 1).shape().dims(), &[3, 0]);
    assert_eq!(
        x.repeat(1, 1).to_vec::<i64>().unwrap(),
        (0..12).collect::<Vec<_>>()
    );
    assert_eq!(
        m.zeros([0, 2], DType::F32).repeat(4, 0).shape().dims(),
        &[0, 2]
    );
    fails!(m, x.try_repeat(2, 2), NdError::AxisOutOfRange { .. });
    let s = m.scalar(1i32);
    fails!(m, s.try_repeat(2, 0), NdError::AxisOutOfRange { .. });
    fails!(m, x.try_repeat(usize::MAX, 0), NdError::InvalidShape { .. });
    same_panic(
        || x.try_repeat(2, -3),
        || {
            x.repeat(2, -3);
        },
    );
    gradcheck(&[&[3, 4]], -1.0, 1.0, |xs| xs[0].repeat(3, 0));
    gradcheck(&[&[3, 4]], -1.0, 1.0, |xs| xs[0].transpose().repeat(2, -1));
    // Zero repeats: an empty result, a zero gradient.
    gradcheck(&[&[2, 3]], -1.0, 1.0, |xs| xs[0].repeat(0, 0).sum() + xs[0]);
    m.close();
}

#[test]
fn tile_values() {
    let m = NDManager::new();
    let x = grid(&m);
    let r = m.arange(0.0, 3.0, 1.0, DType::I64);
    every_dtype(r, &[0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2], |a| {
        let t = a.tile(&[2, 2]);
        assert_eq!(t.shape().dims(), &[2, 6]);
        t
    });
    // reps shorter than ndim: padded with leading 1s.
    every_dtype(x.get(":2, :2"), &[0, 1, 0, 1, 4, 5, 4, 5], |a| a.tile(&[2]));
    // reps longer than ndim, on a transposed view: x.T[:2] tiled (1, 1, 2).
    let t = x.transpose().get(":2").tile(&[1, 1, 2]);
    assert_eq!(t.shape().dims(), &[1, 2, 6]);
    assert_eq!(
        t.to_vec::<i64>().unwrap(),
        vec![0, 4, 8, 0, 4, 8, 1, 5, 9, 1, 5, 9]
    );
    assert_eq!(
        x.tile(&[]).to_vec::<i64>().unwrap(),
        (0..12).collect::<Vec<_>>()
    );
    assert_eq!(x.tile(&[0, 2]).shape().dims(), &[0, 8]);
    assert_eq!(
        m.scalar(3i32).tile(&[2]).to_vec::<i32>().unwrap(),
        vec![3, 3]
    );
    assert_eq!(
        m.zeros([0, 2], DType::U8).tile(&[3, 1]).shape().dims(),
        &[0, 2]
    );
    fails!(
        m,
        x.try_tile(&[usize::MAX, 2]),
        NdError::InvalidShape { .. }
    );
    gradcheck(&[&[2, 3]], -1.0, 1.0, |xs| xs[0].tile(&[2, 2]));
    gradcheck(&[&[3]], -1.0, 1.0, |xs| xs[0].tile(&[2, 1, 2]));
    gradcheck(&[&[3, 2]], -1.0, 1.0, |xs| xs[0].transpose().tile(&[3]));
    gradcheck(&[&[2, 3]], -1.0, 1.0, |xs| {
        xs[0].tile(&[0, 1]).sum() + xs[0]
    });
    m.close();
}

#[test]
fn pad_values() {
    let m = NDManager::new();
    let x = grid(&m);
    for dt in [DType::F32, DType::F64, DType::I32, DType::I64] {
        let p = x.to_dtype(dt).get(":2, :2").pad(&[(1, 0), (2, 1)], -5.0);
        assert_eq!(p.shape().dims(), &[3, 5]);
        assert_eq!(
            f64s(p),
            as_dtype(
                &[-5, -5, -5, -5, -5, -5, -5, 0, 1, -5, -5, -5, 4, 5, -5],
                dt
            )
        );
    }
    // x.T[::2] (non-contiguous), zeros.
    every_dtype(
        x.transpose().get("::2"),
        &[0, 0, 4, 8, 0, 2, 6, 10, 0, 0, 0, 0],
        |a| a.pad(&[(0, 1), (1, 0)], 0.0),
    );
    assert_eq!(
        x.to_dtype(DType::Bool)
            .get("0, :1")
            .pad(&[(1, 1)], 2.0)
            .to_vec::<bool>()
            .unwrap(),
        vec![true, false, true]
    );
    assert_eq!(m.scalar(4u8).pad(&[], 1.0).to_vec::<u8>().unwrap(), vec![4]);
    assert_eq!(
        m.zeros([0, 2], DType::F32)
            .pad(&[(1, 1), (0, 0)], 3.0)
            .to_vec::<f32>()
            .unwrap(),
        vec![3.0; 4]
    );
    fails!(
        m,
        x.try_pad(&[(1, 1)], 0.0),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_pad(&[(0, 0), (0, 0), (0, 0)], 0.0),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_pad(&[(0, 0), (0, 0)], f64::INFINITY),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_pad(&[(usize::MAX, 1), (0, 0)], 0.0),
        NdError::InvalidShape { .. }
    );
    same_panic(
        || x.try_pad(&[(1, 1)], 0.0),
        || {
            x.pad(&[(1, 1)], 0.0);
        },
    );
    gradcheck(&[&[2, 3]], -1.0, 1.0, |xs| {
        xs[0].pad(&[(1, 2), (0, 1)], 0.5)
    });
    gradcheck(&[&[3, 2]], -1.0, 1.0, |xs| {
        xs[0].transpose().pad(&[(2, 0), (1, 1)], 0.0)
    });
    m.close();
}

// ------------------------------------------------------------------ swap_axes, flip

#[test]
fn swap_axes_and_flip_values() {
    let m = NDManager::new();
    let y = y24(&m);
    let swapped = [
        0, 12, 4, 16, 8, 20, 1, 13, 5, 17, 9, 21, 2, 14, 6, 18, 10, 22, 3, 15, 7, 19, 11, 23,
    ];
    every_dtype(y, &swapped, |a| a.swap_axes(0, -1));
    assert_eq!(y.swap_axes(0, 2).shape().dims(), &[4, 3, 2]);
    assert_eq!(
        y.swap_axes(1, 1).to_vec::<i64>().unwrap(),
        (0..24).collect::<Vec<_>>()
    );
    let flipped = [
        15, 14, 13, 12, 19, 18, 17, 16, 23, 22, 21, 20, 3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8,
    ];
    every_dtype(y, &flipped, |a| a.flip(&[0, -1]));
    let x = grid(&m);
    every_dtype(
        x.transpose(),
        &[8, 4, 0, 9, 5, 1, 10, 6, 2, 11, 7, 3],
        |a| a.flip(&[1]),
    );
    // Views: no new buffer; flipping twice is the identity; empty axes.
    let before = m.memory().live_buffers;
    let f = y.flip(&[1]).flip(&[1]);
    assert_eq!(m.memory().live_buffers, before);
    assert_eq!(f.to_vec::<i64>().unwrap(), (0..24).collect::<Vec<_>>());
    assert_eq!(
        y.flip(&[]).to_vec::<i64>().unwrap(),
        (0..24).collect::<Vec<_>>()
    );
    let z = m.zeros([0, 3], DType::F32);
    assert_eq!(z.flip(&[0, 1]).shape().dims(), &[0, 3]);
    assert_eq!(
        m.zeros([2, 0], DType::F32)
            .get("1")
            .flip(&[0])
            .shape()
            .dims(),
        &[0]
    );
    fails!(m, y.try_swap_axes(0, 3), NdError::AxisOutOfRange { .. });
    fails!(m, y.try_flip(&[-4]), NdError::AxisOutOfRange { .. });
    fails!(m, y.try_flip(&[1, -2]), NdError::InvalidArgument { .. });
    same_panic(
        || y.try_flip(&[0, 0]),
        || {
            y.flip(&[0, 0]);
        },
    );
    same_panic(
        || y.try_swap_axes(-4, 0),
        || {
            y.swap_axes(-4, 0);
        },
    );
    gradcheck(&[&[2, 3, 4]], -1.0, 1.0, |xs| xs[0].swap_axes(0, -1) * 1.5);
    gradcheck(&[&[2, 3, 4]], -1.0, 1.0, |xs| xs[0].flip(&[0, 2]));
    gradcheck(&[&[3, 4]], -1.0, 1.0, |xs| {
        xs[0].transpose().flip(&[-1]).swap_axes(0, 1)
    });
    m.close();
}

// ------------------------------------------------------------------ tril, triu

#[test]
fn tril_triu_values() {
    let m = NDManager::new();
    let y = y24(&m);
    every_dtype(
        y,
        &[
            0, 1, 0, 0, 4, 5, 6, 0, 8, 9, 10, 11, 12, 13, 0, 0, 16, 17, 18, 0, 20, 21, 22, 23,
        ],
        |a| a.tril(1),
    );
    every_dtype(
        y,
        &[
            0, 1, 2, 3, 4, 5, 6, 7, 0, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 0, 21, 22, 23,
        ],
        |a| a.triu(-1),
    );
    let x = grid(&m);
    every_dtype(x.transpose(), &[0, 4, 8, 0, 5, 9, 0, 0, 10, 0, 0, 0], |a| {
        a.triu(0)
    });
    let all: Vec<i64> = (0..12).collect();
    assert_eq!(x.tril(5).to_vec::<i64>().unwrap(), all);
    assert_eq!(x.triu(-5).to_vec::<i64>().unwrap(), all);
    assert_eq!(x.tril(-3).to_vec::<i64>().unwrap(), vec![0; 12]);
    assert_eq!(x.tril(i64::MAX).to_vec::<i64>().unwrap(), all);
    assert_eq!(x.triu(i64::MIN).to_vec::<i64>().unwrap(), all);
    assert_eq!(
        m.zeros([2, 0, 3], DType::F32).tril(0).shape().dims(),
        &[2, 0, 3]
    );
    let (v, s) = (m.zeros([3], DType::F32), m.scalar(1.0f64));
    fails!(m, v.try_tril(0), NdError::InvalidShape { .. });
    fails!(m, s.try_triu(0), NdError::InvalidShape { .. });
    same_panic(
        || v.try_triu(0),
        || {
            v.triu(0);
        },
    );
    gradcheck(&[&[2, 3, 3]], -1.0, 1.0, |xs| xs[0].tril(0));
    gradcheck(&[&[3, 4]], -1.0, 1.0, |xs| xs[0].triu(1));
    gradcheck(&[&[4, 3]], -1.0, 1.0, |xs| xs[0].transpose().tril(-1));
    m.close();
}

// ------------------------------------------------------------------ *_like

#[test]
fn like_constructors() {
    let m = NDManager::new();
    let other = NDManager::new();
    let x = grid(&other).transpose();
    for dt in VALUE_DTYPES {
        let a = x.to_dtype(dt);
        let (z, o, f) = (a.zeros_like(), a.ones_like(), a.full_like(3.0));
        for (r, v) in [
            (z, 0.0),
            (o, 1.0),
            (f, if dt == DType::Bool { 1.0 } else { 3.0 }),
        ] {
            assert_eq!((r.dtype(), r.shape().dims()), (dt, &[4usize, 3][..]));
            assert_eq!(r.manager(), other);
            assert_eq!(f64s(r), vec![v; 12]);
        }
    }
    assert_eq!(
        x.to_dtype(DType::I32)
            .full_like(-2.7)
            .to_vec::<i32>()
            .unwrap(),
        vec![-2; 12]
    );
    assert!(
        x.to_dtype(DType::F32)
            .full_like(f64::NAN)
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|v| v.is_nan())
    );
    assert_eq!(
        m.zeros([0, 2], DType::F32).ones_like().shape().dims(),
        &[0, 2]
    );
    // Registered in the current scope.
    let s = NDScope::new();
    let t = x.zeros_like();
    drop(s);
    assert!(t.is_closed());
    fails!(
        other,
        x.try_full_like(f64::NAN),
        NdError::InvalidArgument { .. }
    );
    same_panic(
        || x.try_full_like(f64::INFINITY),
        || {
            x.full_like(f64::INFINITY);
        },
    );
    let c = m.zeros([2], DType::F32);
    c.close();
    assert!(matches!(c.try_zeros_like(), Err(NdError::Closed(_))));
    m.close();
    other.close();
}

// ------------------------------------------------------------------ random

#[test]
fn random_permutation_is_a_reproducible_permutation() {
    let _g = rng_lock();
    let m = NDManager::new();
    for n in [0usize, 1, 2, 10, 1000] {
        let p = m.random_permutation(n);
        assert_eq!((p.dtype(), p.shape().dims()), (DType::I64, &[n][..]));
        let mut v = p.to_vec::<i64>().unwrap();
        v.sort();
        assert_eq!(v, (0..n as i64).collect::<Vec<_>>());
    }
    {
        random::seed(42);
        let a = m.random_permutation(50).to_vec::<i64>().unwrap();
        random::seed(42);
        let b = m.random_permutation(50).to_vec::<i64>().unwrap();
        random::seed(43);
        let c = m.random_permutation(50).to_vec::<i64>().unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, (0..50).collect::<Vec<_>>());
    }
    let capped = m.new_sub_manager();
    capped.cap();
    assert!(matches!(
        capped.try_random_permutation(3),
        Err(NdError::ManagerCapped { .. })
    ));
    m.close();
}

#[test]
fn random_bernoulli_frequency_and_seed() {
    let _g = rng_lock();
    let m = NDManager::new();
    let b = m.random_bernoulli(0.25, [400, 250]);
    assert_eq!(
        (b.dtype(), b.shape().dims()),
        (DType::Bool, &[400usize, 250][..])
    );
    let ones = b.to_vec::<bool>().unwrap().iter().filter(|&&v| v).count();
    let freq = ones as f64 / 100_000.0;
    assert!((freq - 0.25).abs() < 0.01, "frequency {freq}");
    assert_eq!(
        m.random_bernoulli(0.0, [50]).to_vec::<bool>().unwrap(),
        vec![false; 50]
    );
    assert_eq!(
        m.random_bernoulli(1.0, [50]).to_vec::<bool>().unwrap(),
        vec![true; 50]
    );
    assert_eq!(m.random_bernoulli(0.5, [0, 3]).shape().dims(), &[0, 3]);
    {
        random::seed(9);
        let a = m.random_bernoulli(0.5, [64]).to_vec::<bool>().unwrap();
        random::seed(9);
        let b = m.random_bernoulli(0.5, [64]).to_vec::<bool>().unwrap();
        assert_eq!(a, b);
    }
    fails!(
        m,
        m.try_random_bernoulli(1.5, [2]),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        m.try_random_bernoulli(-0.1, [2]),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        m.try_random_bernoulli(f64::NAN, [2]),
        NdError::InvalidArgument { .. }
    );
    let msg = same_panic(
        || m.try_random_bernoulli(2.0, [2]),
        || {
            m.random_bernoulli(2.0, [2]);
        },
    );
    assert!(msg.contains("probability 2 is not in [0, 1]"), "{msg}");
    m.close();
}

#[test]
fn dropout_statistics_and_modes() {
    let _g = rng_lock();
    let m = NDManager::new();
    let n = 200_000;
    for dt in [DType::F32, DType::F64] {
        let x = m.ones([n], dt);
        let y = x.dropout(0.3, true);
        assert_eq!((y.dtype(), y.shape().dims()), (dt, &[n][..]));
        let v = f64s(y);
        let zeros = v.iter().filter(|&&e| e == 0.0).count() as f64 / n as f64;
        let mean = v.iter().sum::<f64>() / n as f64;
        assert!((zeros - 0.3).abs() < 0.01, "dropped fraction {zeros}");
        assert!((mean - 1.0).abs() < 0.01, "mean {mean}");
        assert!(v.iter().all(|&e| e == 0.0 || (e - 1.0 / 0.7).abs() < 1e-6));
    }
    // Evaluation mode and p = 0: x itself.
    let x = m.create(&[1.0f32, 2.0, 3.0], [3]);
    assert_eq!(x.dropout(0.5, false), x);
    assert_eq!(x.dropout(0.0, true), x);
    // p = 1: zeros, even for non-finite values.
    let w = m.create(&[f64::NAN, f64::INFINITY, 1.0], [3]);
    assert_eq!(w.dropout(1.0, true).to_vec::<f64>().unwrap(), vec![0.0; 3]);
    // Non-contiguous and zero-size inputs.
    let t = m
        .arange(1.0, 7.0, 1.0, DType::F64)
        .reshape([2, 3])
        .transpose();
    let d = t.dropout(0.5, true);
    for (o, i) in f64s(d).iter().zip(f64s(t)) {
        assert!(*o == 0.0 || *o == 2.0 * i);
    }
    assert_eq!(
        m.zeros([0, 4], DType::F32)
            .dropout(0.5, true)
            .shape()
            .dims(),
        &[0, 4]
    );
    // Reproducible.
    {
        random::seed(5);
        let a = f64s(t.dropout(0.5, true));
        random::seed(5);
        assert_eq!(f64s(t.dropout(0.5, true)), a);
    }
    m.close();
}

#[test]
fn dropout_errors_and_memory() {
    let _g = rng_lock();
    let m = NDManager::new();
    let x = m.ones([4], DType::F32);
    fails!(m, x.try_dropout(1.5, true), NdError::InvalidArgument { .. });
    fails!(
        m,
        x.try_dropout(-0.5, false),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        x.try_dropout(f64::NAN, true),
        NdError::InvalidArgument { .. }
    );
    let xi = m.ones([4], DType::I32);
    fails!(
        m,
        xi.try_dropout(0.5, true),
        NdError::UnsupportedDType { .. }
    );
    fails!(
        m,
        xi.try_dropout(0.5, false),
        NdError::UnsupportedDType { .. }
    );
    let capped = m.new_sub_manager();
    let xc = capped.ones([4], DType::F32);
    capped.cap();
    fails!(m, xc.try_dropout(0.5, true), NdError::ManagerCapped { .. });
    let msg = same_panic(
        || x.try_dropout(2.0, true),
        || {
            x.dropout(2.0, true);
        },
    );
    assert!(
        msg.contains("dropout: probability 2 is not in [0, 1]"),
        "{msg}"
    );
    // Outside a collector the mask is freed at once: only the result is new.
    let before = counts(&m);
    let y = x.dropout(0.5, true);
    assert_eq!(counts(&m).0, before.0 + 1);
    // The result is registered in the current scope.
    let s = NDScope::new();
    let z = x.dropout(0.5, true);
    drop(s);
    assert!(z.is_closed() && !y.is_closed());
    m.close();
}

#[test]
fn dropout_gradient() {
    let _g = rng_lock();
    let m = NDManager::new();
    // The mask is kept by the tape: g * mask / (1 - p), checked directly...
    let w = m
        .create(&[0.5f64, -1.0, 2.0, 3.0, -0.25, 1.5], [2, 3])
        .set_requires_gradient(true);
    let before = counts(&m).0;
    let y = {
        let gc = GradientCollector::new();
        let _s = NDScope::new();
        let y = w.dropout(0.25, true);
        let out = ndscope::scope(|| y * 1.0);
        gc.backward(out.sum()).unwrap();
        f64s(y)
    };
    assert_eq!(
        counts(&m).0,
        before,
        "the mask and intermediates were freed"
    );
    let g = f64s(w.gradient());
    for (gi, yi) in g.iter().zip(&y) {
        let expected = if *yi == 0.0 { 0.0 } else { 1.0 / 0.75 };
        assert!((gi - expected).abs() < 1e-12, "{g:?} vs {y:?}");
    }
    // ...and by finite differences with a fixed mask (reseeded on every call).
    {
        gradcheck(&[&[3, 4]], -1.0, 1.0, |xs| {
            random::seed(17);
            xs[0].dropout(0.4, true)
        });
    }
    {
        gradcheck(&[&[4, 3]], -1.0, 1.0, |xs| {
            random::seed(18);
            xs[0].transpose().dropout(0.5, true)
        });
    }
    gradcheck(&[&[3]], -1.0, 1.0, |xs| xs[0].dropout(1.0, true) + xs[0]);
    gradcheck(&[&[3]], -1.0, 1.0, |xs| xs[0].dropout(0.5, false) * 2.0);
    m.close();
}

// ------------------------------------------------------------------ composites

#[test]
fn ops_compose_under_a_collector_without_leaks() {
    let m = NDManager::new();
    let table = m
        .random_uniform(-1.0, 1.0, [5, 3], DType::F64)
        .set_requires_gradient(true);
    let ids = idx(&m, &[4, 0, 4, 2], &[2, 2], DType::I64);
    let before = counts(&m);
    {
        let _s = NDScope::new();
        let gc = GradientCollector::new();
        // An embedding lookup, a causal mask and a split: the gradient of every row
        // used is the number of times it was used (times the mask's effect).
        let e = table.index_select(0, ids); // [2, 2, 3]
        let parts = e.split(2, 0);
        let loss = parts[0].sum()
            + parts[1]
                .tril(0)
                .masked_fill(m.zeros([3], DType::Bool), 0.0)
                .sum();
        gc.backward(loss).unwrap();
    }
    assert_eq!(counts(&m), before);
    // Rows: ids [[4, 0], [4, 2]]; part 1 is rows (4, 2) as a [2, 3] matrix with its
    // lower triangle kept: row 4 keeps column 0, row 2 columns 0 and 1.
    assert_eq!(
        f64s(table.gradient()),
        vec![
            1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 2.0, 1.0, 1.0
        ]
    );
    m.close();
}

/// Each thread has its own generator: two threads seeded alike draw alike, however
/// their draws interleave.
#[test]
fn generators_are_per_thread() {
    let draw = || {
        let m = NDManager::new();
        random::seed(123);
        let mut v = Vec::new();
        for _ in 0..200 {
            v.extend(m.random_permutation(8).to_vec::<i64>().unwrap());
            m.random_bernoulli(0.5, [3]); // interleaved draws of another kind
        }
        m.close();
        v
    };
    let (a, b) = std::thread::scope(|s| {
        let (a, b) = (s.spawn(draw), s.spawn(draw));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(a, b);
}
