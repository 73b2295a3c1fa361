//! [`CountingAllocator`]: a global allocator wrapper that counts the calling thread's
//! heap allocations, to check that a steady loop allocates nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static COUNT: Cell<u64> = const { Cell::new(0) };
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

    fn bump() {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees hold; the counter is a const-initialised thread-local `Cell`
// that never allocates (and is skipped while the thread's locals are torn down).
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::bump();
        // SAFETY: forwarded unchanged (see the impl's comment).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::bump();
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::bump();
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
