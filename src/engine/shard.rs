//! Shards: where records live, and how operations lock them.
//!
//! Every thread that uses ndscope gets a shard of its own (a `RwLock<Shard>`): the
//! records of the arrays, buffers and scopes it creates, its share of every manager's
//! array list and counters ([`MgrEntry`]), and its graveyard of recently freed arrays.
//! A thread working on its own arrays locks only its own shard, which no other thread
//! touches unless it uses those arrays, so independent threads never contend.
//!
//! Any thread may lock any shard: cross-thread use is ordinary, just not free. An
//! operation first looks at the records it will touch under the lock of the shard that
//! holds its main record ([`Ctx::one`]); if everything it will modify lives in that
//! shard it proceeds, otherwise it drops the lock and runs under the locks of every
//! shard ([`Ctx::all`]), taken in index order (the one lock order, so no deadlock).
//! The global manager table ([`super::managers`]) may be locked while shard locks are
//! held, never the other way round.
//!
//! Shards are never freed: a thread that exits leaves its shard (and the records in
//! it) to the next new thread, so arrays outlive the thread that made them and shards
//! stay bounded by the number of threads alive at once.

use super::Storage;
use super::managers::MgrEntry;
use super::records::ScopeRec;
use super::records::{ArrayRec, BufMeta, Tomb, Traces};
use super::slab::{ArrayId, ArrayK, Graveyard, ScopeId, Serials, Slab};
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use smallvec::SmallVec;
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// A freed array's details (creating line, close site and reason) survive this many
/// later frees of arrays of the same shard; after that a use of it reports
/// `NdError::ClosedUnknown`.
pub(crate) const CLOSED_DETAILS_KEPT: usize = 4096;

/// At most this many threads may use ndscope at the same time.
const MAX_SHARDS: usize = 4096;

pub(crate) static ARRAY_SERIALS: Serials = Serials::new();
pub(crate) static BUFFER_SERIALS: Serials = Serials::new();
pub(crate) static SCOPE_SERIALS: Serials = Serials::new();

/// One thread's records.
pub(crate) struct Shard {
    pub arrays: Slab<ArrayK, ArrayRec>,
    pub buffers: Slab<super::slab::BufferK, BufMeta>,
    pub scopes: Slab<super::slab::ScopeK, ScopeRec>,
    /// This shard's part of each manager, indexed by the manager's slot index.
    pub mgrs: Vec<Option<MgrEntry>>,
    /// Parameters (arrays with a gradient) whose records live here: what a collector
    /// on this thread zeroes. Dead ones are pruned when a collector starts.
    pub params: Vec<ArrayId>,
    /// What recently freed arrays were, for use-after-close errors.
    pub graves: Graveyard<ArrayK, Tomb>,
    /// Backtraces of recently freed arrays (verbose mode only).
    pub traces: Graveyard<ArrayK, Traces>,
    /// Emptied `Arc<Storage>` shells kept for reuse, so a new buffer costs no allocation
    /// for its `Arc` (the block itself comes from the caching pool).
    pub spare_arcs: Vec<Arc<Storage>>,
    /// Emptied scope array lists kept for reuse by the next scopes.
    pub spare_lists: Vec<Vec<ArrayId>>,
}

impl Shard {
    fn new(index: u32) -> Shard {
        Shard {
            arrays: Slab::new(index, &ARRAY_SERIALS),
            buffers: Slab::new(index, &BUFFER_SERIALS),
            scopes: Slab::new(index, &SCOPE_SERIALS),
            mgrs: Vec::new(),
            params: Vec::new(),
            graves: Graveyard::new(CLOSED_DETAILS_KEPT + 1),
            traces: Graveyard::new(CLOSED_DETAILS_KEPT + 1),
            spare_arcs: Vec::new(),
            spare_lists: Vec::new(),
        }
    }
}

/// A shard's lock and records, alone on their cache lines: each is written on every
/// op of its thread, and two shards side by side in the heap (they are made as
/// threads start) would make independent threads fight over the line they share.
#[repr(align(128))]
struct ShardCell(RwLock<Shard>);

/// The shard table: leaked shards, published once and never freed.
static SHARDS: [AtomicPtr<ShardCell>; MAX_SHARDS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_SHARDS];
/// Number of shards created so far (all of `SHARDS[..count]` are published).
static SHARD_COUNT: AtomicUsize = AtomicUsize::new(0);
/// Shards whose thread exited, for the next new thread.
static FREE_SHARDS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// No shard assigned to this thread yet.
const UNSET: u32 = u32::MAX;
/// This thread is exiting: use shard 0 for whatever its destructors still do.
const EXITED: u32 = u32::MAX - 1;

thread_local! {
    /// This thread's shard index.
    static MY_SHARD: Cell<u32> = const { Cell::new(UNSET) };
    /// Gives the shard back when the thread exits.
    static RETURN_SHARD: ShardReturn = const { ShardReturn };
    /// The innermost open scope of this thread.
    pub(crate) static CURRENT_SCOPE: Cell<Option<ScopeId>> = const { Cell::new(None) };
    /// The lowest serial of the arrays this thread created in its shard: an adopted
    /// shard still holds arrays of the thread that exited, which are not this one's.
    static MINE_FROM: Cell<u64> = const { Cell::new(0) };
}

struct ShardReturn;

impl Drop for ShardReturn {
    fn drop(&mut self) {
        let s = MY_SHARD.with(|c| c.replace(EXITED));
        if s < EXITED {
            // The thread that adopts the shard numbers its arrays above every serial
            // issued before it adopts (see `mine_from`): none from this block.
            shard(s).write().arrays.end_serial_block();
            FREE_SHARDS.lock().push(s);
        }
    }
}

/// The shard with this index (it exists: ids only name published shards).
#[inline]
pub(crate) fn shard(index: u32) -> &'static RwLock<Shard> {
    let p = SHARDS[index as usize].load(Ordering::Acquire);
    debug_assert!(!p.is_null());
    // SAFETY: published pointers come from `Box::leak` and are never freed or replaced.
    unsafe { &(*p).0 }
}

/// This thread's shard index (assigned on first use).
#[inline]
pub(crate) fn my_shard() -> u32 {
    let s = MY_SHARD.with(Cell::get);
    if s < EXITED {
        return s;
    }
    if s == EXITED {
        return 0;
    }
    assign_shard()
}

#[cold]
fn assign_shard() -> u32 {
    let mut free = FREE_SHARDS.lock();
    let index = match free.pop() {
        Some(i) => {
            // Adopted: its records of the exited thread's arrays have lower serials
            // (that thread ended its block of serials before handing the shard back).
            MINE_FROM.with(|c| c.set(ARRAY_SERIALS.issued()));
            i
        }
        None => {
            let i = SHARD_COUNT.load(Ordering::Acquire);
            assert!(
                i < MAX_SHARDS,
                "ndscope: more than {MAX_SHARDS} threads use arrays at the same time"
            );
            let p = Box::leak(Box::new(ShardCell(RwLock::new(Shard::new(i as u32)))));
            SHARDS[i].store(p, Ordering::Release);
            SHARD_COUNT.store(i + 1, Ordering::Release);
            i as u32
        }
    };
    drop(free);
    MY_SHARD.with(|c| c.set(index));
    // Registers the destructor that hands the shard back at thread exit.
    RETURN_SHARD.with(|_| {});
    index
}

/// Whether this thread created array `id`: it lives in this thread's shard and is
/// not one of the arrays a previous, exited owner of the shard left there.
#[inline]
pub(crate) fn created_here(id: ArrayId) -> bool {
    id.shard == my_shard() && id.uid() >= MINE_FROM.with(Cell::get)
}

/// Number of shards created so far.
pub(crate) fn shard_count() -> usize {
    SHARD_COUNT.load(Ordering::Acquire)
}

/// A set of shard indices.
pub(crate) type Shards = SmallVec<[u32; 8]>;

/// Add shard `s` to the set.
#[inline(always)]
pub(crate) fn add(out: &mut Shards, s: u32) {
    if !out.contains(&s) {
        out.push(s);
    }
}

/// Beyond this many shards an operation simply locks them all.
const MANY_SHARDS: usize = 8;

/// Lock the shards an operation needs: start with `first`, ask `need` (which may read
/// only locked shards) which shards it touches, and lock more until it asks for no
/// shard that is not locked. Records can change while no lock is held, hence the loop.
#[inline]
pub(crate) fn lock_needed(first: &[u32], need: impl Fn(&Ctx, &mut Shards)) -> Ctx {
    // The common case: one shard, and the operation stays in it.
    if let [only] = first {
        let ctx = Ctx::one(*only);
        let mut more = Shards::new();
        need(&ctx, &mut more);
        if more.iter().all(|s| s == only) {
            return ctx;
        }
    }
    lock_needed_slow(first, need)
}

#[cold]
fn lock_needed_slow(first: &[u32], need: impl Fn(&Ctx, &mut Shards)) -> Ctx {
    let mut want: Shards = first.iter().copied().collect();
    loop {
        let ctx = Ctx::set(&want);
        let mut more = Shards::new();
        need(&ctx, &mut more);
        let before = want.len();
        for s in more {
            if !ctx.holds(s) && !want.contains(&s) {
                want.push(s);
            }
        }
        if want.len() == before {
            return ctx;
        }
        drop(ctx);
        if want.len() > MANY_SHARDS {
            let ctx = Ctx::all();
            return ctx;
        }
    }
}

/// A held shard lock: exclusive, or shared (an op that only reads another shard's
/// arrays, so that threads reading one data set do not serialise).
pub(crate) enum Guard {
    W(RwLockWriteGuard<'static, Shard>),
    R(RwLockReadGuard<'static, Shard>),
}

/// The shards an operation holds locked (exclusively unless said otherwise).
pub(crate) enum Ctx {
    /// One shard (the common case).
    One(u32, RwLockWriteGuard<'static, Shard>),
    /// A few shards, sorted by index.
    Some(SmallVec<[(u32, Guard); 3]>),
    /// Every shard, by index.
    All(Vec<RwLockWriteGuard<'static, Shard>>),
}

impl Ctx {
    /// Lock one shard.
    #[inline]
    pub(crate) fn one(s: u32) -> Ctx {
        Ctx::One(s, shard(s).write())
    }

    /// Let go of the locks: what dropping `self` does, with the common case (one
    /// shard) unlocked inline. The drop glue of `Ctx` is a call that saves and
    /// restores registers for its three variants; a scope's open and close end with
    /// this instead. (An op's path and an array's close gained nothing from it.)
    #[inline(always)]
    pub(crate) fn unlock(self) {
        match self {
            Ctx::One(_, guard) => drop(guard),
            other => drop(other),
        }
    }

    /// Lock these shards (in index order).
    pub(crate) fn set(shards: &[u32]) -> Ctx {
        if let [first, rest @ ..] = shards
            && rest.iter().all(|s| s == first)
        {
            return Ctx::one(*first);
        }
        let v = lock_order(shards.iter().copied());
        if v.len() == 1 {
            return Ctx::one(v[0]);
        }
        Ctx::Some(
            v.into_iter()
                .map(|s| (s, Guard::W(shard(s).write())))
                .collect(),
        )
    }

    /// Lock `write` exclusively and the other shards of `read` shared (in index order).
    pub(crate) fn reading(read: &[u32], write: u32) -> Ctx {
        if read.iter().all(|&s| s == write) {
            return Ctx::one(write);
        }
        let v = lock_order(read.iter().copied().chain([write]));
        Ctx::Some(
            v.into_iter()
                .map(|s| {
                    let g = if s == write {
                        Guard::W(shard(s).write())
                    } else {
                        Guard::R(shard(s).read())
                    };
                    (s, g)
                })
                .collect(),
        )
    }

    /// Lock these shards shared (in index order): for reading only.
    pub(crate) fn read_only(read: &[u32]) -> Ctx {
        let v = lock_order(read.iter().copied());
        Ctx::Some(
            v.into_iter()
                .map(|s| (s, Guard::R(shard(s).read())))
                .collect(),
        )
    }

    /// Whether shard `s` is locked exclusively here.
    #[inline]
    pub(crate) fn holds_mut(&self, s: u32) -> bool {
        match self {
            Ctx::Some(v) => v.iter().any(|(i, g)| *i == s && matches!(g, Guard::W(_))),
            _ => self.holds(s),
        }
    }

    /// Lock every shard (in index order).
    pub(crate) fn all() -> Ctx {
        my_shard(); // this thread's shard exists before the count is read
        let n = shard_count();
        Ctx::All((0..n as u32).map(|s| shard(s).write()).collect())
    }

    /// Whether shard `s` is locked here.
    #[inline]
    pub(crate) fn holds(&self, s: u32) -> bool {
        match self {
            Ctx::One(i, _) => *i == s,
            Ctx::Some(v) => v.iter().any(|(i, _)| *i == s),
            Ctx::All(v) => (s as usize) < v.len(),
        }
    }

    /// Shard `s`, which must be locked here.
    #[inline]
    pub(crate) fn sh(&mut self, s: u32) -> &mut Shard {
        match self {
            Ctx::One(i, g) if *i == s => g,
            Ctx::Some(v) => match v.iter_mut().find(|(i, _)| *i == s) {
                Some((_, Guard::W(g))) => g,
                _ => not_held(s),
            },
            Ctx::All(v) if (s as usize) < v.len() => &mut v[s as usize],
            _ => not_held(s),
        }
    }

    /// Shard `s` for reading, which must be locked here.
    #[inline]
    pub(crate) fn shr(&self, s: u32) -> &Shard {
        match self {
            Ctx::One(i, g) if *i == s => g,
            Ctx::Some(v) => match v.iter().find(|(i, _)| *i == s) {
                Some((_, Guard::W(g))) => g,
                Some((_, Guard::R(g))) => g,
                None => not_held(s),
            },
            Ctx::All(v) if (s as usize) < v.len() => &v[s as usize],
            _ => not_held(s),
        }
    }

    /// The indices of the locked shards.
    pub(crate) fn held(&self) -> SmallVec<[u32; 4]> {
        match self {
            Ctx::One(i, _) => smallvec::smallvec![*i],
            Ctx::Some(v) => v.iter().map(|(i, _)| *i).collect(),
            Ctx::All(v) => (0..v.len() as u32).collect(),
        }
    }
}

/// Shard indices in the one lock order (ascending, no repeats).
fn lock_order(shards: impl Iterator<Item = u32>) -> SmallVec<[u32; 3]> {
    let mut v: SmallVec<[u32; 3]> = shards.collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[cold]
#[inline(never)]
fn not_held(s: u32) -> ! {
    panic!("ndscope engine invariant: shard {s} used without its (exclusive) lock")
}
