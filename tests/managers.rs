//! The manager tree: docs/ownership.md rules 1 (one owner, recursive close, system never
//! closed) and 8 (cap, closed sub-managers forgotten at once).

use ndscope::{CloseReason, DType, NDManager, NdError};

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

/// Accounting (docs/ownership.md): `debug_dump` shows the manager tree with its counts.
#[test]
fn parent_name_and_tree_dump() {
    let m = NDManager::new();
    m.set_name("model");
    let sub = m.new_sub_manager();
    sub.set_name("layer1");
    assert_eq!(sub.parent(), Some(m.clone()));
    assert_eq!(m.parent(), Some(NDManager::system()));
    assert_eq!(NDManager::system().parent(), None);
    let _a = sub.zeros([256], DType::F32);
    let dump = m.debug_dump();
    assert!(
        dump.contains("model: 0 arrays here, subtree 1 arrays"),
        "{dump}"
    );
    assert!(dump.contains("  layer1: 1 arrays here"), "{dump}");
    m.close();
    assert_eq!(m.name(), "model", "the name is kept after close");
    assert!(m.debug_dump().contains("closed"));
}

/// Rule 8 (docs/ownership.md): a capped manager takes no new arrays; its sub-managers work.
#[test]
fn capped_manager_refuses_new_arrays_but_sub_managers_work() {
    let m = NDManager::new();
    let a = m.ones([2], DType::F32);
    m.cap();
    assert!(m.is_capped());
    assert!(matches!(
        m.try_zeros([2], DType::F32),
        Err(NdError::ManagerCapped { .. })
    ));
    // An op whose first input lives in a capped manager cannot create its result there.
    assert!(matches!(a.try_add(1.0), Err(NdError::ManagerCapped { .. })));
    let other = NDManager::new();
    let b = other.ones([2], DType::F32);
    assert!(matches!(
        b.try_attach(&m),
        Err(NdError::ManagerCapped { .. })
    ));
    let sub = m.new_sub_manager();
    let c = sub.ones([2], DType::F32);
    assert_eq!((c + a).to_vec::<f32>().unwrap(), vec![2.0, 2.0]);
    assert_eq!(m.memory().live_arrays, 3);
    m.close();
    other.close();
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
