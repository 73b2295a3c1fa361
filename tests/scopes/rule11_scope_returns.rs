//! Rule 11 (docs/ownership.md): `ndscope::scope` returns any `Escape` value (tuples,
//! `Vec`s, maps, `NDList`s, user types); its arrays move up exactly one level, plain
//! values pass through, arrays from outside stay where they were, freed ones are
//! tolerated. Mostly TensorFlow.js's `tf.tidy` tests.

use crate::common::{arrays_bytes, f32s};
use crate::{B, T1D, arr, tensor1d};
use ndscope::{DType, NDArray, NDList, NDManager, NDScope};

/// Rule 11 (docs/ownership.md).
/// tfjs "allows primitive types": plain values pass through, nothing is created or freed.
#[test]
fn tidy_returns_plain_values() {
    let m = NDManager::new();
    let x = tensor1d(&m, [1.0, 2.0, 3.0]);
    let n = ndscope::scope(|| 5);
    assert_eq!(n, 5);
    let s = ndscope::scope(|| "hello");
    assert_eq!(s, "hello");
    let owned = ndscope::scope(|| {
        let t = x * 2.0;
        format!("sum={}", f32s(t).iter().sum::<f32>())
    });
    assert_eq!(owned, "sum=12");
    let f = ndscope::scope(|| (x * 3.0).to_vec::<f32>().unwrap()[0]);
    assert_eq!(f, 3.0);
    let shape = ndscope::scope(|| (x + 1.0).shape());
    assert_eq!(shape.dims(), &[3]);
    assert_eq!(arrays_bytes(&m), (1, T1D), "temporaries are freed, x stays");
    m.close();
    assert_eq!(arrays_bytes(&m), (0, 0));
}

/// A user type mixing arrays and plain values (tfjs "allows complex types").
struct Complex {
    a: NDArray,
    b: String,
    c: (NDArray, String),
    n: usize,
}

ndscope::impl_escape!(Complex { a, c });

/// Rule 11 (docs/ownership.md): a user type's arrays escape (`impl_escape!`); its plain
/// fields pass through.
#[test]
fn tidy_returns_a_struct_mixing_arrays_and_plain_values() {
    let m = NDManager::new();
    let res = ndscope::scope(|| {
        let _garbage = m.ones([3], DType::F32) * 7.0;
        Complex {
            a: m.scalar(1.0f32),
            b: "hello".to_string(),
            c: (m.scalar(2.0f32), "world".to_string()),
            n: 3,
        }
    });
    assert_eq!(arrays_bytes(&m), (2, 2 * 4), "only the two scalars escaped");
    assert_eq!(res.a.to_scalar::<f32>().unwrap(), 1.0);
    assert_eq!(res.c.0.to_scalar::<f32>().unwrap(), 2.0);
    assert_eq!(
        (res.b.as_str(), res.c.1.as_str(), res.n),
        ("hello", "world", 3)
    );
    assert_eq!(res.a.ref_count(), 0, "escaped out of every scope");
    res.a.close();
    res.c.0.close();
    assert_eq!(arrays_bytes(&m), (0, 0));
}

/// Rule 11 (docs/ownership.md): arrays in a tuple escape; plain values pass through.
#[test]
fn tidy_returns_a_tuple_mixing_arrays_and_plain_values() {
    let m = NDManager::new();
    let x = tensor1d(&m, [1.0, 2.0, 3.0]);
    let (y, label, k) = ndscope::scope(|| {
        let t = x * 2.0;
        (t + 1.0, "y", 42u64)
    });
    assert_eq!((label, k), ("y", 42));
    assert_eq!(f32s(y), vec![3.0, 5.0, 7.0]);
    assert_eq!(arrays_bytes(&m), (2, 2 * T1D));
    m.close();
    assert!(y.is_closed());
}

/// Rule 11 (docs/ownership.md).
/// tfjs "returns Tensor[]".
#[test]
fn tidy_returns_a_vec_of_arrays() {
    let m = NDManager::new();
    let a = tensor1d(&m, [1.0, 2.0, 3.0]);
    let b = tensor1d(&m, [0.0, -1.0, 1.0]);
    assert_eq!(arrays_bytes(&m), (2, 2 * T1D));
    ndscope::scope(|| {
        let result = ndscope::scope(|| {
            let _ = a + b;
            vec![a + b, a - b]
        });
        // The two results are new; the intermediate is freed.
        assert_eq!(arrays_bytes(&m), (4, 4 * T1D));
        assert_eq!(f32s(result[0]), vec![1.0, 1.0, 4.0]);
        assert_eq!(f32s(result[1]), vec![1.0, 3.0, 2.0]);
    });
    // The two results are freed with the outer scope.
    assert_eq!(arrays_bytes(&m), (2, 2 * T1D));
    a.close();
    b.close();
    assert_eq!(arrays_bytes(&m), (0, 0));
}

/// Rule 11 (docs/ownership.md).
/// tfjs "nested usage returns tensor created from outside scope": the array survives
/// and keeps its place (here: no scope, count 0).
#[test]
fn returning_an_array_created_outside_leaves_it_where_it_was() {
    let m = NDManager::new();
    let x = m.scalar(1.0f32);
    let r = ndscope::scope(|| ndscope::scope(|| x));
    assert_eq!(r, x);
    assert!(!x.is_closed());
    assert_eq!(x.ref_count(), 0);
    assert_eq!(arrays_bytes(&m), (1, 4));

    // Created in an outer scope and returned from two inner ones: it stays registered
    // in the outer scope only, and dies with it.
    let outer = NDScope::new();
    let y = m.scalar(2.0f32);
    let r = ndscope::scope(|| ndscope::scope(|| y));
    assert_eq!(r, y);
    assert_eq!(y.ref_count(), 1);
    assert_eq!(outer.arrays(), vec![y]);
    drop(outer);
    assert!(y.is_closed());
    assert_eq!(arrays_bytes(&m), (1, 4));
    m.close();
}

/// Rule 11 (docs/ownership.md).
/// tfjs "works with arbitrary depth of result": arrays nested anywhere in the result.
#[test]
fn arrays_at_arbitrary_depth_in_the_result_escape() {
    let m = NDManager::new();
    let outer = NDScope::new();
    let (a, nested, c) = ndscope::scope(|| {
        let _junk = m.ones([3], DType::F32);
        (
            m.scalar(1.0f32),
            vec![vec![m.scalar(2.0f32)]],
            Some(m.scalar(3.0f32)),
        )
    });
    let b = nested[0][0];
    let c = c.unwrap();
    assert_eq!(arrays_bytes(&m), (3, 3 * 4));
    for x in [a, b, c] {
        assert_eq!(x.ref_count(), 1, "moved up exactly one level");
    }
    let mut in_outer = outer.arrays();
    in_outer.sort_by_key(|a| a.uid());
    let mut expected = vec![a, b, c];
    expected.sort_by_key(|a| a.uid());
    assert_eq!(in_outer, expected);

    // Options, Results, fixed arrays and boxes too.
    let (r, arr, bx): (
        Result<NDArray, ndscope::NdError>,
        [NDArray; 2],
        Box<NDArray>,
    ) = ndscope::scope(|| {
        (
            Ok(m.scalar(4.0f32)),
            [m.scalar(5.0f32), m.scalar(6.0f32)],
            Box::new(m.scalar(7.0f32)),
        )
    });
    assert_eq!(arrays_bytes(&m), (7, 7 * 4));
    assert!(!r.unwrap().is_closed() && !arr[1].is_closed() && !bx.is_closed());
    drop(outer);
    assert_eq!(arrays_bytes(&m), (0, 0));
    m.close();
}

/// Rule 11 (docs/ownership.md).
/// Maps escape their values; a returned array that was already freed inside is
/// tolerated (the scope neither panics nor resurrects it).
#[test]
fn tidy_returns_maps_and_tolerates_freed_arrays() {
    let m = NDManager::new();
    let outer = NDScope::new();
    let map = ndscope::scope(|| {
        let mut h = std::collections::HashMap::new();
        h.insert("w", m.ones([3], DType::F32));
        h.insert("b", m.zeros([3], DType::F32));
        h
    });
    assert_eq!(outer.arrays().len(), 2);
    assert!(map.values().all(|a| a.ref_count() == 1));
    let gone = ndscope::scope(|| {
        let t = m.ones([3], DType::F32);
        t.close();
        (t, m.scalar(1.0f32))
    });
    assert!(gone.0.is_closed() && !gone.1.is_closed());
    assert_eq!(arrays_bytes(&m), (3, 2 * T1D + 4));
    drop(outer);
    assert_eq!(arrays_bytes(&m), (0, 0));
    m.close();
}

/// Rule 11 (docs/ownership.md): an `NDList` escapes from `scope` and closes with a scope.
#[test]
fn nd_list_in_a_scope_and_as_a_tidy_result() {
    let m = NDManager::new();
    let list = ndscope::scope(|| {
        let _junk = arr(&m);
        let mut l = NDList::new();
        l.push(arr(&m));
        l.push(arr(&m));
        l
    });
    assert_eq!(list.len(), 2);
    assert_eq!(arrays_bytes(&m), (2, 2 * B));
    let arrays = list.0.clone();
    {
        let s = NDScope::new();
        s.attach_resource(list);
    }
    assert!(arrays.iter().all(|a| a.is_closed()));
    assert_eq!(arrays_bytes(&m), (0, 0));
    m.close();
}
