//! Rule 8 (docs/ownership.md): a capped manager takes no new arrays, while its
//! sub-managers keep working. (That closed sub-managers leave nothing behind, however
//! many, is `tests/process/manager_churn.rs`: it counts the system manager's children.)

use ndscope::{DType, NDManager, NdError};

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
