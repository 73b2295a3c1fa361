//! `ndscope::scope_async`: scopes that follow async tasks across `.await`s and worker
//! threads (issue 13). Tokio runtimes, and a hand-written executor where a test must
//! control which thread polls.
//!
//! Every test takes `common::serial()` (as every test of this binary), so the process-wide
//! counters (`ndscope::memory()`) can be compared with their value before the test: they
//! are back at baseline after each.

use crate::common::{Serial, expect_panic, serial};
use ndscope::{CloseReason, DType, NDArray, NDManager, NDScope, NdError, TaskEnd};
use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Process-wide live (arrays, bytes).
fn live() -> (usize, usize) {
    let s = ndscope::memory();
    (s.live_arrays, s.live_bytes)
}

/// Checks at the end of a test that nothing created during it is left.
struct Baseline {
    before: (usize, usize),
    _serial: Serial,
}

fn baseline() -> Baseline {
    let serial = serial();
    Baseline {
        before: live(),
        _serial: serial,
    }
}

impl Baseline {
    /// Close `m` and check the process counters are back where they were.
    fn check(self, m: NDManager) {
        m.close();
        assert_eq!(live(), self.before, "process counters back at baseline");
    }
}

fn multi_thread(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Poll once with a no-op waker.
fn poll_once<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

/// A future that is pending once, then ready (no runtime needed).
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

fn yield_once() -> YieldOnce {
    YieldOnce(false)
}

/// Run a future (Send or not) to completion on this thread, polling in a loop.
fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = poll_once(f.as_mut()) {
            return v;
        }
    }
}

fn closed_info(a: NDArray) -> (CloseReason, String) {
    let e = a.try_sum().unwrap_err();
    let reason = e
        .close_reason()
        .cloned()
        .expect("a Closed error with details");
    (reason, e.to_string())
}

fn assert_send<T: Send>(_: &T) {}

/// Issue 13's first test: a task yielding hundreds of times on a 4-worker runtime,
/// creating arrays between yields (with 8 such tasks and timers in the mix, they move
/// between workers): every array is freed at completion, the output survives.
#[test]
fn tasks_migrating_across_four_workers_free_everything_at_completion() {
    let base = baseline();
    let m = NDManager::new();
    let rt = multi_thread(4);
    let w = m.ones([8], DType::F32);
    let threads = Arc::new(Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let m = m.clone();
            let threads = threads.clone();
            rt.spawn(ndscope::scope_async(async move {
                let mut seen = HashSet::new();
                let mut acc = m.zeros([8], DType::F32);
                for i in 0..300 {
                    seen.insert(std::thread::current().id());
                    let next = acc + w * (i as f32); // a new array each step
                    acc = next;
                    let _tmp = acc.exp();
                    // 3 arrays per step, all still registered in the task's scope.
                    if i % 10 == 0 {
                        let mem = ndscope::task_memory().expect("inside a task");
                        assert_eq!(mem.live_arrays, 1 + 3 * (i + 1));
                    }
                    if i % 50 == t {
                        tokio::time::sleep(Duration::from_micros(200)).await;
                    } else {
                        tokio::task::yield_now().await;
                    }
                }
                threads.lock().unwrap().push(seen.len());
                acc.sum()
            }))
        })
        .collect();
    let outs: Vec<NDArray> = rt.block_on(async {
        let mut v = Vec::new();
        for h in handles {
            v.push(h.await.unwrap());
        }
        v
    });
    // The outputs escaped into no scope (worker threads have none): only they and `w`.
    assert_eq!(m.memory().live_arrays, 1 + 8);
    let expected: f32 = 8.0 * (0..300).sum::<i32>() as f32;
    for o in &outs {
        assert_eq!(o.to_scalar::<f32>().unwrap(), expected);
    }
    let seen = threads.lock().unwrap().clone();
    let moved = seen.iter().filter(|&&n| n > 1).count();
    eprintln!("threads seen per task: {seen:?} ({moved} of 8 tasks moved)");
    drop(rt);
    base.check(m);
}

type Job = Pin<Box<dyn Future<Output = (NDArray, NDArray)> + Send>>;

/// The same with migration forced: four long-lived threads poll one task in turn (a
/// hand-made executor), so its arrays are made in four shards; all land in the task's
/// scope and die at completion, on the thread of the last poll.
#[test]
fn a_task_polled_by_four_threads_in_turn() {
    let base = baseline();
    let m = NDManager::new();
    let w = m.ones([4], DType::F32);
    let m2 = m.clone();
    let task = ndscope::scope_async(async move {
        let mut kept = Vec::new();
        let mut acc = m2.zeros([4], DType::F32);
        for i in 0..200 {
            let t = w * (i as f32);
            let next = acc + t; // a new array each step
            acc = next;
            kept.push(t);
            yield_once().await;
        }
        (acc, kept[0])
    });
    assert_send(&task);
    // Each worker polls what it receives once and sends it back with the result.
    let (back_tx, back_rx) = mpsc::channel::<(Job, Option<(NDArray, NDArray)>)>();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (tx, rx) = mpsc::channel::<Job>();
            let back = back_tx.clone();
            let h = std::thread::spawn(move || {
                for mut job in rx {
                    let r = match poll_once(job.as_mut()) {
                        Poll::Ready(v) => Some(v),
                        Poll::Pending => None,
                    };
                    back.send((job, r)).unwrap();
                }
            });
            (tx, h)
        })
        .collect();
    let mut job: Job = Box::pin(task);
    let mut polls = 0;
    let (acc, first) = loop {
        workers[polls % 4].0.send(job).unwrap();
        let (j, r) = back_rx.recv().unwrap();
        job = j;
        polls += 1;
        if let Some(v) = r {
            break v;
        }
    };
    assert_eq!(polls, 201);
    drop(job);
    for (tx, h) in workers {
        drop(tx);
        h.join().unwrap();
    }
    assert_eq!(m.memory().live_arrays, 3); // w, acc, first
    assert_eq!(acc.to_vec::<f32>().unwrap(), vec![19900.0; 4]);
    assert_eq!(first.to_vec::<f32>().unwrap(), vec![0.0; 4]);
    base.check(m);
}

/// Memory of a task migrating across threads, through its handle, mid-way.
#[test]
fn memory_of_a_task_across_threads() {
    let base = baseline();
    let m = NDManager::new();
    let m2 = m.clone();
    let mut task = Box::pin(ndscope::scope_async(async move {
        for _ in 0..4 {
            let _a = m2.zeros([2], DType::F32);
            yield_once().await;
        }
    }));
    for _ in 0..4 {
        task = std::thread::spawn(move || {
            assert!(poll_once(task.as_mut()).is_pending());
            task
        })
        .join()
        .unwrap();
    }
    assert_eq!(task.memory().live_arrays, 4);
    assert_eq!(task.memory().live_bytes, 32);
    assert!(poll_once(task.as_mut()).is_ready());
    assert_eq!(m.memory().live_arrays, 0);
    base.check(m);
}

/// Two tasks interleaved on one thread (a current-thread runtime): each scope holds and
/// frees exactly its own arrays.
#[test]
fn two_interleaved_tasks_on_a_current_thread_runtime_free_their_own_arrays() {
    let base = baseline();
    let m1 = NDManager::new();
    let m2 = NDManager::new();
    let rt = current_thread();
    let order = Arc::new(Mutex::new(Vec::new()));
    let task = |m: NDManager, tag: u8, steps: usize| {
        let order = order.clone();
        ndscope::scope_async(async move {
            for i in 0..steps {
                order.lock().unwrap().push(tag);
                let _a = m.full([2], i as f64, DType::F64);
                let _b = m.zeros([3], DType::F32);
                // Exactly this task's arrays: 2 per step, none of the other task's.
                let mem = ndscope::task_memory().unwrap();
                assert_eq!(mem.live_arrays, 2 * (i + 1));
                assert_eq!(mem.live_bytes, (2 * 8 + 3 * 4) * (i + 1));
                assert_eq!(m.memory().live_arrays, 2 * (i + 1));
                tokio::task::yield_now().await;
            }
            m.memory().live_arrays
        })
    };
    let (n1, n2) = rt.block_on(async {
        let h1 = tokio::spawn(task(m1.clone(), 1, 50));
        let h2 = tokio::spawn(task(m2.clone(), 2, 80));
        (h1.await.unwrap(), h2.await.unwrap())
    });
    assert_eq!((n1, n2), (100, 160));
    let order = order.lock().unwrap();
    let switches = order.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(
        switches >= 50,
        "the tasks interleaved ({switches} switches)"
    );
    assert_eq!(m1.memory().live_arrays, 0);
    assert_eq!(m2.memory().live_arrays, 0);
    drop(rt);
    m1.close();
    base.check(m2);
}

/// Two tasks in one `join!` (polled by one task, so strictly alternating), one ending
/// early: the other's arrays survive its end.
#[test]
fn one_interleaved_task_ending_leaves_the_other_alone() {
    let base = baseline();
    let m = NDManager::new();
    let rt = current_thread();
    let (short_arrays, long_arrays) = rt.block_on(async {
        let short = ndscope::scope_async(async {
            let a = m.zeros([1], DType::F32);
            tokio::task::yield_now().await;
            vec![a.keep()] // `keep`: out of every scope, so it survives; checked below
        });
        let long = ndscope::scope_async(async {
            let mut v = Vec::new();
            for _ in 0..5 {
                v.push(m.ones([1], DType::F32));
                tokio::task::yield_now().await;
            }
            // `short` ended long ago: this task's arrays are all alive.
            assert!(v.iter().all(|a| !a.is_closed()));
            assert_eq!(ndscope::task_memory().unwrap().live_arrays, 5);
            v
        });
        tokio::join!(short, long)
    });
    assert!(short_arrays.iter().all(|a| !a.is_closed()));
    assert!(long_arrays.iter().all(|a| !a.is_closed()), "escaped output");
    assert_eq!(m.memory().live_arrays, 6);
    drop(rt);
    base.check(m);
}

/// Cancellation by `tokio::time::timeout`: the dropped task's arrays are freed, and a
/// use of one says the task's scope was cancelled.
#[test]
fn cancelled_by_a_timeout() {
    let base = baseline();
    let m = NDManager::new();
    let rt = multi_thread(2);
    let (tx, rx) = mpsc::channel();
    let task = ndscope::scope_async({
        let m = m.clone();
        async move {
            let a = m.ones([16], DType::F32);
            tx.send(a).unwrap();
            let _b = a * 2.0;
            tokio::time::sleep(Duration::from_secs(3600)).await;
            a
        }
    });
    let at = task.opened_at();
    let r = rt.block_on(async { tokio::time::timeout(Duration::from_millis(20), task).await });
    assert!(r.is_err(), "timed out");
    let a = rx.recv().unwrap();
    assert!(a.is_closed());
    assert_eq!(m.memory().live_arrays, 0);
    let (reason, msg) = closed_info(a);
    assert_eq!(
        reason,
        CloseReason::TaskScopeClose {
            opened_at: at,
            end: TaskEnd::Cancelled
        }
    );
    assert!(
        msg.contains(&format!(
            "was closed by close of the async task scope opened at {at} (cancelled)"
        )),
        "{msg}"
    );
    drop(rt);
    base.check(m);
}

/// Cancellation by `JoinHandle::abort` of a spawned task on a multi-threaded runtime
/// (the task is dropped by a worker thread).
#[test]
fn cancelled_by_join_handle_abort() {
    let base = baseline();
    let m = NDManager::new();
    let rt = multi_thread(4);
    let (tx, rx) = mpsc::channel();
    let handle = rt.spawn(ndscope::scope_async({
        let m = m.clone();
        async move {
            let mut made = Vec::new();
            for _ in 0..10 {
                made.push(m.zeros([4, 4], DType::F64));
                tokio::task::yield_now().await;
            }
            tx.send(made.clone()).unwrap();
            std::future::pending::<()>().await;
        }
    }));
    let made = rx.recv().unwrap();
    assert_eq!(m.memory().live_arrays, 10);
    handle.abort();
    let err = rt.block_on(handle).unwrap_err();
    assert!(err.is_cancelled());
    assert!(made.iter().all(|a| a.is_closed()));
    assert_eq!(m.memory().live_arrays, 0);
    let (reason, _) = closed_info(made[0]);
    assert!(matches!(
        reason,
        CloseReason::TaskScopeClose {
            end: TaskEnd::Cancelled,
            ..
        }
    ));
    drop(rt);
    base.check(m);
}

/// A panic inside a poll closes the task's scope (as panicked), propagates, and leaves
/// the polling thread's own scope current and working.
#[test]
fn a_panic_inside_a_poll_frees_the_task_and_restores_the_thread_scope() {
    let base = baseline();
    let m = NDManager::new();
    let (tx, rx) = mpsc::channel();
    let outer = NDScope::new();
    let before = m.zeros([1], DType::F32);
    let mut task = Box::pin(ndscope::scope_async({
        let m = m.clone();
        async move {
            let a = m.ones([3], DType::F32);
            tx.send(a).unwrap();
            yield_once().await;
            let _b = m.ones([3], DType::F32);
            // Inner scopes still open at the panic unwind first.
            let _s = NDScope::new();
            let c = m.ones([3], DType::F32);
            if !c.is_closed() {
                panic!("boom in a poll");
            }
        }
    }));
    let at = task.opened_at();
    assert!(poll_once(task.as_mut()).is_pending());
    let msg = expect_panic(|| {
        let _ = poll_once(task.as_mut());
    });
    assert_eq!(msg, "boom in a poll");
    assert_eq!(task.end(), Some(TaskEnd::Panicked));
    let a = rx.recv().unwrap();
    assert!(a.is_closed());
    let (reason, msg) = closed_info(a);
    assert_eq!(
        reason,
        CloseReason::TaskScopeClose {
            opened_at: at,
            end: TaskEnd::Panicked
        }
    );
    assert!(msg.contains("(panicked)"), "{msg}");
    // Polling again is a clear panic.
    let msg = expect_panic(|| {
        let _ = poll_once(task.as_mut());
    });
    assert!(msg.contains("polled after it panicked"), "{msg}");
    drop(task);
    // The thread's scope is current again: a new array registers in `outer`.
    let after = m.zeros([1], DType::F32);
    assert_eq!(outer.arrays(), vec![before, after]);
    assert_eq!(m.memory().live_arrays, 2);
    drop(outer);
    assert_eq!(m.memory().live_arrays, 0);
    base.check(m);
}

/// A panic in a spawned task on a multi-threaded runtime: the JoinHandle reports it, the
/// arrays are freed, and the worker goes on serving other tasks.
#[test]
fn a_panicking_spawned_task_frees_its_arrays() {
    let base = baseline();
    let m = NDManager::new();
    let rt = multi_thread(2);
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let results: Vec<_> = rt.block_on(async {
        let hs: Vec<_> = (0..16)
            .map(|i| {
                let m = m.clone();
                tokio::spawn(ndscope::scope_async(async move {
                    let a = m.ones([4], DType::F32);
                    tokio::task::yield_now().await;
                    let b = a * 2.0;
                    if i % 2 == 0 {
                        panic!("request {i} failed");
                    }
                    b.sum()
                }))
            })
            .collect();
        let mut v = Vec::new();
        for h in hs {
            v.push(h.await);
        }
        v
    });
    std::panic::set_hook(hook);
    assert_eq!(results.iter().filter(|r| r.is_err()).count(), 8);
    for r in results.iter().flatten() {
        assert_eq!(r.to_scalar::<f32>().unwrap(), 8.0);
    }
    assert_eq!(m.memory().live_arrays, 8, "only the 8 outputs");
    drop(rt);
    base.check(m);
}

/// Nested `scope_async`: the inner task's output escapes into the outer task's scope,
/// the outer's into the caller's scope; each frees its own temporaries.
#[test]
fn nested_scope_async() {
    let base = baseline();
    let m = NDManager::new();
    let rt = multi_thread(2);
    let (tx, rx) = mpsc::channel();
    let (at_tx, at_rx) = mpsc::channel();
    let out = rt.block_on({
        let m = m.clone();
        async move {
            ndscope::scope_async(async move {
                let a = m.ones([2], DType::F32);
                let inner = ndscope::scope_async(async {
                    let b = a + 1.0;
                    tokio::task::yield_now().await;
                    let c = b * 2.0;
                    assert_eq!(ndscope::task_memory().unwrap().live_arrays, 2);
                    tx.send(b).unwrap();
                    c
                });
                at_tx.send(inner.opened_at()).unwrap();
                let c = inner.await;
                // `c` escaped into this task: a and c are here, b is gone.
                assert_eq!(ndscope::task_memory().unwrap().live_arrays, 2);
                tokio::task::yield_now().await;
                c + a
            })
            .await
        }
    });
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![5.0, 5.0]);
    let b = rx.recv().unwrap();
    let (reason, _) = closed_info(b);
    assert_eq!(
        reason,
        CloseReason::TaskScopeClose {
            opened_at: at_rx.recv().unwrap(),
            end: TaskEnd::Completed
        }
    );
    assert_eq!(m.memory().live_arrays, 1, "only the outer output");
    drop(rt);
    base.check(m);
}

/// Nested tasks with the inner one cancelled inside the outer (a `select!`-style race
/// lost), and the outer then completing.
#[test]
fn nested_task_cancelled_inside_its_parent() {
    let base = baseline();
    let m = NDManager::new();
    let rt = current_thread();
    let (tx, rx) = mpsc::channel();
    let out = rt.block_on(ndscope::scope_async({
        let m = m.clone();
        async move {
            let slow = ndscope::scope_async(async {
                let x = m.zeros([5], DType::F32);
                tx.send(x).unwrap();
                tokio::time::sleep(Duration::from_secs(3600)).await;
                x
            });
            let r = tokio::time::timeout(Duration::from_millis(5), slow).await;
            assert!(r.is_err());
            assert_eq!(ndscope::task_memory().unwrap().live_arrays, 0);
            m.ones([1], DType::F32)
        }
    }));
    let x = rx.recv().unwrap();
    let (reason, _) = closed_info(x);
    assert!(matches!(
        reason,
        CloseReason::TaskScopeClose {
            end: TaskEnd::Cancelled,
            ..
        }
    ));
    assert!(!out.is_closed());
    assert_eq!(m.memory().live_arrays, 1);
    drop(rt);
    base.check(m);
}

/// The output escapes one level: into the scope current where the task is polled
/// (here the test's `NDScope`), with the same rules as `ndscope::scope`: arrays made
/// outside the task are left where they are, closed ones are tolerated, plain values
/// pass through, nested containers are searched.
#[test]
fn completion_escapes_the_output_into_the_pollers_scope() {
    let base = baseline();
    let m = NDManager::new();
    let outside = m.zeros([1], DType::F32); // in no scope
    let s = NDScope::new();
    let (v, (x, n), closed, same) = block_on(ndscope::scope_async(async {
        let v = vec![m.ones([2], DType::F32), m.ones([3], DType::F32)];
        yield_once().await;
        let x = m.zeros([4], DType::F32);
        let closed = m.zeros([1], DType::F32);
        closed.close();
        let _tmp = x + 1.0;
        (v, (Some(x), 7), closed, outside)
    }));
    assert_eq!(n, 7);
    assert!(closed.is_closed());
    let x = x.unwrap();
    let mut in_s = s.arrays();
    in_s.sort_by_key(|a| a.uid());
    let mut expect = vec![v[0], v[1], x];
    expect.sort_by_key(|a| a.uid());
    assert_eq!(
        in_s, expect,
        "the output is registered in the poller's scope"
    );
    assert_eq!(same, outside);
    assert_eq!(outside.ref_count(), 0, "left where it was: no scope");
    drop(s);
    assert!(v.iter().all(|a| a.is_closed()) && x.is_closed());
    assert!(!outside.is_closed());
    base.check(m);
}

/// Sync scopes inside a poll nest inside the task's scope: `ndscope::scope` returns
/// into the task, an `NDScope` guard frees its own arrays.
#[test]
fn sync_scopes_inside_a_poll() {
    let base = baseline();
    let m = NDManager::new();
    let rt = multi_thread(2);
    let out = rt.block_on(ndscope::scope_async({
        let m = m.clone();
        async move {
            let w = m.ones([3], DType::F32);
            tokio::task::yield_now().await;
            let y = ndscope::scope(|| {
                let t = w * 3.0; // freed by the sync scope
                t + 1.0 // escapes into the task's scope
            });
            assert_eq!(ndscope::task_memory().unwrap().live_arrays, 2);
            {
                let g = NDScope::new();
                let _z = y * 2.0;
                assert_eq!(g.memory().live_arrays, 1);
                assert_eq!(ndscope::task_memory().unwrap().live_arrays, 2);
            }
            tokio::task::yield_now().await;
            y.sum()
        }
    }));
    assert_eq!(out.to_scalar::<f32>().unwrap(), 12.0);
    assert_eq!(m.memory().live_arrays, 1);
    drop(rt);
    base.check(m);
}

/// An `NDScope` held across an `.await` (a `!Send` future, so it stays on one thread)
/// stays the task's innermost scope: arrays made after the `.await` go to it, even with
/// another task interleaved on the thread, and its guard closes it normally. Cancelled
/// with such a guard alive, the guard's drop runs inside the task and closes it too.
#[test]
fn a_guard_held_across_an_await_in_a_local_task() {
    let base = baseline();
    let m = NDManager::new();
    let rt = current_thread();
    let (r1, r2) = rt.block_on(async {
        let holder = ndscope::scope_async(async {
            let g = NDScope::new();
            let a = m.zeros([1], DType::F32);
            tokio::task::yield_now().await;
            let b = m.zeros([1], DType::F32);
            assert_eq!(g.arrays(), vec![a, b]);
            tokio::task::yield_now().await;
            drop(g);
            assert!(a.is_closed() && b.is_closed());
            let c = m.zeros([1], DType::F32);
            assert_eq!(ndscope::task_memory().unwrap().live_arrays, 1);
            c
        });
        let other = ndscope::scope_async(async {
            let mut v = Vec::new();
            for _ in 0..3 {
                v.push(m.ones([1], DType::F32));
                assert_eq!(ndscope::task_memory().unwrap().live_arrays, v.len());
                tokio::task::yield_now().await;
            }
            v.len()
        });
        tokio::join!(holder, other)
    });
    assert!(!r1.is_closed());
    assert_eq!(r2, 3);
    assert_eq!(m.memory().live_arrays, 1);
    r1.close();

    // Cancelled while the guard is alive.
    let (tx, rx) = mpsc::channel();
    let mut task = Box::pin(ndscope::scope_async(async {
        let _g = NDScope::new();
        tx.send(m.zeros([2], DType::F32)).unwrap();
        std::future::pending::<()>().await;
    }));
    assert!(poll_once(task.as_mut()).is_pending());
    let thread_scope = NDScope::new();
    drop(task);
    let a = rx.recv().unwrap();
    assert!(a.is_closed());
    // The guard closed its scope (a plain scope close), inside the task.
    assert!(matches!(closed_info(a).0, CloseReason::ScopeClose { .. }));
    let b = m.zeros([1], DType::F32);
    assert_eq!(thread_scope.arrays(), vec![b]);
    drop(thread_scope);
    drop(rt);
    base.check(m);
}

/// Dropped on another thread than the ones that polled it: the scope's records are
/// closed from there.
#[test]
fn cancelled_from_another_thread() {
    let base = baseline();
    let m = NDManager::new();
    let (tx, rx) = mpsc::channel();
    let mut task = Box::pin(ndscope::scope_async({
        let m = m.clone();
        async move {
            tx.send(m.zeros([64], DType::F32)).unwrap();
            yield_once().await;
            std::future::pending::<()>().await;
        }
    }));
    assert!(poll_once(task.as_mut()).is_pending());
    let t = std::thread::spawn(move || {
        assert!(poll_once(task.as_mut()).is_pending());
        task
    })
    .join()
    .unwrap();
    assert_eq!(m.memory().live_arrays, 1);
    std::thread::spawn(move || drop(t)).join().unwrap();
    assert!(rx.recv().unwrap().is_closed());
    assert_eq!(m.memory().live_arrays, 0);
    base.check(m);
}

/// The diagnostics test: a use after completion names the task's `scope_async`
/// line and says it completed; the creating line is named too.
#[test]
fn use_after_close_after_completion_names_the_task() {
    let base = baseline();
    let m = NDManager::new();
    let (tx, rx) = mpsc::channel();
    let task = ndscope::scope_async(async {
        let created = std::panic::Location::caller();
        let t = m.ones([2, 3], DType::F32);
        tx.send((t, created)).unwrap();
        yield_once().await;
    });
    let at = task.opened_at();
    assert_eq!(at.file(), file!());
    block_on(task);
    let (t, _) = rx.recv().unwrap();
    let err = t.try_add(1.0).unwrap_err();
    let NdError::Closed(info) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(info.closed_at, None);
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "use of a closed array: array #{} f32[2, 3]",
            t.uid()
        )),
        "{msg}"
    );
    assert!(
        msg.contains(&format!(
            "was closed by close of the async task scope opened at {at} (completed)"
        )),
        "{msg}"
    );
    assert!(!msg.contains("guard dropped"), "{msg}");
    // The panicking form says exactly the same.
    let p = expect_panic(|| {
        let _ = t + 1.0;
    });
    assert_eq!(p, msg);
    base.check(m);
}

/// `task_memory()` is `None` outside a task; `TaskScope::memory()` counts the task's
/// arrays on every thread it ran on; the wrapper is `Send` for a `Send` future.
#[test]
fn memory_of_a_task_and_send() {
    let base = baseline();
    let m = NDManager::new();
    assert!(ndscope::task_memory().is_none());
    let m2 = m.clone();
    let mut task = Box::pin(ndscope::scope_async(async move {
        let _a = m2.zeros([10], DType::F32);
        yield_once().await;
        let _b = m2.zeros([5], DType::F64);
        yield_once().await;
    }));
    assert_eq!(task.memory().live_arrays, 0, "not polled yet");
    assert_eq!(task.end(), None);
    assert!(poll_once(task.as_mut()).is_pending());
    let mut task = std::thread::spawn(move || {
        assert!(poll_once(task.as_mut()).is_pending());
        task
    })
    .join()
    .unwrap();
    let mem = task.memory();
    assert_eq!((mem.live_arrays, mem.live_bytes), (2, 40 + 40));
    assert!(format!("{task:?}").starts_with("TaskScope(opened at "));
    assert!(poll_once(task.as_mut()).is_ready());
    assert_eq!(task.end(), Some(TaskEnd::Completed));
    assert_eq!(task.memory().live_arrays, 0);
    let msg = expect_panic(|| {
        let _ = poll_once(task.as_mut());
    });
    assert!(msg.contains("polled after completion"), "{msg}");
    drop(task);
    assert!(ndscope::task_memory().is_none());
    base.check(m);
}

/// A never-polled task dropped: nothing to close, nothing leaks; closing a scope opened
/// outside the task from inside it is refused (logged), not a corruption.
#[test]
fn never_polled_and_closing_an_outer_scope_from_inside() {
    let base = baseline();
    let m = NDManager::new();
    let t = ndscope::scope_async(async { m.zeros([1], DType::F32) });
    drop(t);
    assert_eq!(m.memory().live_arrays, 0);

    // On a thread of its own: the refused scope stays open on that thread.
    let m2 = m.clone();
    std::thread::spawn(move || {
        let outer = NDScope::new();
        let out = block_on(ndscope::scope_async(async move {
            let a = m2.zeros([1], DType::F32);
            drop(outer); // refused: `outer` is outside the task
            yield_once().await;
            assert!(!a.is_closed());
            a.sum()
        }));
        assert!(!out.is_closed());
        out.close();
    })
    .join()
    .unwrap();
    assert_eq!(m.memory().live_arrays, 0);
    base.check(m);
}

/// The output escapes into the scope current at the *completing* poll: a task polled
/// inside one scope, then on another thread in none, then inside a second scope, lands
/// in the second; the first scope's close between polls does not touch the task.
#[test]
fn output_escapes_where_the_completing_poll_runs() {
    let base = baseline();
    let m = NDManager::new();
    let m2 = m.clone();
    let mut task = Box::pin(ndscope::scope_async(async move {
        let a = m2.zeros([3], DType::F32);
        yield_once().await;
        let _b = m2.zeros([3], DType::F32);
        yield_once().await;
        a
    }));
    let s1 = NDScope::new();
    assert!(poll_once(task.as_mut()).is_pending());
    assert!(
        s1.arrays().is_empty(),
        "the task's arrays are in its own scope"
    );
    drop(s1);
    assert_eq!(task.memory().live_arrays, 1);
    let unscoped = m.zeros([1], DType::F32); // the thread's scope is none again
    assert_eq!(unscoped.ref_count(), 0);
    let mut task = std::thread::spawn(move || {
        assert!(poll_once(task.as_mut()).is_pending());
        task
    })
    .join()
    .unwrap();
    let s2 = NDScope::new();
    let Poll::Ready(a) = poll_once(task.as_mut()) else {
        panic!("ready")
    };
    assert_eq!(s2.arrays(), vec![a]);
    assert_eq!(m.memory().live_arrays, 2); // a, unscoped
    drop(s2);
    assert!(a.is_closed());
    base.check(m);
}
