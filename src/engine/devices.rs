//! Which device an op's operands live on: the checks the op path makes before it runs
//! a kernel (an op's CPU kernel sees only host operands; a device-aware op sees
//! operands all on one device), and the typed errors when they fail.

use super::exec::Operand;
use super::shard::Ctx;
use super::slab::ArrayId;
use crate::Device;
use crate::error::{NdError, Result};

/// The device array `id`'s data lives on.
pub(crate) fn device_of(id: ArrayId) -> Result<Device> {
    let ctx = Ctx::read_only(&[id.shard]);
    Ok(ctx.operand(id)?.device())
}

/// Check that op `name` may run its CPU kernel on `ops`: every operand is on the host.
/// Operands on different devices are a `DeviceMismatch` naming the first input and the
/// first one elsewhere; operands all on one other device are `Unsupported` there (this
/// op has no kernel for it). Nothing has been allocated when this fails.
#[inline]
pub(crate) fn on_host(name: &'static str, ops: &[Operand<'_>]) -> Result<()> {
    if ops.iter().all(|o| o.device() == Device::Cpu) {
        Ok(())
    } else {
        Err(device_error(name, ops))
    }
}

/// Check that `ops` live on one device (else `DeviceMismatch`); true when it is not
/// the CPU.
#[inline]
pub(crate) fn on_one_device(name: &'static str, ops: &[Operand<'_>]) -> Result<bool> {
    let device = ops[0].device();
    if ops.iter().any(|o| o.device() != device) {
        return Err(device_error(name, ops));
    }
    Ok(device != Device::Cpu)
}

#[cold]
#[inline(never)]
fn device_error(name: &'static str, ops: &[Operand<'_>]) -> NdError {
    let first = &ops[0];
    match ops.iter().find(|o| o.device() != first.device()) {
        Some(other) => NdError::DeviceMismatch {
            op: name,
            lhs: first.desc(),
            lhs_device: first.device(),
            rhs: other.desc(),
            rhs_device: other.device(),
        },
        None => NdError::Unsupported {
            op: name,
            device: first.device(),
        },
    }
}

/// Live arrays per GPU (`Device::Gpu(n)` for `n` below [`COUNTED_GPUS`]), counted as
/// arrays are registered and freed; the CPU's are the rest of the process's.
#[cfg(feature = "gpu")]
static GPU_ARRAYS: [std::sync::atomic::AtomicIsize; COUNTED_GPUS] =
    [const { std::sync::atomic::AtomicIsize::new(0) }; COUNTED_GPUS];

/// GPUs whose live arrays are counted one by one (a later one counts with the CPU's).
#[cfg(feature = "gpu")]
pub(crate) const COUNTED_GPUS: usize = 16;

/// Count an array registered (`+1`) or freed (`-1`) whose data lives on `device`.
#[cfg(feature = "gpu")]
#[inline]
pub(crate) fn count_array(device: Device, delta: isize) {
    if let Device::Gpu(n) = device
        && let Some(c) = GPU_ARRAYS.get(n)
    {
        c.fetch_add(delta, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Live arrays whose data lives on `Device::Gpu(n)` (`None`: on any GPU).
pub(crate) fn gpu_arrays(n: Option<usize>) -> usize {
    #[cfg(feature = "gpu")]
    {
        let live = |c: &std::sync::atomic::AtomicIsize| {
            c.load(std::sync::atomic::Ordering::Relaxed).max(0) as usize
        };
        match n {
            Some(n) => GPU_ARRAYS.get(n).map_or(0, live),
            None => GPU_ARRAYS.iter().map(live).sum(),
        }
    }
    #[cfg(not(feature = "gpu"))]
    {
        let _ = n;
        0
    }
}
