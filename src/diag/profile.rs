//! [`profile`]: what one closure allocated, and one record per op it ran (like
//! TensorFlow.js `tf.profile`).

use super::human_bytes;
pub use crate::engine::oplog::OpRecord;
use crate::engine::{self, oplog};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// What [`profile`] measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    /// Live arrays at the end minus live arrays at the start (process-wide).
    pub new_arrays: i64,
    /// Live bytes at the end minus live bytes at the start.
    pub new_bytes: i64,
    /// Highest live bytes during the closure minus live bytes at its start.
    pub peak_bytes: usize,
    /// Ops run on this thread inside the closure, in order.
    pub ops: Vec<OpRecord>,
}

/// Restores the thread's profiling state and the process peak even if the closure
/// panics.
struct Window {
    saved_peak: Vec<usize>,
    start_bytes: usize,
    finished: bool,
    done: Option<(usize, Vec<OpRecord>)>,
}

impl Window {
    fn finish(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let peak = engine::end_peak_window(&self.saved_peak);
        let ops = oplog::end();
        self.done = Some((peak.saturating_sub(self.start_bytes), ops));
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Run `f` and measure it: new arrays and bytes, peak bytes, and each op it ran.
///
/// Counters are process-wide (arrays created by other threads meanwhile count too);
/// op records are this thread's.
///
/// ```
/// use ndscope::{DType, NDManager};
/// let m = NDManager::new();
/// let x = m.ones([2, 2], DType::F32);
/// let (y, p) = ndscope::profile(|| x.square() + 1.0);
/// assert_eq!(p.ops.len(), 2);
/// assert_eq!(p.ops[0].name, "square");
/// assert_eq!(p.new_arrays, 2); // the square and the sum are both still live
/// # let _ = y;
/// ```
pub fn profile<R>(f: impl FnOnce() -> R) -> (R, Profile) {
    let (start_arrays, start_bytes, saved_peak) = {
        let saved = engine::begin_peak_window();
        let s = engine::stats(engine::SYSTEM).expect("system");
        (s.arrays, s.bytes, saved)
    };
    oplog::begin();
    let mut window = Window {
        saved_peak,
        start_bytes,
        finished: false,
        done: None,
    };
    let r = f();
    window.finish();
    let (peak_bytes, ops) = window.done.take().expect("finished");
    let s = engine::stats(engine::SYSTEM).expect("system");
    let p = Profile {
        new_arrays: s.arrays as i64 - start_arrays as i64,
        new_bytes: s.bytes as i64 - start_bytes as i64,
        peak_bytes,
        ops,
    };
    (r, p)
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "new arrays {}, new bytes {}, peak bytes {}",
            self.new_arrays,
            self.new_bytes,
            human_bytes(self.peak_bytes)
        )?;
        writeln!(
            f,
            "{:<14} {:<28} {:<14} {:>10} {:>10}",
            "op", "inputs", "output", "bytes", "time"
        )?;
        for r in &self.ops {
            let inputs: Vec<String> = r.input_shapes.iter().map(|s| s.to_string()).collect();
            writeln!(
                f,
                "{:<14} {:<28} {:<14} {:>10} {:>10.1?}",
                r.name,
                inputs.join(" "),
                r.output_shape.to_string(),
                human_bytes(r.bytes_added),
                r.duration
            )?;
        }
        let mut summary: BTreeMap<&str, (usize, Duration, usize)> = BTreeMap::new();
        for r in &self.ops {
            let e = summary.entry(r.name).or_default();
            e.0 += 1;
            e.1 += r.duration;
            e.2 += r.bytes_added;
        }
        writeln!(
            f,
            "per op: {:<8} {:>6} {:>12} {:>10}",
            "", "count", "total time", "bytes"
        )?;
        for (name, (count, time, bytes)) in summary {
            writeln!(
                f,
                "        {name:<8} {count:>6} {:>12.1?} {:>10}",
                time,
                human_bytes(bytes)
            )?;
        }
        Ok(())
    }
}
