//! The random number generator behind `random_*` creation functions
//! (`random_normal`, `random_uniform`, `random_integer`, `random_permutation`,
//! `random_bernoulli`) and [`NDArray::dropout`](crate::NDArray::dropout)'s masks.
//!
//! One generator per thread (xoshiro256++ via `rand::rngs::SmallRng`), so threads
//! that draw (a dropout mask per step) never contend, and a thread's draws depend only
//! on its own seed. Call [`seed`] on a thread to make its draws reproducible; a thread
//! that never calls it is seeded from the clock, the process id and a per-thread
//! counter. (PyTorch's `manual_seed` is process-wide; per-thread is what lets two
//! threads train reproducibly at once.)
//!
//! On a GPU, `random_uniform` and `random_normal` (F32) draw on the device: a
//! counter-based generator (Philox4x32-10, as cuRAND's and PyTorch's) keyed by one
//! 64-bit draw of the thread's generator, so [`seed`] makes them reproducible too. The
//! device's values are not the CPU's for the same seed (another generator).
//!
//! ```
//! use ndscope::{DType, NDManager, random};
//! let m = NDManager::new();
//! random::seed(7);
//! let a = m.random_normal(0.0, 1.0, [3], DType::F64).to_vec::<f64>()?;
//! random::seed(7);
//! let b = m.random_normal(0.0, 1.0, [3], DType::F64).to_vec::<f64>()?;
//! assert_eq!(a, b);
//! # Ok::<(), ndscope::NdError>(())
//! ```

use crate::error::{NdError, Result};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

thread_local! {
    static RNG: RefCell<Option<SmallRng>> = const { RefCell::new(None) };
}

/// Threads seeded from the clock so far (so two threads starting at once differ).
static UNSEEDED: AtomicU64 = AtomicU64::new(0);

/// Reseed the calling thread's generator.
pub fn seed(seed: u64) {
    RNG.with(|r| *r.borrow_mut() = Some(SmallRng::seed_from_u64(seed)));
}

fn with_rng<R>(f: impl FnOnce(&mut SmallRng) -> R) -> R {
    RNG.with(|g| {
        let mut g = g.borrow_mut();
        let rng = g.get_or_insert_with(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            let n = UNSEEDED.fetch_add(1, Ordering::Relaxed);
            SmallRng::seed_from_u64(
                t ^ ((std::process::id() as u64) << 32) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            )
        });
        f(rng)
    })
}

/// Room for `n` samples, or `OutOfMemory` (never an allocation abort).
fn samples<T>(n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| NdError::OutOfMemory {
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
        device: crate::Device::Cpu,
    })?;
    Ok(v)
}

/// A key for a device's counter-based generator, drawn from the calling thread's
/// generator (so [`seed`] makes device draws reproducible too).
#[cfg(feature = "gpu")]
pub(crate) fn key() -> u64 {
    with_rng(|r| r.random::<u64>())
}

/// `random_normal`'s parameters, or `InvalidArgument`.
pub(crate) fn check_normal(loc: f64, scale: f64) -> Result<()> {
    if !(loc.is_finite() && scale.is_finite() && scale >= 0.0) {
        return Err(NdError::invalid(
            "random_normal",
            format!("need a finite loc and a finite scale >= 0, got loc {loc}, scale {scale}"),
        ));
    }
    Ok(())
}

/// `random_uniform`'s parameters, or `InvalidArgument`.
pub(crate) fn check_uniform(low: f64, high: f64) -> Result<()> {
    if !(low.is_finite() && high.is_finite() && low <= high) {
        return Err(NdError::invalid(
            "random_uniform",
            format!("need finite low <= high, got [{low}, {high})"),
        ));
    }
    Ok(())
}

pub(crate) fn normal(loc: f64, scale: f64, n: usize) -> Result<Vec<f64>> {
    draw_normal(loc, scale, |next| collect(n, next))?
}

pub(crate) fn uniform(low: f64, high: f64, n: usize) -> Result<Vec<f64>> {
    draw_uniform(low, high, |next| collect(n, next))?
}

/// The next `n` draws of `next`, in order.
fn collect(n: usize, next: &mut dyn FnMut() -> f64) -> Result<Vec<f64>> {
    let mut v = samples(n)?;
    v.extend((0..n).map(|_| next()));
    Ok(v)
}

/// `fill(next)` with `next` drawing the thread's next sample of N(`loc`, `scale`), after
/// checking the parameters: lets a caller write the samples straight into an array's
/// buffer, with no vector of f64 twice its size on the way (the draws and their order
/// are those of [`normal`]).
pub(crate) fn draw_normal<R>(
    loc: f64,
    scale: f64,
    fill: impl FnOnce(&mut dyn FnMut() -> f64) -> R,
) -> Result<R> {
    check_normal(loc, scale)?;
    let dist = Normal::new(loc, scale)
        .map_err(|e| NdError::invalid("random_normal", format!("loc {loc}, scale {scale}: {e}")))?;
    Ok(with_rng(|r| fill(&mut || dist.sample(r))))
}

/// [`draw_normal`] for U[`low`, `high`) (the draws of [`uniform`]).
pub(crate) fn draw_uniform<R>(
    low: f64,
    high: f64,
    fill: impl FnOnce(&mut dyn FnMut() -> f64) -> R,
) -> Result<R> {
    check_uniform(low, high)?;
    Ok(with_rng(|r| {
        fill(&mut || low + (high - low) * r.random::<f64>())
    }))
}

pub(crate) fn integers(low: i64, high: i64, n: usize) -> Result<Vec<i64>> {
    if low >= high {
        return Err(NdError::invalid(
            "random_integer",
            format!("need low < high, got [{low}, {high})"),
        ));
    }
    let mut v = samples(n)?;
    with_rng(|r| v.extend((0..n).map(|_| r.random_range(low..high))));
    Ok(v)
}

/// `0..n` in a uniformly random order (Fisher-Yates).
pub(crate) fn permutation(n: usize) -> Result<Vec<i64>> {
    let mut v: Vec<i64> = samples(n)?;
    v.extend(0..n as i64);
    with_rng(|r| {
        for i in (1..n).rev() {
            let j = r.random_range(0..=i);
            v.swap(i, j);
        }
    });
    Ok(v)
}

/// `n` Bernoulli(`p`) draws as bytes (1 with probability `p`); `op` names the caller in
/// the error for a `p` outside `[0, 1]`.
pub(crate) fn bernoulli(op: &'static str, p: f64, n: usize) -> Result<Vec<u8>> {
    if !(0.0..=1.0).contains(&p) {
        return Err(NdError::invalid(
            op,
            format!("probability {p} is not in [0, 1]"),
        ));
    }
    let mut v = samples(n)?;
    // `random::<f64>()` is in [0, 1): p = 0 never fires, p = 1 always does.
    with_rng(|r| v.extend((0..n).map(|_| (r.random::<f64>() < p) as u8)));
    Ok(v)
}
