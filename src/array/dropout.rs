//! `dropout`: zero each element with probability `p` and scale the survivors by
//! `1 / (1 - p)` (inverted dropout, as PyTorch), with the mask drawn from the
//! process-wide generator of [`crate::random`] (so `random::seed` makes it
//! reproducible) and kept for the backward pass.

use super::NDArray;
use crate::autograd::{self, Backward, BackwardCtx, Grads};
use crate::backend::cpu::new_overwritten;
use crate::dtype::{Native, dispatch_float};
use crate::engine::{self, ArrayId, Layout, Output};
use crate::error::{NdError, Result, SourceLocation, twins};
use crate::layout::for_each_row;
use crate::scope::NDScope;
use smallvec::{SmallVec, smallvec};
use std::panic::Location;

/// `out = mask ? x * scale : 0` into a contiguous `out` of `l`'s shape; `mask` is
/// contiguous (row-major) with the same shape.
pub(crate) fn dropout_kernel<T: Native>(
    src: &[T],
    l: &Layout,
    mask: &[u8],
    scale: T,
    out: &mut [T],
) {
    if out.is_empty() {
        return;
    }
    let mut w = 0;
    for_each_row(l.shape.dims(), [&l.strides], [l.offset], |off, len, s| {
        for i in 0..len as isize {
            out[w] = if mask[w] != 0 {
                src[(off[0] + i * s[0]) as usize].mul(scale)
            } else {
                T::ZERO
            };
            w += 1;
        }
    });
}

fn dropout_impl(x: NDArray, p: f64, training: bool, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "dropout";
    let dtype = x.try_dtype()?;
    if !dtype.is_float() {
        return Err(NdError::UnsupportedDType {
            op: OP,
            dtype,
            array: engine::desc(x.id)?,
        });
    }
    if !(0.0..=1.0).contains(&p) {
        return Err(NdError::invalid(
            OP,
            format!("probability {p} is not in [0, 1]"),
        ));
    }
    if !training || p == 0.0 {
        return Ok(x);
    }
    let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
    // The mask lives in a scope of its own: the tape holds it when the op is recorded
    // (its backward reads it); otherwise, and on error, it is freed right here.
    let scope = NDScope::new();
    let result = (|| {
        // Drawn on the host whatever the device, so a seed gives the same mask on
        // every device; made on x's device (its manager's may differ).
        let mask = x
            .try_manager()?
            .bernoulli_at(OP, 1.0 - p, x.try_shape()?, at)?;
        mask.try_move_to_device(x.try_device()?)?;
        let id = engine::run_op_on(OP, &[x.id, mask.id], at, |o| {
            let (a, m) = (&o[0], &o[1]);
            #[cfg(feature = "gpu")]
            if let (Some(ga), Some(gm)) = (a.gpu(), m.gpu()) {
                let zero = if a.dtype == crate::DType::F32 {
                    "0.0"
                } else {
                    "f64(0)"
                };
                let buf = crate::backend::wgpu::math::masked(OP, ga, gm, (zero, "x * s"), scale)?;
                return Ok(Output::device(buf, a.shape().clone(), a.dtype));
            }
            let bits = m.data::<u8>();
            let bits = &bits[m.layout.offset..m.layout.offset + m.layout.size()];
            let buf = dispatch_float!(a.dtype, T => new_overwritten::<T>(a.layout.size(), |out| {
                dropout_kernel(a.data::<T>(), a.layout, bits, T::from_f64(scale), out)
            })?, else return Err(engine::unsupported(OP, a)));
            Ok(Output::New {
                buf,
                shape: a.shape().clone(),
                dtype: a.dtype,
            })
        })?;
        autograd::record(&[x.id], id, || DropoutRule {
            mask: mask.id,
            scale,
        });
        scope.try_escape(NDArray { id })
    })();
    drop(scope);
    result
}

/// `dropout`'s gradient: `g * scale` where the mask kept the element, else 0.
struct DropoutRule {
    mask: ArrayId,
    scale: f64,
}

impl Backward for DropoutRule {
    fn name(&self) -> &'static str {
        "dropout"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn extra(&self) -> SmallVec<[ArrayId; 2]> {
        smallvec![self.mask]
    }
    fn backward(&self, _: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let zero = crate::array::grad::zero_like(g)?;
        let mask = NDArray { id: self.mask };
        Ok(smallvec![Some(
            mask.try_where_(g.try_mul(self.scale)?, zero)?
        )])
    }
}

impl NDArray {
    twins! {
        /// Dropout (inverted, as PyTorch's `dropout`): with `training`, each element is
        /// zeroed with probability `p` and the others are multiplied by `1 / (1 - p)`, so
        /// the expected value is unchanged; `p == 1` gives zeros. The mask comes from the
        /// generator [`random::seed`](crate::random::seed) seeds and is kept (by the
        /// gradient tape, only while recording) for the backward pass, whose gradient is `g
        /// * mask / (1 - p)`.
        ///
        /// With `training == false` or `p == 0` the result is `self` itself, the same
        /// handle (as PyTorch returns its input): no array is created, so closing the
        /// result closes `self`. Float arrays only. Panics on error.
        ///
        /// ```
        /// use ndscope::{DType, NDManager, random};
        /// let m = NDManager::new();
        /// let x = m.ones([1000], DType::F32);
        /// random::seed(1);
        /// let y = x.dropout(0.5, true);
        /// let v = y.to_vec::<f32>()?;
        /// assert!(v.iter().all(|&e| e == 0.0 || e == 2.0));     // dropped or scaled by 2
        /// assert_eq!(x.dropout(0.5, false), x);                   // evaluation: x itself
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn dropout,
        /// [`NDArray::dropout`]. Errors: `InvalidArgument` (`p` outside `[0, 1]` or NaN,
        /// also in evaluation mode), `UnsupportedDType` (not a float array), `Closed`,
        /// `ManagerClosed`/`ManagerCapped`.
        pub fn try_dropout(self, p: f64, training: bool) -> NDArray {
            dropout_impl(self, p, training, Location::caller())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Shape;

    #[test]
    fn kernel_scales_kept_elements_of_strided_input() {
        let src = [1.0f64, 2.0, 3.0, 4.0];
        // The transpose of [[1, 2], [3, 4]]: [1, 3, 2, 4].
        let l = Layout {
            shape: Shape::from([2, 2]),
            strides: smallvec::smallvec![1, 2],
            offset: 0,
        };
        let mut out = [9.0; 4];
        dropout_kernel(&src, &l, &[1, 0, 0, 1], 2.0, &mut out);
        assert_eq!(out, [2.0, 0.0, 0.0, 8.0]);
    }
}
