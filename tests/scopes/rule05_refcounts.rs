//! Rule 5 (docs/ownership.md): reference counts, JavaCPP's model (scope registrations
//! plus outstanding retains); `release` frees at 0; `close()` and a manager's close free
//! whatever the count.

use crate::common::arrays_bytes;
use crate::{B, T1D, arr, tensor1d};
use ndscope::{CloseReason, DType, NDArray, NDManager, NDScope, NdError};

/// Rule 5 (docs/ownership.md): one `release()` frees an unscoped, unretained array; a
/// second is an error.
#[test]
fn retain_release_basics() {
    let m = NDManager::new();
    let a = m.ones([1], DType::F32);
    assert_eq!(a.ref_count(), 0);
    assert!(
        a.release(),
        "one release frees an unscoped, unretained array"
    );
    assert!(a.is_closed());
    assert_eq!(
        a.try_release().unwrap_err().close_reason(),
        Some(&CloseReason::Release)
    );
    m.close();
}

/// Rule 5 (docs/ownership.md): retain then release frees.
#[test]
fn retain_then_release_frees() {
    let m = NDManager::new();
    let a = arr(&m);
    assert_eq!(a.ref_count(), 0);
    assert_eq!(a.retain(), 1);
    assert_eq!(a.ref_count(), 1);
    assert!(a.release());
    assert!(a.is_closed());
    assert_eq!(arrays_bytes(&m), (0, 0));
}

/// Rule 5 (docs/ownership.md): two retains need two releases.
#[test]
fn two_retains_need_two_releases() {
    let m = NDManager::new();
    let a = arr(&m);
    a.retain();
    assert_eq!(a.retain(), 2);
    assert!(!a.release());
    assert_eq!(a.ref_count(), 1);
    assert_eq!(arrays_bytes(&m), (1, B));
    assert!(a.release());
    assert!(a.is_closed());
    assert_eq!(arrays_bytes(&m), (0, 0));
}

/// Rule 5 (docs/ownership.md): a retained array survives its scope; one release frees it.
#[test]
fn retained_array_survives_its_scope_and_one_release_frees_it() {
    let m = NDManager::new();
    let a;
    {
        let _s = NDScope::new();
        a = arr(&m);
        assert_eq!(a.ref_count(), 1);
        assert_eq!(a.retain(), 2);
    }
    assert!(!a.is_closed());
    assert_eq!(a.ref_count(), 1);
    assert_eq!(arrays_bytes(&m), (1, B));
    assert!(a.release());
    assert!(a.is_closed());
    assert_eq!(arrays_bytes(&m), (0, 0));
}

/// Rules 3 and 5 (docs/ownership.md): a second scope's registration is one more reference.
#[test]
fn retained_and_attached_to_an_outer_scope_survives_the_inner_one() {
    let m = NDManager::new();
    let outer = NDScope::new();
    let a;
    {
        let _inner = NDScope::new();
        a = arr(&m);
        a.retain();
        assert_eq!(outer.register(a), a);
        assert_eq!(a.ref_count(), 3);
        outer.register(a); // already registered there: no second registration
        assert_eq!(a.ref_count(), 3);
    }
    assert_eq!(a.ref_count(), 2);
    assert!(!a.release(), "the outer scope still holds it");
    assert_eq!(a.ref_count(), 1);
    assert_eq!(arrays_bytes(&m), (1, B));
    drop(outer);
    assert!(a.is_closed());
    assert_eq!(arrays_bytes(&m), (0, 0));
}

/// Rule 5 (docs/ownership.md): a scope registration counts as a reference.
#[test]
fn release_inside_a_scope_counts_the_registration() {
    let m = NDManager::new();
    let s = NDScope::new();
    let a = arr(&m);
    a.retain();
    assert_eq!(a.ref_count(), 2);
    assert!(!a.release());
    assert_eq!(a.ref_count(), 1);
    assert!(a.release(), "the scope registration was the last reference");
    assert!(a.is_closed());
    assert!(s.arrays().is_empty());
    assert_eq!(arrays_bytes(&m), (0, 0));
    drop(s); // tolerates the array it no longer holds
}

/// Rule 5 (docs/ownership.md).
/// `release()` with only scope registrations left gives up the innermost one (as the
/// engine documents), so the array outlives the inner scope and dies with the outer.
#[test]
fn release_gives_up_the_innermost_registration() {
    let m = NDManager::new();
    let outer = NDScope::new();
    let inner = NDScope::new();
    let a = arr(&m);
    outer.register(a);
    assert_eq!(a.ref_count(), 2);
    assert!(!a.release());
    assert_eq!(
        inner.arrays(),
        Vec::<NDArray>::new(),
        "inner gave up its reference"
    );
    drop(inner);
    assert!(!a.is_closed(), "outer still holds it");
    drop(outer);
    assert!(a.is_closed());
    m.close();
}

fn is_closed_error(e: &NdError) -> bool {
    // `ClosedUnknown` only once the tombstone was recycled (thousands of frees later).
    matches!(e, NdError::Closed(_) | NdError::ClosedUnknown { .. })
}

/// Rule 5 (docs/ownership.md): releasing a freed array is an error; `close()` stays
/// idempotent.
#[test]
fn release_of_a_freed_array_is_an_error() {
    let m = NDManager::new();
    let a = arr(&m);
    assert!(
        a.release(),
        "one release frees an unscoped, unretained array"
    );
    let e = a.try_release().unwrap_err();
    assert!(is_closed_error(&e), "{e:?}");
    assert!(a.try_retain().is_err());
    assert!(a.try_ref_count().is_err());
    // close() stays idempotent.
    a.close();
    assert_eq!(arrays_bytes(&m), (0, 0));
}

/// Rule 5 (docs/ownership.md): `close()` and a manager's close free whatever the count.
#[test]
fn close_and_manager_close_ignore_the_count() {
    let m = NDManager::new();
    let a = arr(&m);
    a.retain();
    a.retain();
    a.close();
    assert!(a.is_closed());
    let b = arr(&m);
    b.retain();
    let s = NDScope::new();
    s.register(b);
    assert_eq!(b.ref_count(), 2);
    m.close();
    assert!(b.is_closed());
    assert!(s.arrays().is_empty());
    assert_eq!(arrays_bytes(&m), (0, 0));
}

/// Rule 5 (docs/ownership.md): `close()` is idempotent.
/// tfjs "multiple disposes does not affect num arrays".
#[test]
fn closing_twice_is_harmless() {
    let m = NDManager::new();
    let a = tensor1d(&m, [1.0, 2.0, 3.0]);
    let b = tensor1d(&m, [1.0, 2.0, 3.0]);
    assert_eq!(arrays_bytes(&m), (2, 2 * T1D));
    a.close();
    a.close();
    assert_eq!(arrays_bytes(&m), (1, T1D));
    b.close();
    assert_eq!(arrays_bytes(&m), (0, 0));
    assert!(a.is_closed() && b.is_closed());
}
