//! Shape ops: reshape, transpose/permute, expand_dims/squeeze, flatten, broadcast_to,
//! concat/stack, dtype conversion, split, repeat, tile, pad, swap_axes, flip,
//! tril/triu and the `*_like` constructors.
//!
//! Ops that only reinterpret the layout (reshape of a contiguous array, transpose,
//! permute, expand_dims, squeeze) return views sharing the input's storage, as numpy
//! does. Ops that need new data (`broadcast_to`, `concat`, `stack`, `to_dtype`, and a
//! reshape of a non-contiguous array) copy into a new contiguous buffer.

use super::NDArray;
use super::axis::normalize_axis;
use crate::autograd::{self, Backward, BackwardCtx, Grads, Rule};
use crate::backend::cpu;
use crate::backend::cpu::copy::{fill_value, for_each_offset};
use crate::backend::cpu::gather::index_select_kernel;
use crate::backend::cpu::{new_filled, new_overwritten};
use crate::dtype::{Native, dispatch};
use crate::engine::{self, Layout, Operand, Output};
use crate::error::{NdError, Result, SourceLocation, unwrap};
use crate::layout::{Strides, for_each_row};
use crate::shape::Dims;
use crate::{DType, Shape};
use smallvec::smallvec;
use std::panic::Location;

/// Copy `src` (broadcast to `shape`) into `out`, element `(i..)` going to
/// `out_base + sum(i_k * out_strides[k])`.
fn copy_strided<T: Native>(
    out: &mut [T],
    out_strides: &[isize],
    out_base: usize,
    src: &Operand<'_>,
    shape: &Shape,
) {
    let data = src.data::<T>();
    let ss = src.layout.broadcast_strides(shape);
    for_each_row(
        shape.dims(),
        [out_strides, &ss],
        [out_base, src.layout.offset],
        |off, len, s| {
            let (o, i) = (off[0] as usize, off[1]);
            if s[0] == 1 && s[1] == 1 {
                out[o..o + len].copy_from_slice(&data[i as usize..i as usize + len]);
            } else {
                for k in 0..len as isize {
                    out[(off[0] + k * s[0]) as usize] = data[(i + k * s[1]) as usize];
                }
            }
        },
    );
}

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
    let (buf, _) = engine::materialize(o)?;
    Ok(Output::New {
        buf,
        shape,
        dtype: o.dtype,
    })
}

fn reshape(x: NDArray, shape: Shape, at: SourceLocation) -> Result<NDArray> {
    let id = engine::run_op("reshape", &[x.id], at, |o| {
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
    autograd::record(&[x.id], id, || Rule::Reshape);
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
    let id = engine::run_op("permute", &[x.id], at, |o| {
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
    autograd::record(&[x.id], id, || Rule::Permute(axes.map(Dims::from_slice)));
    Ok(NDArray { id })
}

fn expand_dims(x: NDArray, axis: isize, at: SourceLocation) -> Result<NDArray> {
    let id = engine::run_op("expand_dims", &[x.id], at, |o| {
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
    autograd::record(&[x.id], id, || Rule::Reshape);
    Ok(NDArray { id })
}

fn squeeze(x: NDArray, axis: Option<isize>, at: SourceLocation) -> Result<NDArray> {
    let id = engine::run_op("squeeze", &[x.id], at, |o| {
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
    autograd::record(&[x.id], id, || Rule::Reshape);
    Ok(NDArray { id })
}

fn broadcast_to(x: NDArray, shape: Shape, at: SourceLocation) -> Result<NDArray> {
    let id = engine::run_op("broadcast_to", &[x.id], at, |o| {
        let o = &o[0];
        if shape.checked_size().is_none()
            || Shape::broadcast(o.shape(), &shape).as_ref() != Some(&shape)
        {
            return Err(NdError::shape(
                "broadcast_to",
                format!("cannot broadcast {} to {shape}", o.desc()),
            ));
        }
        let strides = shape.contiguous_strides();
        let buf = dispatch!(o.dtype, T => new_filled::<T>(shape.size(), |out| {
            copy_strided::<T>(out, &strides, 0, o, &shape)
        }))?;
        Ok(Output::New {
            buf,
            shape,
            dtype: o.dtype,
        })
    })?;
    autograd::record(&[x.id], id, || Rule::BroadcastTo);
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
    ops: &[Operand<'_>],
    shape: &Shape,
    dst_strides: &Strides,
    bases: &[usize],
) -> Result<Output> {
    let dtype = ops[0].dtype;
    let buf = dispatch!(dtype, T => new_filled::<T>(shape.size(), |out| {
        for (o, &base) in ops.iter().zip(bases) {
            copy_strided::<T>(out, dst_strides, base, o, o.shape());
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
    let id = engine::run_op("concat", &ids, at, |ops| {
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
        gather(ops, &shape, &strides, &bases)
    })?;
    autograd::record(&ids, id, || Rule::Concat { axis, stack: false });
    Ok(NDArray { id })
}

fn stack(arrays: &[NDArray], axis: isize, at: SourceLocation) -> Result<NDArray> {
    if arrays.is_empty() {
        return Err(NdError::invalid("stack", "needs at least one array"));
    }
    let ids: Vec<_> = arrays.iter().map(|a| a.id).collect();
    let id = engine::run_op("stack", &ids, at, |ops| {
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
        gather(ops, &shape, &strides, &bases)
    })?;
    autograd::record(&ids, id, || Rule::Concat { axis, stack: true });
    Ok(NDArray { id })
}

fn to_dtype(x: NDArray, dtype: DType, at: SourceLocation) -> Result<NDArray> {
    let id = engine::run_op("to_dtype", &[x.id], at, |o| {
        let o = &o[0];
        Ok(Output::New {
            buf: cast(o, dtype)?,
            shape: o.shape().clone(),
            dtype,
        })
    })?;
    autograd::record(&[x.id], id, || Rule::ToDType);
    Ok(NDArray { id })
}

impl NDArray {
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
    #[track_caller]
    pub fn reshape(self, shape: impl Into<Shape>) -> NDArray {
        unwrap(reshape(self, shape.into(), Location::caller()))
    }

    /// [`NDArray::reshape`]. Errors: `InvalidShape` when the element counts differ,
    /// `Closed`, `ManagerClosed`/`ManagerCapped`.
    #[track_caller]
    pub fn try_reshape(self, shape: impl Into<Shape>) -> Result<NDArray> {
        reshape(self, shape.into(), Location::caller())
    }

    /// Reshape where one dimension may be `-1`, inferred from the element count
    /// (numpy's `reshape(-1, 2)`). Panics on error.
    ///
    /// ```
    /// use ndscope::{DType, NDManager};
    /// let m = NDManager::new();
    /// let a = m.arange(0.0, 6.0, 1.0, DType::F32);
    /// assert_eq!(a.reshape_infer(&[-1, 2]).shape().dims(), &[3, 2]);
    /// ```
    #[track_caller]
    pub fn reshape_infer(self, dims: &[isize]) -> NDArray {
        unwrap(reshape_infer(self, dims, Location::caller()))
    }

    /// [`NDArray::reshape_infer`]. Errors: `InvalidShape` (more than one `-1`, other
    /// negative dims, element counts that do not divide), `Closed`.
    #[track_caller]
    pub fn try_reshape_infer(self, dims: &[isize]) -> Result<NDArray> {
        reshape_infer(self, dims, Location::caller())
    }

    /// A 1-D view (or copy, when not contiguous) of all elements in row-major order.
    /// Panics on error.
    #[track_caller]
    pub fn flatten(self) -> NDArray {
        unwrap(self.try_flatten_at(Location::caller()))
    }

    /// [`NDArray::flatten`]. Errors: `Closed`, `ManagerClosed`/`ManagerCapped`.
    #[track_caller]
    pub fn try_flatten(self) -> Result<NDArray> {
        self.try_flatten_at(Location::caller())
    }

    fn try_flatten_at(self, at: SourceLocation) -> Result<NDArray> {
        reshape(self, Shape::from([self.try_shape()?.size()]), at)
    }

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
    #[track_caller]
    pub fn transpose(self) -> NDArray {
        unwrap(permute(self, None, Location::caller()))
    }

    /// [`NDArray::transpose`]. Errors: `Closed`, `ManagerClosed`/`ManagerCapped`.
    #[track_caller]
    pub fn try_transpose(self) -> Result<NDArray> {
        permute(self, None, Location::caller())
    }

    /// A view with axis `i` of the result being axis `axes[i]` of `self` (numpy's
    /// `transpose(axes)`). Panics on error.
    ///
    /// ```
    /// use ndscope::{DType, NDManager};
    /// let m = NDManager::new();
    /// let a = m.zeros([2, 3, 4], DType::F32);
    /// assert_eq!(a.permute(&[2, 0, 1]).shape().dims(), &[4, 2, 3]);
    /// ```
    #[track_caller]
    pub fn permute(self, axes: &[usize]) -> NDArray {
        unwrap(permute(self, Some(axes), Location::caller()))
    }

    /// [`NDArray::permute`]. Errors: `InvalidArgument` (wrong number of axes, repeated
    /// axis), `AxisOutOfRange`, `Closed`.
    #[track_caller]
    pub fn try_permute(self, axes: &[usize]) -> Result<NDArray> {
        permute(self, Some(axes), Location::caller())
    }

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
    #[track_caller]
    pub fn expand_dims(self, axis: isize) -> NDArray {
        unwrap(expand_dims(self, axis, Location::caller()))
    }

    /// [`NDArray::expand_dims`]. Errors: `AxisOutOfRange` (outside
    /// `-(ndim+1)..=ndim`), `Closed`.
    #[track_caller]
    pub fn try_expand_dims(self, axis: isize) -> Result<NDArray> {
        expand_dims(self, axis, Location::caller())
    }

    /// A view without its size-1 axes. Panics on error.
    ///
    /// ```
    /// use ndscope::{DType, NDManager};
    /// let m = NDManager::new();
    /// let a = m.zeros([1, 3, 1], DType::F32);
    /// assert_eq!(a.squeeze().shape().dims(), &[3]);
    /// assert_eq!(a.squeeze_axis(-1).shape().dims(), &[1, 3]);
    /// ```
    #[track_caller]
    pub fn squeeze(self) -> NDArray {
        unwrap(squeeze(self, None, Location::caller()))
    }

    /// [`NDArray::squeeze`]. Errors: `Closed`, `ManagerClosed`/`ManagerCapped`.
    #[track_caller]
    pub fn try_squeeze(self) -> Result<NDArray> {
        squeeze(self, None, Location::caller())
    }

    /// A view without axis `axis` (negative counts from the end), which must have
    /// size 1. Panics on error.
    #[track_caller]
    pub fn squeeze_axis(self, axis: isize) -> NDArray {
        unwrap(squeeze(self, Some(axis), Location::caller()))
    }

    /// [`NDArray::squeeze_axis`]. Errors: `AxisOutOfRange`, `InvalidShape` (the axis
    /// is not of size 1), `Closed`.
    #[track_caller]
    pub fn try_squeeze_axis(self, axis: isize) -> Result<NDArray> {
        squeeze(self, Some(axis), Location::caller())
    }

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
    #[track_caller]
    pub fn broadcast_to(self, shape: impl Into<Shape>) -> NDArray {
        unwrap(broadcast_to(self, shape.into(), Location::caller()))
    }

    /// [`NDArray::broadcast_to`]. Errors: `InvalidShape` when `self` does not broadcast
    /// to `shape`, `Closed`, `OutOfMemory`.
    #[track_caller]
    pub fn try_broadcast_to(self, shape: impl Into<Shape>) -> Result<NDArray> {
        broadcast_to(self, shape.into(), Location::caller())
    }

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
    #[track_caller]
    pub fn concat(arrays: &[NDArray], axis: isize) -> NDArray {
        unwrap(concat(arrays, axis, Location::caller()))
    }

    /// [`NDArray::concat`]. Errors: `InvalidArgument` (empty list), `DTypeMismatch`,
    /// `InvalidShape` (0-d inputs, or shapes differing off `axis`), `AxisOutOfRange`,
    /// `Closed`.
    #[track_caller]
    pub fn try_concat(arrays: &[NDArray], axis: isize) -> Result<NDArray> {
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
    #[track_caller]
    pub fn stack(arrays: &[NDArray], axis: isize) -> NDArray {
        unwrap(stack(arrays, axis, Location::caller()))
    }

    /// [`NDArray::stack`]. Errors: `InvalidArgument` (empty list), `DTypeMismatch`,
    /// `InvalidShape` (shapes differ), `AxisOutOfRange`, `Closed`.
    #[track_caller]
    pub fn try_stack(arrays: &[NDArray], axis: isize) -> Result<NDArray> {
        stack(arrays, axis, Location::caller())
    }

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
    #[track_caller]
    pub fn to_dtype(self, dtype: DType) -> NDArray {
        unwrap(to_dtype(self, dtype, Location::caller()))
    }

    /// [`NDArray::to_dtype`]. Errors: `Closed`, `OutOfMemory`,
    /// `ManagerClosed`/`ManagerCapped`.
    #[track_caller]
    pub fn try_to_dtype(self, dtype: DType) -> Result<NDArray> {
        to_dtype(self, dtype, Location::caller())
    }
}

// ------------------------------------------------------------------ split .. full_like
//
// `split`, `swap_axes` and `flip` return views; `repeat`, `tile`, `pad`, `tril`, `triu`
// and the `*_like` constructors new contiguous arrays. Each differentiable one records a
// rule kept beside it.

/// `out[i_0, .., i_n] = src[offset + sum_d maps[d][i_d] * strides[d]]`: a gather along
/// every axis at once (`tile` uses it with `i % n`). `out` has `prod(maps[d].len())`
/// elements, row-major.
pub(crate) fn gather_axes_kernel<T: Copy>(
    src: &[T],
    strides: &[isize],
    offset: usize,
    maps: &[Vec<usize>],
    out: &mut [T],
) {
    if out.is_empty() {
        return;
    }
    let nd = maps.len();
    if nd == 0 {
        out[0] = src[offset];
        return;
    }
    let (last, sl) = (&maps[nd - 1], strides[nd - 1]);
    let mut idx = vec![0usize; nd - 1];
    let mut w = 0;
    loop {
        let base = offset as isize
            + (0..nd - 1)
                .map(|d| maps[d][idx[d]] as isize * strides[d])
                .sum::<isize>();
        for &j in last {
            out[w] = src[(base + j as isize * sl) as usize];
            w += 1;
        }
        let mut d = nd - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < maps[d].len() {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// `tril` (`lower`) or `triu` over the last two axes of `l` (batched over the others):
/// element `(.., i, j)` is kept when `j - i <= k` (tril) or `j - i >= k` (triu), else 0.
pub(crate) fn tri_kernel<T: Native>(src: &[T], l: &Layout, k: i64, lower: bool, out: &mut [T]) {
    if out.is_empty() {
        return;
    }
    let (dims, nd) = (l.shape.dims(), l.shape.ndim());
    let (rows, cols) = (dims[nd - 2], dims[nd - 1]);
    let (sr, sc) = (l.strides[nd - 2], l.strides[nd - 1]);
    let mut w = 0;
    for_each_offset(
        &dims[..nd - 2],
        &l.strides[..nd - 2],
        l.offset as isize,
        |base| {
            for i in 0..rows {
                for j in 0..cols {
                    let d = j as i64 - i as i64;
                    let keep = if lower { d <= k } else { d >= k };
                    out[w] = if keep {
                        src[(base + i as isize * sr + j as isize * sc) as usize]
                    } else {
                        T::ZERO
                    };
                    w += 1;
                }
            }
        },
    );
}

/// A view of `len` positions from `start` along axis `ax` (already validated).
fn narrow(x: NDArray, ax: usize, start: usize, len: usize, at: SourceLocation) -> Result<NDArray> {
    let id = engine::run_op("split", &[x.id], at, |o| {
        let l = o[0].layout;
        let mut layout = l.clone();
        layout.shape.0[ax] = len;
        if len > 0 {
            layout.offset = (l.offset as isize + start as isize * l.strides[ax]) as usize;
        }
        Ok(Output::View { of: 0, layout })
    })?;
    autograd::record_custom(&[x.id], id, || NarrowRule { ax, start, len });
    Ok(NDArray { id })
}

/// The gradient of a part of `split`: `g` padded with zeros back to the input's shape.
struct NarrowRule {
    ax: usize,
    start: usize,
    len: usize,
}

impl Backward for NarrowRule {
    fn name(&self) -> &'static str {
        "split"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let dims = cx.shapes[0].dims();
        let widths: Vec<(usize, usize)> = (0..dims.len())
            .map(|d| {
                if d == self.ax {
                    (self.start, dims[d] - self.start - self.len)
                } else {
                    (0, 0)
                }
            })
            .collect();
        Ok(smallvec![Some(g.try_pad(&widths, 0.0)?)])
    }
}

fn split(x: NDArray, sections: usize, axis: isize, at: SourceLocation) -> Result<Vec<NDArray>> {
    const OP: &str = "split";
    // Validate everything first, so a failure creates nothing.
    let (ax, n) = engine::read(x.id, |o| -> Result<(usize, usize)> {
        let ax = normalize_axis(OP, axis, o.shape().ndim(), o)?;
        let n = o.shape().dims()[ax];
        if sections == 0 || n % sections != 0 {
            return Err(NdError::invalid(
                OP,
                format!(
                    "axis {ax} of {} has size {n}, which cannot be split into {sections} \
                     equal sections",
                    o.desc()
                ),
            ));
        }
        Ok((ax, n))
    })??;
    let len = n / sections;
    let mut parts = Vec::with_capacity(sections);
    for i in 0..sections {
        match narrow(x, ax, i * len, len, at) {
            Ok(p) => parts.push(p),
            Err(e) => {
                for p in parts {
                    p.close();
                }
                return Err(e);
            }
        }
    }
    Ok(parts)
}

fn repeat(x: NDArray, repeats: usize, axis: isize, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "repeat";
    let id = engine::run_op(OP, &[x.id], at, |o| {
        let a = &o[0];
        let ax = normalize_axis(OP, axis, a.shape().ndim(), a)?;
        let mut dims = a.shape().0.clone();
        let n = dims[ax];
        let too_large =
            || NdError::shape(OP, format!("the result of {repeats} repeats is too large"));
        dims[ax] = n.checked_mul(repeats).ok_or_else(too_large)?;
        let shape = Shape(dims);
        let total = shape.checked_size().ok_or_else(too_large)?;
        let idx: Vec<usize> = (0..n)
            .flat_map(|i| std::iter::repeat_n(i, repeats))
            .collect();
        let buf = dispatch!(a.dtype, T => new_overwritten::<T>(total, |out| {
            index_select_kernel(a.data::<T>(), a.layout, ax, &idx, out)
        }))?;
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    autograd::record_custom(&[x.id], id, || RepeatRule { axis, repeats });
    Ok(NDArray { id })
}

/// `repeat`'s gradient: the `repeats` copies of each element summed.
struct RepeatRule {
    axis: isize,
    repeats: usize,
}

impl Backward for RepeatRule {
    fn name(&self) -> &'static str {
        "repeat"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let xs = &cx.shapes[0];
        let nd = xs.ndim() as isize;
        let ax = if self.axis < 0 {
            self.axis + nd
        } else {
            self.axis
        } as usize;
        let mut dims = xs.0.clone();
        dims.insert(ax + 1, self.repeats);
        let gx = g
            .try_reshape(Shape(dims))?
            .try_sum_axes(&[ax as isize + 1], false)?;
        Ok(smallvec![Some(gx)])
    }
}

/// `self`'s dims and `reps`, both left-padded with 1s to the same length (numpy's
/// `tile` promotion).
fn tile_dims(x: &[usize], reps: &[usize]) -> (Dims, Dims) {
    let nd = x.len().max(reps.len());
    let pad = |v: &[usize]| -> Dims {
        std::iter::repeat_n(1, nd - v.len())
            .chain(v.iter().copied())
            .collect()
    };
    (pad(x), pad(reps))
}

fn tile(x: NDArray, reps: &[usize], at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "tile";
    let id = engine::run_op(OP, &[x.id], at, |o| {
        let a = &o[0];
        let (xd, rd) = tile_dims(a.shape().dims(), reps);
        let extra = xd.len() - a.shape().ndim();
        let mut dims = Dims::new();
        for (&n, &r) in xd.iter().zip(&rd) {
            dims.push(n.checked_mul(r).ok_or_else(|| {
                NdError::shape(OP, format!("tiling {} by {reps:?} is too large", a.shape()))
            })?);
        }
        let shape = Shape(dims);
        let total = shape.checked_size().ok_or_else(|| {
            NdError::shape(OP, format!("tiling {} by {reps:?} is too large", a.shape()))
        })?;
        let strides: Strides = std::iter::repeat_n(0, extra)
            .chain(a.layout.strides.iter().copied())
            .collect();
        let maps: Vec<Vec<usize>> = xd
            .iter()
            .zip(shape.dims())
            .map(|(&n, &len)| (0..len).map(|i| i % n.max(1)).collect())
            .collect();
        let buf = dispatch!(a.dtype, T => new_overwritten::<T>(total, |out| {
            gather_axes_kernel(a.data::<T>(), &strides, a.layout.offset, &maps, out)
        }))?;
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    let reps: Dims = Dims::from_slice(reps);
    autograd::record_custom(&[x.id], id, || TileRule { reps });
    Ok(NDArray { id })
}

/// `tile`'s gradient: the tiles summed (`g` seen as `[r0, n0, r1, n1, ..]`, summed
/// over the `r` axes).
struct TileRule {
    reps: Dims,
}

impl Backward for TileRule {
    fn name(&self) -> &'static str {
        "tile"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let xs = &cx.shapes[0];
        let (xd, rd) = tile_dims(xs.dims(), &self.reps);
        let split: Dims = rd.iter().zip(&xd).flat_map(|(&r, &n)| [r, n]).collect();
        let axes: Vec<isize> = (0..xd.len() as isize).map(|d| 2 * d).collect();
        let summed = g.try_reshape(Shape(split))?.try_sum_axes(&axes, false)?;
        Ok(smallvec![Some(summed.try_reshape(xs.clone())?)])
    }
}

fn pad(x: NDArray, widths: &[(usize, usize)], value: f64, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "pad";
    let id = engine::run_op(OP, &[x.id], at, |o| {
        let a = &o[0];
        let ad = a.shape().dims();
        if widths.len() != ad.len() {
            return Err(NdError::invalid(
                OP,
                format!(
                    "{} (before, after) pairs given for the {}-d array {}; need one per axis",
                    widths.len(),
                    ad.len(),
                    a.desc()
                ),
            ));
        }
        let too_large = || {
            NdError::shape(
                OP,
                format!("padding {} by {widths:?} is too large", a.shape()),
            )
        };
        let mut dims = Dims::new();
        for (&n, &(b, e)) in ad.iter().zip(widths) {
            dims.push(
                n.checked_add(b)
                    .and_then(|v| v.checked_add(e))
                    .ok_or_else(too_large)?,
            );
        }
        let shape = Shape(dims);
        let total = shape.checked_size().ok_or_else(too_large)?;
        let os = shape.contiguous_strides();
        let base: usize = widths
            .iter()
            .zip(&os)
            .map(|(&(b, _), &s)| b * s as usize)
            .sum();
        let buf = dispatch!(a.dtype, T => {
            let v: T = fill_value(OP, value, a.dtype)?;
            new_overwritten::<T>(total, |out| {
                out.fill(v);
                if total > 0 {
                    copy_strided::<T>(out, &os, base, a, a.shape());
                }
            })?
        });
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    let widths: Vec<(usize, usize)> = widths.to_vec();
    autograd::record_custom(&[x.id], id, || PadRule { widths });
    Ok(NDArray { id })
}

/// `pad`'s gradient: the interior of `g`.
struct PadRule {
    widths: Vec<(usize, usize)>,
}

impl Backward for PadRule {
    fn name(&self) -> &'static str {
        "pad"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let index: Vec<String> = self
            .widths
            .iter()
            .zip(cx.shapes[0].dims())
            .map(|(&(b, _), &n)| format!("{b}:{}", b + n))
            .collect();
        Ok(smallvec![Some(g.try_get(&index.join(","))?)])
    }
}

fn swap_axes(x: NDArray, a: isize, b: isize, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "swap_axes";
    let id = engine::run_op(OP, &[x.id], at, |o| {
        let o = &o[0];
        let nd = o.shape().ndim();
        let (i, j) = (normalize_axis(OP, a, nd, o)?, normalize_axis(OP, b, nd, o)?);
        let mut perm: Dims = (0..nd).collect();
        perm.swap(i, j);
        Ok(Output::View {
            of: 0,
            layout: permuted(o.layout, &perm),
        })
    })?;
    autograd::record_custom(&[x.id], id, || SwapAxesRule { a, b });
    Ok(NDArray { id })
}

/// `swap_axes`'s gradient: the same swap.
struct SwapAxesRule {
    a: isize,
    b: isize,
}

impl Backward for SwapAxesRule {
    fn name(&self) -> &'static str {
        "swap_axes"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn backward(&self, _: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        Ok(smallvec![Some(g.try_swap_axes(self.a, self.b)?)])
    }
}

fn flip(x: NDArray, axes: &[isize], at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "flip";
    let id = engine::run_op(OP, &[x.id], at, |o| {
        let o = &o[0];
        let nd = o.shape().ndim();
        let mut layout = o.layout.clone();
        let mut seen = vec![false; nd];
        let mut offset = layout.offset as isize;
        for &axis in axes {
            let d = normalize_axis(OP, axis, nd, o)?;
            if std::mem::replace(&mut seen[d], true) {
                return Err(NdError::invalid(
                    OP,
                    format!("axis {axis} repeated in {axes:?}"),
                ));
            }
            let n = layout.shape.0[d];
            if n > 0 {
                offset += (n as isize - 1) * layout.strides[d];
            }
            layout.strides[d] = -layout.strides[d];
        }
        layout.offset = offset as usize;
        Ok(Output::View { of: 0, layout })
    })?;
    let axes: Vec<isize> = axes.to_vec();
    autograd::record_custom(&[x.id], id, || FlipRule { axes });
    Ok(NDArray { id })
}

/// `flip`'s gradient: the same flip.
struct FlipRule {
    axes: Vec<isize>,
}

impl Backward for FlipRule {
    fn name(&self) -> &'static str {
        "flip"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn backward(&self, _: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        Ok(smallvec![Some(g.try_flip(&self.axes)?)])
    }
}

fn tri(x: NDArray, k: i64, lower: bool, at: SourceLocation) -> Result<NDArray> {
    let op = if lower { "tril" } else { "triu" };
    let id = engine::run_op(op, &[x.id], at, |o| {
        let a = &o[0];
        if a.shape().ndim() < 2 {
            return Err(NdError::shape(
                op,
                format!(
                    "needs at least 2 dims (a matrix or a batch of them), got {}",
                    a.desc()
                ),
            ));
        }
        let n = a.layout.size();
        let buf = dispatch!(a.dtype, T => new_overwritten::<T>(n, |out| {
            tri_kernel(a.data::<T>(), a.layout, k, lower, out)
        }))?;
        Ok(Output::New {
            buf,
            shape: a.shape().clone(),
            dtype: a.dtype,
        })
    })?;
    autograd::record_custom(&[x.id], id, || TriRule { k, lower });
    Ok(NDArray { id })
}

/// `tril`/`triu`'s gradient: the same triangle of `g`.
struct TriRule {
    k: i64,
    lower: bool,
}

impl Backward for TriRule {
    fn name(&self) -> &'static str {
        if self.lower { "tril" } else { "triu" }
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn backward(&self, _: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        Ok(smallvec![Some(if self.lower {
            g.try_tril(self.k)?
        } else {
            g.try_triu(self.k)?
        })])
    }
}

fn full_like(x: NDArray, value: f64, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "full_like";
    let id = engine::run_op(OP, &[x.id], at, |o| {
        let a = &o[0];
        let n = a.layout.size();
        let buf = dispatch!(a.dtype, T => {
            let v: T = fill_value(OP, value, a.dtype)?;
            new_overwritten::<T>(n, |out| out.fill(v))?
        });
        Ok(Output::New {
            buf,
            shape: a.shape().clone(),
            dtype: a.dtype,
        })
    })?;
    Ok(NDArray { id })
}

impl NDArray {
    /// Split into `sections` equal parts along `axis` (negative counts from the end):
    /// numpy's `split(x, sections, axis)`, PyTorch's `chunk` for a divisible size. The
    /// parts are views sharing `self`'s storage. An axis whose size `sections` does not
    /// divide is an error (numpy's `array_split` would make unequal parts).
    /// Differentiable: each part's gradient lands in its slice of the input. Panics on
    /// error.
    ///
    /// ```
    /// use ndscope::{DType, NDManager};
    /// let m = NDManager::new();
    /// let x = m.arange(0.0, 6.0, 1.0, DType::F32).reshape([2, 3]);
    /// let cols = x.split(3, -1);
    /// assert_eq!(cols.len(), 3);
    /// assert_eq!(cols[1].to_vec::<f32>()?, vec![1.0, 4.0]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn split(self, sections: usize, axis: isize) -> Vec<NDArray> {
        unwrap(split(self, sections, axis, Location::caller()))
    }

    /// [`NDArray::split`]. Errors: `InvalidArgument` (`sections` is 0 or does not
    /// divide the axis), `AxisOutOfRange` (also for a 0-d array), `Closed`. Nothing is
    /// created on error.
    #[track_caller]
    pub fn try_split(self, sections: usize, axis: isize) -> Result<Vec<NDArray>> {
        split(self, sections, axis, Location::caller())
    }

    /// Repeat each element `repeats` times along `axis` (numpy's `repeat(x, repeats,
    /// axis)`, PyTorch's `repeat_interleave`): `[1, 2]` becomes `[1, 1, 2, 2]`. Every
    /// dtype; `repeats == 0` gives an empty axis. Differentiable. Panics on error.
    ///
    /// ```
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let x = m.create(&[1, 2, 3, 4], [2, 2]);
    /// assert_eq!(x.repeat(2, 0).to_vec::<i32>()?, vec![1, 2, 1, 2, 3, 4, 3, 4]);
    /// assert_eq!(x.repeat(2, -1).to_vec::<i32>()?, vec![1, 1, 2, 2, 3, 3, 4, 4]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn repeat(self, repeats: usize, axis: isize) -> NDArray {
        unwrap(repeat(self, repeats, axis, Location::caller()))
    }

    /// [`NDArray::repeat`]. Errors: `AxisOutOfRange` (also for a 0-d array),
    /// `InvalidShape` (the result is too large), `Closed`.
    #[track_caller]
    pub fn try_repeat(self, repeats: usize, axis: isize) -> Result<NDArray> {
        repeat(self, repeats, axis, Location::caller())
    }

    /// The whole array repeated `reps[d]` times along each axis (numpy's `tile`): when
    /// `reps` is shorter than the shape it is padded with leading 1s; when longer, the
    /// array gets leading size-1 axes. Every dtype. Differentiable. Panics on error.
    ///
    /// ```
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let x = m.create(&[1, 2], [2]);
    /// assert_eq!(x.tile(&[3]).to_vec::<i32>()?, vec![1, 2, 1, 2, 1, 2]);
    /// let t = x.tile(&[2, 1]);
    /// assert_eq!(t.shape().dims(), &[2, 2]);
    /// assert_eq!(t.to_vec::<i32>()?, vec![1, 2, 1, 2]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn tile(self, reps: &[usize]) -> NDArray {
        unwrap(tile(self, reps, Location::caller()))
    }

    /// [`NDArray::tile`]. Errors: `InvalidShape` (the result is too large), `Closed`.
    #[track_caller]
    pub fn try_tile(self, reps: &[usize]) -> Result<NDArray> {
        tile(self, reps, Location::caller())
    }

    /// Pad with the constant `value`: `widths[d] = (before, after)` elements are added
    /// along axis `d`, one pair per axis (numpy's `pad(x, widths,
    /// constant_values=value)`). The value is converted to the dtype (integers truncate;
    /// Bool stores `value != 0`). Differentiable: the gradient is the interior of `g`.
    /// Panics on error.
    ///
    /// ```
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let x = m.create(&[1.0f32, 2.0], [1, 2]);
    /// let p = x.pad(&[(1, 0), (0, 1)], 9.0);
    /// assert_eq!(p.shape().dims(), &[2, 3]);
    /// assert_eq!(p.to_vec::<f32>()?, vec![9.0, 9.0, 9.0, 1.0, 2.0, 9.0]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn pad(self, widths: &[(usize, usize)], value: f64) -> NDArray {
        unwrap(pad(self, widths, value, Location::caller()))
    }

    /// [`NDArray::pad`]. Errors: `InvalidArgument` (not one pair per axis, or a NaN or
    /// infinite value for an integer array), `InvalidShape` (too large), `Closed`.
    #[track_caller]
    pub fn try_pad(self, widths: &[(usize, usize)], value: f64) -> Result<NDArray> {
        pad(self, widths, value, Location::caller())
    }

    /// A view with axes `a` and `b` exchanged (negative counts from the end; numpy's
    /// `swapaxes`, PyTorch's `transpose(a, b)`). Differentiable. Panics on error.
    ///
    /// ```
    /// use ndscope::{DType, NDManager};
    /// let m = NDManager::new();
    /// let x = m.zeros([2, 3, 4], DType::F32);
    /// assert_eq!(x.swap_axes(0, -1).shape().dims(), &[4, 3, 2]);
    /// ```
    #[track_caller]
    pub fn swap_axes(self, a: isize, b: isize) -> NDArray {
        unwrap(swap_axes(self, a, b, Location::caller()))
    }

    /// [`NDArray::swap_axes`]. Errors: `AxisOutOfRange`, `Closed`.
    #[track_caller]
    pub fn try_swap_axes(self, a: isize, b: isize) -> Result<NDArray> {
        swap_axes(self, a, b, Location::caller())
    }

    /// A view with the order of the elements reversed along each of `axes` (negative
    /// counts from the end; numpy's `flip(x, axes)`). An empty list flips nothing
    /// (numpy's `flip(x, axis=None)`, flipping all axes, is `flip(&[0, 1, ..])` here).
    /// Differentiable. Panics on error.
    ///
    /// ```
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let x = m.create(&[1, 2, 3, 4, 5, 6], [2, 3]);
    /// assert_eq!(x.flip(&[-1]).to_vec::<i32>()?, vec![3, 2, 1, 6, 5, 4]);
    /// assert_eq!(x.flip(&[0, 1]).to_vec::<i32>()?, vec![6, 5, 4, 3, 2, 1]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn flip(self, axes: &[isize]) -> NDArray {
        unwrap(flip(self, axes, Location::caller()))
    }

    /// [`NDArray::flip`]. Errors: `AxisOutOfRange`, `InvalidArgument` (an axis
    /// repeated), `Closed`.
    #[track_caller]
    pub fn try_flip(self, axes: &[isize]) -> Result<NDArray> {
        flip(self, axes, Location::caller())
    }

    /// The lower triangle of the last two axes (batched over the others): element
    /// `(.., i, j)` is kept when `j - i <= k`, else 0 (numpy's and PyTorch's `tril`;
    /// `k = 0` is the main diagonal, `k < 0` below it). Every dtype (Bool: false).
    /// Differentiable. Panics on error.
    ///
    /// ```
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let x = m.create(&[1, 2, 3, 4, 5, 6, 7, 8, 9], [3, 3]);
    /// assert_eq!(x.tril(0).to_vec::<i32>()?, vec![1, 0, 0, 4, 5, 0, 7, 8, 9]);
    /// assert_eq!(x.tril(-1).to_vec::<i32>()?, vec![0, 0, 0, 4, 0, 0, 7, 8, 0]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn tril(self, k: i64) -> NDArray {
        unwrap(tri(self, k, true, Location::caller()))
    }

    /// [`NDArray::tril`]. Errors: `InvalidShape` (fewer than 2 dims), `Closed`.
    #[track_caller]
    pub fn try_tril(self, k: i64) -> Result<NDArray> {
        tri(self, k, true, Location::caller())
    }

    /// The upper triangle of the last two axes (batched): element `(.., i, j)` is kept
    /// when `j - i >= k`, else 0 (numpy's and PyTorch's `triu`). Every dtype.
    /// Differentiable. Panics on error.
    ///
    /// ```
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let x = m.create(&[1, 2, 3, 4], [2, 2]);
    /// assert_eq!(x.triu(0).to_vec::<i32>()?, vec![1, 2, 0, 4]);
    /// assert_eq!(x.triu(1).to_vec::<i32>()?, vec![0, 2, 0, 0]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn triu(self, k: i64) -> NDArray {
        unwrap(tri(self, k, false, Location::caller()))
    }

    /// [`NDArray::triu`]. Errors: `InvalidShape` (fewer than 2 dims), `Closed`.
    #[track_caller]
    pub fn try_triu(self, k: i64) -> Result<NDArray> {
        tri(self, k, false, Location::caller())
    }

    /// Zeros of `self`'s shape and dtype, owned by its manager. Not differentiable (the
    /// result does not depend on `self`'s values). Panics if `self` is closed.
    ///
    /// ```
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let x = m.create(&[1.5f64, 2.5], [2]);
    /// assert_eq!(x.zeros_like().to_vec::<f64>()?, vec![0.0, 0.0]);
    /// assert_eq!(x.ones_like().to_vec::<f64>()?, vec![1.0, 1.0]);
    /// assert_eq!(x.full_like(7.0).to_vec::<f64>()?, vec![7.0, 7.0]);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn zeros_like(self) -> NDArray {
        unwrap(full_like(self, 0.0, Location::caller()))
    }

    /// [`NDArray::zeros_like`]. Errors: `Closed`, `ManagerClosed`/`ManagerCapped`.
    /// Not differentiable: the values do not depend on `self`.
    #[track_caller]
    pub fn try_zeros_like(self) -> Result<NDArray> {
        full_like(self, 0.0, Location::caller())
    }

    /// Ones of `self`'s shape and dtype (Bool: true). Not differentiable. Panics if
    /// `self` is closed.
    #[track_caller]
    pub fn ones_like(self) -> NDArray {
        unwrap(full_like(self, 1.0, Location::caller()))
    }

    /// [`NDArray::ones_like`]. Errors: `Closed`, `ManagerClosed`/`ManagerCapped`.
    /// Not differentiable: the values do not depend on `self`.
    #[track_caller]
    pub fn try_ones_like(self) -> Result<NDArray> {
        full_like(self, 1.0, Location::caller())
    }

    /// `value` (converted to the dtype: integers truncate, Bool stores `value != 0`) in
    /// an array of `self`'s shape and dtype. Not differentiable. Panics on error.
    #[track_caller]
    pub fn full_like(self, value: f64) -> NDArray {
        unwrap(full_like(self, value, Location::caller()))
    }

    /// [`NDArray::full_like`]. Errors: `InvalidArgument` (a NaN or infinite value for
    /// an integer array), `Closed`, `ManagerClosed`/`ManagerCapped`.
    /// Not differentiable: the values do not depend on `self`.
    #[track_caller]
    pub fn try_full_like(self, value: f64) -> Result<NDArray> {
        full_like(self, value, Location::caller())
    }
}

/// Convert between dtypes (through f64 for floats, i64 for integers).
fn cast(o: &Operand<'_>, to: DType) -> Result<cpu::Buffer> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_axes_tiles_and_handles_scalars() {
        let src = [1, 2, 3];
        let mut out = [0; 6];
        gather_axes_kernel(&src, &[0, 1], 0, &[vec![0, 0], vec![0, 1, 2]], &mut out);
        assert_eq!(out, [1, 2, 3, 1, 2, 3]);
        let mut one = [0];
        gather_axes_kernel(&src, &[], 2, &[], &mut one);
        assert_eq!(one, [3]);
    }

    #[test]
    fn triangles() {
        let src: Vec<i64> = (1..=6).collect(); // [[1,2,3],[4,5,6]]
        let l = Layout::contiguous(Shape::from([2, 3]));
        let mut out = vec![0; 6];
        tri_kernel(&src, &l, 0, true, &mut out);
        assert_eq!(out, vec![1, 0, 0, 4, 5, 0]);
        tri_kernel(&src, &l, 1, false, &mut out);
        assert_eq!(out, vec![0, 2, 3, 0, 0, 6]);
    }
}
