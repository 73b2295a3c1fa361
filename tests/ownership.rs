//! Moving ownership (docs/ownership.md rule 2), handle identity and use-after-close
//! errors (rule 7), and reference-count basics (rule 5).

use ndscope::{CloseReason, DType, NDArray, NDManager, NdError};
use std::collections::HashSet;

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

/// Rule 7 (docs/ownership.md): uids are never reused, so a stale handle stays closed.
#[test]
fn stale_handles_never_alias_new_arrays() {
    let m = NDManager::new();
    let mut seen = HashSet::new();
    let first = m.zeros([1], DType::F32);
    first.close();
    // Create and free far more arrays than the registry keeps tombstones for, so slots
    // are recycled; no uid repeats and the stale handle stays closed.
    for _ in 0..20_000 {
        let a = m.zeros([1], DType::F32);
        assert!(seen.insert(a.uid()), "uid reused");
        a.close();
    }
    assert!(first.is_closed());
    let e = first.try_shape().unwrap_err();
    assert!(matches!(
        e,
        NdError::ClosedUnknown { .. } | NdError::Closed(_)
    ));
    assert!(!seen.contains(&first.uid()));
    m.close();
}

/// Rule 7 (docs/ownership.md): equality and hashing are identity, also after close.
#[test]
fn handles_are_identity_equal_and_hash_after_close() {
    let m = NDManager::new();
    let a = m.ones([2], DType::F32);
    let b = m.ones([2], DType::F32);
    let a2 = a;
    assert_eq!(a, a2);
    assert_ne!(a, b, "equal contents are not equal handles");
    let set: HashSet<NDArray> = [a, b, a2].into_iter().collect();
    assert_eq!(set.len(), 2);
    a.close();
    assert_eq!(a, a2);
    assert!(set.contains(&a));
    assert!(std::mem::size_of::<NDArray>() <= 16);
    m.close();
}

/// Rule 7 (docs/ownership.md): a use after close names the array, its creating line, and
/// where and why it was closed.
#[test]
fn use_after_close_names_array_creation_line_and_reason() {
    let m = NDManager::new();
    let line = line!() + 1;
    let a = m.zeros([2, 3], DType::F32);
    let close_line = line!() + 1;
    a.close();
    a.close(); // idempotent
    let e = a.try_exp().unwrap_err();
    let NdError::Closed(info) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(info.reason, CloseReason::Explicit);
    assert_eq!(info.array.uid, a.uid());
    assert_eq!(info.array.shape.dims(), &[2, 3]);
    assert_eq!(info.array.created_at.line(), line);
    assert_eq!(info.array.created_at.file(), file!());
    assert_eq!(info.closed_at.unwrap().line(), close_line);
    let msg = e.to_string();
    assert!(msg.contains(&format!("#{} f32[2, 3]", a.uid())), "{msg}");
    assert!(msg.contains(&format!("{}:{line}", file!())), "{msg}");
    assert!(msg.contains("explicit close()"), "{msg}");
    let r = std::panic::catch_unwind(|| a.exp());
    assert_eq!(*r.unwrap_err().downcast::<String>().unwrap(), msg);
    m.close();
}

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
