//! Diagnostics: verbose mode and memory accounting.

use crate::Device;
use crate::backend::cpu;
use crate::engine;
use std::fmt;

pub(crate) mod leaks;
pub(crate) mod profile;
pub use leaks::{
    LeakReport, LeakSite, LeakWarning, LeakWatch, assert_no_leaks, check_leaks, leak_report,
};
pub use profile::{OpRecord, Profile, profile};

/// Live memory counters of the process or of one manager's subtree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Live array handles (views included).
    pub live_arrays: usize,
    /// Live data buffers (an array and its views share one).
    pub live_buffers: usize,
    /// Bytes held by live buffers.
    pub live_bytes: usize,
    /// Highest `live_bytes` since the start or the last [`reset_peak`].
    pub peak_bytes: usize,
    /// Bytes held by the caching pool for reuse, not counted in `live_bytes`. The pool
    /// is process-wide and belongs to no manager: [`memory`] reports it, a manager's
    /// statistics report 0.
    pub cached_bytes: usize,
    /// Buffers allocated so far (monotonic; for a GPU in [`memory_on`], the buffers
    /// its pool handed out, cached or new).
    pub allocations: u64,
}

impl MemoryStats {
    pub(crate) fn from_stats(s: engine::Stats) -> Self {
        MemoryStats {
            live_arrays: s.arrays,
            live_buffers: s.buffers,
            live_bytes: s.bytes,
            peak_bytes: s.peak,
            cached_bytes: 0,
            allocations: s.allocations,
        }
    }
}

impl fmt::Display for MemoryStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} arrays, {} buffers, {} live (peak {}, cached {}), {} allocations",
            self.live_arrays,
            self.live_buffers,
            human_bytes(self.live_bytes),
            human_bytes(self.peak_bytes),
            human_bytes(self.cached_bytes),
            self.allocations
        )
    }
}

/// `1536` → `"1.5 KiB"`.
pub(crate) fn human_bytes(b: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Process-wide memory counters (the system manager's subtree: every array).
pub fn memory() -> MemoryStats {
    MemoryStats {
        cached_bytes: cpu::pool::cached_bytes(),
        ..MemoryStats::from_stats(engine::stats(engine::SYSTEM).expect("system manager is live"))
    }
}

/// The memory counters of one device: its live arrays, buffers and bytes, its peak,
/// and the bytes its caching pool holds. `memory()` totals every device's live arrays,
/// buffers and bytes; in a build without a GPU backend every array is on the CPU, so a
/// GPU (or a device not found) has zeros. (A 17th GPU and later ones count their
/// arrays with the CPU's; their bytes are their own.)
///
/// ```
/// use ndscope::{Device, memory, memory_on};
/// assert_eq!(memory_on(Device::Cpu).live_bytes, memory().live_bytes);
/// assert_eq!(memory_on(Device::Gpu(99)).live_arrays, 0);
/// ```
pub fn memory_on(device: Device) -> MemoryStats {
    #[cfg(feature = "gpu")]
    let gpu_totals = crate::backend::wgpu::totals;
    #[cfg(not(feature = "gpu"))]
    let gpu_totals = MemoryStats::default;
    match device {
        Device::Cpu => {
            let all = memory();
            let gpus = gpu_totals();
            MemoryStats {
                live_arrays: all.live_arrays - engine::gpu_arrays(None),
                live_buffers: all.live_buffers - gpus.live_buffers,
                live_bytes: all.live_bytes - gpus.live_bytes,
                ..all
            }
        }
        #[cfg(feature = "gpu")]
        Device::Gpu(n) => {
            let s = crate::backend::wgpu::stats(n);
            MemoryStats {
                live_arrays: engine::gpu_arrays(Some(n)),
                live_buffers: s.live_buffers,
                live_bytes: s.live_bytes,
                peak_bytes: s.peak_bytes,
                cached_bytes: s.cached_bytes,
                allocations: s.allocations,
            }
        }
        #[cfg(not(feature = "gpu"))]
        Device::Gpu(_) => MemoryStats::default(),
    }
}

/// What the driver of `device` reports as allocated, in bytes (for a GPU, wgpu's
/// allocator report), so a test can see device memory go back after a scope closes and
/// [`empty_cache`] runs. `None` where no driver reports (the CPU, or no such GPU).
pub fn driver_memory(device: Device) -> Option<usize> {
    match device {
        Device::Cpu => None,
        #[cfg(feature = "gpu")]
        Device::Gpu(n) => crate::backend::wgpu::driver_bytes(n),
        #[cfg(not(feature = "gpu"))]
        Device::Gpu(_) => None,
    }
}

/// Reset every peak to the current live bytes.
pub fn reset_peak() {
    engine::reset_peak();
    #[cfg(feature = "gpu")]
    crate::backend::wgpu::reset_peak();
}

/// Statistics of the caching allocator that recycles array buffers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Bytes held by the pool for reuse (the shared pool and every thread's cache).
    pub cached_bytes: usize,
    /// The cap on the shared pool's bytes ([`set_cache_limit`]).
    pub cache_limit: usize,
    /// Blocks obtained from the system allocator so far (pool misses; monotonic).
    pub system_allocations: u64,
    /// Blocks returned to the system allocator so far (monotonic).
    pub system_frees: u64,
}

/// The caching allocator's statistics. In a steady loop `system_allocations` stops
/// growing: every buffer comes from the pool.
///
/// ```
/// let m = ndscope::NDManager::new();
/// let a = m.zeros([1000], ndscope::DType::F32);
/// for _ in 0..3 {
///     let _s = ndscope::NDScope::new();
///     let _ = a + 1.0;
/// }
/// let before = ndscope::cache_stats().system_allocations;
/// for _ in 0..100 {
///     let _s = ndscope::NDScope::new();
///     let _ = a + 1.0;
/// }
/// assert_eq!(ndscope::cache_stats().system_allocations, before);
/// # m.close();
/// ```
pub fn cache_stats() -> CacheStats {
    let (system_allocations, system_frees) = cpu::pool::system_counts();
    CacheStats {
        cached_bytes: cpu::pool::cached_bytes(),
        cache_limit: cpu::pool::limit(),
        system_allocations,
        system_frees,
    }
}

/// Return the cached blocks of every device's pool to its driver: for the CPU, the
/// shared pool's and the calling thread's blocks go back to the system allocator
/// (like `torch.cuda.empty_cache()`). Live arrays are not affected. Other threads keep
/// their small per-thread caches (under 1 MiB each) until they exit.
pub fn empty_cache() {
    cpu::pool::empty();
    #[cfg(feature = "gpu")]
    crate::backend::wgpu::empty_cache();
}

/// Cap the bytes the shared pool keeps for reuse (default 1 GiB); blocks freed beyond
/// the cap go back to the system, and the pool is trimmed now if it is over. `0` turns
/// caching off entirely. Each thread may keep under 1 MiB of small blocks besides.
pub fn set_cache_limit(bytes: usize) {
    cpu::pool::set_limit(bytes);
}
