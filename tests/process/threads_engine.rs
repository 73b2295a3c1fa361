//! Cross-thread tests of the sharded engine (issue 10; docs/ownership.md, "Threads"):
//! every rule of the ownership model holds when arrays, managers and scopes are spread
//! over several threads.
//!
//! * `cross_thread_ownership_matches_the_reference_model`: a model-based property test
//!   whose actions run one at a time on a pool of three long-lived worker threads, so
//!   that most actions touch arrays created on another thread, with per-thread scopes.
//! * Two gradient collectors on two threads; a thread that exits while its arrays live
//!   on, and thread churn; in-place writes racing reads; a manager closed or capped
//!   while another thread uses it; a shared read-only data set; scopes holding arrays
//!   made on other threads.
//!
//! These tests check the process-wide counters (`ndscope::memory()`), so they run one at
//! a time (`common::serial()`, as every test of this binary), each with its own threads
//! inside.
//!
//! Cases of the model test: `NDSCOPE_MODEL_CASES` (default 400, about 6 s in a debug
//! build); steps per case: up to `NDSCOPE_MODEL_STEPS` (default 100).
//! `NDSCOPE_THREADS_SCALE` scales the iteration counts of the other tests, in percent
//! (default 100; `.ci/valgrind` uses 20).

use crate::common::{bindex, broadcast, counters, env_or, expect_panic, open_scope, serial, tidy};
use ndscope::{
    CloseReason, DType, GradientCollector, NDArray, NDManager, NDScope, NdError, SourceLocation,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::collections::{BTreeSet, HashSet};
use std::panic::{AssertUnwindSafe, Location, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel, sync_channel};
use std::sync::{Barrier, Mutex};
use std::thread::JoinHandle;

// ==================================================================== shared helpers

/// Iteration counts of the non-model tests, scaled by `NDSCOPE_THREADS_SCALE` percent
/// (at least 1).
fn iters(n: usize) -> usize {
    (n * env_or("NDSCOPE_THREADS_SCALE", 100) as usize / 100).max(1)
}

/// Each sum of an `n`-element array, written in place by adding 1 to every element at
/// most `max_writes` times, is a whole number of writes times `n`: no read saw a write
/// half done (exact in f32 at the sizes used).
fn assert_whole_writes(sums: &[f32], n: usize, max_writes: usize) {
    for s in sums {
        let k = s / n as f32;
        assert!(
            k.fract() == 0.0 && k >= 0.0 && k <= max_writes as f32,
            "sum {s}"
        );
    }
}

/// `h.close()`, returning the location the engine records for it.
#[track_caller]
fn close_here(h: NDArray) -> SourceLocation {
    h.close();
    Location::caller()
}

/// `h.try_release()`, with the location the engine records for it.
#[track_caller]
fn release_here(h: NDArray) -> (SourceLocation, ndscope::Result<bool>) {
    (Location::caller(), h.try_release())
}

/// `m.close()`, returning the location the engine records for it.
#[track_caller]
fn close_manager_here(m: &NDManager) -> SourceLocation {
    m.close();
    Location::caller()
}

/// `s.close()`, returning the location the engine records for it.
#[track_caller]
fn close_scope_here(s: NDScope) -> SourceLocation {
    s.close();
    Location::caller()
}

/// `e` is `Closed` for `h`, freed for `reason`.
fn assert_closed(e: &NdError, h: NDArray, reason: &CloseReason) {
    match e {
        NdError::Closed(info) => {
            assert_eq!(info.array.uid, h.uid(), "{e}");
            assert_eq!(&info.reason, reason, "{e}");
        }
        other => panic!(
            "expected Closed({reason:?}) for #{}, got {other:?}",
            h.uid()
        ),
    }
}

// ==================================================================== worker pool

/// A job for a worker: it gets the worker's stack of open scopes (outermost first).
type Job = Box<dyn FnOnce(&mut Vec<NDScope>) + Send>;

/// Long-lived worker threads, each with its own scope stack (scopes are `!Send`, so
/// they stay on their thread). [`Pool::on`] runs one closure on one worker and waits,
/// so a sequence of calls is deterministic.
struct Pool {
    txs: Vec<Sender<Job>>,
    handles: Vec<JoinHandle<()>>,
}

impl Pool {
    fn new(n: usize) -> Pool {
        let mut txs = Vec::new();
        let mut handles = Vec::new();
        for i in 0..n {
            let (tx, rx) = channel::<Job>();
            let h = std::thread::Builder::new()
                .name(format!("model-worker-{i}"))
                .spawn(move || {
                    let mut scopes: Vec<NDScope> = Vec::new();
                    for job in rx {
                        job(&mut scopes);
                    }
                    while let Some(s) = scopes.pop() {
                        drop(s);
                    }
                })
                .expect("spawn a worker");
            txs.push(tx);
            handles.push(h);
        }
        Pool { txs, handles }
    }

    /// Run `f` on worker `t` and wait for it; a panic in `f` comes back as `Err`.
    fn try_on<R: Send + 'static>(
        &self,
        t: usize,
        f: impl FnOnce(&mut Vec<NDScope>) -> R + Send + 'static,
    ) -> std::thread::Result<R> {
        let (tx, rx) = sync_channel(1);
        let job: Job = Box::new(move |scopes| {
            let r = catch_unwind(AssertUnwindSafe(|| f(scopes)));
            let _ = tx.send(r);
        });
        self.txs[t].send(job).expect("worker alive");
        rx.recv().expect("worker replies")
    }

    /// Run `f` on worker `t` and wait for it; a panic in `f` is resumed here.
    fn on<R: Send + 'static>(
        &self,
        t: usize,
        f: impl FnOnce(&mut Vec<NDScope>) -> R + Send + 'static,
    ) -> R {
        match self.try_on(t, f) {
            Ok(r) => r,
            Err(p) => resume_unwind(p),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.txs.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

// ==================================================================== the model test

const WORKERS: usize = 3;
/// Model index of the system manager (never closed, never capped).
const SYS: usize = 0;
/// Model index of the test's root manager (made on the main thread).
const ROOT: usize = 1;

static STEPS: AtomicU64 = AtomicU64::new(0);
static CASES: AtomicU64 = AtomicU64::new(0);
/// Coverage: actions on an array made on another thread; use-after-close errors
/// checked; temp-attached arrays returned home; releases whose innermost registration
/// was a tie between threads; scope closes that freed an array made on another thread;
/// arrays registered in scopes of two threads at once.
static FOREIGN_ACTIONS: AtomicU64 = AtomicU64::new(0);
static CLOSED_SEEN: AtomicU64 = AtomicU64::new(0);
static RETURNED_HOME: AtomicU64 = AtomicU64::new(0);
static RELEASE_TIES: AtomicU64 = AtomicU64::new(0);
static FOREIGN_SCOPE_FREES: AtomicU64 = AtomicU64::new(0);
static MULTI_THREAD_REGS: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Debug)]
enum Act {
    Create { m: usize, len: usize },
    Binary { a: usize, b: usize },
    Scalar { a: usize },
    View { a: usize },
    InPlace { a: usize },
    OpenScope { site: u8 },
    CloseScope { k: usize, by_drop: bool },
    Tidy { a: usize },
    Escape { k: usize, a: usize },
    Register { k: usize, a: usize },
    Unregister { a: usize, keep: bool },
    Retain { a: usize },
    Release { a: usize },
    CloseArray { a: usize },
    CloseManager { m: usize },
    NewSub { m: usize },
    Attach { a: usize, m: usize },
    Detach { a: usize },
    TempAttach { a: usize, m: usize },
    Cap { m: usize },
    UseFreed { a: usize, how: u8 },
}

fn act() -> impl Strategy<Value = Act> {
    let i = || 0usize..64;
    prop_oneof![
        8 => (i(), 0usize..4).prop_map(|(m, len)| Act::Create { m, len }),
        5 => (i(), i()).prop_map(|(a, b)| Act::Binary { a, b }),
        3 => i().prop_map(|a| Act::Scalar { a }),
        3 => i().prop_map(|a| Act::View { a }),
        2 => i().prop_map(|a| Act::InPlace { a }),
        5 => any::<u8>().prop_map(|site| Act::OpenScope { site }),
        4 => (i(), any::<bool>()).prop_map(|(k, by_drop)| Act::CloseScope { k, by_drop }),
        2 => i().prop_map(|a| Act::Tidy { a }),
        3 => (i(), i()).prop_map(|(k, a)| Act::Escape { k, a }),
        4 => (i(), i()).prop_map(|(k, a)| Act::Register { k, a }),
        2 => (i(), any::<bool>()).prop_map(|(a, keep)| Act::Unregister { a, keep }),
        3 => i().prop_map(|a| Act::Retain { a }),
        4 => i().prop_map(|a| Act::Release { a }),
        2 => i().prop_map(|a| Act::CloseArray { a }),
        2 => i().prop_map(|m| Act::CloseManager { m }),
        3 => i().prop_map(|m| Act::NewSub { m }),
        2 => (i(), i()).prop_map(|(a, m)| Act::Attach { a, m }),
        1 => i().prop_map(|a| Act::Detach { a }),
        2 => (i(), i()).prop_map(|(a, m)| Act::TempAttach { a, m }),
        1 => i().prop_map(|m| Act::Cap { m }),
        4 => (i(), any::<u8>()).prop_map(|(a, how)| Act::UseFreed { a, how }),
    ]
}

/// Why the model freed an array.
#[derive(Clone, Debug, PartialEq)]
enum Why {
    Explicit,
    Release,
    Scope(SourceLocation),
    Manager(String),
}

#[derive(Clone, Debug)]
struct Freed {
    why: Why,
    /// The location the engine records for the free (`None`: a dropped guard).
    closed_at: Option<SourceLocation>,
}

struct MArr {
    h: NDArray,
    live: bool,
    shape: Vec<usize>,
    owner: usize,
    temp_home: Option<usize>,
    /// Model ids of the scopes it is registered in (of any thread).
    scopes: BTreeSet<usize>,
    retains: u32,
    buf: usize,
    /// The worker that created it.
    creator: usize,
    freed: Option<Freed>,
}

/// A data buffer as the engine keeps it: one record per worker that views it (the
/// creator's is the home, kept while other records exist; the others are proxies, in
/// the order they were made, dropped when empty), each with its holders in creation
/// order. One record carries the charge: its first holder is charged. When that holder
/// goes, the record's next holder takes the charge; when the record has none left, the
/// home's first holder, else the first proxy's.
struct MBuf {
    bytes: usize,
    /// (worker, holders); `records[0]` is the home.
    records: Vec<(usize, Vec<usize>)>,
    /// The worker whose record carries the charge.
    carrier: usize,
    /// The elements (row-major; every view has the same flat data).
    vals: Vec<f32>,
}

struct MMgr {
    h: NDManager,
    name: String,
    parent: Option<usize>,
    /// Open sub-managers in the engine's order (push; swap_remove on close).
    children: Vec<usize>,
    open: bool,
    capped: bool,
}

struct MScope {
    thread: usize,
    opened_at: SourceLocation,
}

#[derive(Clone, Copy, Debug)]
enum Exp {
    Closed(usize),
    MgrClosed,
    Capped,
    Shape,
}

struct Model<'p> {
    pool: &'p Pool,
    /// Whether `Register` may register an array made on another thread (see
    /// `run_model`).
    foreign_registrations: bool,
    arrays: Vec<MArr>,
    bufs: Vec<MBuf>,
    mgrs: Vec<MMgr>,
    scopes: Vec<MScope>,
    /// Each worker's open scopes (model ids), outermost first: mirrors its stack.
    stacks: [Vec<usize>; WORKERS],
    base: (usize, usize, usize),
    base_sys: HashSet<NDArray>,
}

impl<'p> Model<'p> {
    fn new(pool: &'p Pool, foreign_registrations: bool) -> Model<'p> {
        let root = NDManager::new();
        let sys = NDManager::system();
        let base_sys = sys.arrays().into_iter().collect();
        Model {
            pool,
            foreign_registrations,
            arrays: Vec::new(),
            bufs: Vec::new(),
            mgrs: vec![
                MMgr {
                    name: sys.name(),
                    h: sys,
                    parent: None,
                    children: Vec::new(),
                    open: true,
                    capped: false,
                },
                MMgr {
                    name: root.name(),
                    h: root,
                    parent: Some(SYS),
                    children: Vec::new(),
                    open: true,
                    capped: false,
                },
            ],
            scopes: Vec::new(),
            stacks: Default::default(),
            base: counters(),
            base_sys,
        }
    }

    // ------------------------------------------------------------ picking

    /// An array index: mostly a live one, sometimes any (possibly freed) one.
    fn pick(&self, a: usize, t: usize) -> Option<usize> {
        if self.arrays.is_empty() {
            return None;
        }
        let live: Vec<usize> = (0..self.arrays.len())
            .filter(|&i| self.arrays[i].live)
            .collect();
        let i = if a % 4 != 3 && !live.is_empty() {
            live[(a / 4) % live.len()]
        } else {
            (a / 4) % self.arrays.len()
        };
        if self.arrays[i].creator != t {
            FOREIGN_ACTIONS.fetch_add(1, Ordering::Relaxed);
        }
        Some(i)
    }

    fn pick_freed(&self, a: usize) -> Option<usize> {
        let dead: Vec<usize> = (0..self.arrays.len())
            .filter(|&i| !self.arrays[i].live)
            .collect();
        (!dead.is_empty()).then(|| dead[a % dead.len()])
    }

    /// A manager index other than the system's: mostly an open one.
    fn pick_mgr(&self, m: usize) -> usize {
        if m % 4 != 3 {
            let open: Vec<usize> = (ROOT..self.mgrs.len())
                .filter(|&i| self.mgrs[i].open)
                .collect();
            if !open.is_empty() {
                return open[(m / 4) % open.len()];
            }
        }
        ROOT + (m / 4) % (self.mgrs.len() - ROOT)
    }

    /// The values of array `i` (its buffer's).
    fn vals(&self, i: usize) -> &[f32] {
        &self.bufs[self.arrays[i].buf].vals
    }

    /// Depth of an open model scope in its thread's stack (the engine's `depth`).
    fn depth(&self, sid: usize) -> usize {
        let t = self.scopes[sid].thread;
        self.stacks[t]
            .iter()
            .position(|&s| s == sid)
            .expect("registrations name open scopes")
    }

    // ------------------------------------------------------------ model updates

    /// A new array made on worker `t` (registered in `t`'s innermost scope).
    fn add_array(
        &mut self,
        h: NDArray,
        shape: Vec<usize>,
        owner: usize,
        share: Option<usize>,
        vals: Vec<f32>,
        t: usize,
    ) {
        let i = self.arrays.len();
        let buf = match share {
            Some(b) => {
                let recs = &mut self.bufs[b].records;
                match recs.iter_mut().find(|(w, _)| *w == t) {
                    Some((_, hs)) => hs.push(i),
                    None => recs.push((t, vec![i])),
                }
                b
            }
            None => {
                assert_eq!(vals.len(), shape.iter().product::<usize>());
                self.bufs.push(MBuf {
                    bytes: vals.len() * 4,
                    records: vec![(t, vec![i])],
                    carrier: t,
                    vals,
                });
                self.bufs.len() - 1
            }
        };
        let mut scopes = BTreeSet::new();
        if let Some(&sid) = self.stacks[t].last() {
            scopes.insert(sid);
        }
        self.arrays.push(MArr {
            h,
            live: true,
            shape,
            owner,
            temp_home: None,
            scopes,
            retains: 0,
            buf,
            creator: t,
            freed: None,
        });
    }

    fn free(&mut self, i: usize, why: Why, closed_at: Option<SourceLocation>) {
        let a = &mut self.arrays[i];
        if !a.live {
            return;
        }
        a.live = false;
        a.scopes.clear();
        a.freed = Some(Freed { why, closed_at });
        let b = a.buf;
        let buf = &mut self.bufs[b];
        let r = buf
            .records
            .iter()
            .position(|(_, hs)| hs.contains(&i))
            .expect("holder is listed");
        buf.records[r].1.retain(|&h| h != i);
        if !buf.records[r].1.is_empty() {
            return;
        }
        let worker = buf.records[r].0;
        if r > 0 {
            buf.records.remove(r); // an empty proxy goes
        }
        if buf.carrier == worker {
            // The charge moves to the home's first holder, else the first proxy's.
            buf.carrier = match buf.records.iter().find(|(_, hs)| !hs.is_empty()) {
                Some((w, _)) => *w,
                None => usize::MAX, // no holder left: the buffer is gone
            };
        }
    }

    /// Close worker `t`'s scope at stack position `k` (and the ones opened inside it).
    fn close_scopes(&mut self, t: usize, k: usize, by_drop: bool) {
        let at = self.pool.on(t, move |w| {
            let mut chain = w.split_off(k);
            let outer = chain.remove(0);
            let at = if by_drop {
                drop(outer);
                None
            } else {
                Some(close_scope_here(outer))
            };
            for inner in &chain {
                assert!(
                    !inner.is_open(),
                    "closing an outer scope closes the inner ones"
                );
            }
            drop(chain); // dropping guards of closed scopes does nothing
            at
        });
        let ids = self.stacks[t].split_off(k);
        for &sid in ids.iter().rev() {
            let opened_at = self.scopes[sid].opened_at;
            for i in 0..self.arrays.len() {
                let a = &mut self.arrays[i];
                if a.live && a.scopes.remove(&sid) && a.scopes.is_empty() && a.retains == 0 {
                    if a.creator != t {
                        FOREIGN_SCOPE_FREES.fetch_add(1, Ordering::Relaxed);
                    }
                    self.free(i, Why::Scope(opened_at), at);
                }
            }
        }
    }

    fn close_mgr(&mut self, m: usize, at: SourceLocation) {
        if m == SYS || !self.mgrs[m].open {
            return;
        }
        while let Some(&c) = self.mgrs[m].children.last() {
            self.close_mgr(c, at);
        }
        for i in 0..self.arrays.len() {
            if !(self.arrays[i].live && self.arrays[i].owner == m) {
                continue;
            }
            match self.arrays[i].temp_home {
                Some(h) if self.mgrs[h].open && !self.mgrs[h].capped && h != m => {
                    self.arrays[i].owner = h;
                    self.arrays[i].temp_home = None;
                    RETURNED_HOME.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    let name = self.mgrs[m].name.clone();
                    self.free(i, Why::Manager(name), Some(at));
                }
            }
        }
        self.mgrs[m].open = false;
        let p = self.mgrs[m].parent.expect("only the system has no parent");
        let list = &mut self.mgrs[p].children;
        // (The system manager's children are not modelled: it has others.)
        if let Some(pos) = list.iter().position(|&c| c == m) {
            list.swap_remove(pos);
        }
    }

    // ------------------------------------------------------------ checks

    fn is_expected(&self, e: &NdError, allowed: &[Exp]) -> bool {
        allowed.iter().any(|exp| match (exp, e) {
            (Exp::Closed(i), _) => self.is_closed_error(e, *i),
            (Exp::MgrClosed, NdError::ManagerClosed { .. }) => true,
            (Exp::Capped, NdError::ManagerCapped { .. }) => true,
            (Exp::Shape, NdError::ShapeMismatch { .. }) => true,
            _ => false,
        })
    }

    fn expect_err<T: std::fmt::Debug>(&self, what: &str, r: ndscope::Result<T>, allowed: &[Exp]) {
        match r {
            Err(e) if self.is_expected(&e, allowed) => {}
            other => panic!("{what}: expected one of {allowed:?}, got {other:?}"),
        }
    }

    /// `e` says array `i` is closed, with the model's reason and close site. (A case
    /// frees far fewer than 4,096 arrays per shard, so the details are always kept.)
    fn is_closed_error(&self, e: &NdError, i: usize) -> bool {
        let a = &self.arrays[i];
        let Some(f) = &a.freed else { return false };
        let NdError::Closed(info) = e else {
            return false;
        };
        let reason_ok = match (&f.why, &info.reason) {
            (Why::Explicit, CloseReason::Explicit) => true,
            (Why::Release, CloseReason::Release) => true,
            (Why::Scope(at), CloseReason::ScopeClose { opened_at }) => at == opened_at,
            (Why::Manager(n), CloseReason::ManagerClose { manager }) => n == manager,
            _ => false,
        };
        CLOSED_SEEN.fetch_add(1, Ordering::Relaxed);
        reason_ok
            && info.array.uid == a.h.uid()
            && info.array.shape.dims() == a.shape.as_slice()
            && info.closed_at == f.closed_at
    }

    fn check_freed(&self, i: usize, what: &str, r: ndscope::Result<impl std::fmt::Debug>) {
        self.expect_err(what, r, &[Exp::Closed(i)]);
    }

    /// The whole model against the engine, read from the main thread (and each worker
    /// for its scopes).
    fn check(&self) {
        // Arrays: liveness, owner, shape, count, values.
        for (i, a) in self.arrays.iter().enumerate() {
            assert_eq!(a.h.is_closed(), !a.live, "array {i} liveness");
            if !a.live {
                continue;
            }
            let count = a.retains + a.scopes.len() as u32;
            assert_eq!(a.h.try_ref_count().unwrap(), count, "array {i} count");
            assert_eq!(
                a.h.try_manager().unwrap(),
                self.mgrs[a.owner].h,
                "array {i} owner"
            );
            assert_eq!(a.h.try_shape().unwrap().dims(), a.shape.as_slice());
            assert_eq!(
                a.h.to_vec::<f32>().unwrap(),
                self.vals(i),
                "array {i} values"
            );
        }
        // Expected subtree counters: (arrays, buffers, bytes) per manager.
        let mut stats = vec![(0usize, 0usize, 0usize); self.mgrs.len()];
        let mut add = |mut m: usize, d: (usize, usize, usize)| {
            loop {
                stats[m].0 += d.0;
                stats[m].1 += d.1;
                stats[m].2 += d.2;
                match self.mgrs[m].parent {
                    Some(p) => m = p,
                    None => return,
                }
            }
        };
        for a in self.arrays.iter().filter(|a| a.live) {
            add(a.owner, (1, 0, 0));
        }
        for b in &self.bufs {
            if let Some(&first) = b
                .records
                .iter()
                .find(|(w, _)| *w == b.carrier)
                .and_then(|(_, hs)| hs.first())
            {
                add(self.arrays[first].owner, (0, 1, b.bytes));
            }
        }
        for (m, mm) in self.mgrs.iter().enumerate().skip(ROOT) {
            let s = mm.h.memory();
            if !mm.open {
                assert!(!mm.h.is_open(), "manager {m} should be closed");
                assert_eq!(s, Default::default(), "closed manager {m}");
                continue;
            }
            assert!(mm.h.is_open(), "manager {m} should be open");
            assert_eq!(mm.h.is_capped(), mm.capped, "manager {m} capped");
            assert_eq!(
                (s.live_arrays, s.live_buffers, s.live_bytes),
                stats[m],
                "manager {m} counters"
            );
            let direct: HashSet<NDArray> = mm.h.arrays().into_iter().collect();
            let model: HashSet<NDArray> = self
                .arrays
                .iter()
                .filter(|a| a.live && a.owner == m)
                .map(|a| a.h)
                .collect();
            assert_eq!(direct, model, "manager {m} direct arrays");
            let children: Vec<NDManager> = mm
                .children
                .iter()
                .map(|&c| self.mgrs[c].h.clone())
                .collect();
            assert_eq!(mm.h.children(), children, "manager {m} children");
        }
        // The system manager: detached arrays; the process-wide counters.
        let sys: HashSet<NDArray> = NDManager::system().arrays().into_iter().collect();
        let mut model_sys = self.base_sys.clone();
        model_sys.extend(
            self.arrays
                .iter()
                .filter(|a| a.live && a.owner == SYS)
                .map(|a| a.h),
        );
        assert_eq!(sys, model_sys, "system manager's direct arrays");
        let (ba, bb, bn) = self.base;
        let (sa, sb, sn) = stats[SYS];
        assert_eq!(counters(), (ba + sa, bb + sb, bn + sn), "process counters");
        // Scopes: each worker's stack and registrations.
        for t in 0..WORKERS {
            let real: Vec<(bool, HashSet<NDArray>)> = self.pool.on(t, |w| {
                w.iter()
                    .map(|s| (s.is_open(), s.arrays().into_iter().collect()))
                    .collect()
            });
            assert_eq!(real.len(), self.stacks[t].len(), "worker {t} scope depth");
            for (pos, (&sid, (open, real))) in self.stacks[t].iter().zip(&real).enumerate() {
                assert!(open, "worker {t} scope at depth {pos} is open");
                let model: HashSet<NDArray> = self
                    .arrays
                    .iter()
                    .filter(|a| a.live && a.scopes.contains(&sid))
                    .map(|a| a.h)
                    .collect();
                assert_eq!(
                    real, &model,
                    "worker {t} scope at depth {pos} registrations"
                );
            }
        }
        let multi = self.arrays.iter().any(|a| {
            let threads: HashSet<usize> = a.scopes.iter().map(|&s| self.scopes[s].thread).collect();
            threads.len() > 1
        });
        if multi {
            MULTI_THREAD_REGS.fetch_add(1, Ordering::Relaxed);
        }
    }

    // ------------------------------------------------------------ the interpreter

    /// Run one action on worker `t`.
    fn step(&mut self, t: usize, act: &Act) {
        let pool = self.pool;
        match *act {
            Act::Create { m, len } => {
                let m = self.pick_mgr(m);
                let vals: Vec<f32> = (0..len).map(|k| 0.5 + k as f32 + 10.0 * t as f32).collect();
                let (mh, v) = (self.mgrs[m].h.clone(), vals.clone());
                let r = pool.on(t, move |_| mh.try_create(&v, [len]));
                if !self.mgrs[m].open {
                    self.expect_err("create", r, &[Exp::MgrClosed]);
                } else if self.mgrs[m].capped {
                    self.expect_err("create", r, &[Exp::Capped]);
                } else {
                    self.add_array(r.expect("create"), vec![len], m, None, vals, t);
                }
            }
            Act::Binary { a, b } => {
                let (Some(a), Some(b)) = (self.pick(a, t), self.pick(b, t)) else {
                    return;
                };
                let (xh, yh) = (self.arrays[a].h, self.arrays[b].h);
                let r = pool.on(t, move |_| xh.try_add(yh));
                let (x, y) = (&self.arrays[a], &self.arrays[b]);
                let shape = broadcast(&x.shape, &y.shape);
                if !x.live {
                    self.expect_err("add", r, &[Exp::Closed(a)]);
                } else if !y.live {
                    self.expect_err("add", r, &[Exp::Closed(b)]);
                } else if self.mgrs[x.owner].capped || shape.is_none() {
                    let mut allowed = vec![];
                    if self.mgrs[x.owner].capped {
                        allowed.push(Exp::Capped);
                    }
                    if shape.is_none() {
                        allowed.push(Exp::Shape);
                    }
                    self.expect_err("add", r, &allowed);
                } else if let Some(out) = shape {
                    let n: usize = out.iter().product();
                    let (xv, yv) = (self.vals(a), self.vals(b));
                    let vals = (0..n)
                        .map(|o| xv[bindex(&out, &x.shape, o)] + yv[bindex(&out, &y.shape, o)])
                        .collect();
                    let owner = x.owner;
                    self.add_array(r.expect("add"), out, owner, None, vals, t);
                }
            }
            Act::Scalar { a } => {
                let Some(a) = self.pick(a, t) else { return };
                let xh = self.arrays[a].h;
                let r = pool.on(t, move |_| xh.try_mul(2.0));
                let x = &self.arrays[a];
                if !x.live {
                    self.expect_err("mul", r, &[Exp::Closed(a)]);
                } else if self.mgrs[x.owner].capped {
                    self.expect_err("mul", r, &[Exp::Capped]);
                } else {
                    let (shape, owner) = (x.shape.clone(), x.owner);
                    let vals = self.vals(a).iter().map(|v| v * 2.0).collect();
                    self.add_array(r.expect("mul"), shape, owner, None, vals, t);
                }
            }
            Act::View { a } => {
                let Some(a) = self.pick(a, t) else { return };
                let x = &self.arrays[a];
                let mut shape = vec![1];
                shape.extend(&x.shape);
                let (xh, s) = (x.h, shape.clone());
                let r = pool.on(t, move |_| xh.try_reshape(s.as_slice()));
                let x = &self.arrays[a];
                if !x.live {
                    self.expect_err("reshape", r, &[Exp::Closed(a)]);
                } else if self.mgrs[x.owner].capped {
                    self.expect_err("reshape", r, &[Exp::Capped]);
                } else {
                    let (owner, buf) = (x.owner, x.buf);
                    self.add_array(r.expect("reshape"), shape, owner, Some(buf), vec![], t);
                }
            }
            Act::InPlace { a } => {
                let Some(a) = self.pick(a, t) else { return };
                let xh = self.arrays[a].h;
                let r = pool.on(t, move |_| xh.try_addi(1.0));
                if !self.arrays[a].live {
                    return self.check_freed(a, "addi", r);
                }
                // Allowed on a capped manager's array too (rule 8); seen by every view.
                r.expect("addi");
                let b = self.arrays[a].buf;
                for v in &mut self.bufs[b].vals {
                    *v += 1.0;
                }
            }
            Act::OpenScope { site } => {
                let opened_at = pool.on(t, move |w| {
                    let s = open_scope(site);
                    let at = s.opened_at().expect("open");
                    w.push(s);
                    at
                });
                let sid = self.scopes.len();
                self.scopes.push(MScope {
                    thread: t,
                    opened_at,
                });
                self.stacks[t].push(sid);
            }
            Act::CloseScope { k, by_drop } => {
                if !self.stacks[t].is_empty() {
                    let k = k % self.stacks[t].len();
                    self.close_scopes(t, k, by_drop);
                }
            }
            Act::Tidy { a } => {
                let Some(a) = self.pick(a, t) else { return };
                let xh = self.arrays[a].h;
                let (at, tmp, r) = pool.on(t, move |_| tidy(xh));
                let x = &self.arrays[a];
                if !x.live {
                    self.expect_err("scope(a * 2 + 1)", r, &[Exp::Closed(a)]);
                    assert!(tmp.is_none());
                } else if self.mgrs[x.owner].capped {
                    self.expect_err("scope(a * 2 + 1)", r, &[Exp::Capped]);
                    assert!(tmp.is_none());
                } else {
                    let (shape, owner) = (x.shape.clone(), x.owner);
                    let doubled: Vec<f32> = self.vals(a).iter().map(|v| v * 2.0).collect();
                    let plus: Vec<f32> = doubled.iter().map(|v| v + 1.0).collect();
                    // The product lived only in the tidy scope (freed at its close, which
                    // records the caller's line); the result escaped to `t`'s scope.
                    self.add_array(
                        tmp.expect("product"),
                        shape.clone(),
                        owner,
                        None,
                        doubled,
                        t,
                    );
                    let ti = self.arrays.len() - 1;
                    self.free(ti, Why::Scope(at), Some(at));
                    self.add_array(r.expect("tidy result"), shape, owner, None, plus, t);
                }
            }
            Act::Escape { k, a } => {
                let Some(a) = self.pick(a, t) else { return };
                if self.stacks[t].is_empty() {
                    return;
                }
                let k = k % self.stacks[t].len();
                let h = self.arrays[a].h;
                let r = pool.on(t, move |w| w[k].try_escape(h).map(|_| ()));
                if !self.arrays[a].live {
                    return self.check_freed(a, "escape", r);
                }
                r.expect("escape");
                let sid = self.stacks[t][k];
                let parent = k.checked_sub(1).map(|p| self.stacks[t][p]);
                let x = &mut self.arrays[a];
                if x.scopes.remove(&sid)
                    && let Some(p) = parent
                {
                    x.scopes.insert(p);
                }
            }
            Act::Register { k, a } => {
                let Some(a) = self.pick(a, t) else { return };
                if self.stacks[t].is_empty()
                    || (!self.foreign_registrations && self.arrays[a].creator != t)
                {
                    return;
                }
                let k = k % self.stacks[t].len();
                let h = self.arrays[a].h;
                let r = pool.on(t, move |w| w[k].try_register(h).map(|_| ()));
                if !self.arrays[a].live {
                    return self.check_freed(a, "register", r);
                }
                r.expect("register");
                let sid = self.stacks[t][k];
                self.arrays[a].scopes.insert(sid);
            }
            Act::Unregister { a, keep } => {
                let Some(a) = self.pick(a, t) else { return };
                let h = self.arrays[a].h;
                let call = move || {
                    if keep {
                        h.keep();
                    } else {
                        NDScope::unregister(h);
                    }
                };
                if self.arrays[a].live {
                    pool.on(t, move |_| call());
                    self.arrays[a].scopes.clear();
                } else {
                    // No `try_` twin: documented to panic with the `Closed` message.
                    let msg = pool.on(t, move |_| expect_panic(call));
                    assert!(msg.starts_with("use of a closed array"), "{msg}");
                }
            }
            Act::Retain { a } => {
                let Some(a) = self.pick(a, t) else { return };
                let h = self.arrays[a].h;
                let r = pool.on(t, move |_| h.try_retain());
                if !self.arrays[a].live {
                    return self.check_freed(a, "retain", r);
                }
                let x = &mut self.arrays[a];
                x.retains += 1;
                assert_eq!(r.expect("retain"), x.retains + x.scopes.len() as u32);
            }
            Act::Release { a } => self.release(t, a),
            Act::CloseArray { a } => {
                let Some(a) = self.pick(a, t) else { return };
                let h = self.arrays[a].h;
                let at = pool.on(t, move |_| close_here(h)); // idempotent
                self.free(a, Why::Explicit, Some(at));
            }
            Act::CloseManager { m } => {
                let m = self.pick_mgr(m);
                let mh = self.mgrs[m].h.clone();
                let at = pool.on(t, move |_| close_manager_here(&mh)); // idempotent
                self.close_mgr(m, at);
            }
            Act::NewSub { m } => {
                let m = self.pick_mgr(m);
                let mh = self.mgrs[m].h.clone();
                let r = pool.on(t, move |_| mh.try_new_sub_manager());
                if !self.mgrs[m].open {
                    return self.expect_err("new_sub_manager", r, &[Exp::MgrClosed]);
                }
                let h = r.expect("new_sub_manager");
                let i = self.mgrs.len();
                self.mgrs.push(MMgr {
                    name: h.name(),
                    h,
                    parent: Some(m),
                    children: Vec::new(),
                    open: true,
                    capped: false,
                });
                self.mgrs[m].children.push(i);
            }
            Act::Attach { a, m } | Act::TempAttach { a, m } => {
                let temp = matches!(act, Act::TempAttach { .. });
                let Some(a) = self.pick(a, t) else { return };
                let m = self.pick_mgr(m);
                let (h, mh) = (self.arrays[a].h, self.mgrs[m].h.clone());
                let r = pool.on(t, move |_| {
                    if temp {
                        h.try_temp_attach(&mh)
                    } else {
                        h.try_attach(&mh)
                    }
                });
                let mut allowed = vec![];
                if !self.arrays[a].live {
                    allowed.push(Exp::Closed(a));
                }
                if !self.mgrs[m].open {
                    allowed.push(Exp::MgrClosed);
                } else if self.mgrs[m].capped {
                    allowed.push(Exp::Capped);
                }
                if !allowed.is_empty() {
                    return self.expect_err("attach", r, &allowed);
                }
                r.expect("attach");
                let x = &mut self.arrays[a];
                if temp {
                    x.temp_home = Some(x.temp_home.unwrap_or(x.owner));
                } else {
                    x.temp_home = None;
                }
                x.owner = m;
            }
            Act::Detach { a } => {
                let Some(a) = self.pick(a, t) else { return };
                let h = self.arrays[a].h;
                let r = pool.on(t, move |_| h.try_detach());
                if !self.arrays[a].live {
                    return self.check_freed(a, "detach", r);
                }
                r.expect("detach");
                self.arrays[a].owner = SYS;
                self.arrays[a].temp_home = None;
            }
            Act::Cap { m } => {
                let m = self.pick_mgr(m);
                let mh = self.mgrs[m].h.clone();
                pool.on(t, move |_| mh.cap());
                if self.mgrs[m].open {
                    self.mgrs[m].capped = true;
                }
            }
            Act::UseFreed { a, how } => {
                let Some(i) = self.pick_freed(a) else { return };
                self.use_freed(t, i, how);
            }
        }
    }

    /// `release()` on worker `t`: frees at count 1; otherwise gives up a retain, or the
    /// innermost scope registration (deepest in its thread's stack; between scopes of
    /// two threads at the same depth the rules do not say which, so the model looks).
    fn release(&mut self, t: usize, a: usize) {
        let Some(a) = self.pick(a, t) else { return };
        let h = self.arrays[a].h;
        let (at, r) = self.pool.on(t, move |_| release_here(h));
        if !self.arrays[a].live {
            return self.check_freed(a, "release", r);
        }
        let x = &self.arrays[a];
        let count = x.retains + x.scopes.len() as u32;
        let freed = r.expect("release");
        assert_eq!(freed, count <= 1, "release of count {count}");
        if count <= 1 {
            self.free(a, Why::Release, Some(at));
        } else if x.retains > 0 {
            self.arrays[a].retains -= 1;
        } else {
            let deepest = x
                .scopes
                .iter()
                .map(|&s| self.depth(s))
                .max()
                .expect("count > 1");
            let tied: Vec<usize> = x
                .scopes
                .iter()
                .copied()
                .filter(|&s| self.depth(s) == deepest)
                .collect();
            let gone = if tied.len() == 1 {
                tied[0]
            } else {
                RELEASE_TIES.fetch_add(1, Ordering::Relaxed);
                let lost: Vec<usize> = tied
                    .iter()
                    .copied()
                    .filter(|&sid| {
                        let (st, k) = (self.scopes[sid].thread, self.depth(sid));
                        !self.pool.on(st, move |w| w[k].arrays().contains(&h))
                    })
                    .collect();
                assert_eq!(lost.len(), 1, "release gives up exactly one registration");
                lost[0]
            };
            self.arrays[a].scopes.remove(&gone);
        }
    }

    /// Every use of a freed array on worker `t` fails with `Closed` and the right
    /// reason and close site.
    fn use_freed(&self, t: usize, i: usize, how: u8) {
        let h = self.arrays[i].h;
        let live = self.arrays.iter().find(|a| a.live).map(|a| a.h);
        let root = self.mgrs[ROOT].h.clone();
        let has_scope = !self.stacks[t].is_empty();
        if how % 16 == 15 {
            let (msg, e) = self.pool.on(t, move |_| {
                assert!(h.is_closed());
                h.close(); // idempotent, no panic
                assert!(format!("{h:?}").contains("closed"));
                let msg = expect_panic(|| {
                    let _ = h + 1.0;
                });
                (msg, h.try_add(1.0).unwrap_err())
            });
            assert!(self.is_closed_error(&e, i), "{e}");
            return assert_eq!(
                msg,
                e.to_string(),
                "the operator panics with the error text"
            );
        }
        let r: ndscope::Result<()> = self.pool.on(t, move |w| match how % 16 {
            0 => h.try_shape().map(drop),
            1 => h.try_dtype().map(drop),
            2 => h.to_vec::<f32>().map(drop),
            3 => h.try_add(1.0).map(drop),
            4 => match live {
                Some(l) => l.try_add(h).map(drop),
                None => h.try_add(h).map(drop),
            },
            5 => h.try_retain().map(drop),
            6 => h.try_release().map(drop),
            7 => h.try_ref_count().map(drop),
            8 => h.try_reshape([1, 1]).map(drop),
            9 => h.try_sum().map(drop),
            10 => h.try_addi(1.0),
            11 => h.try_detach().map(drop),
            12 => h.try_manager().map(drop),
            13 if has_scope => w.last().expect("open").try_register(h).map(drop),
            13 => h.to_scalar::<f32>().map(drop),
            _ => h.try_temp_attach(&root).map(drop),
        });
        self.check_freed(i, "use of a freed array", r);
    }

    /// Close what is left the way a user would, checking the model on the way; then the
    /// process counters are back at the baseline.
    fn finish(&mut self) {
        for t in 0..WORKERS {
            while !self.stacks[t].is_empty() {
                let k = self.stacks[t].len() - 1;
                self.close_scopes(t, k, true);
                self.check();
            }
        }
        let root = self.mgrs[ROOT].h.clone();
        let at = self.pool.on(0, move |_| close_manager_here(&root));
        self.close_mgr(ROOT, at);
        self.check();
        for i in 0..self.arrays.len() {
            if self.arrays[i].live {
                assert_eq!(self.arrays[i].owner, SYS, "only detached arrays are left");
                let h = self.arrays[i].h;
                let at = self.pool.on(i % WORKERS, move |_| close_here(h));
                self.free(i, Why::Explicit, Some(at));
            }
        }
        self.check();
        assert_eq!(counters(), self.base, "counters back at baseline");
    }
}

impl Drop for Model<'_> {
    /// After a failure, free everything the case made so that shrinking starts clean.
    fn drop(&mut self) {
        for t in 0..WORKERS {
            let _ = self.pool.try_on(t, |w| {
                while let Some(s) = w.pop() {
                    drop(s);
                }
            });
        }
        self.mgrs[ROOT].h.close();
        for a in &self.arrays {
            a.h.close();
        }
    }
}

fn run_case(pool: &Pool, steps: &[(usize, Act)], foreign_registrations: bool) {
    let mut model = Model::new(pool, foreign_registrations);
    model.check();
    for (t, act) in steps {
        model.step(*t, act);
        model.check();
        STEPS.fetch_add(1, Ordering::Relaxed);
    }
    model.finish();
    CASES.fetch_add(1, Ordering::Relaxed);
}

/// Run the model test; `foreign_registrations`: whether a worker's scope may register
/// an array made on another worker.
fn run_model(foreign_registrations: bool) {
    let _serial = serial();
    let cases = env_or("NDSCOPE_MODEL_CASES", 400);
    let max_steps = env_or("NDSCOPE_MODEL_STEPS", 100) as usize;
    let base = counters();
    let system_children = NDManager::system().children().len();
    let pool = Pool::new(WORKERS);
    let t0 = std::time::Instant::now();
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let steps = prop::collection::vec((0..WORKERS, act()), 1..=max_steps);
    let result = runner.run(&steps, |steps| {
        run_case(&pool, &steps, foreign_registrations);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    drop(pool);
    assert_eq!(counters(), base);
    assert_eq!(NDManager::system().children().len(), system_children);
    let n = |c: &AtomicU64| c.swap(0, Ordering::Relaxed);
    println!(
        "threads model (foreign registrations: {foreign_registrations}): {} cases, {} steps, \
         in {:.1?}; actions on another thread's array: {}; freed-array errors checked: {}; \
         temp-attached arrays returned home: {}; releases between tied scopes of two \
         threads: {}; scope closes freeing another thread's array: {}; steps with an array \
         in scopes of two threads: {}",
        n(&CASES),
        n(&STEPS),
        t0.elapsed(),
        n(&FOREIGN_ACTIONS),
        n(&CLOSED_SEEN),
        n(&RETURNED_HOME),
        n(&RELEASE_TIES),
        n(&FOREIGN_SCOPE_FREES),
        n(&MULTI_THREAD_REGS),
    );
}

/// Rules 1-9 (docs/ownership.md) across threads: random sequences of actions, each run
/// on one of three worker threads (so most touch arrays, managers and scopes made on
/// another thread), checked after every step against a reference model: liveness of
/// every handle, owners, counts, values, each manager's counters, direct arrays and
/// children, the process counters, each worker's scope registrations, and the reason
/// and site of every use-after-close error. Scopes are per worker (rule 9); arrays made
/// on one thread are registered in (rule 3), escaped from (rule 4), released by and
/// freed with (rule 5) scopes of others; managers are closed and capped from any thread
/// (rules 1, 2, 8); views share buffers across threads (rule 6); stale handles report
/// their reason and close site (rule 7).
#[test]
fn cross_thread_ownership_matches_the_reference_model() {
    run_model(true);
}

/// The model test above with `NDScope::register` limited to arrays made on the same
/// thread (every other action still crosses threads), so that it runs while the bug
/// that the full test hits is open. Rules 1-9 (docs/ownership.md).
#[test]
fn cross_thread_ownership_matches_the_reference_model_with_own_thread_registrations() {
    run_model(false);
}

// ==================================================================== the engine bug

/// Spawn `n` threads that each run `f(i)` and stay alive until all have returned (so
/// each has a shard of its own, none adopted from another), and collect the results.
fn on_live_threads<R: Send>(n: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let barrier = Barrier::new(n);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|i| {
                let (f, barrier) = (&f, &barrier);
                s.spawn(move || {
                    let r = f(i);
                    barrier.wait();
                    r
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// An array made on another (exited) thread while this thread's shard already exists.
fn foreign_array(m: &NDManager) -> NDArray {
    ndscope::memory(); // gives this thread its shard first
    on_live_threads(1, |_| m.full([2], 5.0, DType::F32).keep()).remove(0)
}

/// Rules 3 and 5 (docs/ownership.md): freeing an array registered in a scope of its own
/// thread, where that scope also holds an array of another thread (registered by
/// hand), frees just that array.
#[test]
fn scope_holding_another_threads_array_survives_a_close_of_a_local_one() {
    let _serial = serial();
    let base = counters();
    let m = NDManager::new();
    let x = foreign_array(&m);
    let s = NDScope::new();
    let a = m.zeros([1], DType::F32); // registered in `s`, before `x`
    s.register(x);
    a.close(); // unlinks `a`; `x` moves into its slot of the scope's list
    assert!(a.is_closed() && !x.is_closed());
    assert_eq!(s.arrays(), vec![x]);
    assert_eq!(m.memory().live_arrays, 1);
    drop(s);
    assert!(x.is_closed());
    m.close();
    assert_eq!(counters(), base);
}

/// Rule 5 (docs/ownership.md): the same with `release()`.
#[test]
fn scope_holding_another_threads_array_survives_a_release_of_a_local_one() {
    let _serial = serial();
    let base = counters();
    let m = NDManager::new();
    let x = foreign_array(&m);
    let s = NDScope::new();
    let a = m.zeros([1], DType::F32);
    s.register(x);
    assert!(a.release());
    assert!(!x.is_closed());
    assert_eq!(s.arrays(), vec![x]);
    drop(s);
    m.close();
    assert_eq!(counters(), base);
}

/// Rule 4 (docs/ownership.md): `keep()` of an array registered in its own thread's
/// scope, next to another thread's array.
#[test]
fn scope_holding_another_threads_array_survives_a_keep_of_a_local_one() {
    let _serial = serial();
    let base = counters();
    let m = NDManager::new();
    let x = foreign_array(&m);
    let s = NDScope::new();
    let a = m.zeros([1], DType::F32);
    s.register(x);
    a.keep();
    assert_eq!(s.arrays(), vec![x]);
    drop(s);
    assert!(x.is_closed() && !a.is_closed());
    m.close();
    assert_eq!(counters(), base);
}

/// Rule 4 (docs/ownership.md): escaping one of two arrays of two other threads from a
/// scope.
#[test]
fn scope_holding_two_other_threads_arrays_escapes_one() {
    let _serial = serial();
    let base = counters();
    let m = NDManager::new();
    ndscope::memory(); // gives this thread its shard first
    let xy = on_live_threads(2, |i| m.full([1], i as f64, DType::F32));
    let (x, y) = (xy[0], xy[1]);
    let outer = NDScope::new();
    let s = NDScope::new();
    s.register(y);
    s.register(x); // after `y`: moves into `y`'s slot when `y` leaves
    s.escape(y);
    assert_eq!(s.arrays(), vec![x]);
    assert_eq!(outer.arrays(), vec![y]);
    drop(s);
    assert!(x.is_closed() && !y.is_closed());
    drop(outer);
    assert!(y.is_closed());
    m.close();
    assert_eq!(counters(), base);
}

// ==================================================================== autograd

/// Train a linear model `w` [3, 1] on data made from `seed`, `steps` times with a new
/// `GradientCollector` each step; returns the bits of `w`'s gradient after each step.
/// Everything is made on the calling thread; `start` is waited on before training.
fn train(seed: u32, steps: usize, start: Option<&Barrier>) -> Vec<Vec<u32>> {
    let m = NDManager::new();
    let xs: Vec<f32> = (0..24u32)
        .map(|k| ((k * 7 + seed * 13) % 11) as f32 * 0.25 - 1.0)
        .collect();
    let ys: Vec<f32> = (0..8u32)
        .map(|k| ((k * 5 + seed) % 7) as f32 * 0.5)
        .collect();
    let x = m.create(&xs, [8, 3]);
    let y = m.create(&ys, [8, 1]);
    let w = m
        .create(&[0.1 * seed as f32, -0.2, 0.3], [3, 1])
        .set_requires_gradient(true);
    if let Some(b) = start {
        b.wait();
    }
    let mut grads = Vec::with_capacity(steps);
    for _ in 0..steps {
        let _step = NDScope::new();
        let g = {
            let gc = GradientCollector::new();
            let loss = (x.matmul(w) - y).square().sum();
            gc.backward(loss).expect("backward");
            w.gradient()
        };
        grads.push(
            g.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect(),
        );
        w.try_subi(g * 0.002).expect("update");
    }
    assert_eq!(m.memory().live_arrays, 4, "x, y, w and its gradient");
    m.close();
    grads
}

/// Threads (docs/ownership.md, "Autograd per collector") and rules 9 and 10: two
/// threads each train their own model with a new `GradientCollector` per step, at the
/// same time; every gradient is bit for bit the one the same training gives alone.
#[test]
fn two_collectors_on_two_threads_compute_what_each_computes_alone() {
    let _serial = serial();
    let base = counters();
    let steps = iters(150);
    let alone: Vec<Vec<Vec<u32>>> = (1..=2u32)
        .map(|seed| {
            std::thread::spawn(move || train(seed, steps, None))
                .join()
                .unwrap()
        })
        .collect();
    assert_ne!(alone[0], alone[1], "the two models differ");
    for round in 0..3 {
        let start = Barrier::new(2);
        let together: Vec<Vec<Vec<u32>>> = std::thread::scope(|s| {
            let hs: Vec<_> = (1..=2u32)
                .map(|seed| {
                    let start = &start;
                    s.spawn(move || train(seed, steps, Some(start)))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for t in 0..2 {
            if let Some(k) = (0..steps).find(|&k| together[t][k] != alone[t][k]) {
                panic!(
                    "round {round}, thread {t}, step {k}: gradient {:?} together, {:?} alone",
                    together[t][k]
                        .iter()
                        .map(|b| f32::from_bits(*b))
                        .collect::<Vec<_>>(),
                    alone[t][k]
                        .iter()
                        .map(|b| f32::from_bits(*b))
                        .collect::<Vec<_>>(),
                );
            }
        }
    }
    assert_eq!(counters(), base);
}

/// Threads (docs/ownership.md: "Each collector zeroes and accumulates only the
/// gradients of the parameters its own tape records") and the docs of
/// `GradientCollector::new` ("zeroing the gradient of every array that requires one"):
/// a parameter made on the main thread and trained on another thread gets a fresh
/// gradient from each new collector there, not the sum over all steps.
#[test]
fn collector_zeroes_a_parameter_made_on_another_thread() {
    let _serial = serial();
    let base = counters();
    let m = NDManager::new();
    let w = m.create(&[1.0f32, 2.0], [2, 1]).set_requires_gradient(true);
    let x = m.create(&[3.0f32, 4.0], [1, 2]);
    let grads = std::thread::spawn(move || {
        (0..3)
            .map(|_| {
                let gc = GradientCollector::new();
                let loss = ndscope::scope(|| x.matmul(w).square().sum());
                gc.backward(loss).expect("backward");
                drop(gc);
                loss.close();
                w.gradient().to_vec::<f32>().unwrap()
            })
            .collect::<Vec<_>>()
    })
    .join()
    .unwrap();
    // d/dw (x w)^2 = 2 * 11 * x^T, the same on every step.
    assert_eq!(grads, vec![vec![66.0, 88.0]; 3]);
    m.close();
    assert_eq!(counters(), base);
}

// ==================================================================== thread exit

/// Threads (docs/ownership.md: "a thread may exit while arrays it created live on, and
/// they stay usable and are freed elsewhere") and rules 1, 5, 6, 7: arrays a thread
/// made in a manager of the main thread, a view, a retained array that outlived the
/// thread's scope, and a manager the thread made, all used, released and closed on
/// the main thread (and on a later thread, which may adopt the exited one's shard).
#[test]
fn arrays_outlive_the_thread_that_made_them() {
    let _serial = serial();
    let base = counters();
    let m = NDManager::new();
    let mc = m.clone();
    let (a, b, c, v, kept, own, own_arr) = std::thread::spawn(move || {
        let a = mc.create(&[1.0f32, 2.0, 3.0], [3]);
        let b = mc.arange(0.0, 4.0, 1.0, DType::F32);
        let c = a * 2.0; // owned by `mc`, like `a`
        let v = b.reshape([2, 2]); // a view of `b`
        let kept = {
            let _s = NDScope::new();
            let k = mc.ones([2], DType::F32);
            assert_eq!(k.retain(), 2);
            let _temp = k + 1.0; // freed with the scope
            k
        };
        let own = NDManager::new();
        let own_arr = own.full([2], 7.0, DType::F32);
        (a, b, c, v, kept, own, own_arr)
    })
    .join()
    .unwrap();
    // All usable on the main thread, with the counters of their managers.
    assert_eq!(m.memory().live_arrays, 5);
    assert_eq!(m.memory().live_buffers, 4);
    assert_eq!(m.memory().live_bytes, (3 + 4 + 3 + 2) * 4);
    assert_eq!(own.memory().live_arrays, 1);
    assert_eq!(a.to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0]);
    assert_eq!(c.to_vec::<f32>().unwrap(), [2.0, 4.0, 6.0]);
    let row = v.get("1"); // one more view of `b`'s buffer, owned by `m`
    assert_eq!(row.to_vec::<f32>().unwrap(), [2.0, 3.0]);
    assert_eq!(own_arr.to_vec::<f32>().unwrap(), [7.0, 7.0]);
    assert_eq!((a + c).sum().to_scalar::<f32>().unwrap(), 18.0); // owned by `m`
    assert_eq!(m.memory().live_arrays, 8);
    assert_eq!(m.memory().live_buffers, 6);
    // Reference counts: the retain outlived the thread's scope.
    assert_eq!(kept.ref_count(), 1);
    assert_eq!(a.retain(), 1);
    assert_eq!(a.retain(), 2);
    assert!(!a.release());
    assert!(a.release());
    let e = a.try_add(1.0).unwrap_err();
    assert_closed(&e, a, &CloseReason::Release);
    // A view outlives its closed base (rule 6), in place writes included.
    b.close();
    assert_closed(&b.try_sum().unwrap_err(), b, &CloseReason::Explicit);
    v.try_addi(1.0).unwrap();
    assert_eq!(v.to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(row.to_vec::<f32>().unwrap(), [3.0, 4.0]);
    // c, v, row, kept, a + c, its sum; `b`'s buffer is still counted (for `v`).
    assert_eq!(m.memory().live_arrays, 6);
    assert_eq!(m.memory().live_buffers, 5);
    assert_eq!(m.memory().live_bytes, (3 + 4 + 2 + 3 + 1) * 4);
    // A later thread (maybe on the exited thread's shard) closes and creates.
    let (mc, own2) = (m.clone(), own.clone());
    let later = std::thread::spawn(move || {
        assert!(kept.release());
        let d = mc.full([4], 1.5, DType::F32);
        let e = own2.zeros([1], DType::F32);
        assert_eq!(c.to_vec::<f32>().unwrap(), [2.0, 4.0, 6.0]);
        (d, e)
    })
    .join()
    .unwrap();
    assert!(kept.is_closed());
    assert_eq!(later.0.to_vec::<f32>().unwrap(), [1.5; 4]);
    assert_eq!(own.memory().live_arrays, 2);
    let name = own.name();
    own.close();
    assert!(own_arr.is_closed() && later.1.is_closed());
    assert_closed(
        &own_arr.to_vec::<f32>().unwrap_err(),
        own_arr,
        &CloseReason::ManagerClose { manager: name },
    );
    // c, v, row, a + c, its sum, d.
    assert_eq!(m.memory().live_arrays, 6);
    m.close();
    assert!(c.is_closed() && v.is_closed() && row.is_closed() && later.0.is_closed());
    assert_eq!(counters(), base);
}

/// Threads (docs/ownership.md) and rules 1, 5, 8: 200 short-lived threads, four at a
/// time (so later ones adopt the shards of exited ones), each make and free arrays in
/// a sub-manager of their own and leave some alive in a shared manager, some handed to
/// later threads through a shared inbox (which close or release them). At the end the
/// counters are exact, every survivor has its value, and closing the shared manager
/// frees everything.
#[test]
fn thread_churn_leaves_exact_counters() {
    let _serial = serial();
    let base = counters();
    let system_children = NDManager::system().children().len();
    let shared = NDManager::new();
    let threads = iters(200);
    // (array, value, retained) handed from one thread to a later one.
    let inbox: Mutex<Vec<(NDArray, f32, bool)>> = Mutex::new(Vec::new());
    let left: Mutex<Vec<(NDArray, f32)>> = Mutex::new(Vec::new());
    let leftover_subs: Mutex<Vec<NDManager>> = Mutex::new(Vec::new());
    for batch in (0..threads).collect::<Vec<_>>().chunks(4) {
        std::thread::scope(|s| {
            for &i in batch {
                let (shared, inbox, left, subs) = (&shared, &inbox, &left, &leftover_subs);
                s.spawn(move || {
                    let value = i as f32;
                    let own = shared.new_sub_manager();
                    {
                        let _s = NDScope::new();
                        let x = own.full([8], value as f64, DType::F32);
                        let y = shared.ones([8], DType::F32);
                        let z = (x + y).sum(); // owned by `own`
                        assert_eq!(z.to_scalar::<f32>().unwrap(), 8.0 * (value + 1.0));
                    }
                    assert_eq!(own.memory().live_arrays, 0);
                    // Left alive in `shared`: i % 3 arrays.
                    for _ in 0..i % 3 {
                        let a = shared.full([2], value as f64, DType::F32);
                        left.lock().unwrap().push((a, value));
                    }
                    // Handed on: one kept, one retained inside a scope.
                    let handed = {
                        let _s = NDScope::new();
                        let k = shared.full([1], value as f64, DType::F32).keep();
                        let r = shared.full([1], value as f64, DType::F32);
                        r.retain();
                        [(k, value, false), (r, value, true)]
                    };
                    // Take (at most) two arrays an earlier thread handed on.
                    let taken: Vec<_> = {
                        let mut inbox = inbox.lock().unwrap();
                        let n = inbox.len().min(2);
                        inbox.drain(..n).collect()
                    };
                    inbox.lock().unwrap().extend(handed);
                    for (a, v, retained) in taken {
                        assert_eq!(a.to_vec::<f32>().unwrap(), [v]);
                        assert_eq!(a.ref_count(), retained as u32);
                        if retained {
                            assert!(a.release());
                        } else {
                            a.close();
                        }
                    }
                    // Every tenth thread leaves its sub-manager open, with an array.
                    if i % 10 == 0 {
                        own.full([3], value as f64, DType::F32);
                        subs.lock().unwrap().push(own);
                    } else {
                        own.close();
                    }
                });
            }
        });
    }
    let left = left.into_inner().unwrap();
    let inbox = inbox.into_inner().unwrap();
    let subs = leftover_subs.into_inner().unwrap();
    assert_eq!(subs.len(), threads.div_ceil(10));
    let expected = left.len() + inbox.len() + subs.len();
    let bytes = (left.len() * 2 + inbox.len() + subs.len() * 3) * 4;
    let s = shared.memory();
    assert_eq!(
        (s.live_arrays, s.live_buffers, s.live_bytes),
        (expected, expected, bytes)
    );
    assert_eq!(shared.arrays().len(), left.len() + inbox.len());
    assert_eq!(
        shared.children().into_iter().collect::<HashSet<_>>(),
        subs.iter().cloned().collect::<HashSet<_>>()
    );
    for (a, v) in &left {
        assert_eq!(a.to_vec::<f32>().unwrap(), [*v, *v]);
    }
    for (a, v, retained) in &inbox {
        assert_eq!(a.to_vec::<f32>().unwrap(), [*v]);
        assert_eq!(a.ref_count(), *retained as u32);
    }
    assert_eq!(counters(), {
        let (a, b, n) = base;
        (a + expected, b + expected, n + bytes)
    });
    let name = shared.name();
    shared.close();
    for (a, _) in &left {
        assert_closed(
            &a.try_sum().unwrap_err(),
            *a,
            &CloseReason::ManagerClose {
                manager: name.clone(),
            },
        );
    }
    assert!(inbox.iter().all(|(a, _, _)| a.is_closed()));
    assert!(subs.iter().all(|m| !m.is_open()));
    assert_eq!(counters(), base);
    assert_eq!(NDManager::system().children().len(), system_children);
}

// ==================================================================== in-place vs reads

/// One reader's view of `a`: every element equal, never below what it saw before.
fn check_uniform(vals: &[f32], last: &mut f32, what: &str) {
    let first = vals[0];
    assert!(
        vals.iter().all(|&v| v == first),
        "torn {what}: {:?} ... {:?}",
        &vals[..4],
        vals.iter().find(|&&v| v != first)
    );
    assert!(first >= *last, "{what} went back from {last} to {first}");
    *last = first;
}

/// One writer keeps every element of an `n`-element array equal (`+=`, `-=` of a
/// negative and `set` of the whole array, each step one higher) while two readers
/// read it (`to_vec`, `a * 1.0`, `a.sum()`), each in a scope of its own.
fn writes_race_reads(n: usize) {
    let base = counters();
    let m = NDManager::new();
    let a = m.zeros([n], DType::F32);
    // Sums stay exact: n * writes < 2^24.
    let writes = iters(120).min((1 << 24) / n - 1);
    let done = AtomicBool::new(false);
    let reads = std::thread::scope(|s| {
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let done = &done;
                s.spawn(move || {
                    let (mut last, mut count) = (0.0f32, 0usize);
                    while !done.load(Ordering::Acquire) || count < 3 {
                        let _s = NDScope::new();
                        check_uniform(&a.to_vec::<f32>().unwrap(), &mut last, "to_vec");
                        check_uniform(&(a * 1.0).to_vec::<f32>().unwrap(), &mut last, "a * 1");
                        let sum = a.sum().to_scalar::<f32>().unwrap();
                        let k = sum / n as f32;
                        assert_eq!(k * n as f32, sum, "sum {sum} of equal elements");
                        assert!(k.fract() == 0.0 && k >= last, "sum {sum} after {last}");
                        last = k;
                        count += 1;
                    }
                    count
                })
            })
            .collect();
        let writer = s.spawn(|| {
            let mut w = a;
            for k in 0..writes {
                match k % 3 {
                    0 => w += 1.0,
                    1 => w -= -1.0,
                    _ => a.set(":", (k + 1) as f64),
                }
            }
            done.store(true, Ordering::Release);
        });
        writer.join().unwrap();
        readers
            .into_iter()
            .map(|r| r.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(reads.iter().all(|&r| r >= 3));
    assert_eq!(a.to_vec::<f32>().unwrap(), vec![writes as f32; n]);
    assert_eq!(
        m.memory().live_arrays,
        1,
        "the readers' scopes freed their results"
    );
    m.close();
    assert_eq!(counters(), base);
}

/// Threads (docs/ownership.md: "an in-place write never races a read, which sees the
/// old values or the new ones, never a mix"), a 4,096-element array (small ops).
#[test]
fn in_place_writes_never_tear_reads_of_a_small_array() {
    let _serial = serial();
    writes_race_reads(4096);
}

/// The same for 65,536 elements (ops read a snapshot outside the shard lock).
#[test]
fn in_place_writes_never_tear_reads_of_a_large_array() {
    let _serial = serial();
    writes_race_reads(1 << 16);
}

// ==================================================================== close and cap races

/// Errors B saw in `manager_closed_while_another_thread_uses_it`.
static CLOSE_RACE_ERRORS: AtomicU64 = AtomicU64::new(0);

/// What thread B may see while A closes manager `name`: a result, `ManagerClosed`, or
/// `Closed` for an array freed by that close (or by the close of `sub`, one of its
/// sub-managers).
fn allowed_while_closing<T>(r: ndscope::Result<T>, names: &[String]) -> Option<T> {
    if r.is_err() {
        CLOSE_RACE_ERRORS.fetch_add(1, Ordering::Relaxed);
    }
    match r {
        Ok(v) => Some(v),
        Err(NdError::ManagerClosed { name }) => {
            assert!(names.contains(&name), "ManagerClosed names {name}");
            None
        }
        Err(NdError::Closed(info)) => {
            match &info.reason {
                CloseReason::ManagerClose { manager } => {
                    assert!(names.contains(manager), "closed by {manager}")
                }
                other => panic!("closed for {other:?}"),
            }
            None
        }
        Err(e) => panic!("unexpected error while the manager closes: {e}"),
    }
}

/// Rules 1 and 8 and Threads (docs/ownership.md: "a manager closed on one thread frees
/// the arrays it owns wherever they were created"): thread A closes a manager while
/// thread B creates arrays and sub-managers in it and runs ops on its arrays. B sees
/// only results or `ManagerClosed` / `Closed` errors naming that close, never a panic
/// (A closes once B has done a few steps; B stops a few steps after it sees the close);
/// afterwards every array B got in it is closed, every sub-manager closed, the other
/// manager's counters are exact, and the process is back at its baseline.
#[test]
fn manager_closed_while_another_thread_uses_it() {
    let _serial = serial();
    let base = counters();
    for round in 0..iters(100) {
        let m = NDManager::new();
        let x = m.ones([16], DType::F32);
        let other = NDManager::new();
        let y = other.ones([16], DType::F32);
        let start = Barrier::new(2);
        // Steps B has finished; A closes after a few, so the close lands mid-way.
        let progress = AtomicU64::new(0);
        let (mine, subs, theirs) = std::thread::scope(|s| {
            let b = s.spawn(|| {
                let names = vec![m.name()];
                let (mut mine, mut subs, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
                let mut closed_seen_at = None;
                start.wait();
                for i in 0u64.. {
                    let mut names = names.clone();
                    names.extend(subs.iter().map(NDManager::name));
                    match allowed_while_closing(m.try_zeros([4], DType::F32), &names) {
                        Some(a) => mine.push(a),
                        None => {
                            closed_seen_at.get_or_insert(i);
                        }
                    }
                    if let Some(r) = allowed_while_closing(x.try_add(1.0), &names) {
                        mine.push(r);
                    }
                    if let Some(r) = allowed_while_closing(y.try_add(x), &names) {
                        theirs.push(r); // owned by `other`
                    }
                    if let Some(v) = allowed_while_closing(x.try_get("2:5"), &names) {
                        mine.push(v);
                    }
                    allowed_while_closing(x.try_sum().map(|s| mine.push(s)), &names);
                    if i % 3 == 0
                        && let Some(sub) = allowed_while_closing(m.try_new_sub_manager(), &names)
                    {
                        names.push(sub.name());
                        if let Some(a) =
                            allowed_while_closing(sub.try_ones([2], DType::F32), &names)
                        {
                            mine.push(a);
                        }
                        subs.push(sub);
                    }
                    {
                        // A scope of B's own: what it registers is freed, closed or not.
                        let _s = NDScope::new();
                        allowed_while_closing(x.try_mul(2.0), &names);
                    }
                    progress.store(i + 1, Ordering::Release);
                    // A few more steps after the close was seen.
                    if closed_seen_at.is_some_and(|c| i >= c + 3) {
                        break;
                    }
                }
                (mine, subs, theirs)
            });
            start.wait();
            while progress.load(Ordering::Acquire) < round as u64 % 7 + 1 {
                std::thread::yield_now();
            }
            m.close();
            b.join().expect("B never panics")
        });
        assert!(!m.is_open() && x.is_closed());
        assert!(!mine.is_empty() && CLOSE_RACE_ERRORS.swap(0, Ordering::Relaxed) > 0);
        assert!(mine.iter().all(|a| a.is_closed()), "round {round}");
        assert!(subs.iter().all(|s| !s.is_open()), "round {round}");
        assert_eq!(m.memory(), Default::default());
        assert_eq!(other.memory().live_arrays, 1 + theirs.len());
        for r in &theirs {
            assert_eq!(r.to_vec::<f32>().unwrap(), vec![2.0; 16]);
        }
        other.close();
        assert_eq!(counters(), base, "round {round}");
    }
}

/// Rule 8 (docs/ownership.md) across threads: once `cap()` has returned on thread A,
/// creating in the manager on thread B fails with `ManagerCapped`; what B made before
/// stays alive and owned; sub-managers, old and new, keep working.
#[test]
fn cap_on_one_thread_stops_creation_on_another() {
    let _serial = serial();
    let base = counters();
    for round in 0..iters(30) {
        let m = NDManager::new();
        let old_sub = m.new_sub_manager();
        let capped = AtomicBool::new(false);
        let start = Barrier::new(2);
        let made = std::thread::scope(|s| {
            let b = s.spawn(|| {
                let mut made = Vec::new();
                start.wait();
                loop {
                    let after_cap = capped.load(Ordering::Acquire);
                    match m.try_zeros([2], DType::F32) {
                        Ok(a) => {
                            assert!(!after_cap, "created after cap() returned");
                            made.push(a);
                        }
                        Err(NdError::ManagerCapped { name }) => assert_eq!(name, m.name()),
                        Err(e) => panic!("{e}"),
                    }
                    if after_cap {
                        return made;
                    }
                    if made.len() >= 2000 {
                        while !capped.load(Ordering::Acquire) {
                            std::thread::yield_now();
                        }
                    }
                }
            });
            start.wait();
            for _ in 0..round % 5 {
                let _s = NDScope::new();
                let _ = old_sub.ones([2], DType::F32);
            }
            m.cap();
            capped.store(true, Ordering::Release);
            b.join().expect("B never panics")
        });
        assert!(matches!(
            m.try_ones([1], DType::F32),
            Err(NdError::ManagerCapped { .. })
        ));
        let new_sub = m.new_sub_manager();
        let c = new_sub.ones([1], DType::F32);
        let d = old_sub.ones([1], DType::F32);
        assert!(made.iter().all(|a| !a.is_closed() && a.manager() == m));
        assert_eq!(m.memory().live_arrays, made.len() + 2);
        m.close();
        assert!(made.iter().all(|a| a.is_closed()) && c.is_closed() && d.is_closed());
        assert_eq!(counters(), base, "round {round}");
    }
}

// ==================================================================== shared data

/// Threads (docs/ownership.md: "Many threads may read a shared array (a data set,
/// parameters) at once") and rules 3, 6: a data set made on the main thread is read by
/// four threads, each in scopes of its own (views by `get`, matmul, sums); every
/// result equals the one computed alone, the data are unchanged and the counters come
/// back to the baseline.
#[test]
fn shared_read_only_data_read_by_four_threads() {
    let _serial = serial();
    let base = counters();
    let m = NDManager::new();
    let data = m.random_uniform(-1.0, 1.0, [64, 16], DType::F32);
    let w = m.random_uniform(-1.0, 1.0, [16, 4], DType::F32);
    let data_before = data.to_vec::<f32>().unwrap();
    // What each thread computes, computed once alone.
    let compute = |t: usize| {
        let rows = format!("{}:{}", t * 16, t * 16 + 16);
        let v = data.get(&rows);
        let y = v.matmul(w);
        let col = data.get(&format!(":, {t}"));
        (
            y.to_vec::<f32>().unwrap(),
            y.sum().to_scalar::<f32>().unwrap(),
            col.to_vec::<f32>().unwrap(),
            (col * v.get("0, :").sum())
                .sum()
                .to_scalar::<f32>()
                .unwrap(),
        )
    };
    let expected: Vec<_> = (0..4).map(|t| ndscope::scope(|| compute(t))).collect();
    assert_eq!(
        m.memory().live_arrays,
        2,
        "the scopes freed everything they made"
    );
    let start = Barrier::new(4);
    std::thread::scope(|s| {
        for (t, want) in expected.iter().enumerate() {
            let (start, compute) = (&start, &compute);
            s.spawn(move || {
                start.wait();
                for i in 0..iters(100) {
                    let scope = NDScope::new();
                    let got = compute(t);
                    assert!(&got == want, "thread {t}, iteration {i}");
                    // v, y, its sum, col, a row of v, its sum, the product, its sum.
                    assert_eq!(scope.memory().live_arrays, 8, "what the scope holds");
                }
            });
        }
    });
    assert_eq!(data.to_vec::<f32>().unwrap(), data_before);
    assert_eq!(m.memory().live_arrays, 2);
    m.close();
    assert_eq!(counters(), base);
}

// ==================================================================== foreign arrays in scopes

/// Rules 3, 4, 5 and 9 (docs/ownership.md): a scope on one thread holding arrays made
/// on other threads. Registering one adds a reference; closing the scope frees it
/// unless a retain (or another thread's scope) still holds it; `escape` moves it to
/// the parent scope of the same thread; `release` of an array held by scopes of two
/// threads at the same depth gives up one of them.
#[test]
fn scopes_hold_arrays_made_on_other_threads() {
    let _serial = serial();
    let base = counters();
    let pool = Pool::new(2);
    let m = NDManager::new();

    // Registered on worker 0, freed by its close; counted right.
    let x = m.full([3], 1.0, DType::F32);
    let opened_at = pool.on(0, move |_| {
        let s = NDScope::new();
        assert_eq!(s.register(x), x);
        assert_eq!(x.ref_count(), 1);
        assert_eq!(s.arrays(), vec![x]);
        assert_eq!(s.memory().live_bytes, 12);
        let at = s.opened_at().unwrap();
        drop(s);
        at
    });
    assert!(x.is_closed());
    assert_closed(
        &x.try_sum().unwrap_err(),
        x,
        &CloseReason::ScopeClose { opened_at },
    );
    assert_eq!(m.memory().live_arrays, 0);

    // Retained: survives the scope, freed by its last release.
    let y = m.full([3], 2.0, DType::F32);
    assert_eq!(y.retain(), 1);
    pool.on(1, move |_| {
        let s = NDScope::new();
        s.register(y);
        assert_eq!(y.ref_count(), 2);
    });
    assert!(!y.is_closed());
    assert_eq!(y.ref_count(), 1);
    assert_eq!(m.memory().live_arrays, 1);
    assert!(y.release());
    assert_closed(&y.to_vec::<f32>().unwrap_err(), y, &CloseReason::Release);

    // Escaped from an inner scope to the outer one of the same (other) thread.
    let z = m.full([2], 3.0, DType::F32);
    pool.on(0, move |w| {
        w.push(NDScope::new());
        let inner = NDScope::new();
        inner.register(z);
        assert_eq!(inner.escape(z), z);
        assert!(inner.arrays().is_empty());
        assert_eq!(w[0].arrays(), vec![z]);
        drop(inner);
        assert!(!z.is_closed());
    });
    assert_eq!(z.ref_count(), 1);
    assert_eq!((z * 2.0).to_vec::<f32>().unwrap(), [6.0, 6.0]); // on the main thread
    let opened_at = pool.on(0, |w| {
        let s = w.pop().unwrap();
        let at = s.opened_at().unwrap();
        drop(s);
        at
    });
    assert_closed(
        &z.try_add(z).unwrap_err(),
        z,
        &CloseReason::ScopeClose { opened_at },
    );
    assert_eq!(
        m.memory().live_arrays,
        1,
        "z * 2.0 (made here, in no scope)"
    );

    // Made in worker 1's scope, registered in worker 0's too: the first close leaves
    // it, the second frees it.
    let q = pool.on(1, {
        let m = m.clone();
        move |w| {
            w.push(NDScope::new());
            m.full([4], 4.0, DType::F32)
        }
    });
    assert_eq!(q.ref_count(), 1);
    pool.on(0, move |w| {
        w.push(NDScope::new());
        w[0].register(q);
        assert_eq!(q.ref_count(), 2);
        w.pop();
    });
    assert!(!q.is_closed());
    assert_eq!(q.ref_count(), 1);
    assert_eq!(m.memory().live_arrays, 2);
    pool.on(1, |w| drop(w.pop()));
    assert!(q.is_closed());
    assert_eq!(m.memory().live_arrays, 1);

    // Registered in scopes of both workers at depth 0: one release gives up one of
    // the two registrations (which one the rules leave open), the next frees it.
    let r = m.full([1], 5.0, DType::F32);
    for t in 0..2 {
        pool.on(t, move |w| {
            w.push(NDScope::new());
            w[0].register(r);
        });
    }
    assert_eq!(r.ref_count(), 2);
    assert!(!r.release());
    assert_eq!(r.ref_count(), 1);
    let held: Vec<bool> = (0..2)
        .map(|t| pool.on(t, move |w| w[0].arrays().contains(&r)))
        .collect();
    assert_eq!(held.iter().filter(|&&h| h).count(), 1, "{held:?}");
    let keeper = held.iter().position(|&h| h).unwrap();
    pool.on(1 - keeper, |w| drop(w.pop()));
    assert!(!r.is_closed());
    pool.on(keeper, |w| drop(w.pop()));
    assert!(r.is_closed());

    assert_eq!(m.memory().live_arrays, 1);
    m.close();
    drop(pool);
    assert_eq!(counters(), base);
}

/// Ops run inside rayon tasks (data-parallel user code) where their kernels could fork:
/// a mid-size matmul (inputs under the engine's lock threshold, enough flops for gemm's
/// threads), a backward pass that sums a big broadcast gradient into a parameter's
/// (under the lock), and big elementwise ops (no lock). A kernel that forked from a
/// worker would let that worker run another task while it waits, in the middle of the
/// op. That task's ops would block on the lock the worker holds, and its collector
/// would find the interrupted task's collector recording on the thread. (Under
/// valgrind, before kernels stopped forking on workers, this test failed with
/// "a GradientCollector is already recording on this thread".) Every task must finish
/// with its own exact result.
#[test]
fn ops_inside_rayon_tasks_whose_kernels_could_fork_never_deadlock() {
    use rayon::prelude::*;
    let _s = serial();
    let before = ndscope::memory();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let sums: Vec<f32> = pool.install(|| {
            (0..iters(48))
                .into_par_iter()
                .map(|i| {
                    let m = NDManager::new();
                    // [256,32] x [32,256]: 16K input elements, 2^21 multiply-adds.
                    let a = m.full([256, 32], 1.0 + i as f64, DType::F32);
                    let b = m.full([32, 256], 0.5, DType::F32);
                    let p = a.matmul(b);
                    // A [1,2048] parameter's gradient summed from a [128,2048] product.
                    let c = m.full([128, 1], 1.0, DType::F32) + m.full([1, 2048], 1.0, DType::F32);
                    let w = m.zeros([1, 2048], DType::F32).set_requires_gradient(true);
                    {
                        let gc = GradientCollector::new();
                        gc.backward((c * w).sum()).unwrap();
                    }
                    let s = p.sum().to_scalar::<f32>().unwrap()
                        + w.gradient().sum().to_scalar::<f32>().unwrap();
                    m.close();
                    s
                })
                .collect()
        });
        let _ = tx.send(sums);
    });
    let sums = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("rayon tasks running ops deadlocked");
    for (i, s) in sums.iter().enumerate() {
        let matmul = 256.0 * 256.0 * 32.0 * 0.5 * (1.0 + i as f32);
        assert_eq!(*s, matmul + 2048.0 * 128.0 * 2.0, "task {i}");
    }
    assert_eq!(ndscope::memory().live_arrays, before.live_arrays);
}

/// The stolen-writer hazard: rayon tasks (user code) write in place, on the global
/// pool, an array that large ops on another thread read meanwhile. Each large op reads
/// the array with no lock held (an outside read) and splits its kernel across threads;
/// a writer waits, parked, until no outside read is in flight. If the kernel's splits
/// ran on the same pool as the user's tasks, a worker waiting on a split could run a
/// writer task meanwhile: that task would wait for the read to end, and the read (the
/// kernel) for that worker. (This test timed out on 10b17d2, where kernels split on
/// rayon's global pool.) Every write and every read must complete, and each sum must
/// see a state between two whole writes.
#[test]
fn in_place_writes_from_rayon_tasks_never_wait_on_a_kernel_that_stole_them() {
    let _s = serial();
    let before = ndscope::memory();
    // The smallest array whose sum splits across threads (kernels::PARALLEL_ELEMS).
    let n = 1usize << 18;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let m = NDManager::new();
        let x = m.full([n], 0.0, DType::F32);
        let writes = iters(60);
        let writer = std::thread::spawn(move || {
            rayon::scope(|s| {
                for _ in 0..writes {
                    s.spawn(move |_| {
                        let mut x = x;
                        x += 1.0;
                    });
                }
            });
        });
        // A fixed number of sums while the writes are queued or running.
        let mut sums: Vec<f32> = (0..writes)
            .map(|_| x.sum().to_scalar::<f32>().unwrap())
            .collect();
        writer.join().unwrap();
        sums.push(x.sum().to_scalar::<f32>().unwrap());
        m.close();
        let _ = tx.send((sums, writes));
    });
    let (sums, writes) = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("in-place writes from rayon tasks and a large op's kernel deadlocked");
    assert_whole_writes(&sums, n, writes);
    assert_eq!(*sums.last().unwrap(), (n * writes) as f32);
    assert_eq!(ndscope::memory().live_arrays, before.live_arrays);
}

/// Writers are not starved by a stream of large reads (docs/ownership.md, "Threads"):
/// three threads sum a large array over and over, each sum reading it with no lock
/// held (an outside read), so that some read is nearly always in flight; a fourth
/// thread writes it in place a fixed number of times. A writer waits for the reads in
/// flight to end, and reads that start meanwhile wait for it, so every write completes
/// while the readers keep reading (readers stop only once the writes are done). Each
/// sum sees a state between two whole writes.
#[test]
fn in_place_writes_complete_while_large_reads_keep_coming() {
    let _s = serial();
    let before = ndscope::memory();
    let n = 1usize << 18;
    let writes = iters(40);
    let m = NDManager::new();
    let x = m.full([n], 0.0, DType::F32);
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let done = done.clone();
            std::thread::spawn(move || {
                let mut sums = Vec::new();
                while !done.load(Ordering::Acquire) {
                    let s = x.sum();
                    sums.push(s.to_scalar::<f32>().unwrap());
                    s.close();
                }
                sums
            })
        })
        .collect();
    let (tx, rx) = channel();
    let writer = std::thread::spawn(move || {
        for _ in 0..writes {
            let mut x = x;
            x += 1.0;
        }
        let _ = tx.send(());
    });
    let finished = rx.recv_timeout(std::time::Duration::from_secs(60));
    done.store(true, Ordering::Release);
    let sums: Vec<f32> = readers
        .into_iter()
        .flat_map(|r| r.join().unwrap())
        .collect();
    writer.join().unwrap();
    finished.expect("in-place writes starved by a stream of large reads");
    assert_whole_writes(&sums, n, writes);
    assert_eq!(x.sum().to_scalar::<f32>().unwrap(), (n * writes) as f32);
    m.close();
    assert_eq!(ndscope::memory().live_arrays, before.live_arrays);
}

/// Large ops reading two arrays while other threads write each of them in place: an op
/// that held the read of one input while it waited for the other's writer could close
/// a cycle (op 1 reads X and waits for Y's writer, which waits for op 2's read of Y,
/// which waits for X's writer, which waits for op 1's read of X). An op takes all its
/// reads at once and waits holding none, so every op and every write completes, and
/// each result sees whole writes of both inputs.
#[test]
fn two_input_reads_and_writes_of_both_inputs_never_wait_in_a_cycle() {
    let _s = serial();
    let before = ndscope::memory();
    let n = 1usize << 17; // two inputs: 2^18 elements read outside the locks
    let rounds = iters(40);
    let m = NDManager::new();
    let x = m.full([n], 0.0, DType::F32);
    let y = m.full([n], 0.0, DType::F32);
    let (tx, rx) = channel();
    let mut threads = Vec::new();
    for (a, b) in [(x, y), (y, x)] {
        let tx = tx.clone();
        threads.push(std::thread::spawn(move || {
            let mut sums = Vec::new();
            for _ in 0..rounds {
                let s = a + b;
                let t = s.sum();
                sums.push(t.to_scalar::<f32>().unwrap());
                s.close();
                t.close();
            }
            tx.send(sums).unwrap();
        }));
    }
    for t in [x, y] {
        let tx = tx.clone();
        threads.push(std::thread::spawn(move || {
            for _ in 0..rounds {
                let mut t = t;
                t += 1.0;
            }
            tx.send(Vec::new()).unwrap();
        }));
    }
    let mut sums = Vec::new();
    for _ in 0..4 {
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("reads of two inputs and writes of both deadlocked");
        sums.extend(got);
    }
    for t in threads {
        t.join().unwrap();
    }
    // Each element of x + y is the number of writes of x plus those of y it saw.
    assert_whole_writes(&sums, n, 2 * rounds);
    let total = (x + y).sum().to_scalar::<f32>().unwrap();
    assert_eq!(total, (2 * n * rounds) as f32);
    m.close();
    assert_eq!(ndscope::memory().live_arrays, before.live_arrays);
}
