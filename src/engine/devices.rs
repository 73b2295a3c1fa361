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

/// Move array `id`'s data, in place, to what `f` makes of it (a contiguous copy, on
/// another device): the record keeps its id, manager, scopes, counts and gradient
/// link, so every handle to it (a model's, an optimizer's) sees the new data; the
/// manager's byte counts and the per-device array counts follow the new buffer, and
/// the old one goes back to its pool. Returns the array's gradient, which the caller
/// moves next.
///
/// The array must be its data's only viewer: it owns its buffer, or it is the one
/// holder left of a buffer record (the views an op took of it are gone) that no
/// other shard or outside read shares. Otherwise it is refused (`InvalidArgument`,
/// before anything is copied), since the views would be left behind.
pub(crate) fn move_data(
    name: &'static str,
    id: ArrayId,
    f: impl FnOnce(&Operand<'_>) -> Result<super::exec::Output>,
) -> Result<Option<ArrayId>> {
    use super::exec::Output;
    use super::records::Store;
    let mut ctx = Ctx::one(id.shard);
    let shared = match ctx.array(id)?.store {
        Store::Own(_) => None,
        Store::Shared(b) => {
            let m = ctx.buffer(b);
            let alone = m.home.is_none()
                && m.proxies.is_empty()
                && m.holders.len() == 1
                && m.carries
                && std::sync::Arc::strong_count(&m.buf) == 1;
            if !alone {
                let o = ctx.operand(id)?;
                return Err(NdError::invalid(
                    name,
                    format!(
                        "{} shares its data with a view, which would be left on {}; move \
                         the array before taking views of it, or close the views",
                        o.desc(),
                        o.device()
                    ),
                ));
            }
            Some(b)
        }
    };
    let out = f(&ctx.operand(id)?)?;
    let (store, shape): (super::Storage, _) = match out {
        Output::New { buf, shape, .. } => (buf.into(), shape),
        #[cfg(feature = "gpu")]
        Output::Stored { buf, shape, .. } => (buf, shape),
        Output::View { .. } => unreachable!("a move makes a copy"),
    };
    let new_bytes = store.bytes() as isize;
    #[cfg(feature = "gpu")]
    count_array(store.device(), 1);
    let r = ctx.array_mut(id);
    let old = std::mem::replace(&mut r.store, Store::Own(store));
    r.layout = crate::layout::Layout::contiguous(shape);
    let (manager, grad) = (r.manager, r.grad);
    // The old data: its own buffer, or the buffer record it was the one holder of
    // (charged to it, as an own buffer is).
    let old: std::sync::Arc<super::Storage> = match (old, shared) {
        (Store::Own(buf), _) => std::sync::Arc::new(buf),
        (Store::Shared(_), Some(b)) => {
            let sh = ctx.sh(id.shard);
            sh.buffers.remove(b).expect("checked above").buf
        }
        (Store::Shared(_), None) => unreachable!("checked above"),
    };
    #[cfg(feature = "gpu")]
    count_array(old.device(), -1);
    ctx.sh(id.shard)
        .adjust(manager, 0, 0, new_bytes - old.bytes() as isize, 0);
    drop(ctx);
    drop(old);
    Ok(grad)
}
