//! Rule 1 (docs/ownership.md): every array has exactly one owning manager; an op's result
//! belongs to its first input's manager; closing a manager frees its subtree and closes
//! its resources; the system manager is never closed.

use crate::common::{arrays_bytes, serial};
use crate::{B, CountClose, arr};
use ndscope::{CloseReason, DType, NDList, NDManager, NdError};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Rules 1 and 8 (docs/ownership.md): a manager's close frees its subtree, and the parent
/// forgets the closed sub-manager at once.
#[test]
fn closing_a_manager_frees_its_arrays_and_its_subtree() {
    let m = NDManager::new();
    let sub = m.new_sub_manager();
    let subsub = sub.new_sub_manager();
    let a = m.zeros([4], DType::F32);
    let b = sub.ones([2, 2], DType::F64);
    let c = subsub.full([3], 7.0, DType::I32);
    assert_eq!(m.memory().live_arrays, 3);
    assert_eq!(m.memory().live_bytes, 16 + 32 + 12);
    assert_eq!(sub.memory().live_arrays, 2);
    assert_eq!(subsub.memory().live_bytes, 12);

    sub.close();
    assert!(!sub.is_open() && !subsub.is_open());
    assert!(b.is_closed() && c.is_closed() && !a.is_closed());
    assert_eq!(m.memory().live_arrays, 1);
    assert_eq!(m.memory().live_bytes, 16);
    assert!(
        m.children().is_empty(),
        "a closed sub-manager is forgotten at once"
    );

    let err = c.try_shape().unwrap_err();
    match err.close_reason() {
        Some(CloseReason::ManagerClose { manager }) => assert_eq!(*manager, subsub.name()),
        other => panic!("unexpected reason {other:?}"),
    }
    m.close();
    assert!(a.is_closed());
    assert_eq!(m.memory(), Default::default());
}

/// Rule 1 (docs/ownership.md): `close()` is idempotent; the system manager is never closed.
#[test]
fn close_is_idempotent_and_system_is_never_closed() {
    let m = NDManager::new();
    m.close();
    m.close();
    assert!(!m.is_open());
    NDManager::system().close();
    assert!(NDManager::system().is_open());
    let a = NDManager::system().zeros([1], DType::U8);
    assert!(!a.is_closed());
    a.close();
}

/// Rule 1 (docs/ownership.md): an op's result belongs to its first input's manager.
#[test]
fn op_results_belong_to_the_first_inputs_manager() {
    let m1 = NDManager::new();
    let m2 = NDManager::new();
    let a = m1.ones([2], DType::F32);
    let b = m2.ones([2], DType::F32);
    assert_eq!((a + b).manager(), m1);
    assert_eq!((b + a).manager(), m2);
    assert_eq!((b * 2.0).manager(), m2);
    assert_eq!((2.0 * a).manager(), m1);
    m1.close();
    m2.close();
}

/// Rule 1 (docs/ownership.md): a closed manager takes no new arrays (`ManagerClosed`,
/// naming it).
#[test]
fn closed_manager_errors() {
    let m = NDManager::new();
    m.set_name("gone");
    m.close();
    let e = m.try_zeros([1], DType::F32).unwrap_err();
    assert_eq!(
        e,
        NdError::ManagerClosed {
            name: "gone".into()
        }
    );
    assert_eq!(e.to_string(), "manager 'gone' is closed");
    assert!(m.try_new_sub_manager().is_err());
    let r = std::panic::catch_unwind(|| m.zeros([1], DType::F32));
    let msg = *r.unwrap_err().downcast::<String>().unwrap();
    assert_eq!(
        msg,
        e.to_string(),
        "the panicking twin panics with the error's message"
    );
}

/// Rule 1 (docs/ownership.md): resources of a manager and its subtree close once with it.
#[test]
fn resource_attached_to_a_manager_closes_once() {
    let m = NDManager::new();
    let sub = m.new_sub_manager();
    let closes = Arc::new(AtomicUsize::new(0));
    m.attach_resource(CountClose::new(&closes)).unwrap();
    sub.attach_resource(CountClose::new(&closes)).unwrap();
    let _a = arr(&sub);
    m.close();
    assert_eq!(
        closes.load(Ordering::SeqCst),
        2,
        "sub-manager resources close too"
    );
    m.close();
    sub.close();
    assert_eq!(closes.load(Ordering::SeqCst), 2);
    // A closed manager closes a new resource at once and says so.
    let e = m.attach_resource(CountClose::new(&closes)).unwrap_err();
    assert!(matches!(e, NdError::ManagerClosed { .. }), "{e:?}");
    assert_eq!(closes.load(Ordering::SeqCst), 3);
}

/// Rule 1 (docs/ownership.md): an `NDList` resource closes its arrays with the manager.
#[test]
fn nd_list_attached_to_a_manager_closes_its_arrays() {
    let owner = NDManager::new();
    let holder = NDManager::new();
    let list = NDList::from(vec![arr(&owner), arr(&owner), arr(&owner)]);
    let arrays = list.0.clone();
    assert_eq!(arrays_bytes(&owner), (3, 3 * B));
    holder.attach_resource(list).unwrap();
    holder.close();
    assert!(arrays.iter().all(|a| a.is_closed()));
    assert_eq!(arrays_bytes(&owner), (0, 0));
    owner.close();
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
    let before = arrays_bytes(&m);
    for _ in 0..STEPS {
        let y = x * w;
        let err = y - x;
        let grad = err * x * 2.0;
        w -= grad * 0.01;
    }
    assert_eq!(
        arrays_bytes(&m),
        (
            before.0 + OPS_PER_STEP * STEPS,
            before.1 + OPS_PER_STEP * STEPS * 16
        )
    );
    // The leak report-free way out: close the manager.
    m.close();
    assert_eq!(arrays_bytes(&m), (0, 0));
}
