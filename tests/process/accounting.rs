//! Accounting (docs/ownership.md) read process-wide: `ndscope::memory()`, the process
//! peak reset, `check_leaks`/`assert_no_leaks` against a baseline, and `profile`'s new
//! arrays and bytes. One test at a time (`common::serial()`), as every test of this
//! binary.

use crate::common::serial;
use ndscope::{DType, NDManager, assert_no_leaks, check_leaks, memory, profile};

/// Accounting (docs/ownership.md): `profile` counts as `tf.profile` does.
#[test]
fn profile_matches_the_tfjs_test() {
    let _serial = serial();
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

/// Accounting and rule 6 (docs/ownership.md): views share a buffer; peaks reset.
#[test]
fn memory_stats_display_and_peak_reset() {
    let _serial = serial();
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
    let _serial = serial();
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
