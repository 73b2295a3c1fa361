//! Reference counting (docs/ownership.md rule 5): JavaCPP's `PointerScopeTest` and DJL's
//! `RCObject` tests ported, and the `Resource` trait closed by scopes and managers.
//!
//! Tests in this file run in parallel threads of one process, so every count is taken
//! from a manager the test created itself (`m.memory()`), never the global counters.

use ndscope::{DType, NDArray, NDList, NDManager, NDScope, NdError, Resource};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes of a `[4]` f32 array.
const B: usize = 16;

/// (live arrays, live bytes) of `m`'s subtree.
fn counts(m: &NDManager) -> (usize, usize) {
    let s = m.memory();
    (s.live_arrays, s.live_bytes)
}

fn arr(m: &NDManager) -> NDArray {
    m.zeros([4], DType::F32)
}

fn is_closed_error(e: &NdError) -> bool {
    // `ClosedUnknown` only once the tombstone was recycled (thousands of frees later).
    matches!(e, NdError::Closed(_) | NdError::ClosedUnknown { .. })
}

// ------------------------------------------------------------------ JavaCPP PointerScope

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
        assert_eq!(counts(&m), (3, 3 * B));
        assert_eq!(inner.memory().live_arrays, 2);
        assert_eq!(inner.memory().live_bytes, 2 * B);
    }
    assert!(b.is_closed() && c.is_closed() && !a.is_closed());
    assert_eq!(counts(&m), (1, B));
    drop(outer);
    assert!(a.is_closed());
    assert_eq!(counts(&m), (0, 0));
}

/// Rule 5 (docs/ownership.md): a retained array survives its scope; one release frees it.
#[test]
fn retained_array_survives_its_scope_and_one_release_frees_it() {
    let m = NDManager::new();
    let a;
    {
        let _s = NDScope::new();
        a = arr(&m);
        assert_eq!(a.ref_count(), 1);
        assert_eq!(a.retain(), 2);
    }
    assert!(!a.is_closed());
    assert_eq!(a.ref_count(), 1);
    assert_eq!(counts(&m), (1, B));
    assert!(a.release());
    assert!(a.is_closed());
    assert_eq!(counts(&m), (0, 0));
}

/// Rules 3 and 5 (docs/ownership.md): a second scope's registration is one more reference.
#[test]
fn retained_and_attached_to_an_outer_scope_survives_the_inner_one() {
    let m = NDManager::new();
    let outer = NDScope::new();
    let a;
    {
        let _inner = NDScope::new();
        a = arr(&m);
        a.retain();
        assert_eq!(outer.register(a), a);
        assert_eq!(a.ref_count(), 3);
        outer.register(a); // already registered there: no second registration
        assert_eq!(a.ref_count(), 3);
    }
    assert_eq!(a.ref_count(), 2);
    assert!(!a.release(), "the outer scope still holds it");
    assert_eq!(a.ref_count(), 1);
    assert_eq!(counts(&m), (1, B));
    drop(outer);
    assert!(a.is_closed());
    assert_eq!(counts(&m), (0, 0));
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
        assert_eq!(counts(&m), (3, 3 * B));
    }
    ndscope::scope(|| {
        let _ = a * b;
    });
    assert_eq!(a.ref_count(), 0);
    assert_eq!(b.ref_count(), 0);
    assert_eq!(counts(&m), (2, 2 * B));
    m.close();
    assert_eq!(counts(&m), (0, 0));
}

/// Rules 2 and 3 (docs/ownership.md): `detach()` moves ownership to the system manager but
/// keeps the scope registration, so the scope still frees it.
#[test]
fn detach_does_not_unregister() {
    let m = NDManager::new();
    let a;
    {
        let s = NDScope::new();
        a = arr(&m).detach();
        assert_eq!(a.manager(), NDManager::system());
        assert_eq!(s.arrays(), vec![a]);
        assert_eq!(a.ref_count(), 1);
        assert_eq!(counts(&m), (0, 0));
    }
    assert!(a.is_closed());

    // attach() to another manager keeps the registration too.
    let other = NDManager::new();
    let b;
    {
        let _s = NDScope::new();
        b = arr(&m).attach(&other);
        assert_eq!((counts(&m), counts(&other)), ((0, 0), (1, B)));
    }
    assert!(b.is_closed());
    assert_eq!(counts(&other), (0, 0));
    m.close();
    other.close();
}

// ------------------------------------------------------------------ DJL RCObject

/// Rule 5 (docs/ownership.md): retain then release frees.
#[test]
fn retain_then_release_frees() {
    let m = NDManager::new();
    let a = arr(&m);
    assert_eq!(a.ref_count(), 0);
    assert_eq!(a.retain(), 1);
    assert_eq!(a.ref_count(), 1);
    assert!(a.release());
    assert!(a.is_closed());
    assert_eq!(counts(&m), (0, 0));
}

/// Rule 5 (docs/ownership.md): two retains need two releases.
#[test]
fn two_retains_need_two_releases() {
    let m = NDManager::new();
    let a = arr(&m);
    a.retain();
    assert_eq!(a.retain(), 2);
    assert!(!a.release());
    assert_eq!(a.ref_count(), 1);
    assert_eq!(counts(&m), (1, B));
    assert!(a.release());
    assert!(a.is_closed());
    assert_eq!(counts(&m), (0, 0));
}

/// Rule 5 (docs/ownership.md): releasing a freed array is an error; `close()` stays
/// idempotent.
#[test]
fn release_of_a_freed_array_is_an_error() {
    let m = NDManager::new();
    let a = arr(&m);
    assert!(
        a.release(),
        "one release frees an unscoped, unretained array"
    );
    let e = a.try_release().unwrap_err();
    assert!(is_closed_error(&e), "{e:?}");
    assert!(a.try_retain().is_err());
    assert!(a.try_ref_count().is_err());
    // close() stays idempotent.
    a.close();
    assert_eq!(counts(&m), (0, 0));
}

/// Rule 5 (docs/ownership.md): a scope registration counts as a reference.
#[test]
fn release_inside_a_scope_counts_the_registration() {
    let m = NDManager::new();
    let s = NDScope::new();
    let a = arr(&m);
    a.retain();
    assert_eq!(a.ref_count(), 2);
    assert!(!a.release());
    assert_eq!(a.ref_count(), 1);
    assert!(a.release(), "the scope registration was the last reference");
    assert!(a.is_closed());
    assert!(s.arrays().is_empty());
    assert_eq!(counts(&m), (0, 0));
    drop(s); // tolerates the array it no longer holds
}

/// Rule 5 (docs/ownership.md): `close()` and a manager's close free whatever the count.
#[test]
fn close_and_manager_close_ignore_the_count() {
    let m = NDManager::new();
    let a = arr(&m);
    a.retain();
    a.retain();
    a.close();
    assert!(a.is_closed());
    let b = arr(&m);
    b.retain();
    let s = NDScope::new();
    s.register(b);
    assert_eq!(b.ref_count(), 2);
    m.close();
    assert!(b.is_closed());
    assert!(s.arrays().is_empty());
    assert_eq!(counts(&m), (0, 0));
}

/// Rule 5 (docs/ownership.md).
/// `release()` with only scope registrations left gives up the innermost one (as the
/// engine documents), so the array outlives the inner scope and dies with the outer.
#[test]
fn release_gives_up_the_innermost_registration() {
    let m = NDManager::new();
    let outer = NDScope::new();
    let inner = NDScope::new();
    let a = arr(&m);
    outer.register(a);
    assert_eq!(a.ref_count(), 2);
    assert!(!a.release());
    assert_eq!(
        inner.arrays(),
        Vec::<NDArray>::new(),
        "inner gave up its reference"
    );
    drop(inner);
    assert!(!a.is_closed(), "outer still holds it");
    drop(outer);
    assert!(a.is_closed());
    m.close();
}

// ------------------------------------------------------------------ Resource

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
    assert_eq!(counts(&m), (0, 0));

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

/// Rule 1 (docs/ownership.md): resources of a manager and its subtree close once with it.
#[test]
fn resource_attached_to_a_manager_closes_once() {
    let m = NDManager::new();
    let sub = m.new_sub_manager();
    let closes = Arc::new(AtomicUsize::new(0));
    m.attach_resource(CountClose::new(&closes)).unwrap();
    sub.attach_resource(CountClose::new(&closes)).unwrap();
    let _a = arr(&sub);
    m.close();
    assert_eq!(
        closes.load(Ordering::SeqCst),
        2,
        "sub-manager resources close too"
    );
    m.close();
    sub.close();
    assert_eq!(closes.load(Ordering::SeqCst), 2);
    // A closed manager closes a new resource at once and says so.
    let e = m.attach_resource(CountClose::new(&closes)).unwrap_err();
    assert!(matches!(e, NdError::ManagerClosed { .. }), "{e:?}");
    assert_eq!(closes.load(Ordering::SeqCst), 3);
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
    assert_eq!(counts(&work).0, 2);
    work.close();
}

/// Rule 1 (docs/ownership.md): an `NDList` resource closes its arrays with the manager.
#[test]
fn nd_list_attached_to_a_manager_closes_its_arrays() {
    let owner = NDManager::new();
    let holder = NDManager::new();
    let list = NDList::from(vec![arr(&owner), arr(&owner), arr(&owner)]);
    let arrays = list.0.clone();
    assert_eq!(counts(&owner), (3, 3 * B));
    holder.attach_resource(list).unwrap();
    holder.close();
    assert!(arrays.iter().all(|a| a.is_closed()));
    assert_eq!(counts(&owner), (0, 0));
    owner.close();
}

/// Rule 11 (docs/ownership.md): an `NDList` escapes from `scope` and closes with a scope.
#[test]
fn nd_list_in_a_scope_and_as_a_tidy_result() {
    let m = NDManager::new();
    let list = ndscope::scope(|| {
        let _junk = arr(&m);
        let mut l = NDList::new();
        l.push(arr(&m));
        l.push(arr(&m));
        l
    });
    assert_eq!(list.len(), 2);
    assert_eq!(counts(&m), (2, 2 * B));
    let arrays = list.0.clone();
    {
        let s = NDScope::new();
        s.attach_resource(list);
    }
    assert!(arrays.iter().all(|a| a.is_closed()));
    assert_eq!(counts(&m), (0, 0));
    m.close();
}
