//! Loops compiled for the widest vector unit the CPU has, chosen at run time: the
//! portable build assumes only SSE2, where a loop of f64 sums runs two lanes at a time.

/// Run `f` compiled for AVX-512 when the CPU has it, else AVX2, else the portable
/// baseline. Pass a closure marked `#[inline(always)]` whose body calls only inlined
/// code (slices, iterators, `Native` arithmetic): what it calls out of line keeps the
/// baseline's instructions. No float result depends on the choice: Rust neither fuses
/// multiplies and adds nor reorders float arithmetic on its own.
#[inline(always)]
pub(crate) fn widest<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked just above).
            return unsafe { avx512(f) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { avx2(f) };
        }
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}
