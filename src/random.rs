//! The random number generator behind `random_*` creation functions.
//!
//! One process-wide generator (xoshiro256++ via `rand::rngs::SmallRng`). Call
//! [`seed`] to make a run reproducible; without it the generator is seeded from the
//! clock and process id.
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
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

static RNG: Mutex<Option<SmallRng>> = Mutex::new(None);

/// Reseed the process-wide generator.
pub fn seed(seed: u64) {
    *RNG.lock() = Some(SmallRng::seed_from_u64(seed));
}

fn with_rng<R>(f: impl FnOnce(&mut SmallRng) -> R) -> R {
    let mut g = RNG.lock();
    let rng = g.get_or_insert_with(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        SmallRng::seed_from_u64(t ^ ((std::process::id() as u64) << 32))
    });
    f(rng)
}

/// Room for `n` samples, or `OutOfMemory` (never an allocation abort).
fn samples<T>(n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| NdError::OutOfMemory {
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    })?;
    Ok(v)
}

pub(crate) fn normal(loc: f64, scale: f64, n: usize) -> Result<Vec<f64>> {
    if !(loc.is_finite() && scale.is_finite() && scale >= 0.0) {
        return Err(NdError::invalid(
            "random_normal",
            format!("need a finite loc and a finite scale >= 0, got loc {loc}, scale {scale}"),
        ));
    }
    let dist = Normal::new(loc, scale)
        .map_err(|e| NdError::invalid("random_normal", format!("loc {loc}, scale {scale}: {e}")))?;
    let mut v = samples(n)?;
    with_rng(|r| v.extend((0..n).map(|_| dist.sample(r))));
    Ok(v)
}

pub(crate) fn uniform(low: f64, high: f64, n: usize) -> Result<Vec<f64>> {
    if !(low.is_finite() && high.is_finite() && low <= high) {
        return Err(NdError::invalid(
            "random_uniform",
            format!("need finite low <= high, got [{low}, {high})"),
        ));
    }
    let mut v = samples(n)?;
    with_rng(|r| v.extend((0..n).map(|_| low + (high - low) * r.random::<f64>())));
    Ok(v)
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
