//! Rule 10 (docs/ownership.md): no hot path walks all arrays or managers. Checked
//! without clocks:
//! * by counting: the hot paths (create, op, view, register, escape, unregister,
//!   retain, release, free, attach, detach, temp_attach, scope open and close, a
//!   sub-manager's create and close, a new collector and its backward) make exactly the
//!   same number of heap allocations, and no larger one, with 100,000 live arrays in
//!   10,000 other managers, registered in 1,000 open scopes, as without them
//!   (`CountingAllocator`, this binary's global allocator): a walk that gathers what
//!   it visits, or a table rebuilt per call, would show;
//! * structurally: the engine's tables (`Slab`: arrays, buffers, managers, scopes) have
//!   no way to visit their entries, so no code can walk them; the only walks are of
//!   one manager's own arrays and sub-managers (its close), one scope's own
//!   registrations (its close) and one array's own links.

use ndscope::{CountingAllocator, DType, GradientCollector, NDArray, NDManager, NDScope};
use std::path::Path;

/// One round of every hot path, on arrays of `m` (and `other` as a second manager);
/// `w` is a parameter.
fn hot_round(m: &NDManager, other: &NDManager, w: NDArray) {
    let s = NDScope::new();
    let a = m.zeros([4], DType::F32); // create (registered in `s`)
    let b = a + 1.0; // op
    let v = b.reshape([2, 2]); // view
    let c = {
        let inner = NDScope::new();
        let c = a * b;
        inner.escape(c) // escape into `s`
    };
    let d = m.ones([2], DType::F32).keep(); // unregister
    s.register(d); // register again
    assert_eq!(c.retain(), 2);
    assert!(!c.release());
    let e = m.ones([2], DType::F32).detach();
    e.attach(m);
    e.temp_attach(other).attach(m);
    let sub = m.new_sub_manager();
    let _t = sub.zeros([3], DType::F32);
    sub.close();
    v.close(); // free
    {
        let gc = GradientCollector::new();
        let loss = (w * a.get(":2")).sum();
        gc.backward(loss).unwrap();
    }
    drop(s); // scope close frees a, b, c, d, e and the loss
}

/// (allocations, largest single allocation) of `rounds` hot rounds on this thread.
fn measure(m: &NDManager, other: &NDManager, w: NDArray, rounds: usize) -> (u64, usize) {
    // Warm up: every table, pool, ring (the last 4,096 frees) and spare list reaches
    // its steady size first.
    for _ in 0..2000 {
        hot_round(m, other, w);
    }
    let before = CountingAllocator::thread_allocations();
    CountingAllocator::reset_thread_largest();
    for _ in 0..rounds {
        hot_round(m, other, w);
    }
    (
        CountingAllocator::thread_allocations() - before,
        CountingAllocator::thread_largest(),
    )
}

/// Rule 10 (docs/ownership.md): with 100,000 live arrays in 10,000 other managers,
/// registered in 1,000 open scopes, every hot path makes the same allocations as
/// without them (no larger one either: a walk gathering 100,000 ids would need
/// 800 KB at once).
#[test]
fn hot_paths_allocate_the_same_with_100k_live_arrays_elsewhere() {
    let _serial = crate::common::serial();
    let m = NDManager::new();
    let other = NDManager::new();
    let w = m.create(&[1.0f32, 2.0], [2]).set_requires_gradient(true);
    let rounds = 50;
    let (base_allocs, base_largest) = measure(&m, &other, w, rounds);

    let crowd = NDManager::new();
    let subs: Vec<NDManager> = (0..10_000).map(|_| crowd.new_sub_manager()).collect();
    let mut scopes = Vec::with_capacity(1000);
    let mut live = Vec::with_capacity(100_000);
    for i in 0..100_000 {
        if i % 100 == 0 {
            scopes.push(NDScope::new());
        }
        live.push(subs[i % subs.len()].zeros([1], DType::U8));
    }
    assert_eq!(crowd.memory().live_arrays, 100_000);
    assert_eq!(scopes.last().unwrap().arrays().len(), 100);
    let (allocs, largest) = measure(&m, &other, w, rounds);
    assert_eq!(
        allocs, base_allocs,
        "allocations of {rounds} hot rounds: {base_allocs} alone, {allocs} beside 100,000 arrays"
    );
    assert!(
        largest <= base_largest + 64,
        "largest allocation: {base_largest} alone, {largest} beside 100,000 arrays"
    );
    // Closing the crowd is the walk rule 10 allows: its own subtree, all of it.
    while let Some(s) = scopes.pop() {
        drop(s);
    }
    assert_eq!(crowd.memory().live_arrays, 0, "the scopes freed them");
    crowd.close();
    assert!(live.iter().all(|a| a.is_closed()));
    m.close();
    other.close();
}

/// Rule 10 (docs/ownership.md): closing a scope costs what is registered in it, and
/// closing a sub-manager what is in its subtree: a scope holding one array, opened
/// inside a scope holding 100,000, and a sub-manager of a manager with 10,000 other
/// children, close with the same allocations as alone.
#[test]
fn closing_a_small_scope_or_sub_manager_ignores_its_big_neighbours() {
    let _serial = crate::common::serial();
    let m = NDManager::new();
    let small_round = |m: &NDManager| {
        let s = NDScope::new();
        let _a = m.zeros([2], DType::F32);
        drop(s);
        let sub = m.new_sub_manager();
        let _b = sub.zeros([2], DType::F32);
        sub.close();
    };
    let count = |m: &NDManager| {
        for _ in 0..5000 {
            small_round(m);
        }
        let before = CountingAllocator::thread_allocations();
        CountingAllocator::reset_thread_largest();
        for _ in 0..100 {
            small_round(m);
        }
        (
            CountingAllocator::thread_allocations() - before,
            CountingAllocator::thread_largest(),
        )
    };
    let (alone, alone_largest) = count(&m);
    let outer = NDScope::new();
    let big: Vec<NDArray> = (0..100_000).map(|_| m.zeros([1], DType::U8)).collect();
    let siblings: Vec<NDManager> = (0..10_000).map(|_| m.new_sub_manager()).collect();
    assert_eq!(outer.arrays().len(), 100_000);
    let (crowded, crowded_largest) = count(&m);
    assert_eq!(crowded, alone);
    assert!(
        crowded_largest <= alone_largest + 64,
        "{alone_largest} then {crowded_largest}"
    );
    drop(outer);
    assert!(big.iter().all(|a| a.is_closed()));
    drop(siblings);
    m.close();
}

/// The non-test code of a source file (everything before its `#[cfg(test)]`
/// module), comment lines dropped.
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let end = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
    text[..end]
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Rule 10 (docs/ownership.md), structurally: the engine's tables of records
/// (`Slab`, in src/engine/slab.rs: arrays, buffers, managers and scopes are all kept in
/// slabs) have no iteration: their storage is private to slab.rs, which never loops
/// over it (no `iter`, `iter_mut`, `retain`, `drain` or `for` over the slots). Every
/// record is reached by its id, so no code can walk all arrays or managers.
#[test]
fn the_engines_tables_cannot_be_walked() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engine");
    let slab = code_of(&root.join("slab.rs"));
    let def = slab
        .find("pub(crate) struct Slab<K, L> {")
        .expect("Slab is defined in slab.rs");
    let body = &slab[def..def + slab[def..].find('}').unwrap()];
    assert!(
        body.contains("slots: Vec<"),
        "Slab keeps its records in `slots`"
    );
    assert!(!body.contains("pub slots") && !body.contains("pub(crate) slots"));
    for walk in [
        "slots.iter",
        "slots.into_iter",
        "slots.retain",
        "slots.drain",
        "in self.slots",
        "in &self.slots",
        "in &mut self.slots",
        "slots.as_slice",
        "slots.as_mut_slice",
        "slots[..]",
    ] {
        assert!(
            !slab.contains(walk),
            "src/engine/slab.rs walks a slab: `{walk}`"
        );
    }
    // `slots` is reached only by index (`slots.get`, `slots.get_mut`, `slots[i]`),
    // grown by `slots.push`, and cut back from its end by `slots.truncate` (the vacant
    // tail a free gives back, above the last live slot, which the slab tracks as
    // entries come and go: each slot is dropped once).
    let uses: Vec<&str> = slab
        .match_indices("slots.")
        .map(|(i, _)| {
            let rest = &slab[i + 6..];
            &rest[..rest
                .find(|c: char| !c.is_alphanumeric() && c != '_')
                .unwrap_or(rest.len())]
        })
        .collect();
    assert!(!uses.is_empty());
    for u in &uses {
        assert!(
            ["get", "get_mut", "push", "len", "truncate"].contains(u),
            "src/engine/slab.rs: `slots.{u}`"
        );
    }
    // And nothing outside slab.rs reaches into a slab's storage.
    for f in std::fs::read_dir(&root).unwrap() {
        let f = f.unwrap().path();
        if f.file_name().unwrap() == "slab.rs" {
            continue;
        }
        assert!(
            !code_of(&f).contains(".slots"),
            "{} reads a slab's slots",
            f.display()
        );
    }
}
