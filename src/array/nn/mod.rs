//! Neural-network helpers: `softmax`, `log_softmax`, `one_hot`, `clip`, `where_`, the
//! normalisations (`layer_norm`, `batch_norm`), `embedding` and the losses
//! (`cross_entropy`, `mse_loss`, `binary_cross_entropy_with_logits`). Each is one fused
//! kernel pass into a fresh contiguous result, never a chain of temporary arrays, with
//! its gradient rule beside it. Every op has a `try_*` form and a panicking form.
//! Convolution and pooling live in `conv.rs`.
//!
//! This file holds `one_hot`, `clip` and `where_` and what the families share (the
//! arrays saved for backward, operand checks); `softmax.rs`, `norm.rs`, `embedding.rs`
//! and `losses.rs` hold the rest. The kernels are in [`crate::backend::cpu::nn`] and
//! [`crate::backend::cpu::norm`].

mod embedding;
mod losses;
mod norm;
mod softmax;

use super::NDArray;
use super::ops::{broadcast_shape, same_dtype};
use crate::DType;
use crate::array::gather::index_values;
use crate::array::grad::zero_like;
use crate::autograd::{self, Backward, BackwardCtx, Grads};
use crate::backend::cpu;
use crate::backend::cpu::new_filled;
use crate::backend::cpu::nn::{one_hot_kernel, select};
use crate::dtype::{Native, dispatch};
use crate::engine::{self, ArrayId, Buffer, Operand, Output};
use crate::error::{NdError, Result, SourceLocation, twins};
use crate::shape::Shape;
use smallvec::{SmallVec, smallvec};
use std::panic::Location;

fn one_hot_impl(x: NDArray, depth: usize, dtype: DType, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "one_hot";
    let id = engine::run_op_on(OP, &[x.id], at, |o| {
        let a = &o[0];
        if a.dtype.is_float() || a.dtype == DType::Bool {
            return Err(engine::unsupported(OP, a));
        }
        let mut dims = a.shape().0.clone();
        dims.push(depth);
        let shape = Shape(dims);
        let total = shape.checked_size().ok_or_else(|| {
            NdError::shape(OP, format!("the result shape {shape} overflows usize"))
        })?;
        let indices = index_values(OP, a)?;
        if let Some(&bad) = indices.iter().find(|&&i| i < 0 || i as u64 >= depth as u64) {
            return Err(NdError::Index {
                op: OP,
                msg: format!("class index {bad} is out of range for depth {depth}"),
                array: a.desc(),
            });
        }
        let buf = dispatch!(dtype, T => new_filled::<T>(total, |out| {
            one_hot_kernel::<T>(&indices, depth, out)
        })?);
        // On a GPU the result goes up as it is: the indices were read back to be
        // checked, and a map for a device kernel would be as large as the result.
        #[cfg(feature = "gpu")]
        if let Some(g) = a.gpu() {
            let bytes = cpu::buffer::into_bytes(buf, total * dtype.size_in_bytes());
            let up = crate::backend::wgpu::upload(OP, g.buf.ctx(), &bytes, dtype)?;
            return Ok(Output::device(up, shape, dtype));
        }
        Ok(Output::New { buf, shape, dtype })
    })?;
    Ok(NDArray { id })
}

fn clip_impl(x: NDArray, min: f64, max: f64, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "clip";
    let id = engine::run_op_on(OP, &[x.id], at, |o| {
        let a = &o[0];
        if a.dtype == DType::Bool {
            return Err(engine::unsupported(OP, a));
        }
        if min.is_nan() || max.is_nan() || min > max {
            return Err(NdError::invalid(
                OP,
                format!("invalid bounds [{min}, {max}]: need min <= max"),
            ));
        }
        // Integer arrays: round the bounds inward (then cast, saturating).
        let (lo, hi) = if a.dtype.is_float() {
            (min, max)
        } else {
            (min.ceil(), max.floor())
        };
        if lo > hi {
            return Err(NdError::invalid(
                OP,
                format!("no {} value lies in [{min}, {max}]", a.dtype),
            ));
        }
        #[cfg(feature = "gpu")]
        if let Some(ga) = a.gpu() {
            let buf = crate::backend::wgpu::math::clip(ga, lo, hi)?;
            return Ok(Output::device(buf, a.shape().clone(), a.dtype));
        }
        let buf = dispatch!(a.dtype, T => {
            let (lo, hi) = (T::from_f64(lo), T::from_f64(hi));
            cpu::map_unary::<T, T>(a, move |v| v.max_of(lo).min_of(hi))?
        });
        Ok(Output::New {
            buf,
            shape: a.shape().clone(),
            dtype: a.dtype,
        })
    })?;
    autograd::record(&[x.id], id, || ClipRule { min, max });
    Ok(NDArray { id })
}

/// `clip`'s gradient: `g` where `min <= x <= max`, else 0.
struct ClipRule {
    min: f64,
    max: f64,
}

impl Backward for ClipRule {
    fn name(&self) -> &'static str {
        "clip"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (1, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let x = cx.input(0);
        let zero = zero_like(g)?;
        let below_max = x.try_le(self.max)?.try_where_(g, zero)?;
        Ok(smallvec![Some(
            x.try_ge(self.min)?.try_where_(below_max, zero)?
        )])
    }
}

fn where_impl(cond: NDArray, x: NDArray, y: NDArray, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "where";
    let id = engine::run_op_on(OP, &[cond.id, x.id, y.id], at, |o| {
        let (c, a, b) = (&o[0], &o[1], &o[2]);
        if c.dtype != DType::Bool {
            return Err(engine::unsupported(OP, c));
        }
        same_dtype(OP, a, b)?;
        let xy = broadcast_shape(OP, a, b)?;
        let shape = Shape::broadcast(c.shape(), &xy).ok_or_else(|| NdError::ShapeMismatch {
            op: OP,
            lhs: c.desc(),
            rhs: a.desc(),
        })?;
        #[cfg(feature = "gpu")]
        if let (Some(gc), Some(ga), Some(gb)) = (c.gpu(), a.gpu(), b.gpu()) {
            let buf = crate::backend::wgpu::kernels::select(gc, ga, gb, &shape)?;
            return Ok(Output::device(buf, shape, a.dtype));
        }
        let buf = dispatch!(a.dtype, T => select::<T>(c.into(), a.into(), b.into(), &shape)?);
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    autograd::record(&[cond.id, x.id, y.id], id, || WhereRule);
    Ok(NDArray { id })
}

impl NDArray {
    twins! {
        /// One-hot encoding of integer class indices: an array of `dtype` (any dtype; Bool
        /// gives `true`/`false`) with a new last axis of length `depth`, 1 at each index and
        /// 0 elsewhere (PyTorch's `one_hot` always returns int64; here the caller picks).
        /// Not differentiable (integer input). Panics on failure.
        ///
        /// ```
        /// use ndscope::{DType, NDManager};
        /// let m = NDManager::new();
        /// let y = m.create(&[2i64, 0], [2]).one_hot(3, DType::F32);
        /// assert_eq!(y.to_vec::<f32>()?, vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
        /// # m.close();
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn one_hot,
        /// [`NDArray::one_hot`]. Errors: `Index` (an index is negative or `>= depth`),
        /// `UnsupportedDType` (float or Bool input), `InvalidShape`, `Closed`.
        /// Not differentiable: its input is integer labels.
        pub fn try_one_hot(self, depth: usize, dtype: DType) -> NDArray {
            one_hot_impl(self, depth, dtype, Location::caller())
        }
    }

    twins! {
        /// Limit every element to `[min, max]` (same dtype; NaN stays NaN; for integer
        /// arrays the bounds are rounded inward). Panics on failure.
        pub fn clip,
        /// [`NDArray::clip`]. Errors: `InvalidArgument` (`min > max`, a NaN bound, or no
        /// integer between them for an integer array), `UnsupportedDType` (Bool), `Closed`.
        pub fn try_clip(self, min: f64, max: f64) -> NDArray {
            clip_impl(self, min, max, Location::caller())
        }
    }

    twins! {
        /// Elementwise select: `x` where `self` (a Bool condition) is true, else `y`. The
        /// three arrays broadcast together; `x` and `y` must have the same dtype, which the
        /// result keeps. Panics on failure.
        ///
        /// ```
        /// use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[1.0f32, -2.0, 3.0], [3]);
        /// let y = m.create(&[0.0f32], [1]);
        /// assert_eq!(x.gt(0.0).where_(x, y).to_vec::<f32>()?, vec![1.0, 0.0, 3.0]);
        /// # m.close();
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn where_,
        /// [`NDArray::where_`]. Errors: `UnsupportedDType` (condition not Bool),
        /// `DTypeMismatch` (`x` and `y`), `ShapeMismatch` (not broadcastable), `Closed`.
        pub fn try_where_(self, x: NDArray, y: NDArray) -> NDArray {
            where_impl(self, x, y, Location::caller())
        }
    }
}

// ---- arrays saved for backward ----

/// An array a gradient rule reads in backward that is neither an input nor the output
/// (batch statistics, argmax indices, a softmax). The op computes its buffer anyway;
/// it becomes an array only when a collector records (the rule is built only then),
/// the tape holds it ([`Backward::extra`]), and it is closed when the rule is dropped:
/// after `backward`, when the collector drops, or at once if the tape does not keep
/// the node. So it never shows up as a live array outside a recording.
pub(super) struct Saved(Option<NDArray>);

impl Saved {
    /// An array of `buf` in the manager of `like` (the op's result). If it cannot be
    /// created, `backward` reports it ([`Saved::get`]).
    pub(super) fn new(like: ArrayId, buf: Buffer, shape: Shape, dtype: DType) -> Saved {
        let at = Location::caller();
        let id = engine::manager_of(like).and_then(|m| engine::create(m, buf, shape, dtype, at));
        Saved(id.ok().map(|id| NDArray { id }))
    }

    /// [`Saved::new`] of a buffer already on the device of `like`'s manager.
    #[cfg(feature = "gpu")]
    pub(super) fn on_device(
        like: ArrayId,
        buf: crate::backend::wgpu::GpuBuffer,
        shape: Shape,
        dtype: DType,
    ) -> Saved {
        let at = Location::caller();
        let id = engine::manager_of(like)
            .and_then(|m| engine::create_stored(m, buf.into(), shape, dtype, at));
        Saved(id.ok().map(|id| NDArray { id }))
    }

    /// Its id, for [`Backward::extra`].
    pub(super) fn ids(&self) -> SmallVec<[ArrayId; 2]> {
        self.0.iter().map(|a| a.id).collect()
    }

    /// The array, or `InvalidArgument` if it could not be created.
    pub(super) fn get(&self, op: &'static str) -> Result<NDArray> {
        self.0.ok_or_else(|| {
            NdError::invalid(
                op,
                "the array saved for the gradient could not be created during the forward pass",
            )
        })
    }
}

impl Drop for Saved {
    fn drop(&mut self) {
        if let Some(a) = self.0 {
            engine::close_array(a.id, Location::caller());
        }
    }
}

/// `x` is F32/F64 (else `UnsupportedDType`) and each of `others` has its dtype (else
/// `DTypeMismatch`).
pub(super) fn float_operands(
    op: &'static str,
    x: &Operand<'_>,
    others: &[&Operand<'_>],
) -> Result<()> {
    if !x.dtype.is_float() {
        return Err(engine::unsupported(op, x));
    }
    for o in others {
        same_dtype(op, x, o)?;
    }
    Ok(())
}

/// Class ids / row ids of an integer operand as `i64` (float and Bool are
/// `UnsupportedDType`), each checked to lie in `0..limit` (else `Index`, naming `what`).
fn int_ids(op: &'static str, ids: &Operand<'_>, limit: usize, what: &str) -> Result<Vec<i64>> {
    let v = index_values(op, ids)?;
    if let Some(&bad) = v.iter().find(|&&i| i < 0 || i as u64 >= limit as u64) {
        return Err(NdError::Index {
            op,
            msg: format!("{what} {bad} is out of range 0..{limit}"),
            array: ids.desc(),
        });
    }
    Ok(v)
}

/// The gradient of `where_(cond, x, y)`: `g` where `cond` to `x`, elsewhere to `y`
/// (`cond` has none).
struct WhereRule;

impl Backward for WhereRule {
    fn name(&self) -> &'static str {
        "where"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (1, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let cond = cx.input(0);
        let zero = zero_like(g)?;
        let mut r = autograd::nones(3);
        if cx.need(1) {
            r[1] = Some(cond.try_where_(g, zero)?);
        }
        if cx.need(2) {
            r[2] = Some(cond.try_where_(zero, g)?);
        }
        Ok(r)
    }
}
