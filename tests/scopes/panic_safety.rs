//! Panic safety wherever a closure runs user code (issue 7.5): `scope`, `profile`,
//! `Escape` impls and `Resource::close`. After a caught panic the library keeps working
//! on that thread and on others, with counters at their baseline.
//!
//! Tests run in parallel threads of one process, so counters are taken from a manager
//! each test created (`m.memory()`, `common::counts`).

use crate::common::counts;
use ndscope::{DType, Escape, NDArray, NDManager, NDScope, Resource};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::time::Duration;

fn quiet<R>(f: impl FnOnce() -> R) -> std::thread::Result<R> {
    catch_unwind(AssertUnwindSafe(f))
}

/// Rule 9 and Accounting (docs/ownership.md): a panic inside `profile` frees the scope's
/// arrays and leaves profiling working.
#[test]
fn panic_inside_profile_restores_profiling() {
    let m = NDManager::new();
    let x = m.ones([4], DType::F32);
    let before = counts(&m);
    let r = quiet(|| {
        ndscope::profile(|| {
            let _s = NDScope::new();
            let _t = x * 2.0;
            let _u = ndscope::scope(|| x + 1.0);
            panic!("boom in profile");
        })
    });
    assert!(r.is_err());
    assert_eq!(counts(&m), before, "the scope inside freed its arrays");
    // Profiling works on this thread: one op recorded, counted once.
    let (y, p) = ndscope::profile(|| x.square());
    assert_eq!(p.ops.len(), 1);
    assert_eq!(p.ops[0].name, "square");
    // (`new_arrays` is process-wide: other tests run meanwhile, so it is not checked.)
    let _ = p.new_arrays;
    y.close();
    // A panic inside a nested profile: the outer one still sees the inner ops.
    let ((), outer) = ndscope::profile(|| {
        let r = quiet(|| {
            ndscope::profile(|| {
                let _s = NDScope::new();
                let _a = x.exp();
                panic!("inner");
            })
        });
        assert!(r.is_err());
        let _s = NDScope::new();
        let _b = x.sqrt();
    });
    let names: Vec<_> = outer.ops.iter().map(|o| o.name).collect();
    assert_eq!(names, ["exp", "sqrt"]);
    assert_eq!(counts(&m), before);
    m.close();
}

/// Rule 9 (docs/ownership.md): a panic through a scope on one thread frees its arrays;
/// other threads keep working.
#[test]
fn panic_inside_scope_inside_another_thread_leaves_others_working() {
    let m = NDManager::new();
    let w = m.ones([8], DType::F32);
    let before = counts(&m);
    std::thread::scope(|s| {
        let bad = s.spawn(|| {
            let _outer = NDScope::new();
            let _a = w * 3.0;
            let _: () = ndscope::scope(|| {
                let _b = w + 1.0;
                panic!("worker failed");
            });
        });
        let good = s.spawn(|| {
            for _ in 0..200 {
                let _s = NDScope::new();
                let _c = (w * 2.0).sum();
            }
        });
        assert!(bad.join().is_err());
        good.join().unwrap();
    });
    assert_eq!(counts(&m), before);
    // This thread too: scopes and profiles work.
    let y = ndscope::scope(|| w * 2.0);
    assert_eq!(y.ref_count(), 0);
    y.close();
    assert_eq!(counts(&m), before);
    m.close();
}

/// A resource whose close panics, attached to a scope and a manager.
struct Bomb;

impl Resource for Bomb {
    fn close(&mut self) {
        panic!("resource close failed");
    }
}

/// Counts its closes.
struct Counted(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Resource for Counted {
    fn close(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Rules 1 and 3 (docs/ownership.md): arrays are freed before resources close, even when
/// one panics.
#[test]
fn panicking_resource_close_frees_arrays_first() {
    let parent = NDManager::new();
    let m = parent.new_sub_manager();
    let x = m.ones([2], DType::F32);
    let r = quiet(|| {
        let s = NDScope::new();
        s.attach_resource(Bomb);
        let _t = x * 2.0;
        drop(s);
    });
    assert!(r.is_err());
    assert_eq!(
        counts(&m),
        (1, 1, 8),
        "the scope's arrays were freed before its resources"
    );
    m.attach_resource(Bomb).unwrap();
    let closed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    m.attach_resource(Counted(closed.clone())).unwrap();
    m.attach_resource(Bomb).unwrap();
    let r = quiet(|| m.close());
    assert!(r.is_err());
    assert_eq!(
        closed.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "a panicking resource does not stop the others from closing"
    );
    assert!(x.is_closed() && !m.is_open());
    assert_eq!(counts(&parent), (0, 0, 0));
    // The library still works on this thread.
    let y = ndscope::scope(|| parent.ones([2], DType::F32) + 1.0);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0; 2]);
    parent.close();
}

/// A user `Escape` impl that panics while `scope` collects the returned arrays.
struct PanickyReturn(NDArray);

impl Escape for PanickyReturn {
    fn visit_arrays(&self, f: &mut dyn FnMut(NDArray)) {
        f(self.0);
        panic!("visit failed");
    }
}

/// Rules 9 and 11 (docs/ownership.md): a panicking `Escape` impl still frees the scope.
#[test]
fn panicking_escape_impl_frees_the_scope() {
    let m = NDManager::new();
    let x = m.ones([2], DType::F32);
    let before = counts(&m);
    let r = quiet(|| ndscope::scope(|| PanickyReturn(x * 2.0)));
    assert!(r.is_err());
    assert_eq!(counts(&m), before);
    let y = ndscope::scope(|| x * 3.0);
    assert!(!y.is_closed());
    m.close();
}

/// A user `Escape` impl that uses the library (here: skips closed arrays) must not
/// deadlock: user code never runs under the engine lock.
struct CheckingReturn(NDArray);

impl Escape for CheckingReturn {
    fn visit_arrays(&self, f: &mut dyn FnMut(NDArray)) {
        if !self.0.is_closed() {
            f(self.0);
        }
    }
}

/// Rule 11 (docs/ownership.md): `visit_arrays` runs outside the engine lock.
#[test]
fn escape_impl_may_use_the_library() {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let m = NDManager::new();
        let x = m.ones([2], DType::F32);
        let r = ndscope::scope(|| CheckingReturn(x * 2.0));
        tx.send(r.0.is_closed()).unwrap();
        m.close();
    });
    let closed = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("deadlock: Escape::visit_arrays ran under the engine lock");
    assert!(!closed, "the returned array escaped");
}
