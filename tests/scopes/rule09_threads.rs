//! Rule 9 (docs/ownership.md): scopes belong to a thread and close in LIFO order (an
//! outer close closes the inner ones); a panic unwinding through a scope frees its arrays
//! and leaves the thread's scope stack consistent; arrays and managers are `Send + Sync`
//! and shared between threads (and the "Threads" section: reads never see a torn
//! in-place write).

use crate::T1D;
use crate::common::arrays_bytes;
use ndscope::{DType, NDArray, NDManager, NDScope};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Rule 9 (docs/ownership.md).
/// Dropping an outer guard first closes the inner scopes too; dropping the inner guard
/// afterwards does nothing.
#[test]
fn dropping_the_outer_scope_first_closes_the_inner_ones() {
    let m = NDManager::new();
    let outer = NDScope::new();
    let a = m.ones([3], DType::F32);
    let inner = NDScope::new();
    let b = m.ones([3], DType::F32);
    let innermost = NDScope::new();
    let c = m.ones([3], DType::F32);
    assert_eq!(arrays_bytes(&m), (3, 3 * T1D));
    drop(outer);
    assert!(a.is_closed() && b.is_closed() && c.is_closed());
    assert!(!inner.is_open() && !innermost.is_open());
    assert_eq!(arrays_bytes(&m), (0, 0));
    drop(inner);
    drop(innermost);
    // The thread has no open scope left: new arrays are registered nowhere.
    let d = m.ones([3], DType::F32);
    assert_eq!(d.ref_count(), 0);
    let later = NDScope::new();
    let e = m.ones([3], DType::F32);
    assert_eq!(later.arrays(), vec![e]);
    drop(later);
    assert!(e.is_closed() && !d.is_closed());
    assert_eq!(arrays_bytes(&m), (1, T1D));
    m.close();
}

/// Rule 9 (docs/ownership.md): explicit closes in and out of LIFO order.
#[test]
fn explicit_close_in_and_out_of_order() {
    let m = NDManager::new();
    let outer = NDScope::new();
    let a = m.ones([3], DType::F32);
    let inner = NDScope::new();
    let b = m.ones([3], DType::F32);
    assert!(inner.is_open());
    inner.close();
    assert!(b.is_closed() && !a.is_closed());
    // The outer scope is the innermost again.
    let c = m.ones([3], DType::F32);
    assert_eq!(outer.arrays(), vec![a, c]);
    let inner2 = NDScope::new();
    let d = m.ones([3], DType::F32);
    assert!(format!("{inner2:?}").contains("opened at"));
    outer.close();
    assert!(a.is_closed() && c.is_closed() && d.is_closed());
    assert!(!inner2.is_open());
    assert_eq!(format!("{inner2:?}"), "NDScope(closed)");
    assert!(inner2.opened_at().is_none());
    inner2.close();
    assert_eq!(arrays_bytes(&m), (0, 0));
    m.close();
}

/// Rule 9 (docs/ownership.md): a panic through `scope` frees its arrays and keeps the scope
/// stack consistent.
#[test]
fn panic_inside_tidy_frees_its_arrays_and_keeps_the_stack_consistent() {
    let m = NDManager::new();
    let x = m.ones([2, 2], DType::F32);
    let outer = NDScope::new();
    let before = arrays_bytes(&m);
    let r = catch_unwind(AssertUnwindSafe(|| {
        let _: () = ndscope::scope(|| {
            let t = x * 2.0;
            let _u = ndscope::scope(|| t + 1.0);
            assert_eq!(arrays_bytes(&m), (before.0 + 2, before.1 + 2 * 16));
            panic!("boom");
        });
    }));
    assert!(r.is_err());
    assert_eq!(arrays_bytes(&m), before);
    assert!(outer.arrays().is_empty());

    // The outer scope is the innermost one again, and scopes work normally.
    let y = ndscope::scope(|| {
        let _junk = x * 3.0;
        x + 1.0
    });
    assert_eq!(outer.arrays(), vec![y]);
    assert_eq!(y.ref_count(), 1);
    let z = x - 1.0;
    assert_eq!(outer.arrays(), vec![y, z]);
    drop(outer);
    assert!(y.is_closed() && z.is_closed());
    assert_eq!(arrays_bytes(&m), (1, 16));
    m.close();
}

/// Rule 9 (docs/ownership.md): a panic through nested guards frees their arrays.
#[test]
fn panic_through_nested_guards_without_an_outer_scope() {
    let m = NDManager::new();
    let (mut a, mut b) = (None, None);
    let r = catch_unwind(AssertUnwindSafe(|| {
        let _s1 = NDScope::new();
        a = Some(m.ones([4], DType::F64));
        let _s2 = NDScope::new();
        b = Some(m.ones([4], DType::F64));
        let _s3 = NDScope::new();
        assert_eq!(arrays_bytes(&m), (2, 2 * 32));
        panic!("boom");
    }));
    assert!(r.is_err());
    assert!(a.unwrap().is_closed() && b.unwrap().is_closed());
    assert_eq!(arrays_bytes(&m), (0, 0));
    // No scope is open on this thread any more.
    let c = m.ones([4], DType::F64);
    assert_eq!(c.ref_count(), 0);
    {
        let s = NDScope::new();
        let d = c * 2.0;
        assert_eq!(s.arrays(), vec![d]);
    }
    assert_eq!(arrays_bytes(&m), (1, 32));
    m.close();
}

/// Rule 9 (docs/ownership.md): a thread that panics inside a scope frees its arrays.
#[test]
fn a_thread_that_panics_inside_a_scope_frees_its_arrays() {
    let m = NDManager::new();
    let x = m.ones([8], DType::F32);
    let joined = std::thread::scope(|t| {
        t.spawn(|| {
            let _s = NDScope::new();
            let _a = x * 2.0;
            let _b = m.zeros([8], DType::F32);
            panic!("worker failed");
        })
        .join()
    });
    assert!(joined.is_err());
    assert_eq!(arrays_bytes(&m), (1, 32));
    m.close();
}

/// Rules 3 and 9 (docs/ownership.md).
/// An array created on thread B while thread A has a scope open is not registered in
/// A's scope; B's own scope frees only B's arrays.
#[test]
fn scopes_are_per_thread() {
    let m = NDManager::new();
    let s = NDScope::new();
    let a = m.ones([3], DType::F32);
    let (b, c) = std::thread::scope(|t| {
        t.spawn(|| {
            let b = m.ones([3], DType::F32);
            assert_eq!(b.ref_count(), 0, "no scope is open on this thread");
            let c;
            {
                let sb = NDScope::new();
                c = b + a;
                assert_eq!(sb.arrays(), vec![c]);
            }
            (b, c)
        })
        .join()
        .unwrap()
    });
    assert!(c.is_closed());
    assert_eq!(s.arrays(), vec![a]);
    assert_eq!(b.ref_count(), 0);
    drop(s);
    assert!(a.is_closed() && !b.is_closed());
    assert_eq!(arrays_bytes(&m), (1, 12));
    m.close();
}

/// Rules 5 and 9 (docs/ownership.md).
/// A retained array crosses threads: created in a scope on one thread, used and
/// released on another.
#[test]
fn retained_array_handed_to_another_thread() {
    let m = NDManager::new();
    let a = ndscope::scope(|| {
        let a = m.create(&[1.0f32, 2.0], [2]);
        a.retain();
        a
    });
    assert_eq!(a.ref_count(), 1);
    let freed = std::thread::spawn(move || {
        assert_eq!((a * 2.0).to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
        a.release()
    })
    .join()
    .unwrap();
    // `a * 2.0` was created on the worker thread with no scope: it is still live.
    assert!(freed && a.is_closed());
    assert_eq!(arrays_bytes(&m).0, 1);
    m.close();
    assert_eq!(arrays_bytes(&m), (0, 0));
}

/// Rules 4, 8 and 9 (docs/ownership.md).
/// Four threads run scoped loops on one shared manager at once; every count returns
/// to its baseline. A large input exercises ops computed outside the engine lock while
/// other threads update their parameters in place.
#[test]
fn threads_share_a_manager_with_scoped_loops() {
    const THREADS: usize = 4;
    const STEPS: usize = 300;
    let m = NDManager::new();
    let x = m.create(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let big = m.ones([40_000], DType::F32);
    let before = arrays_bytes(&m);
    let params: Vec<NDArray> = std::thread::scope(|t| {
        let handles: Vec<_> = (0..THREADS)
            .map(|k| {
                let m = &m;
                t.spawn(move || {
                    let sub = m.new_sub_manager();
                    let mut w = sub.zeros([2, 2], DType::F32);
                    for step in 0..STEPS {
                        let _s = NDScope::new();
                        let grad = ndscope::scope(|| {
                            let y = x * w + 1.0;
                            (y - x) * 0.5
                        });
                        w -= grad * 0.01;
                        if step % 50 == k {
                            let s = ndscope::scope(|| (big + big) * 0.5);
                            assert_eq!(s.size(), 40_000);
                        }
                        if step % 100 == 0 {
                            // Nested scope with an escape in the middle of the loop.
                            let inner = NDScope::new();
                            let e = inner.escape(x + w);
                            drop(inner);
                            assert!(!e.is_closed());
                        }
                    }
                    w.keep()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Only each thread's parameter is left (in its sub-manager).
    assert_eq!(
        arrays_bytes(&m),
        (before.0 + THREADS, before.1 + THREADS * 16)
    );
    // Every thread ran the same computation: the parameters agree exactly.
    let first = params[0].to_vec::<f32>().unwrap();
    assert_eq!(first[0], 0.0, "x = 1 is a fixed point of the update");
    assert!(first[1..].iter().all(|&p| p > 0.0), "{first:?}");
    for w in &params {
        assert_eq!(w.to_vec::<f32>().unwrap(), first);
        w.manager().close();
    }
    assert_eq!(arrays_bytes(&m), before);
    assert_eq!(m.children().len(), 0, "closed sub-managers are forgotten");
    m.close();
    assert_eq!(arrays_bytes(&m), (0, 0));
}

fn assert_send_sync<T: Send + Sync>() {}

/// Rule 9 (docs/ownership.md): `NDArray` and `NDManager` are `Send + Sync`.
#[test]
fn handles_are_send_and_sync() {
    assert_send_sync::<NDArray>();
    assert_send_sync::<NDManager>();
}

/// Rules 1 and 9 (docs/ownership.md): threads share a manager, each with its own scopes,
/// and send arrays back.
#[test]
fn shared_manager_used_by_many_threads() {
    let m = NDManager::new();
    let w = m.ones([4, 4], DType::F32);
    std::thread::scope(|s| {
        for t in 0..4 {
            let m = m.clone();
            s.spawn(move || {
                let local = m.new_sub_manager();
                for i in 0..2000 {
                    let _scope = NDScope::new();
                    let x = local.full([4, 4], (t * i) as f64, DType::F32);
                    let y = (x * w + 1.0) / 2.0;
                    assert_eq!(y.manager(), local);
                }
                assert_eq!(local.memory().live_arrays, 0);
                // An array created here and sent back to the parent thread.
                local.full([2], t as f64, DType::F32).attach(&m)
            });
        }
    });
    // 1 (w) + 4 arrays sent back by the threads.
    assert_eq!(m.memory().live_arrays, 5);
    assert!(m.children().is_empty() || m.children().iter().all(|c| c.memory().live_arrays == 0));
    m.close();
    assert_eq!(m.memory().live_arrays, 0);
}

/// Threads (docs/ownership.md): a read concurrent with in-place writes sees one consistent
/// state.
#[test]
fn concurrent_large_reads_and_in_place_writes() {
    // Large ops read outside the engine lock; in-place writers must wait for them.
    let m = NDManager::new();
    let n = 1 << 18;
    let src = m.ones([n], DType::F32);
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            for _ in 0..20 {
                let _scope = NDScope::new();
                let v = (src + 0.0).to_vec::<f32>().unwrap();
                // Every element read in one op comes from one consistent state.
                assert!(v.iter().all(|&x| x == v[0]), "torn read");
            }
        });
        let writer = s.spawn(|| {
            let mut t = src;
            for _ in 0..20 {
                t += 1.0;
            }
        });
        reader.join().unwrap();
        writer.join().unwrap();
    });
    assert_eq!(src.to_vec::<f32>().unwrap()[n - 1], 21.0);
    m.close();
}
