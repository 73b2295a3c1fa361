//! The caching allocator behind [`super::buffer::Buffer`] (like PyTorch's caching allocator).
//!
//! Requests are rounded up to **size classes**: 64 bytes, then four classes per power of
//! two (`5/4, 6/4, 7/4, 8/4` of the lower power), so a block is at most 25% larger than
//! asked and a loop that frees and re-creates arrays of one shape reuses its blocks
//! exactly. A freed block goes back to its class instead of to the system allocator, so
//! large buffers are not returned to the kernel and re-faulted on every op (a fresh
//! 64 MiB block costs more page faults than the add that fills it).
//!
//! Two levels, so the small-op path takes no lock:
//! * a **thread-local** cache of small blocks (up to [`LOCAL_MAX_BLOCK`] bytes, at most
//!   [`LOCAL_CLASS_BYTES`] per class, under 1 MiB in all), touched only by its thread;
//! * a **shared** pool behind its own small mutex (never the engine lock: buffers may be
//!   dropped while the engine lock is held, or outside it by a large op's snapshot).
//!   Local caches trade with it in batches of half a class's worth of blocks (a full
//!   class spills half its blocks, an empty one refills half), as tcmalloc's per-thread
//!   caches do with its central lists: a scope that frees thousands of temporaries takes
//!   the mutex a few times, not once per block, so threads do not queue on it.
//!
//! Cached bytes are counted apart from live bytes ([`cached_bytes`]); the shared pool
//! stays under [`set_limit`] (blocks freed beyond it go back to the system) and each
//! thread's local cache holds under 1 MiB,
//! unless the limit is 0, which turns caching off. A thread's local blocks move to the
//! shared pool when the thread exits. Blocks are zeroed when first allocated, so every
//! block is initialised; reused ones hold old values.

use crate::error::{NdError, Result};
use parking_lot::{Mutex, MutexGuard};
use std::alloc::{self, Layout};
use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Alignment of every buffer, in bytes (a cache line; enough for any SIMD width).
pub(crate) const ALIGN: usize = 64;

/// Class tag of an empty buffer (no block).
pub(crate) const NO_CLASS: u32 = u32::MAX >> 1;
/// Flag on a buffer's class: the block came zeroed from the system allocator.
pub(crate) const FRESH: u32 = 1 << 31;

/// Number of size classes (covers every size up to `isize::MAX`).
const CLASSES: usize = 1 + 58 * 4;
/// Largest block kept in thread-local caches.
pub(crate) const LOCAL_MAX_BLOCK: usize = 4 * 1024;
/// Bytes kept per class in a thread-local cache (at least one block): 512 blocks of
/// 64 bytes, so a scope of several hundred small arrays recycles them all locally.
pub(crate) const LOCAL_CLASS_BYTES: usize = 32 * 1024;
/// Classes small enough for the local caches (`class_size(i) <= LOCAL_MAX_BLOCK`).
const LOCAL_CLASSES: usize = 1 + (11 - 6) * 4 + 4;
const _: () = assert!(class_size(LOCAL_CLASSES as u32 - 1) == LOCAL_MAX_BLOCK);
const _: () = assert!(class_size(LOCAL_CLASSES as u32) > LOCAL_MAX_BLOCK);

/// Blocks kept per class in a thread-local cache (`LOCAL_CLASS_BYTES / size`, at least
/// one): a table, so giving a block back divides nothing.
const LOCAL_PER_CLASS: [usize; LOCAL_CLASSES] = {
    let mut t = [0; LOCAL_CLASSES];
    let mut c = 0;
    while c < LOCAL_CLASSES {
        let n = LOCAL_CLASS_BYTES / class_size(c as u32);
        t[c] = if n == 0 { 1 } else { n };
        c += 1;
    }
    t
};

/// Default cap on cached bytes: 1 GiB.
pub(crate) const DEFAULT_LIMIT: usize = 1 << 30;

static LIMIT: AtomicUsize = AtomicUsize::new(DEFAULT_LIMIT);
static SYSTEM_ALLOCS: AtomicU64 = AtomicU64::new(0);
static SYSTEM_FREES: AtomicU64 = AtomicU64::new(0);

/// The shared pool: free blocks (addresses) per class, and their total size.
struct Shared {
    free: Vec<Vec<usize>>,
    bytes: usize,
    /// Cached-byte counters of the threads' local caches (each written by its thread).
    locals: Vec<Arc<Counter>>,
}

static SHARED: Mutex<Shared> = Mutex::new(Shared {
    free: Vec::new(),
    bytes: 0,
    locals: Vec::new(),
});

thread_local! {
    /// How many times this thread took the shared pool's lock (for the tests).
    static TRIPS: Cell<usize> = const { Cell::new(0) };
}

/// Lock the shared pool, counting the trip.
fn shared() -> MutexGuard<'static, Shared> {
    let _ = TRIPS.try_with(|t| t.set(t.get() + 1));
    SHARED.lock()
}

/// A thread's cache of small blocks.
struct Local {
    free: [Vec<usize>; LOCAL_CLASSES],
    bytes: usize,
    /// `bytes`, published for [`cached_bytes`] (plain stores: only this thread writes).
    published: Option<Arc<Counter>>,
}

/// A thread's published counter, alone on its cache lines: it is written on every
/// take and give, and two threads' counters side by side in the heap would make their
/// small ops fight over one line.
#[repr(align(128))]
#[derive(Default)]
struct Counter(AtomicUsize);

impl std::ops::Deref for Counter {
    type Target = AtomicUsize;
    fn deref(&self) -> &AtomicUsize {
        &self.0
    }
}

impl Local {
    /// Move up to half a class's worth of blocks of class `c` from the shared pool,
    /// under one lock: a thread that frees more blocks than its cache keeps (a scope
    /// closing on a thousand temporaries) and then makes them again goes to the shared
    /// pool once per batch, not once per block, so threads do not queue on its mutex.
    #[cold]
    fn refill(&mut self, c: usize) {
        let want = LOCAL_PER_CLASS[c].div_ceil(2);
        let mut shared = shared();
        let Some(list) = shared.free.get_mut(c) else {
            return;
        };
        let n = want.min(list.len());
        let moved = list.len() - n..;
        self.free[c].extend(list.drain(moved));
        let bytes = n * class_size(c as u32);
        shared.bytes -= bytes;
        self.bytes += bytes;
    }

    /// Move half of class `c`'s blocks to the shared pool under one lock (those past
    /// the pool's `limit` go back to the system), making room for the next frees.
    #[cold]
    fn spill(&mut self, c: usize, limit: usize) {
        let n = self.free[c].len().div_ceil(2);
        let size = class_size(c as u32);
        let start = self.free[c].len() - n;
        let mut shared = shared();
        for addr in self.free[c].drain(start..) {
            if shared.bytes + size > limit {
                system_free(c as u32, addr);
            } else {
                shared.push(c, addr);
            }
        }
        self.bytes -= n * size;
    }

    #[inline]
    fn publish(&mut self) {
        match &self.published {
            Some(counter) => counter.store(self.bytes, Ordering::Relaxed),
            None => self.publish_first(),
        }
    }

    /// [`Local::publish`] for the thread's first take or give: make its counter (out of
    /// line, so every later one is a check and a store: `get_or_insert_with` here cost
    /// add10 about 25 instructions).
    #[cold]
    #[inline(never)]
    fn publish_first(&mut self) {
        let c = Arc::new(Counter::default());
        c.store(self.bytes, Ordering::Relaxed);
        shared().locals.push(c.clone());
        self.published = Some(c);
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        // The thread is exiting: hand its blocks to the shared pool.
        let mut shared = shared();
        for (class, list) in self.free.iter_mut().enumerate() {
            for addr in list.drain(..) {
                shared.push(class, addr);
            }
        }
        if let Some(c) = self.published.take() {
            shared.locals.retain(|x| !Arc::ptr_eq(x, &c));
        }
        self.bytes = 0;
    }
}

thread_local! {
    static LOCAL: RefCell<Local> = const {
        RefCell::new(Local {
            free: [const { Vec::new() }; LOCAL_CLASSES],
            bytes: 0,
            published: None,
        })
    };
}

impl Shared {
    fn push(&mut self, class: usize, addr: usize) {
        if self.free.len() <= class {
            self.free.resize_with(CLASSES, Vec::new);
        }
        self.free[class].push(addr);
        self.bytes += class_size(class as u32);
    }

    fn pop(&mut self, class: usize) -> Option<usize> {
        let addr = self.free.get_mut(class)?.pop()?;
        self.bytes -= class_size(class as u32);
        Some(addr)
    }

    /// Free blocks back to the system until at most `keep` bytes are cached, largest
    /// classes first.
    fn trim(&mut self, keep: usize) {
        for class in (0..self.free.len()).rev() {
            while self.bytes > keep {
                let Some(addr) = self.free[class].pop() else {
                    break;
                };
                self.bytes -= class_size(class as u32);
                system_free(class as u32, addr);
            }
        }
    }
}

/// The size class of a request of `bytes` (> 0) bytes, or None past `isize::MAX`.
#[inline]
pub(crate) fn class_of(bytes: usize) -> Option<u32> {
    if bytes <= 64 {
        return Some(0);
    }
    if bytes > (isize::MAX as usize) / 2 {
        return None;
    }
    // bytes is in (2^k, 2^(k+1)]: four classes of 2^(k-2) each.
    let k = usize::BITS - 1 - (bytes - 1).leading_zeros();
    let step_shift = k - 2;
    let steps = (bytes - 1) >> step_shift; // 4..=7
    Some(1 + (k - 6) * 4 + (steps as u32 - 4))
}

/// The capacity in bytes of size class `class`.
#[inline]
pub(crate) const fn class_size(class: u32) -> usize {
    if class == 0 {
        return 64;
    }
    let k = (class - 1) / 4 + 6;
    let steps = (class - 1) % 4 + 5;
    (steps as usize) << (k - 2)
}

fn layout(class: u32) -> Layout {
    // Every class size is a multiple of 64 and at most isize::MAX (checked by class_of).
    Layout::from_size_align(class_size(class), ALIGN).expect("valid size class")
}

fn system_free(class: u32, addr: usize) {
    SYSTEM_FREES.fetch_add(1, Ordering::Relaxed);
    // SAFETY: `addr` was allocated by `take` with `layout(class)` and is owned by the
    // pool (no buffer refers to it any more).
    unsafe { alloc::dealloc(addr as *mut u8, layout(class)) }
}

/// A block for `bytes` (> 0) bytes: `(class, pointer)`, with `FRESH` set in the class
/// when it came zeroed from the system allocator.
///
/// The common case, a block of this thread's cache, is inlined into the caller; the
/// rest (a refill from the shared pool, the system allocator) is [`take_slow`].
#[inline]
pub(crate) fn take(bytes: usize) -> Result<(u32, NonNull<u8>)> {
    if let Some(class) = class_of(bytes)
        && (class as usize) < LOCAL_CLASSES
    {
        let hit = LOCAL.try_with(|l| {
            let mut l = l.borrow_mut();
            let addr = l.free[class as usize].pop()?;
            l.bytes -= class_size(class);
            l.publish();
            Some(addr)
        });
        if let Ok(Some(addr)) = hit {
            // SAFETY: pooled addresses come from successful allocations (never null).
            return Ok((class, unsafe { NonNull::new_unchecked(addr as *mut u8) }));
        }
    }
    take_slow(bytes)
}

/// [`take`] past this thread's cache: refill it from the shared pool, else allocate.
#[cold]
#[inline(never)]
fn take_slow(bytes: usize) -> Result<(u32, NonNull<u8>)> {
    let class = class_of(bytes).ok_or_else(|| NdError::OutOfMemory {
        bytes,
        device: crate::Device::Cpu,
    })?;
    let c = class as usize;
    let local = if c < LOCAL_CLASSES {
        LOCAL
            .try_with(|l| {
                let mut l = l.borrow_mut();
                if l.free[c].is_empty() {
                    l.refill(c);
                }
                let addr = l.free[c].pop()?;
                l.bytes -= class_size(class);
                l.publish();
                Some(addr)
            })
            .ok()
    } else {
        None
    };
    // (A local miss has already looked into the shared pool.)
    let hit = local.unwrap_or_else(|| shared().pop(c));
    if let Some(addr) = hit {
        // SAFETY: pooled addresses come from successful allocations (never null).
        return Ok((class, unsafe { NonNull::new_unchecked(addr as *mut u8) }));
    }
    let alloc = || {
        // SAFETY: class sizes are never zero.
        NonNull::new(unsafe { alloc::alloc_zeroed(layout(class)) })
    };
    let ptr = match alloc() {
        Some(p) => p,
        None => {
            // Out of memory: give the cached blocks back and try once more.
            empty();
            alloc().ok_or_else(|| NdError::OutOfMemory {
                bytes,
                device: crate::Device::Cpu,
            })?
        }
    };
    SYSTEM_ALLOCS.fetch_add(1, Ordering::Relaxed);
    Ok((class | FRESH, ptr))
}

/// Take back a block of class `class` (no flag) that no buffer refers to any more.
///
/// The common case, a push onto this thread's cache with room left, is inlined into
/// the caller; the rest (a spill, the first block of a class, the shared pool, the
/// system) is [`give_slow`].
#[inline]
pub(crate) fn give(class: u32, ptr: NonNull<u8>) {
    let c = class as usize;
    if c < LOCAL_CLASSES && LIMIT.load(Ordering::Relaxed) != 0 {
        let kept = LOCAL.try_with(|l| {
            let Ok(mut l) = l.try_borrow_mut() else {
                return false;
            };
            let list = &mut l.free[c];
            if list.len() >= LOCAL_PER_CLASS[c] || list.capacity() == 0 {
                return false;
            }
            list.push(ptr.as_ptr() as usize);
            l.bytes += class_size(class);
            l.publish();
            true
        });
        if kept == Ok(true) {
            return;
        }
    }
    give_slow(class, ptr)
}

/// [`give`] past the common case.
#[cold]
#[inline(never)]
fn give_slow(class: u32, ptr: NonNull<u8>) {
    let addr = ptr.as_ptr() as usize;
    let size = class_size(class);
    let limit = LIMIT.load(Ordering::Relaxed);
    if limit == 0 {
        return system_free(class, addr);
    }
    let c = class as usize;
    if c < LOCAL_CLASSES {
        let kept = LOCAL.try_with(|l| {
            let Ok(mut l) = l.try_borrow_mut() else {
                return false;
            };
            let per_class = LOCAL_PER_CLASS[c];
            if l.free[c].len() >= per_class {
                l.spill(c, limit);
            }
            if l.free[c].capacity() == 0 {
                l.free[c].reserve_exact(per_class);
            }
            l.free[c].push(addr);
            l.bytes += size;
            l.publish();
            true
        });
        if kept == Ok(true) {
            return;
        }
    }
    let mut shared = shared();
    if shared.bytes + size > limit {
        drop(shared);
        return system_free(class, addr);
    }
    shared.push(c, addr);
}

/// Bytes held by the pool (shared pool plus every thread's local cache).
pub(crate) fn cached_bytes() -> usize {
    let shared = shared();
    shared.bytes
        + shared
            .locals
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum::<usize>()
}

/// Give every block of the shared pool and of this thread's local cache back to the
/// system. (Other threads' local caches, at most a few hundred KiB each, stay until
/// those threads exit or call this.)
pub(crate) fn empty() {
    let _ = LOCAL.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            for class in 0..LOCAL_CLASSES {
                while let Some(addr) = l.free[class].pop() {
                    system_free(class as u32, addr);
                }
            }
            l.bytes = 0;
            if l.published.is_some() {
                l.publish();
            }
        }
    });
    shared().trim(0);
}

/// Cap the shared pool at `bytes` (trimming it now if needed); 0 turns caching off.
pub(crate) fn set_limit(bytes: usize) {
    LIMIT.store(bytes, Ordering::Relaxed);
    if bytes == 0 {
        empty();
    } else {
        shared().trim(bytes);
    }
}

pub(crate) fn limit() -> usize {
    LIMIT.load(Ordering::Relaxed)
}

/// Blocks allocated from / returned to the system allocator so far.
pub(crate) fn system_counts() -> (u64, u64) {
    (
        SYSTEM_ALLOCS.load(Ordering::Relaxed),
        SYSTEM_FREES.load(Ordering::Relaxed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread that frees and re-makes four local classes' worth of small blocks (a
    /// scope closing on its temporaries, then the next epoch) trades with the shared
    /// pool in batches: a few dozen locks per round instead of one per block.
    #[test]
    fn bursts_trade_with_the_shared_pool_in_batches() {
        std::thread::spawn(|| {
            let n = 4 * LOCAL_PER_CLASS[0];
            let round = || {
                let blocks: Vec<_> = (0..n).map(|_| take(40).unwrap()).collect();
                for (class, ptr) in blocks {
                    give(class & !FRESH, ptr);
                }
            };
            round(); // fills the caches (may meet an empty shared pool on every take)
            // Other tests share the pool and may drain it meanwhile, which only adds
            // trips: the fewest over a few tries is this thread's own count (a real
            // regression exceeds the bound on every try).
            let trips = (0..5)
                .map(|_| {
                    let before = TRIPS.with(Cell::get);
                    round();
                    round();
                    TRIPS.with(Cell::get) - before
                })
                .min()
                .expect("five tries");
            let (bytes, held) = LOCAL.with(|l| {
                let l = l.borrow();
                let held: usize = (0..LOCAL_CLASSES)
                    .map(|c| l.free[c].len() * class_size(c as u32))
                    .sum();
                (l.bytes, held)
            });
            // Per round: n / (half a class) refills and as many spills, plus slack.
            let batches = 2 * 2 * n / LOCAL_PER_CLASS[0].div_ceil(2);
            assert!(
                trips <= batches + 4,
                "{trips} shared-pool trips for 2 rounds"
            );
            assert_eq!(bytes, held, "the local byte count matches its blocks");
            assert!(
                held <= LOCAL_CLASS_BYTES,
                "the cache keeps at most a class's worth"
            );
        })
        .join()
        .unwrap();
    }

    /// A thread whose first call into the pool gives a block back publishes its cache's
    /// bytes at once (the counter is made then, out of line), so `cached_bytes` sees it.
    #[test]
    fn a_threads_first_give_is_published() {
        let (class, ptr) = take(40).unwrap();
        let (class, addr) = (class & !FRESH, ptr.as_ptr() as usize);
        std::thread::spawn(move || {
            give(
                class,
                NonNull::new(addr as *mut u8).expect("a pooled block"),
            );
            let (bytes, published) = LOCAL.with(|l| {
                let l = l.borrow();
                let published = l.published.as_ref().map(|c| c.load(Ordering::Relaxed));
                (l.bytes, published)
            });
            assert_eq!(bytes, class_size(class), "the one block given back");
            assert_eq!(published, Some(bytes), "published on the first give");
        })
        .join()
        .unwrap();
    }

    /// Threads spilling and refilling at once keep the shared pool's byte count equal
    /// to the blocks it lists (checked under its lock, so other tests may use the pool
    /// meanwhile), and an exiting thread's cache is handed over whole.
    #[test]
    fn concurrent_bursts_keep_the_shared_count_exact() {
        let workers: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    for round in 0..20 {
                        let n = LOCAL_PER_CLASS[0] + 97 * (t + round % 3);
                        let blocks: Vec<_> = (0..n).map(|_| take(50).unwrap()).collect();
                        for (class, ptr) in blocks {
                            give(class & !FRESH, ptr);
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let shared = shared();
        let listed: usize = (0..shared.free.len())
            .map(|c| shared.free[c].len() * class_size(c as u32))
            .sum();
        assert_eq!(shared.bytes, listed);
    }

    #[test]
    fn classes_cover_requests_within_a_quarter() {
        let mut last = 0;
        for bytes in (1..100_000).chain([1 << 20, (1 << 20) + 1, 3 << 30, 1 << 40]) {
            let c = class_of(bytes).unwrap();
            let size = class_size(c);
            assert!(size >= bytes, "{bytes} -> class {c} of {size}");
            assert!(
                bytes <= 64 || size <= bytes + bytes / 4 + 64,
                "{bytes} -> {size}"
            );
            if bytes < 100_000 {
                assert!(c >= last);
                last = c;
            }
            // The class is the smallest that fits.
            assert!(c == 0 || class_size(c - 1) < bytes);
        }
        assert!((class_of(isize::MAX as usize / 2).unwrap() as usize) < CLASSES);
        assert_eq!(class_of(usize::MAX), None);
    }
}
