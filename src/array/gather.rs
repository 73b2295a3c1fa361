//! Indexing with index arrays and masks: `index_select`, `gather`, `scatter_add`,
//! `take`, `boolean_mask` and `masked_fill`.
//!
//! Index arrays may have any integer dtype (I32, I64, U8); float and Bool index arrays
//! are `UnsupportedDType`. **Negative indices are errors**, not counted from the end as
//! numpy and PyTorch do: an index of `-1` is far more often a bug (an uninitialised
//! label, a padding id) than a request for the last row, and a silent wrap hides it.
//! An index outside `0..size` is an `Index` error naming the index, its position in
//! the index array and the bound.
//!
//! The kernels are plain functions over slices and a
//! [`Layout`](crate::layout::Layout), in [`crate::backend::cpu::gather`]; the ops here
//! validate everything before allocating, so a failing `try_*` creates nothing.
//!
//! On a GPU these ops give the CPU's results and the CPU's errors: the index array (or
//! mask) is read back to be checked, which waits for the device's queued work, and the
//! device then moves the elements by a map the host computes with the same kernels
//! ([`crate::backend::wgpu::gather`]; scatters add in the CPU's order).

use super::NDArray;
use super::axis::normalize_axis;
use super::ops::same_dtype;
use crate::DType;
use crate::autograd::{self, Backward, BackwardCtx, Grads};
use crate::backend::cpu;
use crate::backend::cpu::copy::fill_value;
use crate::backend::cpu::gather::{
    boolean_mask_kernel, checked_indices, gather_kernel, index_add_kernel, masked_fill_kernel,
    scatter_add_kernel, take_kernel,
};
use crate::backend::cpu::{new_filled, new_overwritten};
use crate::dtype::{Native, dispatch};
use crate::engine::{self, Operand, Output};
use crate::error::{NdError, Result, SourceLocation, twins};
use crate::shape::{Dims, Shape};
use smallvec::smallvec;
use std::panic::Location;

use crate::backend::cpu::gather::index_select_kernel;

// ---------------------------------------------------------------- validation

/// The values of an integer index operand in row-major order; float and Bool index
/// arrays are `UnsupportedDType`.
pub(crate) fn index_values(op: &'static str, ix: &Operand<'_>) -> Result<Vec<i64>> {
    match ix.dtype {
        DType::F32 | DType::F64 | DType::Bool => Err(engine::unsupported(op, ix)),
        _ => engine::host_copy(ix, |h| {
            dispatch!(h.dtype, T => cpu::to_vec::<T>(h)
                .into_iter()
                .map(Native::to_i64)
                .collect())
        }),
    }
}

/// The result of a gather whose input `a` lives on a GPU, `None` on the host: element
/// `i` of the `shape` result is `a`'s buffer element that `kernel` (the CPU's kernel,
/// run over buffer positions) puts at `i` ([`crate::backend::wgpu::gather`]).
pub(crate) fn picked_on_device(
    op: &'static str,
    a: &Operand<'_>,
    shape: &Shape,
    kernel: impl FnOnce(&[u32], &mut [u32]),
) -> Result<Option<Output>> {
    #[cfg(feature = "gpu")]
    if let Some(g) = a.gpu() {
        use crate::backend::wgpu::gather::{buffer_len, pick, positions};
        let map = positions(buffer_len(&g), shape.size(), kernel)?;
        let buf = pick(op, g, &map)?;
        return Ok(Some(Output::device(buf, shape.clone(), a.dtype)));
    }
    let _ = (op, a, shape, kernel);
    Ok(None)
}

/// The buffer positions of `layout`'s elements in row-major order.
#[cfg(feature = "gpu")]
pub(crate) fn row_major_positions(layout: &crate::layout::Layout) -> Vec<u32> {
    let mut out = Vec::with_capacity(layout.size());
    crate::backend::cpu::copy::for_each_offset(
        layout.shape.dims(),
        &layout.strides,
        layout.offset as isize,
        |o| out.push(o as u32),
    );
    out
}

/// Indices of `ix`, each checked to lie in `0..bound` (`what` names the bound in the
/// message, e.g. "axis 1 with size 3"), or an `Index` error about `x`.
fn valid_indices(
    op: &'static str,
    x: &Operand<'_>,
    ix: &Operand<'_>,
    bound: usize,
    what: &str,
) -> Result<Vec<usize>> {
    let raw = index_values(op, ix)?;
    checked_indices(&raw, bound).map_err(|(p, v)| NdError::Index {
        op,
        msg: format!(
            "index {v} (position {p} of the index array) is out of bounds for {what} \
             with size {bound}{}",
            if v < 0 {
                " (negative indices are not counted from the end)"
            } else {
                ""
            }
        ),
        array: x.desc(),
    })
}

fn checked_shape(op: &'static str, dims: Dims) -> Result<(Shape, usize)> {
    let shape = Shape(dims);
    let n = shape
        .checked_size()
        .ok_or_else(|| NdError::shape(op, format!("the result shape {shape} is too large")))?;
    Ok((shape, n))
}

/// A 0-d zero of `g`'s dtype beside `g`.
fn zero_of(g: NDArray) -> Result<NDArray> {
    crate::array::grad::zero_like(g)
}

fn axis_of(axis: isize, ndim: usize) -> usize {
    if axis < 0 {
        (axis + ndim as isize) as usize
    } else {
        axis as usize
    }
}

// ---------------------------------------------------------------- ops

fn index_select_impl(
    x: NDArray,
    axis: isize,
    indices: NDArray,
    at: SourceLocation,
) -> Result<NDArray> {
    const OP: &str = "index_select";
    let id = engine::run_op_on(OP, &[x.id, indices.id], at, |o| {
        let (a, ix) = (&o[0], &o[1]);
        let dims = a.shape().dims();
        let ax = normalize_axis(OP, axis, dims.len(), a)?;
        let idx = valid_indices(OP, a, ix, dims[ax], &format!("axis {ax}"))?;
        let mut out = Dims::from_slice(&dims[..ax]);
        out.extend_from_slice(ix.shape().dims());
        out.extend_from_slice(&dims[ax + 1..]);
        let (shape, n) = checked_shape(OP, out)?;
        if let Some(out) = picked_on_device(OP, a, &shape, |ids, out| {
            index_select_kernel(ids, a.layout, ax, &idx, out)
        })? {
            return Ok(out);
        }
        let buf = dispatch!(a.dtype, T => new_overwritten::<T>(n, |out| {
            index_select_kernel(a.data::<T>(), a.layout, ax, &idx, out)
        }))?;
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    autograd::record(&[x.id, indices.id], id, || IndexSelectRule { axis });
    Ok(NDArray { id })
}

/// `zeros(shape)` with `src` (row-major `[outer, indices.size(), inner]` around
/// `axis`) added at `indices` along `axis`: the gradient of `index_select`, `take`
/// and `boolean_mask`. Owned by `src`'s manager; not recorded.
pub(crate) fn index_add(
    shape: Shape,
    axis: usize,
    indices: NDArray,
    src: NDArray,
    at: SourceLocation,
) -> Result<NDArray> {
    const OP: &str = "index_add";
    let id = engine::run_op_on(OP, &[src.id, indices.id], at, |o| {
        let (s, ix) = (&o[0], &o[1]);
        let dims = shape.dims();
        let idx = valid_indices(OP, s, ix, dims[axis], &format!("axis {axis}"))?;
        let outer: usize = dims[..axis].iter().product();
        let inner: usize = dims[axis + 1..].iter().product();
        if s.layout.size() != outer * idx.len() * inner || s.dtype == DType::Bool {
            return Err(NdError::shape(
                OP,
                format!(
                    "cannot add {} at {} indices into {shape}",
                    s.desc(),
                    idx.len()
                ),
            ));
        }
        #[cfg(feature = "gpu")]
        if let Some(gs) = s.gpu() {
            // Source element (o, j, i) goes to (o, idx[j], i), in the CPU's order.
            let n = dims[axis];
            let mut dest = Vec::with_capacity(s.layout.size());
            for o in 0..outer {
                for &k in &idx {
                    let row = ((o * n + k) * inner) as u32;
                    dest.extend((0..inner as u32).map(|i| row + i));
                }
            }
            let from = row_major_positions(s.layout);
            let map = crate::backend::wgpu::gather::Csr::new(OP, shape.size(), &dest, &from)?;
            let buf = crate::backend::wgpu::gather::sum_into(OP, None, gs, &shape, &map)?;
            return Ok(Output::device(buf, shape.clone(), s.dtype));
        }
        let buf = dispatch!(s.dtype, T => {
            let rows = cpu::to_vec::<T>(s);
            new_filled::<T>(shape.size(), |out| index_add_kernel(out, dims, axis, &idx, &rows))
        })?;
        Ok(Output::New {
            buf,
            shape: shape.clone(),
            dtype: s.dtype,
        })
    })?;
    Ok(NDArray { id })
}

/// `index_select`'s gradient: `g` added back at the selected positions.
struct IndexSelectRule {
    axis: isize,
}

impl Backward for IndexSelectRule {
    fn name(&self) -> &'static str {
        "index_select"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0b10, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let xs = &cx.shapes[0];
        let ax = axis_of(self.axis, xs.ndim());
        let gx = index_add(xs.clone(), ax, cx.input(1), g, Location::caller())?;
        Ok(smallvec![Some(gx), None])
    }
}

/// Check `gather`/`scatter_add` shapes: the index has the input's number of dims and
/// is no larger than `limit` along every axis but `ax` (and than `src` along all).
fn check_index_shape(
    op: &'static str,
    a: &Operand<'_>,
    ix: &Operand<'_>,
    ax: usize,
    src: Option<&Operand<'_>>,
) -> Result<()> {
    let (ad, id) = (a.shape().dims(), ix.shape().dims());
    let nd = ad.len();
    if id.len() != nd || src.is_some_and(|s| s.shape().ndim() != nd) {
        return Err(NdError::shape(
            op,
            format!(
                "the index array {} must have as many dims as the input {}{}",
                ix.shape(),
                a.shape(),
                src.map_or(String::new(), |s| format!(" and the source {}", s.shape()))
            ),
        ));
    }
    for d in 0..nd {
        if d != ax && id[d] > ad[d] {
            return Err(NdError::shape(
                op,
                format!(
                    "the index array {} is larger than the input {} along axis {d}",
                    ix.shape(),
                    a.shape()
                ),
            ));
        }
        if let Some(s) = src
            && id[d] > s.shape().dims()[d]
        {
            return Err(NdError::shape(
                op,
                format!(
                    "the index array {} is larger than the source {} along axis {d}",
                    ix.shape(),
                    s.shape()
                ),
            ));
        }
    }
    Ok(())
}

fn gather_impl(x: NDArray, axis: isize, indices: NDArray, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "gather";
    let id = engine::run_op_on(OP, &[x.id, indices.id], at, |o| {
        let (a, ix) = (&o[0], &o[1]);
        let dims = a.shape().dims();
        let ax = normalize_axis(OP, axis, dims.len(), a)?;
        check_index_shape(OP, a, ix, ax, None)?;
        let idx = valid_indices(OP, a, ix, dims[ax], &format!("axis {ax}"))?;
        let shape = ix.shape().clone();
        if let Some(out) = picked_on_device(OP, a, &shape, |ids, out| {
            gather_kernel(ids, a.layout, ax, shape.dims(), &idx, out)
        })? {
            return Ok(out);
        }
        let buf = dispatch!(a.dtype, T => new_overwritten::<T>(idx.len(), |out| {
            gather_kernel(a.data::<T>(), a.layout, ax, shape.dims(), &idx, out)
        }))?;
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    autograd::record(&[x.id, indices.id], id, || GatherRule { axis });
    Ok(NDArray { id })
}

/// `gather`'s gradient: `g` scatter-added into zeros of the input's shape.
struct GatherRule {
    axis: isize,
}

impl Backward for GatherRule {
    fn name(&self) -> &'static str {
        "gather"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0b10, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let z = crate::array::grad::full_beside(g, cx.shapes[0].clone(), 0.0)?;
        Ok(smallvec![
            Some(z.try_scatter_add(self.axis, cx.input(1), g)?),
            None
        ])
    }
}

fn scatter_add_impl(
    x: NDArray,
    axis: isize,
    indices: NDArray,
    src: NDArray,
    at: SourceLocation,
) -> Result<NDArray> {
    const OP: &str = "scatter_add";
    let id = engine::run_op_on(OP, &[x.id, indices.id, src.id], at, |o| {
        let (a, ix, s) = (&o[0], &o[1], &o[2]);
        same_dtype(OP, a, s)?;
        if a.dtype == DType::Bool {
            return Err(engine::unsupported(OP, a));
        }
        let dims = a.shape().dims();
        let ax = normalize_axis(OP, axis, dims.len(), a)?;
        check_index_shape(OP, a, ix, ax, Some(s))?;
        let idx = valid_indices(OP, a, ix, dims[ax], &format!("axis {ax}"))?;
        #[cfg(feature = "gpu")]
        if let (Some(ga), Some(gs)) = (a.gpu(), s.gpu()) {
            use crate::backend::wgpu::gather::{Csr, positions, sum_into};
            // Where each index position lands in the result (the CPU's gather over
            // positions of a contiguous result), and which source element it adds.
            let out = crate::layout::Layout::contiguous(a.shape().clone());
            let dest = positions(out.size(), idx.len(), |ids, o| {
                gather_kernel(ids, &out, ax, ix.shape().dims(), &idx, o)
            })?;
            let reach = crate::layout::Layout {
                shape: ix.shape().clone(),
                strides: s.layout.strides.clone(),
                offset: s.layout.offset,
            };
            let from = row_major_positions(&reach);
            let map = Csr::new(OP, out.size(), &dest, &from)?;
            let buf = sum_into(OP, Some(ga), gs, a.shape(), &map)?;
            return Ok(Output::device(buf, a.shape().clone(), a.dtype));
        }
        let buf = dispatch!(a.dtype, T => {
            let base = cpu::to_vec::<T>(a);
            new_overwritten::<T>(base.len(), |out| {
                out.copy_from_slice(&base);
                scatter_add_kernel(out, dims, ax, ix.shape().dims(), &idx, s.data::<T>(), s.layout)
            })
        })?;
        Ok(Output::New {
            buf,
            shape: a.shape().clone(),
            dtype: a.dtype,
        })
    })?;
    autograd::record(&[x.id, indices.id, src.id], id, || ScatterAddRule { axis });
    Ok(NDArray { id })
}

/// `scatter_add`'s gradient: the input gets `g`, the source `gather(g)` (zero where
/// the index array does not reach).
struct ScatterAddRule {
    axis: isize,
}

impl Backward for ScatterAddRule {
    fn name(&self) -> &'static str {
        "scatter_add"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0b010, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let gx = cx.need(0).then_some(g);
        let gs = if cx.need(2) {
            let ix = cx.input(1);
            let part = g.try_gather(self.axis, ix)?;
            let (is, ss) = (ix.try_shape()?, &cx.shapes[2]);
            Some(if is == *ss {
                part
            } else {
                let widths: Vec<(usize, usize)> = ss
                    .dims()
                    .iter()
                    .zip(is.dims())
                    .map(|(&s, &i)| (0, s - i))
                    .collect();
                part.try_pad(&widths, 0.0)?
            })
        } else {
            None
        };
        Ok(smallvec![gx, None, gs])
    }
}

fn take_impl(x: NDArray, indices: NDArray, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "take";
    let id = engine::run_op_on(OP, &[x.id, indices.id], at, |o| {
        let (a, ix) = (&o[0], &o[1]);
        let idx = valid_indices(OP, a, ix, a.layout.size(), "the flattened input")?;
        if let Some(out) = picked_on_device(OP, a, ix.shape(), |ids, out| {
            take_kernel(ids, a.layout, &idx, out)
        })? {
            return Ok(out);
        }
        let buf = dispatch!(a.dtype, T => new_overwritten::<T>(idx.len(), |out| {
            take_kernel(a.data::<T>(), a.layout, &idx, out)
        }))?;
        Ok(Output::New {
            buf,
            shape: ix.shape().clone(),
            dtype: a.dtype,
        })
    })?;
    autograd::record(&[x.id, indices.id], id, || TakeRule);
    Ok(NDArray { id })
}

/// `take`'s gradient: `g` added back at the flat indices.
struct TakeRule;

impl Backward for TakeRule {
    fn name(&self) -> &'static str {
        "take"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0b10, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let xs = &cx.shapes[0];
        let flat = index_add(
            Shape::from([xs.size()]),
            0,
            cx.input(1),
            g,
            Location::caller(),
        )?;
        Ok(smallvec![Some(flat.try_reshape(xs.clone())?), None])
    }
}

fn boolean_mask_impl(x: NDArray, mask: NDArray, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "boolean_mask";
    let id = engine::run_op_on(OP, &[x.id, mask.id], at, |o| {
        let (a, m) = (&o[0], &o[1]);
        if m.dtype != DType::Bool {
            return Err(engine::unsupported(OP, m));
        }
        let (ad, md) = (a.shape().dims(), m.shape().dims());
        if md.is_empty() || md.len() > ad.len() || ad[..md.len()] != *md {
            return Err(NdError::shape(
                OP,
                format!(
                    "the mask's shape {} must equal the input's shape {} or a leading part \
                     of it (at least one dim)",
                    m.shape(),
                    a.shape()
                ),
            ));
        }
        let bits: Vec<bool> = engine::host_copy(m, |h| {
            cpu::to_vec::<u8>(h).into_iter().map(|b| b != 0).collect()
        })?;
        let count = bits.iter().filter(|&&b| b).count();
        let mut dims: Dims = smallvec![count];
        dims.extend_from_slice(&ad[md.len()..]);
        let (shape, n) = checked_shape(OP, dims)?;
        if let Some(out) = picked_on_device(OP, a, &shape, |ids, out| {
            boolean_mask_kernel(ids, a.layout, md.len(), &bits, out)
        })? {
            return Ok(out);
        }
        let buf = dispatch!(a.dtype, T => new_overwritten::<T>(n, |out| {
            boolean_mask_kernel(a.data::<T>(), a.layout, md.len(), &bits, out)
        }))?;
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    autograd::record(&[x.id, mask.id], id, || BooleanMaskRule);
    Ok(NDArray { id })
}

/// `boolean_mask`'s gradient: the rows of `g` put back where the mask is set, zeros
/// elsewhere.
struct BooleanMaskRule;

impl Backward for BooleanMaskRule {
    fn name(&self) -> &'static str {
        "boolean_mask"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0b10, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let (xs, mask) = (&cx.shapes[0], cx.input(1));
        let k = mask.try_shape()?.ndim();
        let rows: Vec<i64> = mask
            .to_vec::<bool>()?
            .into_iter()
            .enumerate()
            .filter_map(|(p, b)| b.then_some(p as i64))
            .collect();
        let positions = g.try_manager()?.try_create(&rows, [rows.len()])?;
        positions.try_move_to_device(g.try_device()?)?; // beside g
        let mut dims: Dims = smallvec![xs.dims()[..k].iter().product()];
        dims.extend_from_slice(&xs.dims()[k..]);
        let gx = index_add(Shape(dims), 0, positions, g, Location::caller())?;
        Ok(smallvec![Some(gx.try_reshape(xs.clone())?), None])
    }
}

fn masked_fill_impl(x: NDArray, mask: NDArray, value: f64, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "masked_fill";
    let id = engine::run_op_on(OP, &[x.id, mask.id], at, |o| {
        let (a, m) = (&o[0], &o[1]);
        if m.dtype != DType::Bool {
            return Err(engine::unsupported(OP, m));
        }
        if Shape::broadcast(m.shape(), a.shape()).as_ref() != Some(a.shape()) {
            return Err(NdError::ShapeMismatch {
                op: OP,
                lhs: a.desc(),
                rhs: m.desc(),
            });
        }
        #[cfg(feature = "gpu")]
        if let (Some(ga), Some(gm)) = (a.gpu(), m.gpu()) {
            dispatch!(a.dtype, T => { let _: T = fill_value(OP, value, a.dtype)?; });
            let buf = crate::backend::wgpu::math::masked(OP, ga, gm, ("x", "s"), value)?;
            return Ok(Output::device(buf, a.shape().clone(), a.dtype));
        }
        let buf = dispatch!(a.dtype, T => {
            let v: T = fill_value(OP, value, a.dtype)?;
            new_overwritten::<T>(a.layout.size(), |out| {
                masked_fill_kernel(a.data::<T>(), a.layout, m.data::<u8>(), m.layout, v, out)
            })?
        });
        Ok(Output::New {
            buf,
            shape: a.shape().clone(),
            dtype: a.dtype,
        })
    })?;
    autograd::record(&[x.id, mask.id], id, || MaskedFillRule);
    Ok(NDArray { id })
}

/// `masked_fill`'s gradient: `g` where the mask is not set.
struct MaskedFillRule;

impl Backward for MaskedFillRule {
    fn name(&self) -> &'static str {
        "masked_fill"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0b10, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        Ok(smallvec![
            Some(cx.input(1).try_where_(zero_of(g)?, g)?),
            None
        ])
    }
}

impl NDArray {
    twins! {
        /// The slices of `self` at `indices` along `axis` (negative counts from the end),
        /// in the order given, repeats allowed: numpy's `take(x, indices, axis)`, PyTorch's
        /// `index_select` for a 1-D index. The result's shape is `self`'s with `axis`
        /// replaced by the index array's shape (so a 2-D index into a `[V, D]` table gives
        /// `[B, T, D]`, an embedding lookup; a 0-d index removes the axis, as numpy; PyTorch
        /// only takes 1-D indices). Every dtype; indices of any integer dtype, each in
        /// `0..size` (negative indices are errors, not counted from the end).
        /// Differentiable: the gradient adds `g` back at the indices. Panics on error.
        ///
        /// ```
        /// use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 2]);
        /// let i = m.create(&[2i64, 0, 2], [3]);
        /// assert_eq!(x.index_select(0, i).to_vec::<f32>()?, vec![5.0, 6.0, 1.0, 2.0, 5.0, 6.0]);
        /// assert_eq!(x.index_select(-1, m.create(&[1i32], [1])).to_vec::<f32>()?, vec![2.0, 4.0, 6.0]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn index_select,
        /// [`NDArray::index_select`]. Errors: `Index` (an index is negative or `>=` the
        /// axis size: the message names it, its position and the bound), `UnsupportedDType`
        /// (float or Bool indices), `AxisOutOfRange`, `Closed`.
        pub fn try_index_select(self, axis: isize, indices: NDArray) -> NDArray {
            index_select_impl(self, axis, indices, Location::caller())
        }
    }

    twins! {
        /// PyTorch's `gather`: `out[i][j][k] = self[indices[i][j][k]][j][k]` for `axis ==
        /// 0` (the index replaces the position along `axis`). `indices` has as many dims as
        /// `self` and is no larger along the other axes; the result has its shape. Every
        /// dtype; indices of any integer dtype in `0..self.shape[axis]` (negative ones are
        /// errors). Differentiable: the gradient scatter-adds `g` into zeros. Panics on
        /// error.
        ///
        /// ```
        /// use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[1, 2, 3, 4], [2, 2]);
        /// let i = m.create(&[0i64, 0, 1, 0], [2, 2]);
        /// assert_eq!(x.gather(1, i).to_vec::<i32>()?, vec![1, 1, 4, 3]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn gather,
        /// [`NDArray::gather`]. Errors: `Index` (an index out of range), `InvalidShape`
        /// (the index has another number of dims, or is larger off `axis`),
        /// `UnsupportedDType` (float or Bool indices), `AxisOutOfRange`, `Closed`.
        pub fn try_gather(self, axis: isize, indices: NDArray) -> NDArray {
            gather_impl(self, axis, indices, Location::caller())
        }
    }

    twins! {
        /// PyTorch's `scatter_add` (out of place): a new array equal to `self` with
        /// `src[i][j][k]` added at `[indices[i][j][k]][j][k]` for `axis == 0`; repeated
        /// indices accumulate. `indices`, `src` and `self` have the same number of dims,
        /// `indices` is no larger than `src` along any axis and than `self` off `axis`
        /// (only its extent is read from `src`). `src` has `self`'s dtype (not Bool).
        /// Differentiable: `self` gets `g`, `src` gets `g.gather(axis, indices)`. Panics on
        /// error.
        ///
        /// ```
        /// use ndscope::{DType, NDManager};
        /// let m = NDManager::new();
        /// let x = m.zeros([3], DType::F32);
        /// let i = m.create(&[0i64, 2, 0], [3]);
        /// let s = m.create(&[1.0f32, 2.0, 3.0], [3]);
        /// assert_eq!(x.scatter_add(0, i, s).to_vec::<f32>()?, vec![4.0, 0.0, 2.0]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn scatter_add,
        /// [`NDArray::scatter_add`]. Errors: `Index`, `InvalidShape` (see above),
        /// `DTypeMismatch` (`src`), `UnsupportedDType` (Bool values, float or Bool indices),
        /// `AxisOutOfRange`, `Closed`.
        pub fn try_scatter_add(self, axis: isize, indices: NDArray, src: NDArray) -> NDArray {
            scatter_add_impl(self, axis, indices, src, Location::caller())
        }
    }

    twins! {
        /// The elements at flat (row-major) `indices` of `self`, in an array of the index
        /// array's shape (numpy's `take` without an axis). Every dtype; indices of any
        /// integer dtype in `0..self.size()` (negative ones are errors). Differentiable.
        /// Panics on error.
        ///
        /// ```
        /// use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[10, 20, 30, 40], [2, 2]);
        /// let t = x.take(m.create(&[3i32, 0, 0, 2], [2, 2]));
        /// assert_eq!(t.shape().dims(), &[2, 2]);
        /// assert_eq!(t.to_vec::<i32>()?, vec![40, 10, 10, 30]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn take,
        /// [`NDArray::take`]. Errors: `Index` (an index out of range), `UnsupportedDType`
        /// (float or Bool indices), `Closed`.
        pub fn try_take(self, indices: NDArray) -> NDArray {
            take_impl(self, indices, Location::caller())
        }
    }

    twins! {
        /// The elements (or rows) of `self` where the Bool `mask` is true, in row-major
        /// order (DJL's `booleanMask`, numpy's `x[mask]`). A mask of `self`'s shape gives
        /// a 1-D result; a mask of a leading part of the shape (`[N]` for `[N, D]`)
        /// selects whole rows: the result is `[count, D]`. Differentiable: the gradient is
        /// `g` put back where the mask is set. Panics on error.
        ///
        /// ```
        /// use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[1.0f32, -2.0, 3.0, -4.0], [2, 2]);
        /// assert_eq!(x.boolean_mask(x.gt(0.0)).to_vec::<f32>()?, vec![1.0, 3.0]);
        /// let rows = x.boolean_mask(m.create(&[false, true], [2]));
        /// assert_eq!(rows.shape().dims(), &[1, 2]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn boolean_mask,
        /// [`NDArray::boolean_mask`]. Errors: `UnsupportedDType` (mask not Bool),
        /// `InvalidShape` (the mask's shape is not `self`'s or a leading part of it, or is
        /// 0-d), `Closed`.
        pub fn try_boolean_mask(self, mask: NDArray) -> NDArray {
            boolean_mask_impl(self, mask, Location::caller())
        }
    }

    twins! {
        /// A new array equal to `self` with `value` where the Bool `mask` (broadcast to
        /// `self`'s shape; it may not enlarge it) is true (PyTorch's `masked_fill`). The
        /// value is converted to `self`'s dtype (integers truncate toward zero; Bool stores
        /// `value != 0`). Differentiable in `self`: the gradient is `g` where the mask is
        /// false. Panics on error.
        ///
        /// ```
        /// use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
        /// let mask = m.create(&[true, false], [2]);            // broadcast over the rows
        /// assert_eq!(x.masked_fill(mask, -1.0).to_vec::<f32>()?, vec![-1.0, 2.0, -1.0, 4.0]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn masked_fill,
        /// [`NDArray::masked_fill`]. Errors: `UnsupportedDType` (mask not Bool),
        /// `ShapeMismatch` (the mask does not broadcast to `self`'s shape),
        /// `InvalidArgument` (a NaN or infinite value for an integer array), `Closed`.
        pub fn try_masked_fill(self, mask: NDArray, value: f64) -> NDArray {
            masked_fill_impl(self, mask, value, Location::caller())
        }
    }
}
