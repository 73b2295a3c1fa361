//! The devices this process can use: listing them ([`devices`]), checking one exists
//! and waiting for one ([`synchronize`]). The backends are asked; [`Device`] itself is
//! in `device.rs`, below them.

use crate::device::{Device, DeviceInfo};

/// The devices this process can use: the CPU first, then every GPU adapter found (only
/// with the `gpu` feature; without a driver the list holds the CPU alone).
pub fn devices() -> Vec<DeviceInfo> {
    let mut v = vec![DeviceInfo {
        device: Device::Cpu,
        name: "cpu".into(),
        backend: "cpu".into(),
    }];
    v.extend(
        gpu_adapters()
            .into_iter()
            .enumerate()
            .map(|(n, (name, backend))| DeviceInfo {
                device: Device::Gpu(n),
                name,
                backend,
            }),
    );
    v
}

/// The GPU adapters (name, backend) in [`devices`]' order: none until a GPU backend
/// is built in.
fn gpu_adapters() -> Vec<(String, String)> {
    #[cfg(feature = "gpu")]
    {
        crate::backend::wgpu::adapters()
            .iter()
            .map(|a| (a.name.clone(), a.backend.to_string()))
            .collect()
    }
    #[cfg(not(feature = "gpu"))]
    Vec::new()
}

/// How many GPUs [`devices`] lists.
pub(crate) fn gpu_count() -> usize {
    gpu_adapters().len()
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
