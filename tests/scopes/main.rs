//! The ownership model of docs/ownership.md, one module per rule (the rules are
//! numbered there; each test's doc comment names the rules it checks, and the table at
//! the end of docs/ownership.md lists the tests of each rule), plus panic safety and the
//! per-manager accounting, in one test binary (each test binary links gemm and rayon).
//! Many tests are ports: of DJL's `NDScopeTest` (`djl_nd_scope`, the training loops),
//! of TensorFlow.js's `tf.tidy` tests (doc comments quoting "tfjs ..."), and of JavaCPP's
//! `PointerScopeTest` and DJL's `RCObject` tests (rules 3 and 5).
//!
//! Tests run in parallel threads of one process, so every count is taken from a manager
//! the test created itself (`m.memory()`), never the process-wide counters (those tests
//! are in `tests/process`). Tests that read close details or churn through thousands of
//! arrays take `common::serial()`, as insurance that no churn recycles the details a
//! test reads (the engine keeps those of the last 4,096 frees of each thread's shard).

#[path = "../common/mod.rs"]
mod common;

mod accounting;
mod panic_safety;
mod rule01_owners;
mod rule02_moves;
mod rule03_scopes;
mod rule04_escape;
mod rule05_refcounts;
mod rule06_views_and_tapes;
mod rule07_errors;
mod rule08_caps;
mod rule09_threads;
mod rule10_hot_paths;
mod rule11_scope_returns;

use ndscope::{CountingAllocator, DType, NDArray, NDManager, Resource};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts each thread's allocations, for rule 10's tests (`rule10_hot_paths.rs`).
#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

/// Bytes of a `[4]` f32 array.
const B: usize = 16;

fn arr(m: &NDManager) -> NDArray {
    m.zeros([4], DType::F32)
}

/// Bytes of a `[3]` f32 array (`tf.tensor1d([1, 2, 3])`).
const T1D: usize = 3 * 4;

fn tensor1d(m: &NDManager, v: [f32; 3]) -> NDArray {
    m.create(&v, [3])
}

/// Counts its closes; remembers whether `watched` was already freed when it closed.
struct CountClose {
    closes: Arc<AtomicUsize>,
    watched: Option<NDArray>,
    watched_was_closed: Arc<AtomicUsize>,
}

impl CountClose {
    fn new(closes: &Arc<AtomicUsize>) -> Self {
        CountClose {
            closes: closes.clone(),
            watched: None,
            watched_was_closed: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Resource for CountClose {
    fn close(&mut self) {
        self.closes.fetch_add(1, Ordering::SeqCst);
        if self.watched.is_some_and(|a| a.is_closed()) {
            self.watched_was_closed.fetch_add(1, Ordering::SeqCst);
        }
    }
}
