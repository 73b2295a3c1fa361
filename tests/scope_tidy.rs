//! `ndscope::scope(|| ...)` ported from TensorFlow.js's `tf.tidy` tests (globals_test),
//! plus escape and out-of-order closes of `NDScope` guards.
//!
//! Tests in this file run in parallel threads of one process, so every count is taken
//! from a manager the test created itself (`m.memory()`), never the global counters.

use ndscope::{DType, NDArray, NDManager, NDScope};

/// Bytes of a `[3]` f32 array (`tf.tensor1d([1, 2, 3])`).
const T1D: usize = 3 * 4;

/// (live arrays, live bytes) of `m`'s subtree.
fn counts(m: &NDManager) -> (usize, usize) {
    let s = m.memory();
    (s.live_arrays, s.live_bytes)
}

fn tensor1d(m: &NDManager, v: [f32; 3]) -> NDArray {
    m.create(&v, [3])
}

fn data(a: NDArray) -> Vec<f32> {
    a.to_vec::<f32>().unwrap()
}

/// Rules 4 and 11 (docs/ownership.md).
/// tfjs "returns Tensor": a result returned through three levels of tidy; each level's
/// close frees what it no longer returns (counts 3 -> 2 -> 0).
#[test]
fn nested_tidy_returns_an_array_through_three_levels() {
    let m = NDManager::new();
    ndscope::scope(|| {
        let a = tensor1d(&m, [1.0, 2.0, 3.0]);
        let mut b = tensor1d(&m, [0.0, 0.0, 0.0]);
        assert_eq!(counts(&m), (2, 2 * T1D));
        ndscope::scope(|| {
            let result = ndscope::scope(|| {
                b = a + b;
                b = a + b;
                b = a + b;
                a + b
            });
            // Only the result is new: all intermediates are freed.
            assert_eq!(counts(&m), (3, 3 * T1D));
            assert_eq!(data(result), vec![4.0, 8.0, 12.0]);
            assert!(
                b.is_closed(),
                "the last intermediate died with the innermost scope"
            );
        });
        // The result died with the middle scope; a and the first b remain.
        assert_eq!(counts(&m), (2, 2 * T1D));
        assert!(!a.is_closed());
    });
    assert_eq!(counts(&m), (0, 0));
    m.close();
}

/// Rule 5 (docs/ownership.md): `close()` is idempotent.
/// tfjs "multiple disposes does not affect num arrays".
#[test]
fn closing_twice_is_harmless() {
    let m = NDManager::new();
    let a = tensor1d(&m, [1.0, 2.0, 3.0]);
    let b = tensor1d(&m, [1.0, 2.0, 3.0]);
    assert_eq!(counts(&m), (2, 2 * T1D));
    a.close();
    a.close();
    assert_eq!(counts(&m), (1, T1D));
    b.close();
    assert_eq!(counts(&m), (0, 0));
    assert!(a.is_closed() && b.is_closed());
}

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
        format!("sum={}", data(t).iter().sum::<f32>())
    });
    assert_eq!(owned, "sum=12");
    let f = ndscope::scope(|| (x * 3.0).to_vec::<f32>().unwrap()[0]);
    assert_eq!(f, 3.0);
    let shape = ndscope::scope(|| (x + 1.0).shape());
    assert_eq!(shape.dims(), &[3]);
    assert_eq!(counts(&m), (1, T1D), "temporaries are freed, x stays");
    m.close();
    assert_eq!(counts(&m), (0, 0));
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
    assert_eq!(counts(&m), (2, 2 * 4), "only the two scalars escaped");
    assert_eq!(res.a.to_scalar::<f32>().unwrap(), 1.0);
    assert_eq!(res.c.0.to_scalar::<f32>().unwrap(), 2.0);
    assert_eq!(
        (res.b.as_str(), res.c.1.as_str(), res.n),
        ("hello", "world", 3)
    );
    assert_eq!(res.a.ref_count(), 0, "escaped out of every scope");
    res.a.close();
    res.c.0.close();
    assert_eq!(counts(&m), (0, 0));
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
    assert_eq!(data(y), vec![3.0, 5.0, 7.0]);
    assert_eq!(counts(&m), (2, 2 * T1D));
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
    assert_eq!(counts(&m), (2, 2 * T1D));
    ndscope::scope(|| {
        let result = ndscope::scope(|| {
            let _ = a + b;
            vec![a + b, a - b]
        });
        // The two results are new; the intermediate is freed.
        assert_eq!(counts(&m), (4, 4 * T1D));
        assert_eq!(data(result[0]), vec![1.0, 1.0, 4.0]);
        assert_eq!(data(result[1]), vec![1.0, 3.0, 2.0]);
    });
    // The two results are freed with the outer scope.
    assert_eq!(counts(&m), (2, 2 * T1D));
    a.close();
    b.close();
    assert_eq!(counts(&m), (0, 0));
}

/// Rule 3 (docs/ownership.md).
/// tfjs "basic usage without return".
#[test]
fn tidy_without_a_return_value() {
    let m = NDManager::new();
    let a = tensor1d(&m, [1.0, 2.0, 3.0]);
    let mut b = tensor1d(&m, [0.0, 0.0, 0.0]);
    assert_eq!(counts(&m), (2, 2 * T1D));
    let b0 = b;
    ndscope::scope(|| {
        b = a + b;
        b = a + b;
        b = a + b;
        let _ = a + b;
        assert_eq!(counts(&m), (6, 6 * T1D));
    });
    // All intermediates are freed.
    assert_eq!(counts(&m), (2, 2 * T1D));
    assert!(b.is_closed() && !b0.is_closed());
    m.close();
}

/// Rules 4 and 11 (docs/ownership.md): each level's result moves up exactly one level.
#[test]
fn four_levels_of_nesting() {
    let m = NDManager::new();
    let x = tensor1d(&m, [1.0, 2.0, 3.0]);
    let out = ndscope::scope(|| {
        let l1 = ndscope::scope(|| {
            let l2 = ndscope::scope(|| {
                let l3 = ndscope::scope(|| {
                    let _junk = x * 100.0;
                    assert_eq!(counts(&m), (2, 2 * T1D));
                    x + 1.0
                });
                assert_eq!(counts(&m), (2, 2 * T1D));
                let _junk = l3 * 100.0;
                l3 + 1.0
            });
            // l3 and its junk died with level 2; l2 escaped to level 1.
            assert_eq!(counts(&m), (2, 2 * T1D));
            l2 + 1.0
        });
        assert_eq!(counts(&m), (2, 2 * T1D));
        l1 + 1.0
    });
    assert_eq!(counts(&m), (2, 2 * T1D));
    assert_eq!(data(out), vec![5.0, 6.0, 7.0]);
    assert_eq!(out.ref_count(), 0);
    m.close();
    assert_eq!(counts(&m), (0, 0));
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
    assert_eq!(counts(&m), (1, 4));

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
    assert_eq!(counts(&m), (1, 4));
    m.close();
}

/// Rule 4 (docs/ownership.md).
/// tfjs "nested usage with keep works".
#[test]
fn keep_inside_nested_scopes() {
    let m = NDManager::new();
    let mut b = None;
    ndscope::scope(|| {
        let a = m.scalar(1.0f32);
        ndscope::scope(|| {
            b = Some(a.keep());
        });
        assert_eq!(a.ref_count(), 0);
        let _junk = a * 2.0;
    });
    let b = b.unwrap();
    assert!(!b.is_closed());
    assert_eq!(counts(&m), (1, 4));
    b.close();
    assert_eq!(counts(&m), (0, 0));
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
    assert_eq!(counts(&m), (3, 3 * 4));
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
    assert_eq!(counts(&m), (7, 7 * 4));
    assert!(!r.unwrap().is_closed() && !arr[1].is_closed() && !bx.is_closed());
    drop(outer);
    assert_eq!(counts(&m), (0, 0));
    m.close();
}

/// Rule 4 (docs/ownership.md): `escape` moves a registration to the parent scope and leaves
/// other arrays alone.
#[test]
fn escape_moves_to_the_parent_scope() {
    let m = NDManager::new();
    let outer = NDScope::new();
    let inner = NDScope::new();
    let a = m.ones([3], DType::F32);
    let t = m.ones([3], DType::F32);
    assert_eq!(inner.arrays(), vec![a, t]);
    assert_eq!(inner.escape(a), a);
    assert_eq!(inner.arrays(), vec![t]);
    assert_eq!(outer.arrays(), vec![a]);
    assert_eq!(a.ref_count(), 1);
    assert_eq!(inner.memory().live_arrays, 1);
    drop(inner);
    assert!(t.is_closed() && !a.is_closed());
    assert_eq!(counts(&m), (1, T1D));
    // Escaping an array the scope does not hold leaves it alone.
    let x = m.scalar(0u8).keep();
    outer.escape(x);
    assert_eq!(x.ref_count(), 0);
    drop(outer);
    assert!(a.is_closed());
    assert_eq!(counts(&m), (1, 1));
    // Escaping a freed array is an error.
    assert!(NDScope::new().try_escape(a).is_err());
    m.close();
}

/// Rule 4 (docs/ownership.md): escaping from the outermost scope leaves every scope.
#[test]
fn escape_at_the_outermost_scope_leaves_all_scopes() {
    let m = NDManager::new();
    let s = NDScope::new();
    let a = m.ones([3], DType::F32);
    assert_eq!(a.ref_count(), 1);
    s.escape(a);
    assert_eq!(a.ref_count(), 0);
    assert!(s.arrays().is_empty());
    drop(s);
    assert!(!a.is_closed());
    assert_eq!(counts(&m), (1, T1D));
    m.close();
    assert!(a.is_closed());
    assert_eq!(counts(&m), (0, 0));
}

/// Rule 9 (docs/ownership.md).
/// Dropping an outer guard first closes the inner scopes too; dropping the inner guard
/// afterwards does nothing.
#[test]
fn dropping_the_outer_scope_first_closes_the_inner_ones() {
    let m = NDManager::new();
    let outer = NDScope::new();
    let a = m.ones([3], DType::F32);
    let inner = NDScope::new();
    let b = m.ones([3], DType::F32);
    let innermost = NDScope::new();
    let c = m.ones([3], DType::F32);
    assert_eq!(counts(&m), (3, 3 * T1D));
    drop(outer);
    assert!(a.is_closed() && b.is_closed() && c.is_closed());
    assert!(!inner.is_open() && !innermost.is_open());
    assert_eq!(counts(&m), (0, 0));
    drop(inner);
    drop(innermost);
    // The thread has no open scope left: new arrays are registered nowhere.
    let d = m.ones([3], DType::F32);
    assert_eq!(d.ref_count(), 0);
    let later = NDScope::new();
    let e = m.ones([3], DType::F32);
    assert_eq!(later.arrays(), vec![e]);
    drop(later);
    assert!(e.is_closed() && !d.is_closed());
    assert_eq!(counts(&m), (1, T1D));
    m.close();
}

/// Rule 9 (docs/ownership.md): explicit closes in and out of LIFO order.
#[test]
fn explicit_close_in_and_out_of_order() {
    let m = NDManager::new();
    let outer = NDScope::new();
    let a = m.ones([3], DType::F32);
    let inner = NDScope::new();
    let b = m.ones([3], DType::F32);
    assert!(inner.is_open());
    inner.close();
    assert!(b.is_closed() && !a.is_closed());
    // The outer scope is the innermost again.
    let c = m.ones([3], DType::F32);
    assert_eq!(outer.arrays(), vec![a, c]);
    let inner2 = NDScope::new();
    let d = m.ones([3], DType::F32);
    assert!(format!("{inner2:?}").contains("opened at"));
    outer.close();
    assert!(a.is_closed() && c.is_closed() && d.is_closed());
    assert!(!inner2.is_open());
    assert_eq!(format!("{inner2:?}"), "NDScope(closed)");
    assert!(inner2.opened_at().is_none());
    inner2.close();
    assert_eq!(counts(&m), (0, 0));
    m.close();
}

/// Rule 3 (docs/ownership.md): a scope frees what was created in it whatever its manager,
/// and arrays created before it opened are untouched.
#[test]
fn scope_frees_arrays_of_every_manager_and_spares_older_ones() {
    let m1 = NDManager::new();
    let m2 = NDManager::new();
    let sub = m1.new_sub_manager();
    let old = m1.ones([3], DType::F32);
    {
        let _s = NDScope::new();
        let _a = m1.ones([3], DType::F32);
        let _b = m2.ones([3], DType::F32);
        let _c = sub.ones([3], DType::F32);
        let _d = old * 2.0;
        assert_eq!(counts(&m1), (4, 4 * T1D));
        assert_eq!(counts(&m2), (1, T1D));
    }
    assert_eq!(counts(&m1), (1, T1D));
    assert_eq!(counts(&m2), (0, 0));
    assert!(!old.is_closed());
    assert!(sub.is_open());
    m1.close();
    m2.close();
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
    assert_eq!(counts(&m), (3, 2 * T1D + 4));
    drop(outer);
    assert_eq!(counts(&m), (0, 0));
    m.close();
}
