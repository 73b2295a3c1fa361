//! `softmax` and `log_softmax`: one fused, stable pass along an axis, and the
//! gradient rule that needs only the output.

use crate::array::NDArray;
use crate::array::reduce::normalize_axis;
use crate::autograd::{self, Backward, BackwardCtx, Grads};
use crate::backend::cpu::nn::softmax_kernel;
use crate::dtype::dispatch_float;
use crate::engine::{self, Output};
use crate::error::{Result, SourceLocation, twins};
use smallvec::smallvec;
use std::panic::Location;

fn softmax_impl(x: NDArray, axis: isize, log: bool, at: SourceLocation) -> Result<NDArray> {
    let name = if log { "log_softmax" } else { "softmax" };
    let id = engine::run_op_on(name, &[x.id], at, |o| {
        let a = &o[0];
        let axis = normalize_axis(name, a, axis)?;
        #[cfg(feature = "gpu")]
        if let Some(g) = a.gpu().filter(|_| a.dtype.is_float()) {
            let buf = crate::backend::wgpu::rows::softmax(name, g, axis, log)?;
            return Ok(Output::device(buf, a.shape().clone(), a.dtype));
        }
        let buf = dispatch_float!(a.dtype, T => softmax_kernel::<T>(a.into(), axis, log)?,
            else return Err(engine::unsupported(name, a)));
        Ok(Output::New {
            buf,
            shape: a.shape().clone(),
            dtype: a.dtype,
        })
    })?;
    autograd::record(&[x.id], id, || SoftmaxRule { axis, log });
    Ok(NDArray { id })
}

/// `softmax`/`log_softmax`'s gradient, from the output `y` alone:
/// softmax `y * (g - sum(g * y))`, log-softmax `g - exp(y) * sum(g)` (sums along `axis`).
struct SoftmaxRule {
    axis: isize,
    log: bool,
}

impl Backward for SoftmaxRule {
    fn name(&self) -> &'static str {
        if self.log { "log_softmax" } else { "softmax" }
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, true)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let (y, axes) = (cx.output, [self.axis]);
        Ok(smallvec![Some(if self.log {
            g.try_sub(y.try_exp()?.try_mul(g.try_sum_axes(&axes, true)?)?)?
        } else {
            y.try_mul(g.try_sub(g.try_mul(y)?.try_sum_axes(&axes, true)?)?)?
        })])
    }
}

impl NDArray {
    twins! {
        /// Softmax along `axis` (negative counts from the end): `exp(x - max) / sum(exp(x -
        /// max))`, stable for large inputs. Float dtypes only. Panics on failure.
        pub fn softmax,
        /// [`NDArray::softmax`]. Errors: `UnsupportedDType` (not a float), `AxisOutOfRange`,
        /// `Closed`.
        pub fn try_softmax(self, axis: isize) -> NDArray {
            softmax_impl(self, axis, false, Location::caller())
        }
    }

    twins! {
        /// Log-softmax along `axis`: `x - max - ln(sum(exp(x - max)))`, finite for large
        /// inputs. Float dtypes only. Panics on failure.
        pub fn log_softmax,
        /// [`NDArray::log_softmax`]. Errors: `UnsupportedDType` (not a float),
        /// `AxisOutOfRange`, `Closed`.
        pub fn try_log_softmax(self, axis: isize) -> NDArray {
            softmax_impl(self, axis, true, Location::caller())
        }
    }
}
