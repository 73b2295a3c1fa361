//! Diagnostics (issue: use-after-close forensics, leak reports by source line, memory
//! accounting, profiles). Every test holds `GLOBAL`: several read process-wide counters
//! or reports, and tests in one binary run in parallel.

use ndscope::{
    CloseReason, DType, LeakWatch, NDManager, NDScope, NdError, assert_no_leaks, check_leaks,
    memory, profile,
};
use std::sync::Mutex;

static GLOBAL: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    GLOBAL.lock().unwrap_or_else(|e| e.into_inner())
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
    let _g = lock();
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
    let _g = lock();
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

/// Accounting (docs/ownership.md): the leak report names the line that leaks.
#[test]
fn the_djl_training_loop_leak_is_pinned_to_its_line() {
    let _g = lock();
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

/// Accounting (docs/ownership.md): `profile` counts as `tf.profile` does.
#[test]
fn profile_matches_the_tfjs_test() {
    let _g = lock();
    // tf.profile(() => { x = [1,2,3]; x2 = x.square(); x2.dispose(); x2 = x.square();
    // x2.dispose(); return x }): newTensors 1, newBytes 12, peakBytes 24, 2 kernels.
    let m = NDManager::new();
    let (x, p) = profile(|| {
        let x = m.create(&[1.0f32, 2.0, 3.0], [3]);
        let x2 = x.square();
        x2.close();
        let x2 = x.square();
        x2.close();
        x
    });
    assert_eq!(p.new_arrays, 1);
    assert_eq!(p.new_bytes, 12);
    assert_eq!(p.peak_bytes, 24);
    assert_eq!(p.ops.len(), 2);
    for op in &p.ops {
        assert_eq!(op.name, "square");
        assert_eq!(op.input_shapes, vec![ndscope::Shape::from([3])]);
        assert_eq!(op.output_shape, ndscope::Shape::from([3]));
        assert_eq!(op.bytes_added, 12);
    }
    let table = p.to_string();
    assert!(table.contains("square"), "{table}");
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    m.close();
}

/// Accounting (docs/ownership.md): profiles nest and survive a panic.
#[test]
fn profile_survives_a_panic_and_nests() {
    let _g = lock();
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

/// Accounting and rule 6 (docs/ownership.md): views share a buffer; peaks reset.
#[test]
fn memory_stats_display_and_peak_reset() {
    let _g = lock();
    let base = memory();
    let m = NDManager::new();
    let a = m.zeros([1024], DType::U8);
    let st = m.memory();
    assert_eq!(
        (st.live_arrays, st.live_buffers, st.live_bytes),
        (1, 1, 1024)
    );
    let v = a.reshape([32, 32]);
    assert_eq!(m.memory().live_buffers, 1, "views share a buffer");
    assert_eq!(m.memory().live_arrays, 2);
    a.close();
    v.close();
    assert_eq!(m.memory().live_bytes, 0);
    assert_eq!(m.memory().peak_bytes, 1024);
    ndscope::reset_peak();
    assert_eq!(m.memory().peak_bytes, 0);
    let text = memory().to_string();
    assert!(
        text.contains("arrays") && text.contains("live") && text.contains("peak"),
        "{text}"
    );
    m.close();
    assert_no_leaks(&base);
}

/// Accounting (docs/ownership.md): `check_leaks` and `assert_no_leaks` compare with a
/// baseline.
#[test]
fn check_leaks_reports_what_is_left() {
    let _g = lock();
    let base = memory();
    let m = NDManager::new();
    let (_a, line) = (m.zeros([16], DType::F32), line!());
    let report = check_leaks(&base).unwrap_err();
    let top_line = report.sites[0]
        .location
        .split(':')
        .nth(1)
        .map(str::to_owned);
    assert_eq!(top_line, Some(line.to_string()));
    let r = std::panic::catch_unwind(|| assert_no_leaks(&base));
    assert!(r.is_err());
    m.close();
    assert!(check_leaks(&base).is_ok());
}

/// Accounting (docs/ownership.md): `debug_dump` shows the tree, counts, bytes and caps.
#[test]
fn debug_dump_shows_tree_counts_and_bytes() {
    let _g = lock();
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
