//! [`scope_async`]: a scope that follows an async task across `.await`s and worker
//! threads, and frees the task's arrays when it completes, is cancelled or panics.
//!
//! ```
//! use ndscope::{DType, NDManager};
//! # fn block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     let mut f = std::pin::pin!(f);
//! #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
//! #     loop {
//! #         if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; }
//! #     }
//! # }
//! let m = NDManager::new();
//! let x = m.ones([3], DType::F32);
//! let request = ndscope::scope_async(async move {
//!     let h = x * 2.0;                  // freed when the task ends
//!     std::future::ready(()).await;     // any await: the task may move to another thread
//!     let out = h.sum();                // returned: escapes to where the task is polled
//!     assert_eq!(ndscope::task_memory().unwrap().live_arrays, 2);
//!     out
//! });
//! let y = block_on(request);            // with tokio: `tokio::spawn(request).await`
//! assert_eq!(y.to_scalar::<f32>()?, 6.0);
//! assert_eq!(m.memory().live_arrays, 2); // x and y; h is gone
//! # Ok::<(), ndscope::NdError>(())
//! ```
//!
//! # Design
//!
//! `NDScope` is thread-bound: arrays register in the innermost scope of the thread that
//! creates them (the thread-local `CURRENT_SCOPE` of the engine), and a scope's record
//! lives in its thread's shard. A future on a multi-threaded executor moves between
//! worker threads at every `.await`, and tasks interleave on one thread, so a guard held
//! across an `.await` would collect other tasks' arrays and be closed on the wrong
//! thread. [`scope_async`] wraps the future instead ([`TaskScope`], a plain `Future`:
//! no executor is involved), and every poll brings the task's scope with it.
//!
//! * **One record per shard.** The task's scope is a set of scope records, one in the
//!   shard of each thread that has polled it, opened on the first poll there (so a
//!   wrapper never polled has none). They are ordinary scope records tagged as the
//!   task's (`TaskTag` in `engine/scopes.rs`: how the task ended, and on the first
//!   record the list of all). The wrapper keeps a small table, per shard: the record,
//!   the task's innermost scope there and the parent last given to the record. Arrays
//!   created during a poll register in the polling thread's record, in its own shard:
//!   the op path stays on its fast path (one lock, the thread's own), and every
//!   thread's chain of open scopes stays within its shard, as for plain scopes. A
//!   record on another shard would make every array creation lock two shards.
//! * **Enter and leave.** A poll reads the thread's current scope (`prev`), makes the
//!   task's innermost scope on this shard current, polls the inner future, and on
//!   return puts `prev` back, remembering what is current then as the task's
//!   innermost scope on this shard. When the poll runs on the same shard as the last
//!   one and the record's parent is already `prev` (the usual case: a worker thread
//!   with no scope of its own), enter is a read of the thread's shard index and one
//!   swap of its current scope, leave one swap, and no lock is taken; otherwise the
//!   record is re-parented to `prev` (one lock of the thread's own shard). `prev`
//!   is kept as that parent, so the guard restores it from there.
//! * **Parent and nesting.** The record's parent is the scope current where the
//!   wrapper is polled (a scope of the polling thread, an enclosing `scope_async`'s
//!   record, or none). Scopes opened during a poll (an `NDScope`, `ndscope::scope(||
//!   ..)`, a nested `scope_async`'s record) nest inside it. One opened and not closed
//!   before the poll returns (an `NDScope` held across an `.await`, possible in a
//!   `!Send` future, which then stays on one thread) stays the task's innermost scope
//!   on that thread: the next poll there resumes it, so arrays created after the
//!   `.await` still go to it and its guard closes it normally; if the task ends
//!   first, it closes with the task. A scope outside the task cannot be closed from
//!   inside a poll (the close is refused with `NdError::Scope`, logged by a guard's
//!   drop), nor can the task's own records be closed except by the task's end.
//! * **Completion.** When the inner future returns `Ready(output)`, the wrapper (still
//!   inside the task's scope) drops the inner future, moves the output's arrays that
//!   are registered in any of the task's records to `prev` (the same [`Escape`] rules
//!   as `ndscope::scope`: one level, arrays created outside the task are left where
//!   they are), closes every record (from its innermost scope up), restores `prev`
//!   and returns the output.
//! * **Cancellation.** Dropping the wrapper before completion enters the task's scope
//!   on the dropping thread (opening a record there if it never polled there), drops
//!   the inner future inside it (its destructors may use ndscope), closes every
//!   record, and restores the thread's scope. It may happen on any thread: closing a
//!   record locks its shard. A wrapper never polled just drops its future.
//! * **Panic.** A drop guard lives across the inner poll; if the poll unwinds, the
//!   guard closes every record as panicked and restores `prev`, and the panic goes
//!   on. The panicked future is dropped later, with the wrapper, outside any task
//!   scope. A resource whose close panics during that unwinding is logged, not
//!   resumed (a second panic would abort).
//! * **Diagnostics.** Each record's tag says how the task ended (set just before the
//!   close); the close records it in each freed array's tombstone, so a later use
//!   says `... was closed by close of the async task scope opened at FILE:LINE
//!   (completed)` (or `cancelled`, `panicked`). [`TaskScope::memory`] and, from inside
//!   the task, [`task_memory`] count the arrays of all the task's records.
//! * **Threads.** `TaskScope<F>` is `Send` when `F` is (it holds only ids), and
//!   `Unpin` when `F` is.
//!
//! An array kept alive past the task's end by a gradient tape and freed by the tape's
//! last hold reports a plain scope close naming the same line.

use crate::diag::MemoryStats;
use crate::engine::{self, ScopeId};
use crate::error::{SourceLocation, TaskEnd};
use crate::{Escape, NDArray};
use smallvec::SmallVec;
use std::future::{Future, IntoFuture};
use std::panic::Location;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Run a future in a scope of its own: arrays created during any of its polls, on
/// whichever thread, are freed when it completes, is dropped (cancelled) or panics.
///
/// On completion its output escapes one level, like the return value of
/// [`crate::scope()`]: into the scope current where the returned future is polled (an
/// enclosing `scope_async`, the thread's scope, or none). Scopes opened inside a poll
/// nest inside the task's scope. A use of an array freed by the task's end says so:
/// `... closed by close of the async task scope opened at FILE:LINE (completed)`.
///
/// This is a plain `Future` wrapper: it works on any executor (tokio, async-std, smol,
/// `block_on`) and is `Send` when `future` is. See the [module docs](crate::task) for
/// how it works.
///
/// ```
/// use ndscope::{DType, NDManager};
/// use std::task::{Context, Poll, Waker};
/// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     let mut f = std::pin::pin!(f);
/// #     let mut cx = Context::from_waker(Waker::noop());
/// #     loop {
/// #         if let Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; }
/// #     }
/// # }
/// let m = NDManager::new();
/// let w = m.ones([4, 4], DType::F32);
/// let (y, t) = block_on(ndscope::scope_async(async {
///     let t = w.matmul(w);
///     let _tmp = t * 2.0;                // freed at completion
///     std::future::ready(()).await;
///     (t.sum(), t)                       // escape
/// }));
/// assert!(!y.is_closed() && !t.is_closed());
/// assert_eq!(m.memory().live_arrays, 3); // w, y, t
///
/// // Dropped before completion: cancelled, and its arrays are freed.
/// let mut task = Box::pin(ndscope::scope_async(async {
///     let _tmp = w * 3.0;
///     std::future::pending::<()>().await
/// }));
/// assert!(task.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending());
/// assert_eq!(task.memory().live_arrays, 1);
/// drop(task);
/// assert_eq!(m.memory().live_arrays, 3);
/// ```
#[track_caller]
pub fn scope_async<F>(future: F) -> TaskScope<F::IntoFuture>
where
    F: IntoFuture,
    F::Output: Escape,
{
    TaskScope {
        fut: Some(future.into_future()),
        task: Task {
            opened_at: Location::caller(),
            slots: SmallVec::new(),
            last: 0,
            end: None,
        },
    }
}

/// The counters of the async task ([`scope_async`]) being polled on this thread: the
/// arrays registered in its scope now, on every thread it ran on (`peak_bytes` is
/// their current bytes; a buffer shared by several counts once). `None` outside a
/// task's poll. Inside nested tasks, the innermost.
pub fn task_memory() -> Option<MemoryStats> {
    let recs = engine::current_task_records()?;
    Some(MemoryStats::from_stats(engine::scopes_stats(&recs)))
}

pin_project_lite::pin_project! {
    /// The future returned by [`scope_async`]: the inner future, run inside a scope
    /// that follows it from poll to poll.
    #[must_use = "futures do nothing unless polled"]
    pub struct TaskScope<F> {
        #[pin]
        fut: Option<F>,
        task: Task,
    }

    impl<F> PinnedDrop for TaskScope<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if this.task.end.is_some() || this.task.slots.is_empty() {
                return; // ended, or never polled: nothing to close
            }
            // Cancelled: drop the inner future inside the task's scope, then close it.
            this.task.enter();
            let guard = Polling { task: this.task, on_unwind: TaskEnd::Cancelled, armed: true };
            let mut fut = this.fut;
            fut.set(None);
            guard.finish(TaskEnd::Cancelled);
        }
    }
}

impl<F> TaskScope<F> {
    /// Counters of the arrays registered in the task's scope now, on every thread it
    /// ran on (zero before the first poll and after the end).
    pub fn memory(&self) -> MemoryStats {
        let recs: SmallVec<[ScopeId; 4]> = self.task.slots.iter().map(|s| s.rec).collect();
        MemoryStats::from_stats(engine::scopes_stats(&recs))
    }

    /// Where `scope_async` was called.
    pub fn opened_at(&self) -> &'static Location<'static> {
        self.task.opened_at
    }

    /// How the task ended (`None` while it runs); after a completion or a panic of a
    /// poll. (A cancelled wrapper is gone.)
    pub fn end(&self) -> Option<TaskEnd> {
        self.task.end
    }
}

impl<F> std::fmt::Debug for TaskScope<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.task.end {
            None => write!(f, "TaskScope(opened at {})", self.task.opened_at),
            Some(end) => write!(f, "TaskScope(opened at {}, {end})", self.task.opened_at),
        }
    }
}

impl<F> Future for TaskScope<F>
where
    F: Future,
    F::Output: Escape,
{
    type Output = F::Output;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        if let Some(end) = this.task.end {
            polled_after(end);
        }
        this.task.enter();
        let guard = Polling {
            task: this.task,
            on_unwind: TaskEnd::Panicked,
            armed: true,
        };
        let mut fut = this.fut;
        let inner = fut
            .as_mut()
            .as_pin_mut()
            .expect("a running task has its future");
        match inner.poll(cx) {
            Poll::Pending => {
                guard.leave();
                Poll::Pending
            }
            Poll::Ready(out) => {
                // Still inside the task's scope: the future's drop may use ndscope.
                fut.set(None);
                let mut arrays = SmallVec::<[NDArray; 4]>::new();
                out.visit_arrays(&mut |a| arrays.push(a));
                guard.escape(&arrays);
                guard.finish(TaskEnd::Completed);
                Poll::Ready(out)
            }
        }
    }
}

#[cold]
#[inline(never)]
fn polled_after(end: TaskEnd) -> ! {
    match end {
        TaskEnd::Panicked => panic!("`scope_async` future polled after it panicked"),
        _ => panic!("`scope_async` future polled after completion"),
    }
}

/// The task's scope, as its wrapper sees it (not generic, so compiled once).
struct Task {
    opened_at: SourceLocation,
    /// One per shard the task was polled on.
    slots: SmallVec<[Slot; 2]>,
    /// The slot of the last poll (looked at first).
    last: usize,
    /// Set when the scope closed.
    end: Option<TaskEnd>,
}

/// The task's scope on one shard.
#[derive(Clone, Copy)]
struct Slot {
    shard: u32,
    /// The record.
    rec: ScopeId,
    /// The task's innermost scope on this shard: `rec`, or a scope opened inside a
    /// poll and left open.
    cur: ScopeId,
    /// The parent last given to `rec`.
    parent: Option<ScopeId>,
}

impl Task {
    /// Make the task's scope current on this thread. The scope it replaces is then the
    /// parent of the current slot's record (`slots[last].parent`), put back on leaving.
    #[inline]
    fn enter(&mut self) {
        let me = engine::this_shard();
        match self.slots.get_mut(self.last) {
            // The usual case: polled on the same thread as last time, where the same
            // scope is current: two thread-local accesses, no lock.
            Some(s) if s.shard == me => {
                let prev = engine::replace_current_scope(Some(s.cur));
                if s.parent != prev {
                    engine::set_task_parent(s.rec, prev);
                    s.parent = prev;
                }
            }
            _ => self.enter_slow(me),
        }
    }

    /// `enter` on another shard than the last poll's (or the first poll).
    #[cold]
    fn enter_slow(&mut self, me: u32) {
        let prev = engine::current_scope();
        let i = self.slot_for(me, prev);
        self.last = i;
        let s = &mut self.slots[i];
        if s.parent != prev {
            engine::set_task_parent(s.rec, prev);
            s.parent = prev;
        }
        engine::replace_current_scope(Some(s.cur));
    }

    /// The slot of shard `me`, opening a record there on the first poll.
    #[cold]
    fn slot_for(&mut self, me: u32, prev: Option<ScopeId>) -> usize {
        if let Some(i) = self.slots.iter().position(|s| s.shard == me) {
            return i;
        }
        let primary = self.slots.first().map(|s| s.rec);
        let rec = engine::open_task_record(self.opened_at, prev, primary);
        self.slots.push(Slot {
            shard: me,
            rec,
            cur: rec,
            parent: prev,
        });
        self.slots.len() - 1
    }
}

/// A poll (or a cancellation) in progress: inside the task's scope until `leave` or
/// `finish`; dropped without either (an unwinding panic), it closes the scope.
struct Polling<'a> {
    task: &'a mut Task,
    on_unwind: TaskEnd,
    /// Cleared by `leave` and `finish`: a guard dropped armed is unwinding.
    armed: bool,
}

impl Polling<'_> {
    /// The poll returns `Pending`: put the thread's scope back.
    #[inline]
    fn leave(mut self) {
        self.armed = false;
        let last = self.task.last;
        let s = &mut self.task.slots[last];
        s.cur = engine::replace_current_scope(s.parent).unwrap_or(s.rec);
    }

    /// Move the output's arrays registered in the task's scope to the scope it
    /// replaced on this thread.
    fn escape(&self, arrays: &[NDArray]) {
        if arrays.is_empty() {
            return;
        }
        let recs: SmallVec<[ScopeId; 4]> = self.task.slots.iter().map(|s| s.rec).collect();
        let prev = self.task.slots[self.task.last].parent;
        for a in arrays {
            // A closed array in the output is tolerated, as by `ndscope::scope`.
            let _ = engine::task_escape(&recs, prev, a.id);
        }
    }

    /// Close the task's scope, recording `end`, and put the thread's scope back.
    fn finish(mut self, end: TaskEnd) {
        self.armed = false;
        let resources = self.close(end);
        engine::close_resources(resources);
    }

    fn close(&mut self, end: TaskEnd) -> Vec<Box<dyn engine::Resource>> {
        let task = &mut *self.task;
        // The innermost scope now, on this thread's slot (a poll may have left one open).
        let now = engine::current_scope();
        let last = task.last;
        let prev = task.slots[last].parent;
        let parts: SmallVec<[(ScopeId, ScopeId); 4]> = task
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| {
                (
                    s.rec,
                    if i == last {
                        now.unwrap_or(s.rec)
                    } else {
                        s.cur
                    },
                )
            })
            .collect();
        let resources = engine::close_task(&parts, end);
        engine::replace_current_scope(prev);
        task.slots.clear();
        task.end = Some(end);
        resources
    }
}

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Unwinding from the poll (or from the future's drop, or `visit_arrays`).
        let resources = self.close(self.on_unwind);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine::close_resources(resources)
        }));
        if r.is_err() {
            log::error!("ndscope: a resource of an async task's scope panicked while closing");
        }
    }
}
