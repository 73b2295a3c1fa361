//! The floor of ndscope's small-op path (issue 10's `add10_ns` target: an add of two
//! [10] f32 arrays plus the close of its result in at most 60 ns).
//!
//! `lean` below is the least that path can do and still keep ndscope's guarantees,
//! written as leanly as I could, with every structure sized for the case (inline
//! fixed-size shapes, one inline scope registration, a per-shard block cache):
//!
//! * handles are `Copy` ids (shard, slot, serial) checked on every use: a stale id never
//!   reaches a new record (the serial), and a use after close can say what the array
//!   was and where and why it was freed (a tombstone written into a ring at every free);
//! * records live in the creating thread's shard behind an `RwLock` (taken for the op
//!   and for the close: cross-thread use stays possible), with the thread's shard, its
//!   innermost scope and the autograd flag read from thread-locals on every op;
//! * every array is in its manager's list (O(1) link and unlink by position, so a
//!   manager close can free it) and in its scope's list when a scope is open;
//! * live arrays and bytes are counted per manager, exactly, on every create and free;
//! * buffers come from a cache of 64-byte-aligned blocks per size class;
//! * the inputs' dtypes and shapes are checked, and the manager is checked to take new
//!   arrays (open, under its cap); the profiler's flag is read on every op, and a
//!   freed record's gradient field is checked (a parameter's gradient dies with it).
//!
//! It leaves out what the real engine also does: typed errors instead of `None`,
//! broadcasting and strided kernels, views and shared buffers, tape holds and retains,
//! resources, profiling, cross-shard locking and the snapshot path for large inputs.
//! So it is a lower bound, not a design: a redesign of the real path would land above
//! it.
//!
//! `cargo run --release --manifest-path bench/floor/Cargo.toml` prints ndscope's
//! `add10` (the same loop as `examples/bench.rs`) and the lean path's, alternated in one
//! process, and the two lock round trips alone (`-- --json`: one JSON line;
//! `bench/compare.sh` runs it right after candle-core). `-- --iters N` runs each loop
//! N times once (for callgrind: `--only lean` or `--only ndscope`).

use parking_lot::RwLock;
use std::alloc::Layout;
use std::cell::Cell;
use std::hint::black_box;
use std::panic::Location;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

type Loc = &'static Location<'static>;

/// An array handle: shard, slot and serial.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Id {
    shard: u32,
    index: u32,
    serial: u64,
}

/// A shape of up to six dimensions, inline.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Shape {
    dims: [u32; 6],
    ndim: u8,
}

impl Shape {
    fn new(d: &[u32]) -> Shape {
        let mut dims = [0; 6];
        dims[..d.len()].copy_from_slice(d);
        Shape {
            dims,
            ndim: d.len() as u8,
        }
    }

    fn size(&self) -> usize {
        self.dims[..self.ndim as usize]
            .iter()
            .map(|&d| d as usize)
            .product()
    }
}

const NO_SCOPE: u32 = u32::MAX;

/// The lean record: every field the op and the close read or write.
struct Rec {
    ptr: NonNull<u8>,
    class: u32,
    shape: Shape,
    offset: u32,
    contiguous: bool,
    dtype: u8,
    manager: u32,
    mgr_pos: u32,
    scope: u32,
    scope_pos: u32,
    retains: u32,
    /// A parameter's gradient, freed with it.
    grad: Option<Id>,
    created_at: Loc,
}

/// What a freed array was.
#[allow(dead_code)] // read by use-after-close errors, which this bench never makes
struct Tomb {
    id: Id,
    shape: Shape,
    dtype: u8,
    created_at: Loc,
    closed_at: Loc,
    cause: u8,
}

const GRAVES: usize = 4096;
/// Block size classes of the cache: 64, 128, ... 4096 bytes.
const CLASSES: usize = 7;

struct Shard {
    slots: Vec<(u64, Option<Rec>)>,
    free: Vec<u32>,
    next_serial: u64,
    end_serial: u64,
    /// Per manager: its arrays in this shard, its live arrays and bytes here, and
    /// whether it takes new arrays (open and under its cap).
    mgr_lists: Vec<Vec<Id>>,
    mgr_stats: Vec<(i64, i64)>,
    mgr_accepts: Vec<bool>,
    /// Per scope: its arrays.
    scopes: Vec<Vec<Id>>,
    graves: Vec<Option<Tomb>>,
    grave_next: usize,
    cache: [Vec<NonNull<u8>>; CLASSES],
}

// SAFETY (bench only): the cached blocks are owned by the shard and used under its lock.
unsafe impl Send for Shard {}
unsafe impl Sync for Shard {}

static SERIALS: AtomicU64 = AtomicU64::new(1);
/// Whether the op profiler records (checked on every op).
static PROFILING: AtomicBool = AtomicBool::new(false);

impl Shard {
    fn new() -> Shard {
        Shard {
            slots: Vec::new(),
            free: Vec::new(),
            next_serial: 0,
            end_serial: 0,
            mgr_lists: vec![Vec::new()],
            mgr_stats: vec![(0, 0)],
            mgr_accepts: vec![true],
            scopes: Vec::new(),
            graves: (0..GRAVES).map(|_| None).collect(),
            grave_next: 0,
            cache: Default::default(),
        }
    }

    #[inline]
    fn get(&self, id: Id) -> Option<&Rec> {
        match self.slots.get(id.index as usize) {
            Some((s, Some(r))) if *s == id.serial => Some(r),
            _ => None,
        }
    }

    #[inline]
    fn take_block(&mut self, bytes: usize) -> (u32, NonNull<u8>) {
        let class = bytes.max(64).next_power_of_two().trailing_zeros() - 6;
        assert!((class as usize) < CLASSES, "bench: small blocks only");
        if let Some(p) = self.cache[class as usize].pop() {
            return (class, p);
        }
        let layout = Layout::from_size_align(64 << class, 64).unwrap();
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        (class, NonNull::new(p).expect("allocation"))
    }

    #[inline]
    fn insert(&mut self, rec: Rec) -> Id {
        if self.next_serial == self.end_serial {
            self.next_serial = SERIALS.fetch_add(1024, Ordering::Relaxed);
            self.end_serial = self.next_serial + 1024;
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        let index = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = (serial, Some(rec));
                i
            }
            None => {
                self.slots.push((serial, Some(rec)));
                self.slots.len() as u32 - 1
            }
        };
        Id {
            shard: 0,
            index,
            serial,
        }
    }
}

static SHARD: std::sync::LazyLock<RwLock<Shard>> =
    std::sync::LazyLock::new(|| RwLock::new(Shard::new()));

thread_local! {
    static MY_SHARD: Cell<u32> = const { Cell::new(0) };
    static CURRENT_SCOPE: Cell<u32> = const { Cell::new(NO_SCOPE) };
    static RECORDING: Cell<bool> = const { Cell::new(false) };
}

fn shard(_s: u32) -> &'static RwLock<Shard> {
    &SHARD
}

/// Create a [len] f32 array of `value` in manager 0.
fn create(len: u32, value: f32) -> Id {
    let me = MY_SHARD.with(Cell::get);
    let mut sh = shard(me).write();
    let (class, ptr) = sh.take_block(len as usize * 4);
    // SAFETY: the block holds at least `len` f32, 64-byte aligned.
    let out = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr() as *mut f32, len as usize) };
    out.fill(value);
    register(
        &mut sh,
        ptr,
        class,
        Shape::new(&[len]),
        0,
        Location::caller(),
    )
}

#[inline]
fn register(sh: &mut Shard, ptr: NonNull<u8>, class: u32, shape: Shape, mgr: u32, at: Loc) -> Id {
    let bytes = shape.size() as i64 * 4;
    let mgr_pos = sh.mgr_lists[mgr as usize].len() as u32;
    let scope = CURRENT_SCOPE.with(Cell::get);
    let scope_pos = if scope == NO_SCOPE {
        0
    } else {
        sh.scopes[scope as usize].len() as u32
    };
    let id = sh.insert(Rec {
        ptr,
        class,
        shape,
        offset: 0,
        contiguous: true,
        dtype: 0,
        manager: mgr,
        mgr_pos,
        scope,
        scope_pos,
        retains: 0,
        grad: None,
        created_at: at,
    });
    sh.mgr_lists[mgr as usize].push(id);
    if scope != NO_SCOPE {
        sh.scopes[scope as usize].push(id);
    }
    let st = &mut sh.mgr_stats[mgr as usize];
    st.0 += 1;
    st.1 += bytes;
    id
}

/// `a + b` of two same-shape contiguous f32 arrays of this thread's shard.
#[track_caller]
#[inline(never)]
fn add(a: Id, b: Id) -> Option<Id> {
    let at = Location::caller();
    if PROFILING.load(Ordering::Relaxed) {
        unreachable!("no profiler in this bench");
    }
    let me = MY_SHARD.with(Cell::get);
    debug_assert!(a.shard == me && b.shard == me);
    let mut sh = shard(me).write();
    let (ra, rb) = (sh.get(a)?, sh.get(b)?);
    if ra.dtype != rb.dtype || ra.shape != rb.shape || !ra.contiguous || !rb.contiguous {
        return None; // the real path broadcasts, or errs
    }
    let (shape, mgr) = (ra.shape, ra.manager);
    if !sh.mgr_accepts[mgr as usize] {
        return None; // closed or over its cap
    }
    let n = shape.size();
    // SAFETY: live records' blocks hold their shape's elements past their offsets.
    let (x, y) = unsafe {
        (
            std::slice::from_raw_parts((ra.ptr.as_ptr() as *const f32).add(ra.offset as usize), n),
            std::slice::from_raw_parts((rb.ptr.as_ptr() as *const f32).add(rb.offset as usize), n),
        )
    };
    let (class, ptr) = sh.take_block(n * 4);
    // SAFETY: a fresh block of at least n f32, distinct from the inputs' blocks.
    let out = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr() as *mut f32, n) };
    for ((o, &p), &q) in out.iter_mut().zip(x).zip(y) {
        *o = p + q;
    }
    let id = register(&mut sh, ptr, class, shape, mgr, at);
    drop(sh);
    if RECORDING.with(Cell::get) {
        unreachable!("no collector in this bench");
    }
    Some(id)
}

/// Free `id` now (explicit close); false if it was already dead.
#[track_caller]
#[inline(never)]
fn close(id: Id) -> bool {
    let at = Location::caller();
    let mut sh = shard(id.shard).write();
    let sh = &mut *sh;
    let Some((serial, slot)) = sh.slots.get_mut(id.index as usize) else {
        return false;
    };
    if *serial != id.serial {
        return false;
    }
    let Some(r) = slot.take() else {
        return false;
    };
    sh.free.push(id.index);
    let g = sh.grave_next;
    sh.graves[g] = Some(Tomb {
        id,
        shape: r.shape,
        dtype: r.dtype,
        created_at: r.created_at,
        closed_at: at,
        cause: 0,
    });
    sh.grave_next = (g + 1) % GRAVES;
    // Unlink from the manager's list (swap-remove, fix the moved entry's position).
    let list = &mut sh.mgr_lists[r.manager as usize];
    list.swap_remove(r.mgr_pos as usize);
    if let Some(&moved) = list.get(r.mgr_pos as usize) {
        sh.slots[moved.index as usize].1.as_mut().unwrap().mgr_pos = r.mgr_pos;
    }
    if r.scope != NO_SCOPE {
        let list = &mut sh.scopes[r.scope as usize];
        list.swap_remove(r.scope_pos as usize);
        if let Some(&moved) = list.get(r.scope_pos as usize) {
            sh.slots[moved.index as usize].1.as_mut().unwrap().scope_pos = r.scope_pos;
        }
    }
    let st = &mut sh.mgr_stats[r.manager as usize];
    st.0 -= 1;
    st.1 -= r.shape.size() as i64 * 4;
    sh.cache[r.class as usize].push(r.ptr);
    black_box(r.retains);
    if r.grad.is_some() {
        unreachable!("no parameters in this bench");
    }
    true
}

/// Median ns per call of `f` over `reps` loops of `iters` calls.
fn median_ns(reps: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..iters.min(1000) {
        f();
    }
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let iters: Option<usize> = arg("--iters").and_then(|s| s.parse().ok());
    let only = arg("--only");
    let run = |name: &str| only.as_deref().is_none_or(|o| o == name);

    let m = ndscope::NDManager::new();
    let (na, nb) = (
        m.random_uniform(0.0, 1.0, [10], ndscope::DType::F32),
        m.random_uniform(0.0, 1.0, [10], ndscope::DType::F32),
    );
    let mut ndscope_add10 = || {
        let c = na + nb;
        black_box(c);
        c.close();
    };
    let (la, lb) = (create(10, 0.5), create(10, 0.25));
    let mut lean_add10 = || {
        let c = add(la, lb).expect("live inputs");
        black_box(c);
        assert!(close(c));
    };
    // Two uncontended write-lock round trips (the op's and the close's).
    let lock = RwLock::new(0u64);
    let mut two_locks = || {
        for _ in 0..2 {
            *black_box(&lock).write() += 1;
        }
    };

    if let Some(n) = iters {
        for _ in 0..n {
            if run("ndscope") {
                ndscope_add10();
            }
            if run("lean") {
                lean_add10();
            }
        }
        return;
    }
    // Alternated rounds, so both see the same machine (`--quick`: a smoke run whose
    // figures mean nothing).
    let quick = args.iter().any(|a| a == "--quick");
    let (rounds, reps, calls) = if quick {
        (1, 1, 2_000)
    } else {
        (5, 15, 200_000)
    };
    let (mut nd, mut le, mut lk) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        nd.push(median_ns(reps, calls, &mut ndscope_add10));
        le.push(median_ns(reps, calls, &mut lean_add10));
        lk.push(median_ns(reps, calls, &mut two_locks));
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (nd, le, lk) = (med(&mut nd), med(&mut le), med(&mut lk));
    if args.iter().any(|a| a == "--json") {
        println!(
            "{{\"impl\":\"floor\",\"ndscope_add10_ns\":{nd:.1},\"floor_add10_ns\":{le:.1},\"two_lock_trips_ns\":{lk:.1}}}"
        );
        return;
    }
    println!("add10 + close, median of 5 alternated rounds (each the median of 15 x 200,000):");
    println!("  ndscope        {nd:7.1} ns");
    println!(
        "  lean floor     {le:7.1} ns   ({:.2}x ndscope's time)",
        le / nd
    );
    println!("  two lock trips {lk:7.1} ns");
}
