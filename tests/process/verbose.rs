//! Verbose mode records backtraces at creation and close. In this binary, one test at a
//! time, because the switch is process-wide.

use crate::common::serial;
use ndscope::{DType, NDManager, NDScope, NdError};

/// Rule 7 (docs/ownership.md): verbose mode adds backtraces of the creation and the close.
#[test]
fn verbose_mode_adds_two_backtraces() {
    let _serial = serial();
    ndscope::config::set_verbose(true);
    assert!(ndscope::config::verbose());
    let m = NDManager::new();
    let x = m.ones([2], DType::F32);
    let t = {
        let _s = NDScope::new();
        x + 1.0
    };
    let e = t.try_mul(2.0).unwrap_err();
    let NdError::Closed(info) = &e else {
        panic!("{e:?}")
    };
    let created = info
        .created_backtrace
        .as_deref()
        .expect("creation backtrace");
    let closed = info.closed_backtrace.as_deref().expect("close backtrace");
    assert!(
        created.contains("verbose_mode_adds_two_backtraces"),
        "{created}"
    );
    assert!(
        closed.contains("verbose_mode_adds_two_backtraces"),
        "{closed}"
    );
    let msg = e.to_string();
    assert!(msg.contains("--- created at ---") && msg.contains("--- closed at ---"));
    ndscope::config::set_verbose(false);
    let u = x * 3.0;
    u.close();
    let NdError::Closed(info) = u.try_exp().unwrap_err() else {
        panic!()
    };
    assert!(info.created_backtrace.is_none() && info.closed_backtrace.is_none());
    m.close();
}
