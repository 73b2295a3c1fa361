//! Devices: where a manager's arrays live.
//!
//! Every [`NDManager`](crate::NDManager) has a [`Device`], as DJL's managers do: the
//! system manager and [`NDManager::new`](crate::NDManager::new) are on the CPU,
//! [`NDManager::new_on`](crate::NDManager::new_on) picks one, and sub-managers inherit
//! their parent's. [`devices`](crate::devices) lists what this process can use: the CPU first, then
//! each GPU adapter that the `gpu` feature's wgpu backend finds, in a stable order, so
//! `Device::Gpu(n)` is the n-th GPU of that list.
//!
//! ```
//! use ndscope::{Device, NDManager, NdError, devices};
//! assert_eq!(devices()[0].device, Device::Cpu);
//! let m = NDManager::new_on(Device::Cpu);
//! assert_eq!(m.device(), Device::Cpu);
//! assert_eq!(m.new_sub_manager().device(), Device::Cpu);
//! // A GPU that is not there is a typed error, never a silent CPU fallback.
//! let gpus = devices().iter().filter(|d| d.device != Device::Cpu).count();
//! let e = NDManager::try_new_on(Device::Gpu(gpus)).unwrap_err();
//! assert!(matches!(e, NdError::NoDevice { .. }));
//! ```
//!
//! The ownership contract is the same on every device: a scope, a manager or a
//! `release()` frees device memory exactly as it frees host memory (see
//! docs/ownership.md, "Devices").
//!
//! This file holds the types only (the backends name devices in their errors); what
//! asks the backends which devices there are is in `adapters.rs`.

use std::fmt;

/// A compute device: the CPU, or the n-th GPU that [`devices`](crate::devices) lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory and the CPU kernels.
    #[default]
    Cpu,
    /// The n-th GPU of [`devices`](crate::devices) (counting GPUs only, from 0).
    Gpu(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Gpu(n) => write!(f, "gpu:{n}"),
        }
    }
}

/// One entry of [`devices`](crate::devices).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device.
    pub device: Device,
    /// The adapter's name as its driver reports it ("llvmpipe (LLVM 15.0.6, 256 bits)",
    /// "NVIDIA H200"); "cpu" for the CPU.
    pub name: String,
    /// The API that drives it: "cpu", or wgpu's backend ("vulkan", "metal", "dx12").
    pub backend: String,
    /// The dtypes its arrays may have: every dtype on the CPU; on a GPU F32, I32, U8
    /// and Bool, plus I64 where the adapter offers 64-bit integers in shaders
    /// (`SHADER_INT64`) and F64 where it offers 64-bit floats too (`SHADER_F64`).
    /// Making an array of another dtype there is an `UnsupportedDTypeOn` error.
    pub dtypes: Vec<crate::DType>,
}
