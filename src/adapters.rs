//! The devices this process can use: listing them ([`devices`]), checking one exists
//! and waiting for one ([`synchronize`]). The backends are asked; [`Device`] itself is
//! in `device.rs`, below them.

use crate::DType;
use crate::device::{Device, DeviceInfo};

/// The devices this process can use: the CPU first, then every GPU adapter found (only
/// with the `gpu` feature; without a driver the list holds the CPU alone).
pub fn devices() -> Vec<DeviceInfo> {
    let cpu = DeviceInfo {
        device: Device::Cpu,
        name: "cpu".into(),
        backend: "cpu".into(),
        dtypes: vec![
            DType::F32,
            DType::F64,
            DType::I32,
            DType::I64,
            DType::U8,
            DType::Bool,
        ],
    };
    #[cfg(feature = "gpu")]
    let gpus = crate::backend::wgpu::adapters()
        .iter()
        .enumerate()
        .map(|(n, a)| DeviceInfo {
            device: Device::Gpu(n),
            name: a.name.clone(),
            backend: a.backend.to_string(),
            dtypes: a.dtypes(),
        });
    #[cfg(not(feature = "gpu"))]
    let gpus = std::iter::empty();
    std::iter::once(cpu).chain(gpus).collect()
}

/// How many GPUs [`devices`] lists.
pub(crate) fn gpu_count() -> usize {
    #[cfg(feature = "gpu")]
    return crate::backend::wgpu::adapters().len();
    #[cfg(not(feature = "gpu"))]
    0
}

/// `Ok` if `device` exists here, else `NoDevice`.
pub(crate) fn check(device: Device) -> crate::Result<()> {
    match device {
        Device::Cpu => Ok(()),
        Device::Gpu(n) => {
            let found = gpu_count();
            if n < found {
                Ok(())
            } else {
                Err(crate::NdError::NoDevice {
                    device,
                    gpus: found,
                })
            }
        }
    }
}

/// Wait until the work queued on `device` is done, as `torch.cuda.synchronize`: ops on
/// a GPU are queued and return at once, so a benchmark synchronizes before it reads
/// the clock. Reads (`to_vec`, `Display`, io) wait by themselves. A no-op on the CPU,
/// whose ops finish before they return. Errors: `NoDevice`.
///
/// ```
/// use ndscope::{Device, synchronize};
/// synchronize(Device::Cpu)?;
/// # Ok::<(), ndscope::NdError>(())
/// ```
pub fn synchronize(device: Device) -> crate::Result<()> {
    check(device)?;
    match device {
        Device::Cpu => Ok(()),
        #[cfg(feature = "gpu")]
        Device::Gpu(n) => crate::backend::wgpu::synchronize(n),
        #[cfg(not(feature = "gpu"))]
        Device::Gpu(_) => Ok(()),
    }
}
