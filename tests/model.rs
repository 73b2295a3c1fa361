//! Model-based property test (issue 7.1): random sequences of ownership actions,
//! checked after every step against a plain reference model of who owns what
//! (docs/ownership.md rules 1-8, and the scope parts of rules 9 and 11).
//!
//! Actions: create, elementwise ops, views, open/close scopes (nested, closed out of
//! order, by `close()` or by drop), `scope(|| ..)`, escape, scope register, unregister /
//! keep, retain, release, close an array, close a manager, new sub-manager, attach,
//! detach, temp_attach, cap, uses of freed arrays, and a churn of more than 4096 frees
//! (so that old tombstones are recycled and `ClosedUnknown` is exercised); autograd:
//! `set_requires_gradient(true/false)` (the gradient is a model array owned by the
//! parameter's manager, in no scope, freed with the parameter for the same reason) and a
//! `GradientCollector` around `x.square().sum()`, `(x * y).sum()` or
//! `(x * y).square().sum()`, in the current scope or an inner one closed after
//! `backward`, before it (loss escaped, or not: `Closed`), or with no `backward` at all;
//! gradient values are checked by the chain rule (others zeroed by the collector),
//! intermediates the tape held are freed when it lets go, and backward's own arrays
//! (counted by uid) are freed.
//!
//! After every step: each array's liveness, owner, shape and ref count; each manager's
//! open/capped state, direct arrays, children (in order) and `memory()` counters (live
//! arrays, buffers and bytes of its subtree); each open scope's registrations; the
//! system manager's direct arrays and the process-wide counters. Every use of a freed
//! array must fail with `NdError::Closed` carrying the right reason (or
//! `ClosedUnknown` once more than 4096 arrays were freed after it).
//!
//! This file holds a single test so that the process-wide counters are the model's
//! alone; the state machine runs on one thread because scopes are per thread.
//!
//! Cases: `NDSCOPE_MODEL_CASES` (default 1200, under a minute in a debug build);
//! steps per case: up to `NDSCOPE_MODEL_STEPS` (default 120).
//!
//! Devices: `NDSCOPE_MODEL_DEVICE=gpu` (a build with `--features gpu`) puts the root
//! manager, and so every array the model creates, on the first GPU, and checks that
//! device's live arrays, buffers and bytes (`memory_on`) after every step as well: the
//! same rules hold for device memory, exactly.

mod common;

use common::{bindex, broadcast, counters, env_or, expect_panic, open_scope, tidy};
use ndscope::{
    CloseReason, DType, Device, GradientCollector, NDArray, NDManager, NDScope, NdError,
    SourceLocation, memory_on,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::collections::{BTreeSet, HashSet};
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};

/// Model index of the system manager (never closed, never capped).
const SYS: usize = 0;
/// Model index of the test's root manager (child of the system manager).
const ROOT: usize = 1;
/// The engine keeps the tombstones of the last this-many freed arrays.
const TOMBSTONES: u64 = 4096;
/// Arrays created and freed by one `Churn` action.
const CHURN: u64 = 4200;

static STEPS: AtomicU64 = AtomicU64::new(0);
static CASES: AtomicU64 = AtomicU64::new(0);
/// Coverage counters: freed-array errors checked (with details / `ClosedUnknown`),
/// temporarily attached arrays returned home by a manager close.
static CLOSED_SEEN: AtomicU64 = AtomicU64::new(0);
static UNKNOWN_SEEN: AtomicU64 = AtomicU64::new(0);
static RETURNED_HOME: AtomicU64 = AtomicU64::new(0);
/// Autograd coverage: gradients created, backward passes checked exactly, tape-held
/// intermediates freed by the tape, arrays backward made (and freed) for itself.
static GRADS_MADE: AtomicU64 = AtomicU64::new(0);
static BACKWARDS: AtomicU64 = AtomicU64::new(0);
static ORPHANS_FREED: AtomicU64 = AtomicU64::new(0);
static BACKWARD_TEMPS: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Debug)]
enum Action {
    Create {
        m: usize,
        len: usize,
    },
    Binary {
        a: usize,
        b: usize,
    },
    Scalar {
        a: usize,
    },
    View {
        a: usize,
    },
    OpenScope {
        site: u8,
    },
    CloseScope {
        k: usize,
        by_drop: bool,
    },
    Tidy {
        a: usize,
    },
    Escape {
        k: usize,
        a: usize,
    },
    ScopeRegister {
        k: usize,
        a: usize,
    },
    Unregister {
        a: usize,
        keep: bool,
    },
    Retain {
        a: usize,
    },
    Release {
        a: usize,
    },
    CloseArray {
        a: usize,
    },
    CloseManager {
        m: usize,
    },
    NewSub {
        m: usize,
    },
    Attach {
        a: usize,
        m: usize,
    },
    Detach {
        a: usize,
    },
    TempAttach {
        a: usize,
        m: usize,
    },
    Cap {
        m: usize,
    },
    UseFreed {
        a: usize,
        how: u8,
    },
    Churn,
    RequireGrad {
        a: usize,
        on: bool,
    },
    Backward {
        a: usize,
        b: usize,
        kind: u8,
        mode: u8,
    },
}

fn action() -> impl Strategy<Value = Action> {
    let i = || 0usize..64;
    prop_oneof![
        8 => (i(), 0usize..4).prop_map(|(m, len)| Action::Create { m, len }),
        5 => (i(), i()).prop_map(|(a, b)| Action::Binary { a, b }),
        3 => i().prop_map(|a| Action::Scalar { a }),
        3 => i().prop_map(|a| Action::View { a }),
        5 => any::<u8>().prop_map(|site| Action::OpenScope { site }),
        4 => (i(), any::<bool>()).prop_map(|(k, by_drop)| Action::CloseScope { k, by_drop }),
        2 => i().prop_map(|a| Action::Tidy { a }),
        3 => (i(), i()).prop_map(|(k, a)| Action::Escape { k, a }),
        2 => (i(), i()).prop_map(|(k, a)| Action::ScopeRegister { k, a }),
        2 => (i(), any::<bool>()).prop_map(|(a, keep)| Action::Unregister { a, keep }),
        3 => i().prop_map(|a| Action::Retain { a }),
        4 => i().prop_map(|a| Action::Release { a }),
        2 => i().prop_map(|a| Action::CloseArray { a }),
        2 => i().prop_map(|m| Action::CloseManager { m }),
        3 => i().prop_map(|m| Action::NewSub { m }),
        2 => (i(), i()).prop_map(|(a, m)| Action::Attach { a, m }),
        1 => i().prop_map(|a| Action::Detach { a }),
        2 => (i(), i()).prop_map(|(a, m)| Action::TempAttach { a, m }),
        1 => i().prop_map(|m| Action::Cap { m }),
        4 => (i(), any::<u8>()).prop_map(|(a, how)| Action::UseFreed { a, how }),
        1 => Just(Action::Churn),
        5 => (i(), any::<bool>()).prop_map(|(a, on)| Action::RequireGrad { a, on: on || a % 3 != 0 }),
        3 => (i(), i(), 0u8..3, 0u8..5).prop_map(|(a, b, kind, mode)| Action::Backward { a, b, kind, mode }),
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
    /// The freeing guard was dropped (no caller location recorded).
    guard_dropped: bool,
    /// Frees counted before this one (a lower bound, for bulk frees).
    seq: u64,
}

struct MArr {
    h: NDArray,
    live: bool,
    shape: Vec<usize>,
    owner: usize,
    temp_home: Option<usize>,
    /// Model ids of the scopes it is registered in.
    scopes: BTreeSet<usize>,
    retains: u32,
    buf: usize,
    freed: Option<Freed>,
    /// Model index of its gradient array (`set_requires_gradient(true)`); the gradient
    /// may have been freed on its own (closed by hand, its manager closed).
    grad: Option<usize>,
}

struct MBuf {
    bytes: usize,
    /// Arrays viewing it, in the order they were created; the first is charged.
    holders: Vec<usize>,
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

/// The errors a call may legitimately return.
#[derive(Clone, Copy, Debug)]
enum Exp {
    Closed(usize),
    MgrClosed,
    Capped,
    Shape,
}

struct Model {
    arrays: Vec<MArr>,
    bufs: Vec<MBuf>,
    mgrs: Vec<MMgr>,
    /// Open scope guards with their model ids, innermost last.
    stack: Vec<(NDScope, usize)>,
    /// Opening location of each model scope id.
    scope_locs: Vec<SourceLocation>,
    /// Arrays freed so far (model and churn).
    frees: u64,
    /// Sequence number to give every free of the bulk close in progress.
    bulk: Option<u64>,
    /// Process-wide (arrays, buffers, bytes) before the case.
    base: (usize, usize, usize),
    base_sys: HashSet<NDArray>,
    /// Where the model's arrays live, and that device's counters at the start.
    device: Device,
    base_device: (usize, usize, usize),
}

/// The device the model's arrays live on (`NDSCOPE_MODEL_DEVICE`: `cpu`, the default,
/// or `gpu`, the first GPU).
fn model_device() -> Device {
    match std::env::var("NDSCOPE_MODEL_DEVICE").as_deref() {
        Ok("gpu") => Device::Gpu(0),
        Ok("cpu") | Err(_) => Device::Cpu,
        Ok(other) => panic!("NDSCOPE_MODEL_DEVICE={other}: expected cpu or gpu"),
    }
}

/// (live arrays, live buffers, live bytes) on `d`.
fn device_counters(d: Device) -> (usize, usize, usize) {
    let s = memory_on(d);
    (s.live_arrays, s.live_buffers, s.live_bytes)
}

impl Model {
    fn new() -> Model {
        let device = model_device();
        let root = NDManager::try_new_on(device).expect("NDSCOPE_MODEL_DEVICE's device");
        assert_eq!(root.device(), device);
        let sys = NDManager::system();
        let base_sys = sys.arrays().into_iter().collect();
        Model {
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
            stack: Vec::new(),
            scope_locs: Vec::new(),
            frees: 0,
            bulk: None,
            base: counters(),
            base_sys,
            device,
            base_device: device_counters(device),
        }
    }

    // ------------------------------------------------------------ picking

    /// An array index: mostly a live one, sometimes any (possibly freed) one.
    fn pick(&self, a: usize) -> Option<usize> {
        if self.arrays.is_empty() {
            return None;
        }
        if a % 4 != 3 {
            let live: Vec<usize> = (0..self.arrays.len())
                .filter(|&i| self.arrays[i].live)
                .collect();
            if !live.is_empty() {
                return Some(live[(a / 4) % live.len()]);
            }
        }
        Some((a / 4) % self.arrays.len())
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

    // ------------------------------------------------------------ model updates

    fn add_array(&mut self, h: NDArray, shape: Vec<usize>, owner: usize, share: Option<usize>) {
        let i = self.arrays.len();
        let buf = match share {
            Some(b) => {
                self.bufs[b].holders.push(i);
                b
            }
            None => {
                self.bufs.push(MBuf {
                    bytes: shape.iter().product::<usize>() * 4,
                    holders: vec![i],
                });
                self.bufs.len() - 1
            }
        };
        let mut scopes = BTreeSet::new();
        if let Some(&(_, sid)) = self.stack.last() {
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
            freed: None,
            grad: None,
        });
    }

    fn free(&mut self, i: usize, why: Why, guard_dropped: bool) {
        let seq = self.bulk.unwrap_or(self.frees);
        let a = &mut self.arrays[i];
        if !a.live {
            return;
        }
        a.live = false;
        a.scopes.clear();
        a.freed = Some(Freed {
            why,
            guard_dropped,
            seq,
        });
        self.frees += 1;
        let b = a.buf;
        let grad = a.grad;
        self.bufs[b].holders.retain(|&h| h != i);
        // A parameter's gradient dies with it, for the same reason.
        if let Some(g) = grad {
            let why = self.arrays[i]
                .freed
                .as_ref()
                .expect("just freed")
                .why
                .clone();
            self.free(g, why, guard_dropped);
        }
    }

    fn stack_pos(&self, sid: usize) -> usize {
        self.stack
            .iter()
            .position(|&(_, s)| s == sid)
            .expect("registrations name open scopes")
    }

    /// Close stack[k] (and every scope opened inside it).
    fn close_scopes(&mut self, k: usize, by_drop: bool) {
        let mut chain = self.stack.split_off(k);
        let ids: Vec<usize> = chain.iter().map(|&(_, sid)| sid).collect();
        let (outer, _) = chain.remove(0);
        if by_drop {
            drop(outer);
        } else {
            outer.close();
        }
        for (inner, _) in &chain {
            assert!(
                !inner.is_open(),
                "closing an outer scope closes the inner ones"
            );
        }
        drop(chain); // dropping guards of closed scopes does nothing
        self.bulk = Some(self.frees);
        for &sid in ids.iter().rev() {
            let at = self.scope_locs[sid];
            for i in 0..self.arrays.len() {
                let a = &mut self.arrays[i];
                if a.live && a.scopes.remove(&sid) && a.scopes.is_empty() && a.retains == 0 {
                    self.free(i, Why::Scope(at), by_drop);
                }
            }
        }
        self.bulk = None;
    }

    fn close_mgr(&mut self, m: usize) {
        if m == SYS || !self.mgrs[m].open {
            return;
        }
        while let Some(&c) = self.mgrs[m].children.last() {
            self.close_mgr(c);
        }
        for i in 0..self.arrays.len() {
            if !(self.arrays[i].live && self.arrays[i].owner == m) {
                continue;
            }
            let home = self.arrays[i].temp_home;
            match home {
                Some(h) if self.mgrs[h].open && !self.mgrs[h].capped && h != m => {
                    self.arrays[i].owner = h;
                    self.arrays[i].temp_home = None;
                    RETURNED_HOME.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    let name = self.mgrs[m].name.clone();
                    self.free(i, Why::Manager(name), false);
                }
            }
        }
        self.mgrs[m].open = false;
        let p = self.mgrs[m]
            .parent
            .expect("only the system manager has no parent");
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

    /// `e` says array `i` is closed, with the model's reason.
    fn is_closed_error(&self, e: &NdError, i: usize) -> bool {
        let a = &self.arrays[i];
        let Some(f) = &a.freed else { return false };
        match e {
            NdError::Closed(info) => {
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
                    && info.closed_at.is_none() == f.guard_dropped
            }
            NdError::ClosedUnknown { uid } => {
                UNKNOWN_SEEN.fetch_add(1, Ordering::Relaxed);
                *uid == a.h.uid() && self.frees - f.seq > TOMBSTONES
            }
            _ => false,
        }
    }

    fn check_freed(&self, i: usize, what: &str, r: ndscope::Result<impl std::fmt::Debug>) {
        self.expect_err(what, r, &[Exp::Closed(i)]);
    }

    fn check(&self) {
        // Arrays: liveness, owner, shape, count.
        for (i, a) in self.arrays.iter().enumerate() {
            assert_eq!(a.h.is_closed(), !a.live, "array {i} liveness");
            if a.live {
                let count = a.retains + a.scopes.len() as u32;
                assert_eq!(a.h.try_ref_count().unwrap(), count, "array {i} count");
                assert_eq!(
                    a.h.try_manager().unwrap(),
                    self.mgrs[a.owner].h,
                    "array {i}"
                );
                assert_eq!(a.h.try_shape().unwrap().dims(), a.shape.as_slice());
                // `gradient()` is always the same handle (even once it was freed).
                assert_eq!(a.h.requires_gradient(), a.grad.is_some(), "array {i}");
                match a.grad {
                    Some(g) => assert_eq!(a.h.try_gradient().unwrap(), self.arrays[g].h),
                    None => assert!(matches!(
                        a.h.try_gradient(),
                        Err(NdError::InvalidArgument { .. })
                    )),
                }
            } else {
                assert!(!a.h.requires_gradient(), "freed array {i}");
            }
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
            if let Some(&first) = b.holders.first() {
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
        if self.device != Device::Cpu {
            // Every array the model made lives on the device.
            let (da, db, dn) = self.base_device;
            assert_eq!(
                device_counters(self.device),
                (da + sa, db + sb, dn + sn),
                "{} counters",
                self.device
            );
        }
        // Scopes: registrations.
        for (pos, (s, sid)) in self.stack.iter().enumerate() {
            assert!(s.is_open(), "scope at depth {pos}");
            let real: HashSet<NDArray> = s.arrays().into_iter().collect();
            let model: HashSet<NDArray> = self
                .arrays
                .iter()
                .filter(|a| a.live && a.scopes.contains(sid))
                .map(|a| a.h)
                .collect();
            assert_eq!(real, model, "scope at depth {pos} registrations");
        }
    }

    // ------------------------------------------------------------ the interpreter

    fn step(&mut self, act: &Action) {
        match *act {
            Action::Create { m, len } => {
                let m = self.pick_mgr(m);
                let vals: Vec<f32> = (0..len).map(|k| 0.5 + k as f32).collect();
                let r = self.mgrs[m].h.try_create(&vals, [len]);
                if !self.mgrs[m].open {
                    self.expect_err("create", r, &[Exp::MgrClosed]);
                } else if self.mgrs[m].capped {
                    self.expect_err("create", r, &[Exp::Capped]);
                } else {
                    self.add_array(r.expect("create"), vec![len], m, None);
                }
            }
            Action::Binary { a, b } => {
                let (Some(a), Some(b)) = (self.pick(a), self.pick(b)) else {
                    return;
                };
                let r = self.arrays[a].h.try_add(self.arrays[b].h);
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
                } else if let Some(shape) = shape {
                    let owner = x.owner;
                    self.add_array(r.expect("add"), shape, owner, None);
                }
            }
            Action::Scalar { a } => {
                let Some(a) = self.pick(a) else { return };
                let r = self.arrays[a].h.try_mul(2.0);
                let x = &self.arrays[a];
                if !x.live {
                    self.expect_err("mul", r, &[Exp::Closed(a)]);
                } else if self.mgrs[x.owner].capped {
                    self.expect_err("mul", r, &[Exp::Capped]);
                } else {
                    let (shape, owner) = (x.shape.clone(), x.owner);
                    self.add_array(r.expect("mul"), shape, owner, None);
                }
            }
            Action::View { a } => {
                let Some(a) = self.pick(a) else { return };
                let x = &self.arrays[a];
                let mut shape = vec![1];
                shape.extend(&x.shape);
                let r = x.h.try_reshape(shape.as_slice());
                if !x.live {
                    self.expect_err("reshape", r, &[Exp::Closed(a)]);
                } else if self.mgrs[x.owner].capped {
                    self.expect_err("reshape", r, &[Exp::Capped]);
                } else {
                    let (owner, buf) = (x.owner, x.buf);
                    self.add_array(r.expect("reshape"), shape, owner, Some(buf));
                }
            }
            Action::OpenScope { site } => {
                let s = open_scope(site);
                let sid = self.scope_locs.len();
                self.scope_locs.push(s.opened_at().expect("open"));
                self.stack.push((s, sid));
            }
            Action::CloseScope { k, by_drop } => {
                if !self.stack.is_empty() {
                    let k = k % self.stack.len();
                    self.close_scopes(k, by_drop);
                }
            }
            Action::Tidy { a } => {
                let Some(a) = self.pick(a) else { return };
                let (at, t, r) = tidy(self.arrays[a].h);
                let x = &self.arrays[a];
                if !x.live {
                    self.expect_err("scope(a * 2 + 1)", r, &[Exp::Closed(a)]);
                    assert!(t.is_none());
                } else if self.mgrs[x.owner].capped {
                    self.expect_err("scope(a * 2 + 1)", r, &[Exp::Capped]);
                    assert!(t.is_none());
                } else {
                    let (shape, owner) = (x.shape.clone(), x.owner);
                    // The product lived only in the tidy scope; the result escaped to the
                    // enclosing scope (registered there as if created in it).
                    self.add_array(t.expect("product"), shape.clone(), owner, None);
                    let ti = self.arrays.len() - 1;
                    self.free(ti, Why::Scope(at), false);
                    self.add_array(r.expect("tidy result"), shape, owner, None);
                }
            }
            Action::Escape { k, a } => {
                let Some(a) = self.pick(a) else { return };
                if self.stack.is_empty() {
                    return;
                }
                let k = k % self.stack.len();
                let r = self.stack[k].0.try_escape(self.arrays[a].h);
                if !self.arrays[a].live {
                    return self.check_freed(a, "escape", r);
                }
                r.expect("escape");
                let sid = self.stack[k].1;
                let parent = k.checked_sub(1).map(|p| self.stack[p].1);
                let x = &mut self.arrays[a];
                if x.scopes.remove(&sid)
                    && let Some(p) = parent
                {
                    x.scopes.insert(p);
                }
            }
            Action::ScopeRegister { k, a } => {
                let Some(a) = self.pick(a) else { return };
                if self.stack.is_empty() {
                    return;
                }
                let k = k % self.stack.len();
                let r = self.stack[k].0.try_register(self.arrays[a].h);
                if !self.arrays[a].live {
                    return self.check_freed(a, "scope register", r);
                }
                r.expect("scope register");
                let sid = self.stack[k].1;
                self.arrays[a].scopes.insert(sid);
            }
            Action::Unregister { a, keep } => {
                let Some(a) = self.pick(a) else { return };
                let h = self.arrays[a].h;
                let call = move || {
                    if keep {
                        h.keep();
                    } else {
                        NDScope::unregister(h);
                    }
                };
                if self.arrays[a].live {
                    call();
                    self.arrays[a].scopes.clear();
                } else {
                    // No `try_` twin: documented to panic with the `Closed` message.
                    let msg = expect_panic(call);
                    assert!(msg.starts_with("use of a closed array"), "{msg}");
                }
            }
            Action::Retain { a } => {
                let Some(a) = self.pick(a) else { return };
                let r = self.arrays[a].h.try_retain();
                if !self.arrays[a].live {
                    return self.check_freed(a, "retain", r);
                }
                let x = &mut self.arrays[a];
                x.retains += 1;
                assert_eq!(r.expect("retain"), x.retains + x.scopes.len() as u32);
            }
            Action::Release { a } => {
                let Some(a) = self.pick(a) else { return };
                let r = self.arrays[a].h.try_release();
                if !self.arrays[a].live {
                    return self.check_freed(a, "release", r);
                }
                let x = &self.arrays[a];
                let count = x.retains + x.scopes.len() as u32;
                let freed = r.expect("release");
                assert_eq!(freed, count <= 1, "release of count {count}");
                if count <= 1 {
                    self.free(a, Why::Release, false);
                } else if x.retains > 0 {
                    self.arrays[a].retains -= 1;
                } else {
                    let innermost = *x
                        .scopes
                        .iter()
                        .max_by_key(|&&sid| self.stack_pos(sid))
                        .expect("count > 1");
                    self.arrays[a].scopes.remove(&innermost);
                }
            }
            Action::CloseArray { a } => {
                let Some(a) = self.pick(a) else { return };
                self.arrays[a].h.close(); // idempotent
                self.free(a, Why::Explicit, false);
            }
            Action::CloseManager { m } => {
                let m = self.pick_mgr(m);
                self.mgrs[m].h.close(); // idempotent
                self.bulk = Some(self.frees);
                self.close_mgr(m);
                self.bulk = None;
            }
            Action::NewSub { m } => {
                let m = self.pick_mgr(m);
                let r = self.mgrs[m].h.try_new_sub_manager();
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
            Action::Attach { a, m } => {
                let Some(a) = self.pick(a) else { return };
                let m = self.pick_mgr(m);
                let r = self.arrays[a].h.try_attach(&self.mgrs[m].h);
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
                self.arrays[a].owner = m;
                self.arrays[a].temp_home = None;
            }
            Action::Detach { a } => {
                let Some(a) = self.pick(a) else { return };
                let r = self.arrays[a].h.try_detach();
                if !self.arrays[a].live {
                    return self.check_freed(a, "detach", r);
                }
                r.expect("detach");
                self.arrays[a].owner = SYS;
                self.arrays[a].temp_home = None;
            }
            Action::TempAttach { a, m } => {
                let Some(a) = self.pick(a) else { return };
                let m = self.pick_mgr(m);
                let r = self.arrays[a].h.try_temp_attach(&self.mgrs[m].h);
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
                    return self.expect_err("temp_attach", r, &allowed);
                }
                r.expect("temp_attach");
                let x = &mut self.arrays[a];
                x.temp_home = Some(x.temp_home.unwrap_or(x.owner));
                x.owner = m;
            }
            Action::Cap { m } => {
                let m = self.pick_mgr(m);
                self.mgrs[m].h.cap();
                if self.mgrs[m].open {
                    self.mgrs[m].capped = true;
                }
            }
            Action::UseFreed { a, how } => {
                let Some(i) = self.pick_freed(a) else { return };
                self.use_freed(i, how);
            }
            Action::Churn => {
                let scratch = NDManager::new();
                for _ in 0..CHURN {
                    scratch.zeros([1], DType::F32).close();
                }
                scratch.close();
                self.frees += CHURN;
            }
            Action::RequireGrad { a, on } => self.require_grad(a, on),
            Action::Backward { a, b, kind, mode } => self.backward(a, b, kind, mode),
        }
    }

    /// `set_requires_gradient(on)`: `true` gives a live array without a gradient a new
    /// gradient array (zeros of its shape, owned by its manager, in no scope); `false`
    /// frees it. Both are no-ops otherwise (also for a gradient that was freed on its own).
    fn require_grad(&mut self, a: usize, on: bool) {
        let Some(a) = self.pick(a) else { return };
        let r = self.arrays[a].h.try_set_requires_gradient(on);
        if !self.arrays[a].live {
            return self.check_freed(a, "set_requires_gradient", r);
        }
        let x = &self.arrays[a];
        match (on, x.grad) {
            (true, None) if self.mgrs[x.owner].capped => {
                self.expect_err("set_requires_gradient", r, &[Exp::Capped]);
            }
            (true, None) => {
                r.expect("set_requires_gradient(true)");
                let g = x.h.try_gradient().expect("gradient");
                assert_eq!(g.to_vec::<f32>().unwrap(), vec![0.0; x.h.size()]);
                let (shape, owner) = (x.shape.clone(), x.owner);
                self.add_array(g, shape, owner, None);
                let gi = self.arrays.len() - 1;
                self.arrays[gi].scopes.clear();
                self.arrays[a].grad = Some(gi);
                GRADS_MADE.fetch_add(1, Ordering::Relaxed);
            }
            (false, Some(g)) => {
                r.expect("set_requires_gradient(false)");
                self.free(g, Why::Explicit, false);
                self.arrays[a].grad = None;
            }
            _ => {
                r.expect("set_requires_gradient no-op");
            }
        }
    }

    /// One collector: `x.square().sum()` (kind 0), `(x * y).sum()` (1) or
    /// `(x * y).square().sum()` (2), computed in the current model scope (mode 0) or in
    /// an inner scope that is dropped after `backward` (1), closed before it with the loss
    /// escaped (2), closed before it without (3: `backward` fails with `Closed`), or
    /// closed and the collector dropped without `backward` (4). Then: the gradients of
    /// all parameters (the involved ones by the chain rule, the others zeroed by the
    /// collector), intermediates the tape held freed when it let go of them, and the
    /// arrays backward made for itself (counted by uid) freed.
    fn backward(&mut self, a: usize, b: usize, kind: u8, mode: u8) {
        // Mostly a live parameter as `x`, so that most passes have something to check.
        let live_params: Vec<usize> = (0..self.arrays.len())
            .filter(|&i| self.arrays[i].live && self.arrays[i].grad.is_some())
            .collect();
        let a = match live_params.len() {
            0 => self.pick(a),
            n if a % 4 != 3 => Some(live_params[(a / 4) % n]),
            _ => self.pick(a),
        };
        let (Some(a), Some(b)) = (a, self.pick(b)) else {
            return;
        };
        let b = if kind == 0 { a } else { b };
        let (x, y) = (&self.arrays[a], &self.arrays[b]);
        if !x.live || !y.live || self.mgrs[x.owner].capped {
            return;
        }
        let Some(out_shape) = broadcast(&x.shape, &y.shape) else {
            return;
        };
        let (xh, yh, owner) = (x.h, y.h, x.owner);
        let (xs, ys) = (x.shape.clone(), y.shape.clone());
        let params: Vec<usize> = [a, b]
            .into_iter()
            .filter(|&i| self.arrays[i].grad.is_some())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let probe = || {
            let p = NDManager::system().zeros([0], DType::F32);
            p.close();
            p.uid()
        };
        let uid0 = probe();
        self.frees += 1;

        let gc = GradientCollector::new();
        let (xv, yv) = (xh.to_vec::<f32>().unwrap(), yh.to_vec::<f32>().unwrap());
        let inner = (mode != 0).then(NDScope::new);
        let inner_at = inner.as_ref().and_then(|s| s.opened_at());
        // Forward: the intermediates in creation order, with their shapes.
        let mut made: Vec<(NDArray, Vec<usize>)> = Vec::new();
        let (p, q) = match kind {
            0 => (None, Some(xh.square())),
            1 => (Some(xh * yh), None),
            _ => {
                let p = xh * yh;
                (Some(p), Some(p.square()))
            }
        };
        if let Some(p) = p {
            made.push((p, out_shape.clone()));
        }
        if let Some(q) = q {
            made.push((q, out_shape.clone()));
        }
        let loss = made.last().expect("an op").0.sum();
        made.push((loss, vec![]));
        assert_eq!(
            gc.tape_len(),
            if params.is_empty() { 0 } else { made.len() }
        );
        if self.arrays[a].grad.is_some() {
            // In-place update of a parameter while the tape depends on it.
            let r = xh.try_addi(0.0);
            assert!(matches!(r, Err(NdError::InvalidArgument { .. })), "{r:?}");
        }
        // Only `(x * y)` feeding `square` is held by the tape (square reads its input).
        let held_p = kind == 2 && !params.is_empty();
        let close_before = mode >= 2;
        if close_before {
            let s = inner.as_ref().expect("inner scope");
            if mode == 2 {
                s.escape(loss);
            }
        }
        let inner = if close_before {
            inner.expect("inner scope").close();
            None
        } else {
            inner
        };
        let result = (mode != 4).then(|| gc.backward(loss));
        drop(inner); // mode 1: by drop, after backward
        drop(gc);
        let uid1 = probe();
        self.frees += 1;
        let temps = uid1 - uid0 - 1 - made.len() as u64;
        BACKWARD_TEMPS.fetch_add(temps, Ordering::Relaxed);

        // The model, in the engine's order of frees.
        let first = self.arrays.len();
        for (h, shape) in made {
            self.add_array(h, shape, owner, None);
        }
        let ids: Vec<usize> = (first..self.arrays.len()).collect();
        let (p_id, loss_id) = (p.map(|_| first), *ids.last().unwrap());
        if mode != 0 {
            for &i in &ids {
                self.arrays[i].scopes.clear();
            }
            if mode == 2 {
                // Escaped from the inner scope to the current model scope.
                if let Some(&(_, sid)) = self.stack.last() {
                    self.arrays[loss_id].scopes.insert(sid);
                }
            }
        }
        let at = inner_at.unwrap_or(Location::caller());
        if close_before {
            self.bulk = Some(self.frees);
            for &i in &ids {
                let escaped = mode == 2 && i == loss_id;
                let kept = escaped || (held_p && Some(i) == p_id);
                if !kept {
                    self.free(i, Why::Scope(at), false);
                }
            }
            self.bulk = None;
        }
        self.frees += temps;
        if mode == 1 {
            self.bulk = Some(self.frees);
            for &i in &ids {
                self.free(i, Why::Scope(at), true);
            }
            self.bulk = None;
        }
        if close_before && held_p {
            // Orphaned: freed by the tape's last hold (no caller location).
            ORPHANS_FREED.fetch_add(1, Ordering::Relaxed);
            self.free(p_id.expect("p"), Why::Scope(at), true);
        }

        // The result.
        let dead_grads: Vec<usize> = params
            .iter()
            .map(|&i| self.arrays[i].grad.expect("param"))
            .filter(|&g| !self.arrays[g].live)
            .collect();
        let mut exact = false;
        match (mode, result) {
            (4, None) => {}
            (3, Some(r)) => self.expect_err("backward(closed loss)", r, &[Exp::Closed(loss_id)]),
            (_, Some(r)) if params.is_empty() => {
                assert!(matches!(r, Err(NdError::InvalidArgument { .. })), "{r:?}");
            }
            (_, Some(r)) if !dead_grads.is_empty() => {
                // A gradient freed on its own: backward reports it (and the other
                // parameters' gradients may or may not have been added to).
                let allowed: Vec<Exp> = dead_grads.iter().map(|&g| Exp::Closed(g)).collect();
                self.expect_err("backward (freed gradient)", r, &allowed);
            }
            (_, Some(r)) => {
                r.expect("backward");
                exact = true;
                BACKWARDS.fetch_add(1, Ordering::Relaxed);
            }
            (m, r) => panic!("mode {m}: {r:?}"),
        }
        // Expected gradients of x and y by the chain rule, summed over broadcast axes.
        let n: usize = out_shape.iter().product();
        let (mut gx, mut gy) = (vec![0f32; xv.len()], vec![0f32; yv.len()]);
        for o in 0..n {
            let (xi, yi) = (bindex(&out_shape, &xs, o), bindex(&out_shape, &ys, o));
            match kind {
                0 => gx[xi] += 2.0 * xv[xi],
                _ => {
                    let d = if kind == 1 {
                        1.0
                    } else {
                        2.0 * xv[xi] * yv[yi]
                    };
                    gx[xi] += d * yv[yi];
                    gy[yi] += d * xv[xi];
                }
            }
        }
        if kind != 0 && a == b {
            for (g, d) in gx.iter_mut().zip(&gy) {
                *g += d;
            }
        }
        for i in 0..self.arrays.len() {
            let Some(g) = self.arrays[i].grad else {
                continue;
            };
            if !self.arrays[i].live || !self.arrays[g].live {
                continue;
            }
            let involved = i == a || i == b;
            if involved && !exact && mode != 4 && !dead_grads.is_empty() {
                continue;
            }
            let got = self.arrays[g].h.to_vec::<f32>().unwrap();
            let want = match (involved && exact, i == a) {
                (false, _) => vec![0.0; got.len()],
                (true, true) => gx.clone(),
                (true, false) => gy.clone(),
            };
            let close = got.len() == want.len()
                && got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| (g - w).abs() <= 1e-4 * w.abs().max(1.0));
            assert!(close, "gradient of array {i}: got {got:?}, want {want:?}");
        }
    }

    /// Every use of a freed array fails with `Closed` and the right reason.
    fn use_freed(&self, i: usize, how: u8) {
        let h = self.arrays[i].h;
        assert!(h.is_closed());
        h.close(); // idempotent, no panic
        assert!(format!("{h:?}").contains("closed"));
        let live = self.arrays.iter().find(|a| a.live).map(|a| a.h);
        match how % 16 {
            0 => self.check_freed(i, "shape", h.try_shape()),
            1 => self.check_freed(i, "dtype", h.try_dtype()),
            2 => self.check_freed(i, "to_vec", h.to_vec::<f32>()),
            3 => self.check_freed(i, "add scalar", h.try_add(1.0)),
            4 => match live {
                Some(l) => self.check_freed(i, "live + freed", l.try_add(h)),
                None => self.check_freed(i, "freed + freed", h.try_add(h)),
            },
            5 => self.check_freed(i, "retain", h.try_retain()),
            6 => self.check_freed(i, "release", h.try_release()),
            7 => self.check_freed(i, "ref_count", h.try_ref_count()),
            8 => self.check_freed(i, "reshape", h.try_reshape([1, 1])),
            9 => self.check_freed(i, "sum", h.try_sum()),
            10 => self.check_freed(i, "addi", h.try_addi(1.0)),
            11 => self.check_freed(i, "detach", h.try_detach()),
            12 => self.check_freed(i, "manager", h.try_manager()),
            13 => match self.stack.last() {
                Some((s, _)) => self.check_freed(i, "escape", s.try_escape(h)),
                None => self.check_freed(i, "to_scalar", h.to_scalar::<f32>()),
            },
            14 => self.check_freed(i, "temp_attach", h.try_temp_attach(&self.mgrs[ROOT].h)),
            _ => {
                let msg = expect_panic(|| {
                    let _ = h + 1.0;
                });
                let e = h.try_add(1.0).unwrap_err();
                assert_eq!(
                    msg,
                    e.to_string(),
                    "the operator panics with the error text"
                );
            }
        }
    }

    /// Close what is left the way a user would, checking the model on the way; then the
    /// process counters are back at the baseline.
    fn finish(&mut self) {
        while !self.stack.is_empty() {
            let k = self.stack.len() - 1;
            self.close_scopes(k, true);
            self.check();
        }
        self.mgrs[ROOT].h.close();
        self.bulk = Some(self.frees);
        self.close_mgr(ROOT);
        self.bulk = None;
        self.check();
        for i in 0..self.arrays.len() {
            if self.arrays[i].live {
                assert_eq!(self.arrays[i].owner, SYS, "only detached arrays are left");
                self.arrays[i].h.close();
                self.free(i, Why::Explicit, false);
            }
        }
        self.check();
        assert_eq!(counters(), self.base, "counters back at baseline");
    }
}

impl Drop for Model {
    /// After a failure, free everything the case made so that shrinking starts clean.
    fn drop(&mut self) {
        while let Some((s, _)) = self.stack.pop() {
            drop(s);
        }
        self.mgrs[ROOT].h.close();
        for a in &self.arrays {
            a.h.close();
        }
    }
}

fn run_case(actions: &[Action]) {
    let mut model = Model::new();
    model.check();
    for act in actions {
        model.step(act);
        model.check();
        STEPS.fetch_add(1, Ordering::Relaxed);
    }
    model.finish();
    CASES.fetch_add(1, Ordering::Relaxed);
}

/// Rules 1-8 (docs/ownership.md), and the scope parts of rules 9 and 11, against a
/// reference model.
#[test]
fn ownership_matches_the_reference_model() {
    let cases = env_or("NDSCOPE_MODEL_CASES", 1200);
    let max_steps = env_or("NDSCOPE_MODEL_STEPS", 120) as usize;
    let base = counters();
    let system_children = NDManager::system().children().len();
    let t0 = std::time::Instant::now();
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&prop::collection::vec(action(), 1..=max_steps), |acts| {
        run_case(&acts);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert_eq!(counters(), base);
    assert_eq!(NDManager::system().children().len(), system_children);
    let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "model: {} cases, {} steps, in {:.1?}; freed-array errors checked: {} with details, \
         {} ClosedUnknown; temp-attached arrays returned home: {}; gradients created: {}, \
         backward passes checked exactly: {}, tape-held intermediates freed by the tape: {}, \
         backward temporaries freed: {}",
        n(&CASES),
        n(&STEPS),
        t0.elapsed(),
        n(&CLOSED_SEEN),
        n(&UNKNOWN_SEEN),
        n(&RETURNED_HOME),
        n(&GRADS_MADE),
        n(&BACKWARDS),
        n(&ORPHANS_FREED),
        n(&BACKWARD_TEMPS),
    );
}
