//! Shape ops: reshape, transpose/permute, expand_dims/squeeze, flatten, broadcast_to,
//! concat/stack and dtype conversion here; split, repeat, tile, pad, swap_axes, flip,
//! tril/triu and the `*_like` constructors in `rearrange.rs`. The copy loops are in
//! [`crate::backend::cpu::copy`].
//!
//! Ops that only reinterpret the layout (reshape of a contiguous array, transpose,
//! permute, expand_dims, squeeze) return views sharing the input's storage, as numpy
//! does. Ops that need new data (`broadcast_to`, `concat`, `stack`, `to_dtype`, and a
//! reshape of a non-contiguous array) copy into a new contiguous buffer.

mod rearrange;

use super::NDArray;
use super::axis::normalize_axis;
use crate::autograd::{self, Backward, BackwardCtx, Base, Grads, LazyGrad, LazyGrads, via_arrays};
use crate::backend::cpu;
use crate::backend::cpu::copy::copy_strided;
use crate::backend::cpu::new_filled;
use crate::dtype::{Native, dispatch};
use crate::engine::{self, Layout, Operand, Output};
use crate::error::{NdError, Result, SourceLocation, twins};
use crate::layout::Strides;
use crate::shape::Dims;
use crate::{DType, Shape};
use std::panic::Location;

/// A view of input 0 with `layout`, or a contiguous copy reshaped to `shape` when the
/// input is not contiguous.
fn reshape_output(o: &Operand<'_>, shape: Shape) -> Result<Output> {
    if o.layout.is_contiguous() {
        return Ok(Output::View {
            of: 0,
            layout: Layout {
                strides: shape.contiguous_strides(),
                shape,
                offset: o.layout.offset,
            },
        });
    }
    #[cfg(feature = "gpu")]
    if let Some(g) = o.gpu() {
        let buf = crate::backend::wgpu::kernels::convert("reshape", g, o.dtype)?;
        return Ok(Output::device(buf, shape, o.dtype));
    }
    let (buf, _) = engine::materialize(o)?;
    Ok(Output::New {
        buf,
        shape,
        dtype: o.dtype,
    })
}

fn reshape(x: NDArray, shape: Shape, at: SourceLocation) -> Result<NDArray> {
    let id = engine::run_op_on("reshape", &[x.id], at, |o| {
        let o = &o[0];
        let Some(n) = shape.checked_size() else {
            return Err(NdError::shape(
                "reshape",
                format!("{shape} has more elements than usize can count"),
            ));
        };
        if n != o.layout.size() {
            return Err(NdError::shape(
                "reshape",
                format!(
                    "cannot reshape {} ({} elements) into {shape} ({n} elements)",
                    o.shape(),
                    o.layout.size()
                ),
            ));
        }
        reshape_output(o, shape)
    })?;
    autograd::record(&[x.id], id, || ReshapeRule);
    Ok(NDArray { id })
}

fn reshape_infer(x: NDArray, dims: &[isize], at: SourceLocation) -> Result<NDArray> {
    let size = x.try_shape()?.size();
    let mut unknown = None;
    let mut known = 1usize;
    let mut out = Dims::with_capacity(dims.len());
    for (i, &d) in dims.iter().enumerate() {
        if d == -1 {
            if unknown.replace(i).is_some() {
                return Err(NdError::shape("reshape", "only one dimension can be -1"));
            }
            out.push(1);
        } else if d < 0 {
            return Err(NdError::shape(
                "reshape",
                format!("invalid dimension {d} (only -1 may be negative)"),
            ));
        } else {
            known = known.checked_mul(d as usize).ok_or_else(|| {
                NdError::shape("reshape", format!("{dims:?} overflows the element count"))
            })?;
            out.push(d as usize);
        }
    }
    if let Some(i) = unknown {
        if known == 0 || size % known != 0 {
            return Err(NdError::shape(
                "reshape",
                format!("cannot infer the -1 dimension of {dims:?} for {size} elements"),
            ));
        }
        out[i] = size / known;
    }
    reshape(x, Shape(out), at)
}

/// A view of input 0 with its axes in the order `perm` (already validated).
fn permuted(l: &Layout, perm: &[usize]) -> Layout {
    Layout {
        shape: Shape(perm.iter().map(|&p| l.shape.0[p]).collect()),
        strides: perm.iter().map(|&p| l.strides[p]).collect(),
        offset: l.offset,
    }
}

fn permute(x: NDArray, axes: Option<&[usize]>, at: SourceLocation) -> Result<NDArray> {
    let id = engine::run_op_on("permute", &[x.id], at, |o| {
        let o = &o[0];
        let nd = o.layout.shape.ndim();
        let perm: Dims = match axes {
            None => (0..nd).rev().collect(),
            Some(axes) => {
                if axes.len() != nd {
                    return Err(NdError::invalid(
                        "permute",
                        format!("{} axes given for a {nd}-d array {}", axes.len(), o.desc()),
                    ));
                }
                let mut seen = Dims::from_elem(0, nd);
                for &a in axes {
                    if a >= nd {
                        return Err(NdError::AxisOutOfRange {
                            op: "permute",
                            axis: a as isize,
                            array: o.desc(),
                        });
                    }
                    seen[a] += 1;
                    if seen[a] > 1 {
                        return Err(NdError::invalid(
                            "permute",
                            format!("axis {a} repeated in {axes:?}"),
                        ));
                    }
                }
                Dims::from_slice(axes)
            }
        };
        Ok(Output::View {
            of: 0,
            layout: permuted(o.layout, &perm),
        })
    })?;
    autograd::record(&[x.id], id, || PermuteRule(axes.map(Dims::from_slice)));
    Ok(NDArray { id })
}

fn expand_dims(x: NDArray, axis: isize, at: SourceLocation) -> Result<NDArray> {
    let id = engine::run_op_on("expand_dims", &[x.id], at, |o| {
        let o = &o[0];
        let l = o.layout;
        let nd = l.shape.ndim();
        let ax = normalize_axis("expand_dims", axis, nd + 1, o)?;
        // The stride of a size-1 axis is never used; pick the contiguous one.
        let stride = if ax < nd {
            l.strides[ax] * l.shape.0[ax] as isize
        } else {
            1
        };
        let mut shape = l.shape.0.clone();
        let mut strides = l.strides.clone();
        shape.insert(ax, 1);
        strides.insert(ax, stride);
        Ok(Output::View {
            of: 0,
            layout: Layout {
                shape: Shape(shape),
                strides,
                offset: l.offset,
            },
        })
    })?;
    autograd::record(&[x.id], id, || ReshapeRule);
    Ok(NDArray { id })
}

fn squeeze(x: NDArray, axis: Option<isize>, at: SourceLocation) -> Result<NDArray> {
    let id = engine::run_op_on("squeeze", &[x.id], at, |o| {
        let o = &o[0];
        let l = o.layout;
        let keep: Dims = match axis {
            None => (0..l.shape.ndim()).filter(|&d| l.shape.0[d] != 1).collect(),
            Some(axis) => {
                let ax = normalize_axis("squeeze", axis, l.shape.ndim(), o)?;
                if l.shape.0[ax] != 1 {
                    return Err(NdError::shape(
                        "squeeze",
                        format!(
                            "axis {axis} of {} has size {}, not 1",
                            o.desc(),
                            l.shape.0[ax]
                        ),
                    ));
                }
                (0..l.shape.ndim()).filter(|&d| d != ax).collect()
            }
        };
        Ok(Output::View {
            of: 0,
            layout: permuted(l, &keep),
        })
    })?;
    autograd::record(&[x.id], id, || ReshapeRule);
    Ok(NDArray { id })
}

fn broadcast_to(x: NDArray, shape: Shape, at: SourceLocation) -> Result<NDArray> {
    let id = engine::run_op_on("broadcast_to", &[x.id], at, |o| {
        let o = &o[0];
        if shape.checked_size().is_none()
            || Shape::broadcast(o.shape(), &shape).as_ref() != Some(&shape)
        {
            return Err(NdError::shape(
                "broadcast_to",
                format!("cannot broadcast {} to {shape}", o.desc()),
            ));
        }
        #[cfg(feature = "gpu")]
        if let Some(g) = o.gpu() {
            let dst = Layout::contiguous(shape.clone());
            let ctx = g.buf.ctx();
            let buf = crate::backend::wgpu::gather::assemble(
                "broadcast_to",
                ctx,
                &shape,
                o.dtype,
                None,
                [(dst, g)],
            )?;
            return Ok(Output::device(buf, shape, o.dtype));
        }
        let strides = shape.contiguous_strides();
        let buf = dispatch!(o.dtype, T => new_filled::<T>(shape.size(), |out| {
            copy_strided::<T>(out, &strides, 0, o.into(), &shape)
        }))?;
        Ok(Output::New {
            buf,
            shape,
            dtype: o.dtype,
        })
    })?;
    autograd::record(&[x.id], id, || BroadcastToRule);
    Ok(NDArray { id })
}

/// Checks shared by concat and stack: one dtype (the list is not empty).
fn same_dtypes(op: &'static str, ops: &[Operand<'_>]) -> Result<()> {
    for b in &ops[1..] {
        super::ops::same_dtype(op, &ops[0], b)?;
    }
    Ok(())
}

/// Copy every operand into a new buffer of `shape`; operand `i` goes at
/// `bases[i]` with `dst_strides` (the output strides seen from the operand's axes).
fn gather(
    op: &'static str,
    ops: &[Operand<'_>],
    shape: &Shape,
    dst_strides: &Strides,
    bases: &[usize],
) -> Result<Output> {
    let dtype = ops[0].dtype;
    #[cfg(not(feature = "gpu"))]
    let _ = op;
    #[cfg(feature = "gpu")]
    if let Some(g) = ops[0].gpu() {
        let parts = ops.iter().zip(bases).map(|(o, &base)| {
            let dst = Layout {
                shape: o.shape().clone(),
                strides: dst_strides.clone(),
                offset: base,
            };
            (dst, o.gpu().expect("one device"))
        });
        let buf =
            crate::backend::wgpu::gather::assemble(op, g.buf.ctx(), shape, dtype, None, parts)?;
        return Ok(Output::device(buf, shape.clone(), dtype));
    }
    let buf = dispatch!(dtype, T => new_filled::<T>(shape.size(), |out| {
        for (o, &base) in ops.iter().zip(bases) {
            copy_strided::<T>(out, dst_strides, base, o.into(), o.shape());
        }
    }))?;
    Ok(Output::New {
        buf,
        shape: shape.clone(),
        dtype,
    })
}

fn concat(arrays: &[NDArray], axis: isize, at: SourceLocation) -> Result<NDArray> {
    if arrays.is_empty() {
        return Err(NdError::invalid("concat", "needs at least one array"));
    }
    let ids: Vec<_> = arrays.iter().map(|a| a.id).collect();
    let id = engine::run_op_on("concat", &ids, at, |ops| {
        same_dtypes("concat", ops)?;
        let first = &ops[0];
        let nd = first.shape().ndim();
        if nd == 0 {
            return Err(NdError::shape(
                "concat",
                format!("cannot concatenate 0-d arrays ({})", first.desc()),
            ));
        }
        let ax = normalize_axis("concat", axis, nd, first)?;
        let mut dims = first.shape().0.clone();
        dims[ax] = 0;
        for (i, b) in ops.iter().enumerate() {
            let bd = b.shape().dims();
            let compatible =
                bd.len() == nd && (0..nd).all(|d| d == ax || bd[d] == first.shape().0[d]);
            if !compatible {
                return Err(NdError::shape(
                    "concat",
                    format!(
                        "array {i} has shape {} but array 0 has {}; along axis {ax} only that axis may differ",
                        b.shape(),
                        first.shape()
                    ),
                ));
            }
            dims[ax] = dims[ax].checked_add(bd[ax]).ok_or_else(|| {
                NdError::shape(
                    "concat",
                    "the result has more elements than usize can count",
                )
            })?;
        }
        let shape = Shape(dims);
        if shape.checked_size().is_none() {
            return Err(NdError::shape("concat", format!("{shape} is too large")));
        }
        let strides = shape.contiguous_strides();
        let mut bases = Vec::with_capacity(ops.len());
        let mut at_axis = 0usize;
        for b in ops {
            bases.push(at_axis * strides[ax] as usize);
            at_axis += b.shape().0[ax];
        }
        gather("concat", ops, &shape, &strides, &bases)
    })?;
    autograd::record(&ids, id, || ConcatRule { axis, stack: false });
    Ok(NDArray { id })
}

fn stack(arrays: &[NDArray], axis: isize, at: SourceLocation) -> Result<NDArray> {
    if arrays.is_empty() {
        return Err(NdError::invalid("stack", "needs at least one array"));
    }
    let ids: Vec<_> = arrays.iter().map(|a| a.id).collect();
    let id = engine::run_op_on("stack", &ids, at, |ops| {
        same_dtypes("stack", ops)?;
        let first = &ops[0];
        for (i, b) in ops.iter().enumerate() {
            if b.shape() != first.shape() {
                return Err(NdError::shape(
                    "stack",
                    format!(
                        "array {i} has shape {} but array 0 has {}; all must be equal",
                        b.shape(),
                        first.shape()
                    ),
                ));
            }
        }
        let nd = first.shape().ndim();
        let ax = normalize_axis("stack", axis, nd + 1, first)?;
        let mut dims = first.shape().0.clone();
        dims.insert(ax, ops.len());
        let shape = Shape(dims);
        if shape.checked_size().is_none() {
            return Err(NdError::shape("stack", format!("{shape} is too large")));
        }
        let mut strides = shape.contiguous_strides();
        let step = strides.remove(ax) as usize;
        let bases: Vec<usize> = (0..ops.len()).map(|i| i * step).collect();
        gather("stack", ops, &shape, &strides, &bases)
    })?;
    autograd::record(&ids, id, || ConcatRule { axis, stack: true });
    Ok(NDArray { id })
}

fn to_dtype(x: NDArray, dtype: DType, at: SourceLocation) -> Result<NDArray> {
    convert(x, dtype, "to_dtype", at)
}

/// A copy of `x` on the CPU, the device of every array in this build (`to_device`).
pub(crate) fn to_cpu(x: NDArray, at: SourceLocation) -> Result<NDArray> {
    convert(x, x.try_dtype()?, "to_device", at)
}

/// A new contiguous array of `x`'s elements as `dtype`, recorded for autograd.
fn convert(x: NDArray, dtype: DType, op: &'static str, at: SourceLocation) -> Result<NDArray> {
    let id = engine::run_op_on(op, &[x.id], at, |o| {
        let o = &o[0];
        #[cfg(feature = "gpu")]
        if let Some(g) = o.gpu() {
            let buf = crate::backend::wgpu::kernels::convert(op, g, dtype)?;
            return Ok(Output::device(buf, o.shape().clone(), dtype));
        }
        Ok(Output::New {
            buf: cast(o, dtype)?,
            shape: o.shape().clone(),
            dtype,
        })
    })?;
    // The input's dtype is read when recording: the tape does not hold the input.
    autograd::record(&[x.id], id, || ToDTypeRule(x.try_dtype().unwrap_or(dtype)));
    Ok(NDArray { id })
}

impl NDArray {
    twins! {
        /// The same elements with another shape of the same size (numpy's `reshape`).
        ///
        /// A view sharing storage when the array is contiguous; otherwise (e.g. after
        /// `transpose`) a contiguous copy. Panics on error (see [`NDArray::try_reshape`]).
        ///
        /// ```
        /// use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let a = m.create(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
        /// let b = a.reshape([3, 2]);
        /// assert_eq!(b.shape().dims(), &[3, 2]);
        /// assert_eq!(b.to_vec::<f32>()?, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        /// assert_eq!(m.memory().live_buffers, 1); // b is a view of a
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn reshape,
        /// [`NDArray::reshape`]. Errors: `InvalidShape` when the element counts differ,
        /// `Closed`, `ManagerClosed`/`ManagerCapped`.
        pub fn try_reshape(self, shape: impl Into<Shape>) -> NDArray {
            reshape(self, shape.into(), Location::caller())
        }
    }

    twins! {
        /// Reshape where one dimension may be `-1`, inferred from the element count
        /// (numpy's `reshape(-1, 2)`). Panics on error.
        ///
        /// ```
        /// use ndscope::{DType, NDManager};
        /// let m = NDManager::new();
        /// let a = m.arange(0.0, 6.0, 1.0, DType::F32);
        /// assert_eq!(a.reshape_infer(&[-1, 2]).shape().dims(), &[3, 2]);
        /// ```
        pub fn reshape_infer,
        /// [`NDArray::reshape_infer`]. Errors: `InvalidShape` (more than one `-1`, other
        /// negative dims, element counts that do not divide), `Closed`.
        pub fn try_reshape_infer(self, dims: &[isize]) -> NDArray {
            reshape_infer(self, dims, Location::caller())
        }
    }

    twins! {
        /// A 1-D view (or copy, when not contiguous) of all elements in row-major order.
        /// Panics on error.
        pub fn flatten,
        /// [`NDArray::flatten`]. Errors: `Closed`, `ManagerClosed`/`ManagerCapped`.
        pub fn try_flatten(self) -> NDArray {
            self.try_flatten_at(Location::caller())
        }
    }

    fn try_flatten_at(self, at: SourceLocation) -> Result<NDArray> {
        reshape(self, Shape::from([self.try_shape()?.size()]), at)
    }

    twins! {
        /// A view with the axes reversed (a matrix transpose for 2-D arrays). Panics on
        /// error.
        ///
        /// ```
        /// use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let a = m.create(&[1, 2, 3, 4, 5, 6], [2, 3]);
        /// let t = a.transpose();
        /// assert_eq!(t.shape().dims(), &[3, 2]);
        /// assert_eq!(t.to_vec::<i32>()?, vec![1, 4, 2, 5, 3, 6]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn transpose,
        /// [`NDArray::transpose`]. Errors: `Closed`, `ManagerClosed`/`ManagerCapped`.
        pub fn try_transpose(self) -> NDArray {
            permute(self, None, Location::caller())
        }
    }

    twins! {
        /// A view with axis `i` of the result being axis `axes[i]` of `self` (numpy's
        /// `transpose(axes)`). Panics on error.
        ///
        /// ```
        /// use ndscope::{DType, NDManager};
        /// let m = NDManager::new();
        /// let a = m.zeros([2, 3, 4], DType::F32);
        /// assert_eq!(a.permute(&[2, 0, 1]).shape().dims(), &[4, 2, 3]);
        /// ```
        pub fn permute,
        /// [`NDArray::permute`]. Errors: `InvalidArgument` (wrong number of axes, repeated
        /// axis), `AxisOutOfRange`, `Closed`.
        pub fn try_permute(self, axes: &[usize]) -> NDArray {
            permute(self, Some(axes), Location::caller())
        }
    }

    twins! {
        /// A view with a new size-1 axis at position `axis` of the result (negative counts
        /// from the end: `-1` appends). Panics on error.
        ///
        /// ```
        /// use ndscope::{DType, NDManager};
        /// let m = NDManager::new();
        /// let a = m.zeros([2, 3], DType::F32);
        /// assert_eq!(a.expand_dims(0).shape().dims(), &[1, 2, 3]);
        /// assert_eq!(a.expand_dims(-1).shape().dims(), &[2, 3, 1]);
        /// ```
        pub fn expand_dims,
        /// [`NDArray::expand_dims`]. Errors: `AxisOutOfRange` (outside
        /// `-(ndim+1)..=ndim`), `Closed`.
        pub fn try_expand_dims(self, axis: isize) -> NDArray {
            expand_dims(self, axis, Location::caller())
        }
    }

    twins! {
        /// A view without its size-1 axes. Panics on error.
        ///
        /// ```
        /// use ndscope::{DType, NDManager};
        /// let m = NDManager::new();
        /// let a = m.zeros([1, 3, 1], DType::F32);
        /// assert_eq!(a.squeeze().shape().dims(), &[3]);
        /// assert_eq!(a.squeeze_axis(-1).shape().dims(), &[1, 3]);
        /// ```
        pub fn squeeze,
        /// [`NDArray::squeeze`]. Errors: `Closed`, `ManagerClosed`/`ManagerCapped`.
        pub fn try_squeeze(self) -> NDArray {
            squeeze(self, None, Location::caller())
        }
    }

    twins! {
        /// A view without axis `axis` (negative counts from the end), which must have
        /// size 1. Panics on error.
        pub fn squeeze_axis,
        /// [`NDArray::squeeze_axis`]. Errors: `AxisOutOfRange`, `InvalidShape` (the axis
        /// is not of size 1), `Closed`.
        pub fn try_squeeze_axis(self, axis: isize) -> NDArray {
            squeeze(self, Some(axis), Location::caller())
        }
    }

    twins! {
        /// A new array of `shape` holding `self` broadcast with numpy's rules.
        ///
        /// Unlike numpy this copies: a stride-0 view would make in-place writes through it
        /// write one element many times, so ndscope never creates one. Panics on error.
        ///
        /// ```
        /// use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let a = m.create(&[1, 2, 3], [3]);
        /// let b = a.broadcast_to([2, 3]);
        /// assert_eq!(b.to_vec::<i32>()?, vec![1, 2, 3, 1, 2, 3]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn broadcast_to,
        /// [`NDArray::broadcast_to`]. Errors: `InvalidShape` when `self` does not broadcast
        /// to `shape`, `Closed`, `OutOfMemory`.
        pub fn try_broadcast_to(self, shape: impl Into<Shape>) -> NDArray {
            broadcast_to(self, shape.into(), Location::caller())
        }
    }

    twins! {
        /// Join arrays along an existing axis (negative counts from the end) into a new
        /// array owned by the first array's manager. Panics on error.
        ///
        /// ```
        /// use ndscope::{NDArray, NDManager};
        /// let m = NDManager::new();
        /// let a = m.create(&[1, 2, 3, 4], [2, 2]);
        /// let b = m.create(&[5, 6], [2, 1]);
        /// let c = NDArray::concat(&[a, b], 1);
        /// assert_eq!(c.shape().dims(), &[2, 3]);
        /// assert_eq!(c.to_vec::<i32>()?, vec![1, 2, 5, 3, 4, 6]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn concat,

        /// [`NDArray::concat`]. Errors: `InvalidArgument` (empty list), `DTypeMismatch`,
        /// `InvalidShape` (0-d inputs, or shapes differing off `axis`), `AxisOutOfRange`,
        /// `Closed`.
        pub fn try_concat(arrays: &[NDArray], axis: isize) -> NDArray {
            concat(arrays, axis, Location::caller())
        }

        /// Join arrays of one shape along a new axis at position `axis` of the result
        /// (negative counts from the end) into a new array owned by the first array's
        /// manager. Panics on error.
        ///
        /// ```
        /// use ndscope::{NDArray, NDManager};
        /// let m = NDManager::new();
        /// let a = m.create(&[1, 2], [2]);
        /// let b = m.create(&[3, 4], [2]);
        /// assert_eq!(NDArray::stack(&[a, b], 0).to_vec::<i32>()?, vec![1, 2, 3, 4]);
        /// assert_eq!(NDArray::stack(&[a, b], 1).to_vec::<i32>()?, vec![1, 3, 2, 4]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn stack,

        /// [`NDArray::stack`]. Errors: `InvalidArgument` (empty list), `DTypeMismatch`,
        /// `InvalidShape` (shapes differ), `AxisOutOfRange`, `Closed`.
        pub fn try_stack(arrays: &[NDArray], axis: isize) -> NDArray {
            stack(arrays, axis, Location::caller())
        }
    }

    twins! {
        /// A new array with the elements converted to `dtype` (floats to integers truncate
        /// toward zero; anything to `Bool` is `x != 0`). Always copies. Panics on error.
        ///
        /// ```
        /// use ndscope::{DType, NDManager};
        /// let m = NDManager::new();
        /// let a = m.create(&[1.7f32, -2.5, 0.0], [3]);
        /// assert_eq!(a.to_dtype(DType::I32).to_vec::<i32>()?, vec![1, -2, 0]);
        /// assert_eq!(a.to_dtype(DType::Bool).to_vec::<bool>()?, vec![true, true, false]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn to_dtype,
        /// [`NDArray::to_dtype`]. Errors: `Closed`, `OutOfMemory`,
        /// `ManagerClosed`/`ManagerCapped`.
        pub fn try_to_dtype(self, dtype: DType) -> NDArray {
            to_dtype(self, dtype, Location::caller())
        }
    }
}

/// Convert between dtypes (through f64 for floats, i64 for integers).
pub(crate) fn cast(o: &Operand<'_>, to: DType) -> Result<cpu::Buffer> {
    let to_bool = to == DType::Bool;
    dispatch!(o.dtype, S => dispatch!(to, D => {
        if to_bool {
            cpu::map_unary::<S, D>(o, |x| D::from_i64((x != S::ZERO) as i64))
        } else if o.dtype.is_float() {
            cpu::map_unary::<S, D>(o, |x| D::from_f64(x.to_f64()))
        } else {
            cpu::map_unary::<S, D>(o, |x| D::from_i64(x.to_i64()))
        }
    }))
}

/// All ones of the input's shape stay all ones through a reshape or a permutation.
fn ones_through(cx: &BackwardCtx<'_>, g: &LazyGrad) -> Option<LazyGrads> {
    g.is_ones().then(|| {
        let ones = LazyGrad {
            base: Base::Ones(cx.shapes[0].clone()),
            scale: g.scale,
        };
        [Some(ones)].into_iter().collect()
    })
}

/// The gradient of reshape, flatten, expand_dims and squeeze: `g` in the input's shape.
struct ReshapeRule;

impl Backward for ReshapeRule {
    fn name(&self) -> &'static str {
        "reshape"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn backward_lazy(&self, cx: &BackwardCtx<'_>, g: LazyGrad) -> Result<LazyGrads> {
        ones_through(cx, &g).map_or_else(|| via_arrays(self, cx, g), Ok)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        Ok([Some(g.try_reshape(cx.shapes[0].clone())?)]
            .into_iter()
            .collect())
    }
}

/// The gradient of permute/transpose (`None`: the axes reversed): the inverse
/// permutation of `g`.
struct PermuteRule(Option<Dims>);

impl Backward for PermuteRule {
    fn name(&self) -> &'static str {
        "permute"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn backward_lazy(&self, cx: &BackwardCtx<'_>, g: LazyGrad) -> Result<LazyGrads> {
        ones_through(cx, &g).map_or_else(|| via_arrays(self, cx, g), Ok)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let nd = cx.shapes[0].ndim();
        let perm: Dims = self.0.clone().unwrap_or_else(|| (0..nd).rev().collect());
        let mut inv: Dims = Dims::from_elem(0, nd);
        for (i, &p) in perm.iter().enumerate() {
            inv[p] = i;
        }
        Ok([Some(g.try_permute(&inv)?)].into_iter().collect())
    }
}

/// The gradient of broadcast_to: `g` summed back to the input's shape (lazily).
struct BroadcastToRule;

impl Backward for BroadcastToRule {
    fn name(&self) -> &'static str {
        "broadcast_to"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn backward_lazy(&self, cx: &BackwardCtx<'_>, g: LazyGrad) -> Result<LazyGrads> {
        Ok([Some(g.unbroadcast(&cx.shapes[0])?)].into_iter().collect())
    }
    fn backward(&self, _: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        Ok([Some(g)].into_iter().collect())
    }
}

/// The gradient of concat (`stack == false`) or stack along `axis`: each input's part
/// of `g`.
struct ConcatRule {
    axis: isize,
    stack: bool,
}

impl Backward for ConcatRule {
    fn name(&self) -> &'static str {
        if self.stack { "stack" } else { "concat" }
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let nd = g.try_shape()?.ndim() as isize;
        let ax = if self.axis < 0 {
            self.axis + nd
        } else {
            self.axis
        } as usize;
        let mut r = autograd::nones(cx.ids.len());
        let mut start = 0usize;
        for (i, s) in cx.shapes.iter().enumerate() {
            let len = if self.stack { 1 } else { s.dims()[ax] };
            if cx.need(i) {
                let mut idx = ":,".repeat(ax);
                if self.stack {
                    idx.push_str(&start.to_string());
                } else {
                    idx.push_str(&format!("{start}:{}", start + len));
                }
                let part = g.try_get(&idx)?;
                // A contiguous copy, so later in-place accumulation never aliases g.
                r[i] = Some(part.try_reshape(s.clone())?.try_mul(1.0)?);
            }
            start += len;
        }
        Ok(r)
    }
}

/// The gradient of a float-to-float dtype conversion: `g` in the input's dtype.
struct ToDTypeRule(DType);

impl Backward for ToDTypeRule {
    fn name(&self) -> &'static str {
        "to_dtype"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn backward(&self, _: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        Ok([Some(g.try_to_dtype(self.0)?)].into_iter().collect())
    }
}
