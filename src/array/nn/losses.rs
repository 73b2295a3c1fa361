//! The losses: `cross_entropy` (a fused log-softmax and negative log-likelihood),
//! `mse_loss` and `binary_cross_entropy_with_logits`, with their gradient rules.

use super::{Saved, float_operands, int_ids};
use crate::array::NDArray;
use crate::autograd::{self, Backward, BackwardCtx, Grads};
use crate::backend::cpu;
use crate::backend::cpu::new_overwritten;
use crate::backend::cpu::nn::{buffer_of, cross_entropy_grad_kernel, mean_of, softmax_nll};
use crate::dtype::{Native, dispatch_float};
use crate::engine::{self, ArrayId, Output};
use crate::error::{NdError, Result, SourceLocation, twins};
use crate::shape::{Dims, Shape};
use smallvec::{SmallVec, smallvec};
use std::panic::Location;

fn cross_entropy_impl(logits: NDArray, labels: NDArray, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "cross_entropy";
    let mut saved = None;
    #[cfg(feature = "gpu")]
    let mut saved_gpu = None;
    let id = engine::run_op_on(OP, &[logits.id, labels.id], at, |o| {
        let (x, y) = (&o[0], &o[1]);
        float_operands(OP, x, &[])?;
        let xd = x.shape().dims();
        if xd.len() != 2 {
            return Err(NdError::invalid(
                OP,
                format!("the logits must be 2-D [N, C], got shape {}", x.shape()),
            ));
        }
        let (n, c) = (xd[0], xd[1]);
        if y.shape().dims() != [n] {
            return Err(NdError::invalid(
                OP,
                format!(
                    "the labels must have shape [{n}] (one per row of logits shape {}), got \
                     shape {}",
                    x.shape(),
                    y.shape()
                ),
            ));
        }
        #[cfg(feature = "gpu")]
        if let (Some(gx), Some(gy)) = (x.gpu(), y.gpu()) {
            if y.dtype.is_float() || y.dtype == crate::DType::Bool {
                return Err(engine::unsupported(OP, y));
            }
            let (loss, soft) = crate::backend::wgpu::rows::cross_entropy(OP, gx, gy, (n, c))?;
            saved_gpu = Some((soft, Shape::from([n, c]), x.dtype));
            return Ok(Output::device(loss, Shape(Dims::new()), x.dtype));
        }
        let labels = int_ids(OP, y, c, "label")?;
        let (buf, soft) = dispatch_float!(x.dtype, T => {
            let mut total = 0.0f64;
            let soft = new_overwritten::<T>(n * c, |p| {
                total = softmax_nll::<T>(x.into(), &labels, p);
            })?;
            let loss = total / n as f64;
            (buffer_of::<T>(&[loss])?, soft)
        }, else unreachable!("checked above"));
        saved = Some((soft, Shape::from([n, c]), x.dtype));
        Ok(Output::New {
            buf,
            shape: Shape(Dims::new()),
            dtype: x.dtype,
        })
    })?;
    if let Some((soft, shape, dtype)) = saved {
        autograd::record(&[logits.id, labels.id], id, || CrossEntropyRule {
            softmax: Saved::new(id, soft, shape, dtype),
        });
    }
    #[cfg(feature = "gpu")]
    if let Some((soft, shape, dtype)) = saved_gpu {
        autograd::record(&[logits.id, labels.id], id, || CrossEntropyRule {
            softmax: Saved::on_device(id, soft, shape, dtype),
        });
    }
    Ok(NDArray { id })
}

/// `cross_entropy`'s gradient: `g * (softmax - one_hot(labels)) / N` for the logits.
struct CrossEntropyRule {
    softmax: Saved,
}

impl Backward for CrossEntropyRule {
    fn name(&self) -> &'static str {
        "cross_entropy"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0b10, false)
    }
    fn extra(&self) -> SmallVec<[ArrayId; 2]> {
        self.softmax.ids()
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        if !cx.need(0) {
            return Ok(smallvec![None, None]);
        }
        const OP: &str = "cross_entropy_grad";
        let p = self.softmax.get(OP)?;
        let id = engine::run_op_on(OP, &[p.id, g.id, cx.input(1).id], Location::caller(), |o| {
            let (pd, gd) = (o[0].shape().dims(), &o[1]);
            let (n, c) = (pd[0], pd[1]);
            #[cfg(feature = "gpu")]
            if let (Some(gp), Some(gg), Some(gl)) = (o[0].gpu(), gd.gpu(), o[2].gpu()) {
                use crate::backend::wgpu::rows::cross_entropy_grad;
                let buf = cross_entropy_grad(OP, gp, gl, gg, (n, c))?;
                return Ok(Output::device(buf, Shape::from([n, c]), o[0].dtype));
            }
            let labels = int_ids(OP, &o[2], c, "label")?;
            let buf = dispatch_float!(o[0].dtype, T => {
                let scale = cpu::to_vec::<T>(gd)[0].to_f64() / n as f64;
                let scale = T::from_f64(scale);
                let src = cpu::to_vec::<T>(&o[0]);
                new_overwritten::<T>(n * c, |out| {
                    cross_entropy_grad_kernel(&src, &labels, c, scale, out)
                })?
            }, else return Err(engine::unsupported(OP, &o[0])));
            Ok(Output::New {
                buf,
                shape: Shape::from([n, c]),
                dtype: o[0].dtype,
            })
        })?;
        Ok(smallvec![Some(NDArray { id }), None])
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loss {
    Mse,
    Bce,
}

impl Loss {
    fn name(self) -> &'static str {
        match self {
            Loss::Mse => "mse_loss",
            Loss::Bce => "binary_cross_entropy_with_logits",
        }
    }
}

fn loss_impl(x: NDArray, target: NDArray, kind: Loss, at: SourceLocation) -> Result<NDArray> {
    let op = kind.name();
    let id = engine::run_op_on(op, &[x.id, target.id], at, |o| {
        let (a, t) = (&o[0], &o[1]);
        float_operands(op, a, &[t])?;
        if a.shape() != t.shape() {
            return Err(NdError::ShapeMismatch {
                op,
                lhs: a.desc(),
                rhs: t.desc(),
            });
        }
        #[cfg(feature = "gpu")]
        if let (Some(ga), Some(gt)) = (a.gpu(), t.gpu()) {
            let bce = kind == Loss::Bce;
            let buf = crate::backend::wgpu::math::mean_loss(op, bce, ga, gt)?;
            return Ok(Output::device(buf, Shape(Dims::new()), a.dtype));
        }
        let loss = dispatch_float!(a.dtype, T => match kind {
            Loss::Mse => mean_of::<T>(a.into(), t.into(), |x, t| (x - t) * (x - t)),
            // Stable for any x: never exponentiates a positive number.
            Loss::Bce => mean_of::<T>(a.into(), t.into(), |x, t| x.max(0.0) - x * t + (-x.abs()).exp().ln_1p()),
        }, else unreachable!("checked above"));
        let buf = dispatch_float!(a.dtype, T => buffer_of::<T>(&[loss])?, else unreachable!());
        Ok(Output::New {
            buf,
            shape: Shape(Dims::new()),
            dtype: a.dtype,
        })
    })?;
    autograd::record(&[x.id, target.id], id, || LossRule { kind });
    Ok(NDArray { id })
}

/// The gradients of the elementwise losses (means over `n` elements):
/// mse `dx = 2 (x - t) g / n`, `dt = -dx`; bce with logits `dx = (sigmoid(x) - t) g / n`,
/// `dt = -x g / n`.
struct LossRule {
    kind: Loss,
}

impl Backward for LossRule {
    fn name(&self) -> &'static str {
        self.kind.name()
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0b11, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let (x, t) = (cx.input(0), cx.input(1));
        let n = cx.shapes[0].size() as f64;
        Ok(match self.kind {
            Loss::Mse => {
                let d = x.try_sub(t)?.try_mul(g.try_mul(2.0 / n)?)?;
                smallvec![
                    cx.need(0).then_some(d),
                    if cx.need(1) { Some(d.try_neg()?) } else { None }
                ]
            }
            Loss::Bce => {
                let s = g.try_div(n)?;
                smallvec![
                    if cx.need(0) {
                        Some(x.try_sigmoid()?.try_sub(t)?.try_mul(s)?)
                    } else {
                        None
                    },
                    if cx.need(1) {
                        Some(x.try_mul(s)?.try_neg()?)
                    } else {
                        None
                    }
                ]
            }
        })
    }
}

impl NDArray {
    twins! {
        /// Cross-entropy of logits `[N, C]` (F32/F64) with integer class `labels` `[N]`:
        /// `mean_i(logsumexp(x_i) - x_i[label_i])`, a 0-d array, as PyTorch's
        /// `cross_entropy` with its defaults (mean reduction; an empty batch gives NaN). A
        /// fused, numerically stable log-softmax and negative log-likelihood: finite for
        /// logits of any magnitude. Differentiable in the logits (`(softmax - one_hot) / N`).
        /// No `ignore_index`: every label must be in `0..C`. On a GPU (F32 logits, I32, I64 or U8
        /// labels) the labels are not read back to check them, which would wait for the
        /// device: a label out of range makes the loss NaN there. Panics on failure.
        ///
        /// ```
        /// use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let logits = m.create(&[0.0f64, 0.0, 1e4, 0.0], [2, 2]);
        /// let labels = m.create(&[1i64, 0], [2]);
        /// let loss = logits.cross_entropy(labels).to_scalar::<f64>()?;
        /// assert!((loss - 2f64.ln() / 2.0).abs() < 1e-12);  // ln 2 for row 0, 0 for row 1
        /// # m.close();
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn cross_entropy,
        /// [`NDArray::cross_entropy`]. Errors: `UnsupportedDType` (logits not F32/F64, float
        /// or Bool labels), `InvalidArgument` (logits not 2-D, labels not `[N]`), `Index` (a
        /// label that is negative or `>= C`), `Closed`.
        pub fn try_cross_entropy(self, labels: NDArray) -> NDArray {
            cross_entropy_impl(self, labels, Location::caller())
        }
    }

    twins! {
        /// Mean squared error `mean((x - target)^2)`, a 0-d array (PyTorch's `mse_loss` with
        /// mean reduction; an empty input gives NaN). `target` must have `x`'s shape and
        /// dtype (PyTorch broadcasts with a warning; here that is an error). F32/F64 only.
        /// Differentiable in both. On a GPU the mean is summed in the array's dtype (the
        /// CPU sums in f64). Panics on failure.
        ///
        /// ```
        /// use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[1.0f32, 2.0, 3.0], [3]);
        /// let t = m.create(&[1.0f32, 0.0, 0.0], [3]);
        /// assert_eq!(x.mse_loss(t).to_scalar::<f32>()?, 13.0 / 3.0);
        /// # m.close();
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn mse_loss,
        /// [`NDArray::mse_loss`]. Errors: `UnsupportedDType` (not F32/F64), `DTypeMismatch`,
        /// `ShapeMismatch` (shapes differ), `Closed`.
        pub fn try_mse_loss(self, target: NDArray) -> NDArray {
            loss_impl(self, target, Loss::Mse, Location::caller())
        }
    }

    twins! {
        /// Binary cross-entropy of logits `x` with targets in `[0, 1]`:
        /// `mean(max(x, 0) - x * target + log1p(exp(-|x|)))`, a 0-d array, as PyTorch's
        /// `binary_cross_entropy_with_logits` (mean reduction; no weights). Stable for
        /// logits of any magnitude. `target` must have `x`'s shape and dtype. F32/F64 only
        /// (F32 only on a GPU, whose `exp` and `log` take 32-bit floats; the mean is summed
        /// in F32 there). Differentiable in both. Panics on failure.
        ///
        /// ```
        /// use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[0.0f64, 1000.0], [2]);
        /// let t = m.create(&[1.0f64, 1.0], [2]);
        /// let loss = x.binary_cross_entropy_with_logits(t).to_scalar::<f64>()?;
        /// assert!((loss - 2f64.ln() / 2.0).abs() < 1e-12);
        /// # m.close();
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn binary_cross_entropy_with_logits,
        /// [`NDArray::binary_cross_entropy_with_logits`]. Errors: as
        /// [`NDArray::try_mse_loss`].
        pub fn try_binary_cross_entropy_with_logits(self, target: NDArray) -> NDArray {
            loss_impl(self, target, Loss::Bce, Location::caller())
        }
    }
}
