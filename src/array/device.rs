//! Moving arrays between devices: `to_device` (a copy) and `move_to_device` (in
//! place). (The ops with a GPU kernel wrap its buffer with the engine's
//! `Output::device`.)
//!
//! A copy between devices is explicit, one per call, and owned like any op's result
//! (rule 1). Its gradient is the output gradient moved back to the input's device.

use super::NDArray;
use super::shape_ops;
use crate::Device;
use crate::autograd::{self, Backward, BackwardCtx, Grads};
use crate::engine::{self, Operand, Output};
#[cfg(not(feature = "gpu"))]
use crate::error::NdError;
use crate::error::{Result, SourceLocation};

/// A copy of `x` on `device` (checked to exist).
pub(crate) fn to_device(x: NDArray, device: Device, at: SourceLocation) -> Result<NDArray> {
    let from = x.try_device()?;
    if from == Device::Cpu && device == Device::Cpu {
        return shape_ops::to_cpu(x, at);
    }
    let id = engine::run_op_on("to_device", &[x.id], at, |o| copy(&o[0], device))?;
    autograd::record(&[x.id], id, || ToDeviceRule(from));
    Ok(NDArray { id })
}

/// Move `x`'s data, and its gradient's, to `device` in place (checked to exist).
pub(crate) fn move_to_device(x: NDArray, device: Device) -> Result<()> {
    const OP: &str = "move_to_device";
    if x.try_device()? == device {
        return Ok(());
    }
    autograd::check_inplace(OP, x.id)?;
    if let Some(g) = engine::move_data(OP, x.id, |o| copy(o, device))? {
        move_to_device(NDArray { id: g }, device)?;
    }
    Ok(())
}

/// `o`'s elements, contiguous, on `device`.
#[cfg(feature = "gpu")]
fn copy(o: &Operand<'_>, device: Device) -> Result<Output> {
    use crate::backend::{cpu, wgpu};
    let (shape, dtype) = (o.shape().clone(), o.dtype);
    // The elements as contiguous host bytes, from either side.
    let host = |o: &Operand<'_>| -> Result<Vec<u8>> {
        match o.gpu() {
            None => {
                let b = shape_ops::cast(o, dtype)?; // a fresh contiguous copy
                Ok(cpu::buffer::into_bytes(
                    b,
                    shape.size() * dtype.size_in_bytes(),
                ))
            }
            Some(g) => {
                let c = wgpu::kernels::convert("to_device", g, dtype)?;
                wgpu::download(&c, shape.size(), dtype)
            }
        }
    };
    match device {
        Device::Cpu => {
            let bytes = host(o)?;
            let buf = cpu::new_overwritten::<u8>(bytes.len(), |d| d.copy_from_slice(&bytes))?;
            Ok(Output::New { buf, shape, dtype })
        }
        Device::Gpu(n) => {
            let ctx = wgpu::ctx(n)?;
            ctx.check_dtype("to_device", dtype)?;
            let buf = match o.gpu() {
                Some(g) if o.device() == device => wgpu::kernels::convert("to_device", g, dtype)?,
                _ => wgpu::upload("to_device", ctx, &host(o)?, dtype)?,
            };
            Ok(Output::Stored {
                buf: buf.into(),
                shape,
                dtype,
            })
        }
    }
}

#[cfg(not(feature = "gpu"))]
fn copy(_: &Operand<'_>, device: Device) -> Result<Output> {
    Err(NdError::Unsupported {
        op: "to_device",
        device,
    })
}

/// `to_device`'s gradient: the output gradient, moved back to the input's device.
struct ToDeviceRule(Device);

impl Backward for ToDeviceRule {
    fn name(&self) -> &'static str {
        "to_device"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn backward(&self, _: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        Ok([Some(g.try_to_device(self.0)?)].into_iter().collect())
    }
}
