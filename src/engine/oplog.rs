//! The op log behind `ndscope::profile`: while a profiling window is open on a thread,
//! the op path logs one [`OpRecord`] per op that thread runs. `diag::profile` opens and
//! closes the windows and adds the memory figures; windows nest, and an inner window's
//! ops are seen by the outer ones too.

use crate::Shape;
use std::cell::{Cell, RefCell};
use std::time::Duration;

thread_local! {
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    static RECORDS: RefCell<Vec<Vec<OpRecord>>> = const { RefCell::new(Vec::new()) };
}

/// One op run inside [`crate::profile()`].
#[derive(Clone, Debug, PartialEq)]
pub struct OpRecord {
    /// The op's name (`"add"`, `"matmul"`, ...).
    pub name: &'static str,
    /// Shapes of its array inputs.
    pub input_shapes: Vec<Shape>,
    /// Shape of its result.
    pub output_shape: Shape,
    /// Bytes of new buffer it allocated (0 for views).
    pub bytes_added: usize,
    /// Wall time of the op.
    pub duration: Duration,
}

/// Whether a [`crate::profile()`] window is open on this thread.
#[inline]
pub(crate) fn active() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

/// Log one op in the innermost open window of this thread.
pub(crate) fn record(r: OpRecord) {
    RECORDS.with(|rs| {
        if let Some(top) = rs.borrow_mut().last_mut() {
            top.push(r);
        }
    });
}

/// Open a window on this thread.
pub(crate) fn begin() {
    RECORDS.with(|rs| rs.borrow_mut().push(Vec::new()));
    DEPTH.with(|d| d.set(d.get() + 1));
}

/// Close this thread's innermost window and return its ops; the enclosing window (if
/// any) keeps them too.
pub(crate) fn end() -> Vec<OpRecord> {
    let ops = RECORDS.with(|rs| rs.borrow_mut().pop().unwrap_or_default());
    RECORDS.with(|rs| {
        if let Some(outer) = rs.borrow_mut().last_mut() {
            outer.extend(ops.iter().cloned());
        }
    });
    DEPTH.with(|d| d.set(d.get() - 1));
    ops
}
