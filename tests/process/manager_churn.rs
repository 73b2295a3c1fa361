//! docs/ownership.md rule 8: a closed sub-manager is forgotten by its parent at once,
//! however many are created and closed. In this binary, one test at a time, so that no
//! other test (a panic loading debug info, say) disturbs the process's resident memory
//! or the system manager's children.

use crate::common::serial;
use ndscope::{DType, NDManager};

/// Rule 8 (docs/ownership.md): closed sub-managers leave no entry and no memory behind.
#[test]
fn a_hundred_thousand_sub_managers_leave_nothing_behind() {
    let _serial = serial();
    let root = NDManager::new();
    let system_children = NDManager::system().children().len();
    // Warm up so that allocator pools and registry tables reach their working size.
    for _ in 0..1000 {
        let sub = root.new_sub_manager();
        let _a = sub.zeros([4], DType::F32);
        sub.close();
    }
    let rss_before = rss_kib();
    for i in 0..100_000 {
        let sub = root.new_sub_manager();
        if i % 2 == 0 {
            let _a = sub.zeros([4], DType::F32);
        }
        sub.close();
    }
    assert!(root.children().is_empty());
    assert_eq!(root.memory().live_arrays, 0);
    assert_eq!(root.memory().allocations, 51_000);
    assert_eq!(NDManager::system().children().len(), system_children);
    let rss_after = rss_kib();
    if let (Some(b), Some(a)) = (rss_before, rss_after) {
        // Slots of closed managers and arrays are recycled: memory stays flat.
        assert!(a < b + 2 * 1024, "rss grew from {b} KiB to {a} KiB");
    }
    root.close();
}

fn rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
