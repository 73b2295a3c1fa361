//! [`CountingAllocator`]: a global allocator wrapper that counts the calling thread's
//! heap allocations, to check that a steady loop allocates nothing, and keeps the
//! largest single allocation, to check that reading a forged file reserves little.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static COUNT: Cell<u64> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

/// Wraps the system allocator and counts allocations per thread. Install it in a
/// test or benchmark binary, then compare [`CountingAllocator::thread_allocations`]
/// before and after a loop:
///
/// ```
/// #[global_allocator]
/// static ALLOC: ndscope::CountingAllocator = ndscope::CountingAllocator;
///
/// let before = ndscope::CountingAllocator::thread_allocations();
/// let v = vec![1u8; 10];
/// assert!(ndscope::CountingAllocator::thread_allocations() > before);
/// # drop(v);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct CountingAllocator;

impl CountingAllocator {
    /// Heap allocations (alloc, alloc_zeroed and realloc calls) made by the calling
    /// thread so far through this allocator (0 where it is not the global allocator).
    pub fn thread_allocations() -> u64 {
        COUNT.try_with(|c| c.get()).unwrap_or(0)
    }

    /// The size in bytes of the largest single allocation (alloc, alloc_zeroed, or
    /// the new size of a realloc) the calling thread has made through this allocator
    /// since it started or since its last [`CountingAllocator::reset_thread_largest`]
    /// (0 where it is not the global allocator). A test resets it, runs a call and
    /// checks that the call never asked for much at once:
    ///
    /// ```
    /// #[global_allocator]
    /// static ALLOC: ndscope::CountingAllocator = ndscope::CountingAllocator;
    ///
    /// ndscope::CountingAllocator::reset_thread_largest();
    /// let v = vec![0u8; 1000];
    /// let w = vec![0u8; 10];
    /// assert_eq!(ndscope::CountingAllocator::thread_largest(), 1000);
    /// # drop((v, w));
    /// ```
    pub fn thread_largest() -> usize {
        LARGEST.try_with(|c| c.get()).unwrap_or(0)
    }

    /// Set the calling thread's [`CountingAllocator::thread_largest`] back to 0.
    pub fn reset_thread_largest() {
        let _ = LARGEST.try_with(|c| c.set(0));
    }

    fn bump(size: usize) {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        let _ = LARGEST.try_with(|c| c.set(c.get().max(size)));
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees hold; the counters are const-initialised thread-local `Cell`s
// that never allocate (and is skipped while the thread's locals are torn down).
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::bump(layout.size());
        // SAFETY: forwarded unchanged (see the impl's comment).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::bump(layout.size());
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::bump(new_size);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
