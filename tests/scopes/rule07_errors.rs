//! Rule 7 (docs/ownership.md): handles are generational ids (never reused, identity
//! equality and hashing); any use of a freed array is `NdError::Closed`, naming the
//! array, the line that created it, and where and why it was freed.
//!
//! These tests take `common::serial()` (see `main.rs`).

use crate::common::{arrays_bytes, serial};
use ndscope::{CloseReason, DType, NDArray, NDManager, NDScope, NdError};
use std::collections::HashSet;

/// Rule 7 (docs/ownership.md): uids are never reused, so a stale handle stays closed.
#[test]
fn stale_handles_never_alias_new_arrays() {
    let _serial = serial();
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
    let _serial = serial();
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
    let _serial = serial();
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

/// Rule 7 (docs/ownership.md).
/// Using an array a scope freed is `NdError::Closed`, naming where the array was
/// created and which scope freed it.
#[test]
fn use_after_scope_close_names_the_scope_and_the_creating_line() {
    let _serial = serial();
    let m = NDManager::new();
    let scope_line = line!() + 1;
    let s = NDScope::new();
    let created_line = line!() + 1;
    let a = m.ones([2, 2], DType::F32);
    drop(s);
    assert!(a.is_closed());
    let e = a.try_add(1.0).unwrap_err();
    let NdError::Closed(info) = &e else {
        panic!("expected Closed, got {e:?}");
    };
    match e.close_reason() {
        Some(CloseReason::ScopeClose { opened_at }) => {
            assert_eq!(opened_at.file(), file!());
            assert_eq!(opened_at.line(), scope_line);
        }
        other => panic!("expected ScopeClose, got {other:?}"),
    }
    assert_eq!(info.array.uid, a.uid());
    assert_eq!(info.array.shape.dims(), &[2, 2]);
    assert_eq!(info.array.dtype, DType::F32);
    assert_eq!(info.array.created_at.line(), created_line);
    assert_eq!(
        info.closed_at, None,
        "a dropped guard has no caller location"
    );
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("{}:{created_line}", file!())),
        "{msg}"
    );
    assert!(msg.contains(&format!("{}:{scope_line}", file!())), "{msg}");
    assert!(msg.contains(&format!("#{}", a.uid())), "{msg}");
    // Every accessor reports the same error.
    assert_eq!(a.try_shape().unwrap_err(), e);
    assert_eq!(a.to_vec::<f32>().unwrap_err(), e);
    assert_eq!(a.try_ref_count().unwrap_err(), e);
    assert_eq!(a.try_retain().unwrap_err(), e);
    assert_eq!(a.try_release().unwrap_err(), e);
    assert_eq!(arrays_bytes(&m), (0, 0));
    m.close();
}

/// Rule 7 (docs/ownership.md): an explicit scope close and `scope(..)` record where they
/// closed.
#[test]
fn explicit_scope_close_and_tidy_record_where_they_closed() {
    let _serial = serial();
    let m = NDManager::new();
    let scope_line = line!() + 1;
    let s = NDScope::new();
    let a = m.ones([2], DType::F32);
    let close_line = line!() + 1;
    s.close();
    let e = a.try_neg().unwrap_err();
    let NdError::Closed(info) = &e else {
        panic!("expected Closed, got {e:?}");
    };
    assert_eq!(info.closed_at.map(|l| l.line()), Some(close_line));
    assert!(matches!(
        info.reason,
        CloseReason::ScopeClose { opened_at } if opened_at.line() == scope_line
    ));
    assert!(
        e.to_string().contains(&format!("{}:{close_line}", file!())),
        "{e}"
    );

    let mut t = None;
    let tidy_line = line!() + 1;
    ndscope::scope(|| t = Some(m.ones([2], DType::F32)));
    let e = t.unwrap().try_shape().unwrap_err();
    let NdError::Closed(info) = &e else {
        panic!("expected Closed, got {e:?}");
    };
    assert_eq!(info.closed_at.map(|l| l.line()), Some(tidy_line));
    assert!(matches!(
        info.reason,
        CloseReason::ScopeClose { opened_at } if opened_at.line() == tidy_line
    ));
    assert_eq!(arrays_bytes(&m), (0, 0));
    m.close();
}

/// Rules 5 and 7 (docs/ownership.md).
/// The operator form panics with exactly the error's message.
#[test]
fn operators_on_a_freed_array_panic_with_the_error_text() {
    let _serial = serial();
    let m = NDManager::new();
    let a = ndscope::scope(|| {
        let t = m.ones([2], DType::F32);
        t.retain();
        t
    });
    a.release();
    let expected = a.try_add(1.0).unwrap_err().to_string();
    let caught = std::panic::catch_unwind(|| a + 1.0).unwrap_err();
    let msg = caught.downcast_ref::<String>().cloned().unwrap_or_default();
    assert_eq!(msg, expected);
    let e = a.try_add(1.0).unwrap_err();
    assert_eq!(e.close_reason(), Some(&CloseReason::Release), "{e:?}");
    m.close();
}

fn closed_info(e: &NdError) -> &ndscope::ClosedInfo {
    match e {
        NdError::Closed(info) => info,
        other => panic!("expected Closed, got {other:?}"),
    }
}

/// Rule 7 (docs/ownership.md): a scope close is named with the scope's line and the
/// creating line.
#[test]
fn scope_close_forensics_name_array_creating_line_scope_line_and_reason() {
    let _serial = serial();
    let m = NDManager::new();
    let x = m.ones([3], DType::F32);
    let scope_line = line!() + 2;
    let (t, create_line) = {
        let _s = NDScope::new();
        (x * 2.0, line!())
    };
    let e = t.try_add(1.0).unwrap_err();
    let info = closed_info(&e);
    assert_eq!(info.array.uid, t.uid());
    assert_eq!(info.array.created_at.line(), create_line);
    match &info.reason {
        CloseReason::ScopeClose { opened_at } => assert_eq!(opened_at.line(), scope_line),
        r => panic!("{r:?}"),
    }
    let msg = e.to_string();
    assert!(msg.contains(&format!("{}:{create_line}", file!())), "{msg}");
    assert!(
        msg.contains(&format!("scope opened at {}:{scope_line}", file!())),
        "{msg}"
    );

    // An explicit close() of the scope records where it was closed.
    let s = NDScope::new();
    let u = x * 3.0;
    let close_line = line!() + 1;
    s.close();
    let info = closed_info(&u.try_exp().unwrap_err()).clone();
    assert_eq!(info.closed_at.map(|l| l.line()), Some(close_line));
    m.close();
}

/// Rule 7 (docs/ownership.md): a manager close, an explicit close and a release are named
/// as reasons.
#[test]
fn manager_close_explicit_close_and_release_forensics() {
    let _serial = serial();
    let m = NDManager::new();
    m.set_name("params");
    let a = m.zeros([2], DType::F64);
    let close_line = line!() + 1;
    m.close();
    let info = closed_info(&a.try_sum().unwrap_err()).clone();
    assert_eq!(
        info.reason,
        CloseReason::ManagerClose {
            manager: "params".into()
        }
    );
    assert_eq!(info.closed_at.map(|l| l.line()), Some(close_line));
    assert!(
        a.try_sum()
            .unwrap_err()
            .to_string()
            .contains("close of manager 'params'")
    );

    let m = NDManager::new();
    let b = m.zeros([2], DType::F64);
    b.close();
    assert_eq!(
        closed_info(&b.try_abs().unwrap_err()).reason,
        CloseReason::Explicit
    );
    let c = m.zeros([2], DType::F64);
    c.retain();
    c.retain();
    assert!(!c.release());
    let release_line = line!() + 1;
    assert!(c.release());
    let info = closed_info(&c.try_abs().unwrap_err()).clone();
    assert_eq!(info.reason, CloseReason::Release);
    assert_eq!(info.closed_at.map(|l| l.line()), Some(release_line));
    assert!(
        info.created_backtrace.is_none(),
        "no backtraces unless verbose"
    );
    m.close();
}
