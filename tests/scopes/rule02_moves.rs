//! Rule 2 (docs/ownership.md): ownership moves with `attach`, `detach` and `temp_attach`
//! (the array's counters and bytes move with it); moving does not unregister.

use crate::common::arrays_bytes;
use crate::{B, arr};
use ndscope::{DType, NDManager, NDScope};

/// Rule 2 (docs/ownership.md): `attach` moves ownership with the counters and bytes.
#[test]
fn attach_moves_ownership_and_counters() {
    let m1 = NDManager::new();
    let m2 = NDManager::new();
    let a = m1.zeros([10], DType::F64);
    assert_eq!(m1.memory().live_bytes, 80);
    a.attach(&m2);
    assert_eq!(a.manager(), m2);
    assert_eq!((m1.memory().live_arrays, m1.memory().live_bytes), (0, 0));
    assert_eq!((m2.memory().live_arrays, m2.memory().live_bytes), (1, 80));
    m1.close();
    assert!(!a.is_closed(), "closing the old owner does not free it");
    m2.close();
    assert!(a.is_closed());
}

/// Rule 2 (docs/ownership.md): a detached array belongs to the system manager and outlives
/// its old one.
#[test]
fn detach_moves_to_system_and_survives_manager_close() {
    let m = NDManager::new();
    let a = m.ones([3], DType::I64).detach();
    assert_eq!(a.manager(), NDManager::system());
    m.close();
    assert_eq!(a.to_vec::<i64>().unwrap(), vec![1, 1, 1]);
    a.close();
    assert!(a.is_closed());
}

/// Rule 2 (docs/ownership.md): `temp_attach` returns the array home when its temporary
/// owner closes (or frees it if home closed).
#[test]
fn temp_attach_returns_home_when_the_temporary_owner_closes() {
    let home = NDManager::new();
    let tmp = NDManager::new();
    let a = home.arange(0.0, 4.0, 1.0, DType::F32);
    a.temp_attach(&tmp);
    assert_eq!(a.manager(), tmp);
    assert_eq!(home.memory().live_arrays, 0);
    tmp.close();
    assert!(
        !a.is_closed(),
        "temp-attached arrays are returned, not freed"
    );
    assert_eq!(a.manager(), home);
    assert_eq!(home.memory().live_bytes, 16);
    // A second temp_attach remembers the original home.
    let t1 = NDManager::new();
    let t2 = NDManager::new();
    a.temp_attach(&t1).temp_attach(&t2);
    t2.close();
    assert_eq!(a.manager(), home);
    t1.close();
    // If home itself closed meanwhile, the array is freed with its temporary owner.
    let t3 = NDManager::new();
    a.temp_attach(&t3);
    home.close();
    assert!(!a.is_closed());
    t3.close();
    assert!(a.is_closed());
}

/// Rule 2 (docs/ownership.md): an `attach` after `temp_attach` is permanent.
#[test]
fn attach_after_temp_attach_is_permanent() {
    let home = NDManager::new();
    let tmp = NDManager::new();
    let a = home.ones([1], DType::F32);
    a.temp_attach(&tmp).attach(&tmp);
    tmp.close();
    assert!(a.is_closed());
    home.close();
}

/// Rules 2 and 3 (docs/ownership.md): `detach()` moves ownership to the system manager but
/// keeps the scope registration, so the scope still frees it.
#[test]
fn detach_does_not_unregister() {
    let m = NDManager::new();
    let a;
    {
        let s = NDScope::new();
        a = arr(&m).detach();
        assert_eq!(a.manager(), NDManager::system());
        assert_eq!(s.arrays(), vec![a]);
        assert_eq!(a.ref_count(), 1);
        assert_eq!(arrays_bytes(&m), (0, 0));
    }
    assert!(a.is_closed());

    // attach() to another manager keeps the registration too.
    let other = NDManager::new();
    let b;
    {
        let _s = NDScope::new();
        b = arr(&m).attach(&other);
        assert_eq!((arrays_bytes(&m), arrays_bytes(&other)), ((0, 0), (1, B)));
    }
    assert!(b.is_closed());
    assert_eq!(arrays_bytes(&other), (0, 0));
    m.close();
    other.close();
}
