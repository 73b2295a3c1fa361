//! DJL's `NDScopeTest` ported, the use-after-scope diagnostics, and the training loop
//! that leaked in DJL before `NDScope` (intermediates such as `grad * lr` piling up in a
//! long-lived manager).
//!
//! Tests in this file run in parallel threads of one process, so every count is taken
//! from a manager the test created itself (`m.memory()`), never the global counters.

use ndscope::{CloseReason, DType, NDManager, NDScope, NdError};
use std::sync::{Mutex, MutexGuard};

/// The engine keeps details of only the last few thousand freed arrays; after that a
/// use-after-close says `ClosedUnknown`. The training loops free hundreds of thousands,
/// so the tests that inspect close details must not run alongside them.
static CHURN: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    CHURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// (live arrays, live bytes) of `m`'s subtree.
fn counts(m: &NDManager) -> (usize, usize) {
    let s = m.memory();
    (s.live_arrays, s.live_bytes)
}

/// Rules 2, 3 and 4 (docs/ownership.md).
/// DJL `testNDScope`: an array closed by hand inside the scope is tolerated by the
/// scope's close; an unregistered one survives both scopes and dies with its manager;
/// a detached and unregistered one survives even the manager.
#[test]
fn djl_nd_scope() {
    let manager = NDManager::new();
    let (uninvolved, inside, detached, scoped);
    {
        let _scope = NDScope::new();
        {
            let scope2 = NDScope::new();
            uninvolved = manager.create(&[1i32], [1]);
            uninvolved.close();
            assert_eq!(counts(&manager), (0, 0));
            inside = manager.create(&[1i32], [1]);
            NDScope::unregister(inside);
            detached = manager.create(&[1i32], [1]).detach();
            NDScope::unregister(detached);
            scoped = manager.create(&[1i32], [1]);
            assert_eq!(scope2.arrays(), vec![scoped]);
            // `detached` belongs to the system manager now.
            assert_eq!(counts(&manager), (2, 2 * 4));
        }
        assert!(scoped.is_closed());
        assert_eq!(counts(&manager), (1, 4));
    }
    assert!(uninvolved.is_closed());
    assert!(!inside.is_closed());
    assert!(!detached.is_closed());
    assert_eq!(counts(&manager), (1, 4));
    manager.close();
    assert!(inside.is_closed());
    assert!(
        !detached.is_closed(),
        "a detached array outlives every manager"
    );
    assert_eq!(detached.manager(), NDManager::system());
    assert_eq!(detached.to_vec::<i32>().unwrap(), vec![1]);
    detached.close();
    assert!(detached.is_closed());
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
    assert_eq!(counts(&m), (1, 16));
    m.close();
    assert!(kept.is_closed());
    assert_eq!(
        kept.try_shape().unwrap_err().close_reason(),
        Some(&CloseReason::ManagerClose { manager: m.name() })
    );
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
    assert_eq!(counts(&m), (0, 0));
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
    assert_eq!(counts(&m), (0, 0));
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

/// Rule 3 (docs/ownership.md).
/// DJL's leaking training loop, fixed with a per-iteration scope: parameters updated in
/// place live on, everything else is freed every step.
#[test]
fn training_loop_in_a_scope_does_not_grow() {
    let _serial = serial();
    let m = NDManager::new();
    let x = m.create(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let mut w = m.ones([2, 2], DType::F32);
    let w_id = w;
    let before = counts(&m);
    assert_eq!(before, (2, 2 * 16));
    for _ in 0..100_000 {
        let _s = NDScope::new();
        let y = x * w;
        let err = y - x;
        let grad = err * x * 2.0;
        w -= grad * 0.01;
    }
    assert_eq!(counts(&m), before);
    assert_eq!(w, w_id, "updated in place");
    let v = w.to_vec::<f32>().unwrap();
    assert!(v.iter().all(|&p| (p - 1.0).abs() < 1e-3), "{v:?}");
    m.close();
}

/// Rule 1 (docs/ownership.md).
/// The same loop without a scope leaks exactly its op results into the manager.
#[test]
fn training_loop_without_a_scope_grows_by_its_ops() {
    let _serial = serial();
    const OPS_PER_STEP: usize = 5; // x*w, -x, *x, *2, *0.01 (the in-place -= adds none)
    const STEPS: usize = 1_000;
    let m = NDManager::new();
    let x = m.create(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let mut w = m.ones([2, 2], DType::F32);
    let before = counts(&m);
    for _ in 0..STEPS {
        let y = x * w;
        let err = y - x;
        let grad = err * x * 2.0;
        w -= grad * 0.01;
    }
    assert_eq!(
        counts(&m),
        (
            before.0 + OPS_PER_STEP * STEPS,
            before.1 + OPS_PER_STEP * STEPS * 16
        )
    );
    // The leak report-free way out: close the manager.
    m.close();
    assert_eq!(counts(&m), (0, 0));
}
