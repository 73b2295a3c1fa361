//! Accounting (docs/ownership.md) that a test can check on its own managers while other
//! tests run: leak reports by source line, `LeakWatch`, profiles of this thread's ops,
//! the manager tree dump. (The process-wide counters, peaks and leak checks are in
//! `tests/process/accounting.rs`.)

use ndscope::{DType, LeakWatch, NDManager, NDScope, profile};

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

/// Accounting (docs/ownership.md): the leak report names the line that leaks.
#[test]
fn the_djl_training_loop_leak_is_pinned_to_its_line() {
    let m = NDManager::new();
    m.set_name("trainer");
    let w = m.random_normal(0.0, 0.01, [2, 1], DType::F32);
    let grad = m.ones([2, 1], DType::F32);
    let lr = 0.03;
    let mut watch = LeakWatch::new(&m);
    let mut warnings = 0;
    let leak_line = line!() + 3;
    for _ in 0..1000 {
        // As in DJL before NDScope: `grad * lr` is owned by the long-lived manager.
        let step = grad * lr;
        w.try_subi(step).unwrap();
        warnings += watch.check().is_some() as usize;
    }
    let report = m.leak_report();
    let top = &report.sites[0];
    assert_eq!(top.count, 1000);
    assert_eq!(top.location, format!("{}:{leak_line}:20", file!()));
    assert_eq!(top.bytes, 1000 * 8);
    assert_eq!(top.manager, "trainer");
    assert!(warnings >= 1, "LeakWatch reported the growth");
    assert!(report.to_string().contains(&top.location));

    // The same loop with a scope: nothing grows, nothing is reported.
    let m2 = NDManager::new();
    let w2 = m2.zeros([2, 1], DType::F32);
    let g2 = m2.ones([2, 1], DType::F32);
    let mut watch = LeakWatch::new(&m2);
    let mut warnings = 0;
    for _ in 0..1000 {
        let _s = NDScope::new();
        w2.try_subi(g2 * lr).unwrap();
        warnings += watch.check().is_some() as usize;
    }
    assert_eq!(warnings, 0);
    assert_eq!(m2.leak_report().total_arrays(), 2);
    m.close();
    m2.close();
}

/// Accounting (docs/ownership.md): profiles nest and survive a panic.
#[test]
fn profile_survives_a_panic_and_nests() {
    let m = NDManager::new();
    let x = m.ones([4], DType::F32);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        profile(|| {
            let _ = x + 1.0;
            panic!("boom")
        })
    }));
    assert!(r.is_err());
    let (_, outer) = profile(|| {
        let (_, inner) = profile(|| x * 2.0);
        assert_eq!(inner.ops.len(), 1);
        x - 1.0
    });
    assert_eq!(
        outer.ops.len(),
        2,
        "the outer profile sees the inner ops too"
    );
    assert_eq!(outer.ops[0].name, "mul");
    assert_eq!(outer.ops[1].name, "sub");
    m.close();
}

/// Accounting (docs/ownership.md): `debug_dump` shows the tree, counts, bytes and caps.
#[test]
fn debug_dump_shows_tree_counts_and_bytes() {
    let m = NDManager::new();
    m.set_name("root-dump");
    let s = m.new_sub_manager();
    s.set_name("child");
    let _a = s.zeros([100], DType::F64);
    s.cap();
    let d = m.debug_dump();
    assert!(
        d.contains("root-dump: 0 arrays here, subtree 1 arrays / 1 buffers / 800 B"),
        "{d}"
    );
    assert!(d.contains("  child [capped]: 1 arrays here"), "{d}");
    m.close();
}
