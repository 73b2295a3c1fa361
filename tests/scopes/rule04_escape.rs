//! Rule 4 (docs/ownership.md): `escape` and the return value of `scope` move a
//! registration up one level (out of every scope at the outermost one); `keep` and
//! `NDScope::unregister` remove an array from every scope.

use crate::common::{arrays_bytes, f32s, serial};
use crate::{T1D, tensor1d};
use ndscope::{CloseReason, DType, NDManager, NDScope};

/// Rules 4 and 11 (docs/ownership.md).
/// tfjs "returns Tensor": a result returned through three levels of tidy; each level's
/// close frees what it no longer returns (counts 3 -> 2 -> 0).
#[test]
fn nested_tidy_returns_an_array_through_three_levels() {
    let m = NDManager::new();
    ndscope::scope(|| {
        let a = tensor1d(&m, [1.0, 2.0, 3.0]);
        let mut b = tensor1d(&m, [0.0, 0.0, 0.0]);
        assert_eq!(arrays_bytes(&m), (2, 2 * T1D));
        ndscope::scope(|| {
            let result = ndscope::scope(|| {
                b = a + b;
                b = a + b;
                b = a + b;
                a + b
            });
            // Only the result is new: all intermediates are freed.
            assert_eq!(arrays_bytes(&m), (3, 3 * T1D));
            assert_eq!(f32s(result), vec![4.0, 8.0, 12.0]);
            assert!(
                b.is_closed(),
                "the last intermediate died with the innermost scope"
            );
        });
        // The result died with the middle scope; a and the first b remain.
        assert_eq!(arrays_bytes(&m), (2, 2 * T1D));
        assert!(!a.is_closed());
    });
    assert_eq!(arrays_bytes(&m), (0, 0));
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
                    assert_eq!(arrays_bytes(&m), (2, 2 * T1D));
                    x + 1.0
                });
                assert_eq!(arrays_bytes(&m), (2, 2 * T1D));
                let _junk = l3 * 100.0;
                l3 + 1.0
            });
            // l3 and its junk died with level 2; l2 escaped to level 1.
            assert_eq!(arrays_bytes(&m), (2, 2 * T1D));
            l2 + 1.0
        });
        assert_eq!(arrays_bytes(&m), (2, 2 * T1D));
        l1 + 1.0
    });
    assert_eq!(arrays_bytes(&m), (2, 2 * T1D));
    assert_eq!(f32s(out), vec![5.0, 6.0, 7.0]);
    assert_eq!(out.ref_count(), 0);
    m.close();
    assert_eq!(arrays_bytes(&m), (0, 0));
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
    assert_eq!(arrays_bytes(&m), (1, T1D));
    // Escaping an array the scope does not hold leaves it alone.
    let x = m.scalar(0u8).keep();
    outer.escape(x);
    assert_eq!(x.ref_count(), 0);
    drop(outer);
    assert!(a.is_closed());
    assert_eq!(arrays_bytes(&m), (1, 1));
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
    assert_eq!(arrays_bytes(&m), (1, T1D));
    m.close();
    assert!(a.is_closed());
    assert_eq!(arrays_bytes(&m), (0, 0));
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
    assert_eq!(arrays_bytes(&m), (1, 4));
    b.close();
    assert_eq!(arrays_bytes(&m), (0, 0));
}

/// Rule 4 (docs/ownership.md).
/// `a.keep()` is DJL's `NDScope.unregister(a)`.
#[test]
fn keep_in_an_inner_scope_survives_both_scopes() {
    let _serial = serial();
    let m = NDManager::new();
    let kept;
    {
        let outer = NDScope::new();
        {
            let inner = NDScope::new();
            kept = m.ones([2, 2], DType::F32).keep();
            assert_eq!(kept.ref_count(), 0);
            assert!(inner.arrays().is_empty() && outer.arrays().is_empty());
        }
    }
    assert!(!kept.is_closed());
    assert_eq!(arrays_bytes(&m), (1, 16));
    m.close();
    assert!(kept.is_closed());
    assert_eq!(
        kept.try_shape().unwrap_err().close_reason(),
        Some(&CloseReason::ManagerClose { manager: m.name() })
    );
}
