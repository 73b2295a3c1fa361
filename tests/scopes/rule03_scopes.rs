//! Rule 3 (docs/ownership.md): a scope registers what is created on its thread while it
//! is the innermost open one, whatever the manager, and frees it on close (then closes
//! its resources); older arrays are untouched.

use crate::common::{arrays_bytes, serial};
use crate::{B, CountClose, T1D, arr, tensor1d};
use ndscope::{DType, NDManager, NDScope, Resource};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Rule 3 (docs/ownership.md): a scope frees what was created while it was innermost.
#[test]
fn nested_scopes_free_what_they_hold() {
    let m = NDManager::new();
    let outer = NDScope::new();
    let a = arr(&m);
    let (b, c);
    {
        let inner = NDScope::new();
        b = arr(&m);
        c = a + b;
        assert_eq!(inner.arrays(), vec![b, c]);
        assert_eq!(outer.arrays(), vec![a]);
        assert_eq!(arrays_bytes(&m), (3, 3 * B));
        assert_eq!(inner.memory().live_arrays, 2);
        assert_eq!(inner.memory().live_bytes, 2 * B);
    }
    assert!(b.is_closed() && c.is_closed() && !a.is_closed());
    assert_eq!(arrays_bytes(&m), (1, B));
    drop(outer);
    assert!(a.is_closed());
    assert_eq!(arrays_bytes(&m), (0, 0));
}

/// Rule 3 (docs/ownership.md): arrays created outside every scope are registered nowhere.
#[test]
fn arrays_created_outside_every_scope_are_untouched() {
    let m = NDManager::new();
    let a = arr(&m);
    let b = arr(&m);
    for _ in 0..3 {
        let s = NDScope::new();
        let t = a + b;
        assert_eq!(s.arrays(), vec![t]);
        assert_eq!(arrays_bytes(&m), (3, 3 * B));
    }
    ndscope::scope(|| {
        let _ = a * b;
    });
    assert_eq!(a.ref_count(), 0);
    assert_eq!(b.ref_count(), 0);
    assert_eq!(arrays_bytes(&m), (2, 2 * B));
    m.close();
    assert_eq!(arrays_bytes(&m), (0, 0));
}

/// Rule 3 (docs/ownership.md).
/// tfjs "basic usage without return".
#[test]
fn tidy_without_a_return_value() {
    let m = NDManager::new();
    let a = tensor1d(&m, [1.0, 2.0, 3.0]);
    let mut b = tensor1d(&m, [0.0, 0.0, 0.0]);
    assert_eq!(arrays_bytes(&m), (2, 2 * T1D));
    let b0 = b;
    ndscope::scope(|| {
        b = a + b;
        b = a + b;
        b = a + b;
        let _ = a + b;
        assert_eq!(arrays_bytes(&m), (6, 6 * T1D));
    });
    // All intermediates are freed.
    assert_eq!(arrays_bytes(&m), (2, 2 * T1D));
    assert!(b.is_closed() && !b0.is_closed());
    m.close();
}

/// Rule 3 (docs/ownership.md): a scope frees what was created in it whatever its manager,
/// and arrays created before it opened are untouched.
#[test]
fn scope_frees_arrays_of_every_manager_and_spares_older_ones() {
    let m1 = NDManager::new();
    let m2 = NDManager::new();
    let sub = m1.new_sub_manager();
    let old = m1.ones([3], DType::F32);
    {
        let _s = NDScope::new();
        let _a = m1.ones([3], DType::F32);
        let _b = m2.ones([3], DType::F32);
        let _c = sub.ones([3], DType::F32);
        let _d = old * 2.0;
        assert_eq!(arrays_bytes(&m1), (4, 4 * T1D));
        assert_eq!(arrays_bytes(&m2), (1, T1D));
    }
    assert_eq!(arrays_bytes(&m1), (1, T1D));
    assert_eq!(arrays_bytes(&m2), (0, 0));
    assert!(!old.is_closed());
    assert!(sub.is_open());
    m1.close();
    m2.close();
}

/// Rules 2, 3 and 4 (docs/ownership.md).
/// DJL `testNDScope`: an array closed by hand inside the scope is tolerated by the
/// scope's close; an unregistered one survives both scopes and dies with its manager;
/// a detached and unregistered one survives even the manager.
#[test]
fn djl_nd_scope() {
    let manager = NDManager::new();
    let (uninvolved, inside, detached, scoped);
    {
        let _scope = NDScope::new();
        {
            let scope2 = NDScope::new();
            uninvolved = manager.create(&[1i32], [1]);
            uninvolved.close();
            assert_eq!(arrays_bytes(&manager), (0, 0));
            inside = manager.create(&[1i32], [1]);
            NDScope::unregister(inside);
            detached = manager.create(&[1i32], [1]).detach();
            NDScope::unregister(detached);
            scoped = manager.create(&[1i32], [1]);
            assert_eq!(scope2.arrays(), vec![scoped]);
            // `detached` belongs to the system manager now.
            assert_eq!(arrays_bytes(&manager), (2, 2 * 4));
        }
        assert!(scoped.is_closed());
        assert_eq!(arrays_bytes(&manager), (1, 4));
    }
    assert!(uninvolved.is_closed());
    assert!(!inside.is_closed());
    assert!(!detached.is_closed());
    assert_eq!(arrays_bytes(&manager), (1, 4));
    manager.close();
    assert!(inside.is_closed());
    assert!(
        !detached.is_closed(),
        "a detached array outlives every manager"
    );
    assert_eq!(detached.manager(), NDManager::system());
    assert_eq!(detached.to_vec::<i32>().unwrap(), vec![1]);
    detached.close();
    assert!(detached.is_closed());
}

/// Rule 3 (docs/ownership.md).
/// DJL's leaking training loop, fixed with a per-iteration scope: parameters updated in
/// place live on, everything else is freed every step.
#[test]
fn training_loop_in_a_scope_does_not_grow() {
    let _serial = serial();
    let m = NDManager::new();
    let x = m.create(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let mut w = m.ones([2, 2], DType::F32);
    let w_id = w;
    let before = arrays_bytes(&m);
    assert_eq!(before, (2, 2 * 16));
    for _ in 0..100_000 {
        let _s = NDScope::new();
        let y = x * w;
        let err = y - x;
        let grad = err * x * 2.0;
        w -= grad * 0.01;
    }
    assert_eq!(arrays_bytes(&m), before);
    assert_eq!(w, w_id, "updated in place");
    let v = w.to_vec::<f32>().unwrap();
    assert!(v.iter().all(|&p| (p - 1.0).abs() < 1e-3), "{v:?}");
    m.close();
}

/// Rules 3 and 9 (docs/ownership.md): a scope's resources close once, after its arrays,
/// also when an outer scope closes it.
#[test]
fn resource_attached_to_a_scope_closes_once_after_its_arrays() {
    let m = NDManager::new();
    let closes = Arc::new(AtomicUsize::new(0));
    let mut r = CountClose::new(&closes);
    let freed_first = r.watched_was_closed.clone();
    {
        let s = NDScope::new();
        r.watched = Some(arr(&m));
        s.attach_resource(r);
        assert_eq!(closes.load(Ordering::SeqCst), 0);
    }
    assert_eq!(closes.load(Ordering::SeqCst), 1);
    assert_eq!(
        freed_first.load(Ordering::SeqCst),
        1,
        "arrays are freed first"
    );
    assert_eq!(arrays_bytes(&m), (0, 0));

    // A scope closed by its outer scope's close closes its resources too, and one
    // already closed closes a new resource at once.
    let outer = NDScope::new();
    let inner = NDScope::new();
    inner.attach_resource(CountClose::new(&closes));
    outer.close();
    assert_eq!(closes.load(Ordering::SeqCst), 2);
    inner.attach_resource(CountClose::new(&closes));
    assert_eq!(closes.load(Ordering::SeqCst), 3);
    drop(inner);
    assert_eq!(closes.load(Ordering::SeqCst), 3);
    m.close();
}

/// Resources close outside the engine lock, so they may use ndscope.
struct UsesEngine(NDManager, Arc<AtomicUsize>);

impl Resource for UsesEngine {
    fn close(&mut self) {
        let t = self.0.ones([2], DType::F32) * 2.0;
        self.1.store(t.size(), Ordering::SeqCst);
        t.close();
    }
}

/// Rules 1 and 3 (docs/ownership.md): the resources of a manager and of a scope close
/// outside the engine's lock, so their `close` may use ndscope.
#[test]
fn resource_close_may_use_ndscope() {
    let m = NDManager::new();
    let work = NDManager::new();
    let seen = Arc::new(AtomicUsize::new(0));
    m.attach_resource(UsesEngine(work.clone(), seen.clone()))
        .unwrap();
    {
        let s = NDScope::new();
        s.attach_resource(UsesEngine(work.clone(), seen.clone()));
    }
    assert_eq!(seen.swap(0, Ordering::SeqCst), 2);
    m.close();
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    // The `ones` input of the multiplication is the only leftover.
    assert_eq!(arrays_bytes(&work).0, 2);
    work.close();
}
