//! Shape ops that rearrange or fill: `split`, `repeat`, `tile`, `pad`, `swap_axes`,
//! `flip`, `tril`/`triu` and the `*_like` constructors.
//!
//! `split`, `swap_axes` and `flip` return views; `repeat`, `tile`, `pad`, `tril`, `triu`
//! and the `*_like` constructors new contiguous arrays. Each differentiable one records a
//! rule kept beside it.

use super::permuted;
use crate::array::NDArray;
use crate::array::axis::normalize_axis;
use crate::array::gather::picked_on_device;
use crate::autograd::{self, Backward, BackwardCtx, Grads};
use crate::backend::cpu::copy::{copy_strided, fill_value, gather_axes_kernel, tri_kernel};
use crate::backend::cpu::gather::index_select_kernel;
use crate::backend::cpu::new_overwritten;
use crate::dtype::dispatch;
use crate::engine::{self, Output};
use crate::error::{NdError, Result, SourceLocation, twins};
use crate::layout::Strides;
use crate::shape::{Dims, Shape};
use smallvec::smallvec;
use std::panic::Location;

/// A view of `len` positions from `start` along axis `ax` (already validated).
fn narrow(x: NDArray, ax: usize, start: usize, len: usize, at: SourceLocation) -> Result<NDArray> {
    let id = engine::run_op_on("split", &[x.id], at, |o| {
        let l = o[0].layout;
        let mut layout = l.clone();
        layout.shape.0[ax] = len;
        if len > 0 {
            layout.offset = (l.offset as isize + start as isize * l.strides[ax]) as usize;
        }
        Ok(Output::View { of: 0, layout })
    })?;
    autograd::record(&[x.id], id, || NarrowRule { ax, start, len });
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
    let id = engine::run_op_on(OP, &[x.id], at, |o| {
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
        if let Some(out) = picked_on_device(OP, a, &shape, |ids, out| {
            index_select_kernel(ids, a.layout, ax, &idx, out)
        })? {
            return Ok(out);
        }
        let buf = dispatch!(a.dtype, T => new_overwritten::<T>(total, |out| {
            index_select_kernel(a.data::<T>(), a.layout, ax, &idx, out)
        }))?;
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    autograd::record(&[x.id], id, || RepeatRule { axis, repeats });
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
    let id = engine::run_op_on(OP, &[x.id], at, |o| {
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
        if let Some(out) = picked_on_device(OP, a, &shape, |ids, out| {
            gather_axes_kernel(ids, &strides, a.layout.offset, &maps, out)
        })? {
            return Ok(out);
        }
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
    autograd::record(&[x.id], id, || TileRule { reps });
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
    let id = engine::run_op_on(OP, &[x.id], at, |o| {
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
        #[cfg(feature = "gpu")]
        if let Some(g) = a.gpu() {
            dispatch!(a.dtype, T => fill_value::<T>(OP, value, a.dtype).map(|_| ()))?;
            let dst = crate::engine::Layout {
                shape: a.shape().clone(),
                strides: os,
                offset: base,
            };
            let ctx = g.buf.ctx();
            let buf = crate::backend::wgpu::gather::assemble(
                OP,
                ctx,
                &shape,
                a.dtype,
                Some(value),
                [(dst, g)],
            )?;
            return Ok(Output::device(buf, shape, a.dtype));
        }
        let buf = dispatch!(a.dtype, T => {
            let v: T = fill_value(OP, value, a.dtype)?;
            new_overwritten::<T>(total, |out| {
                out.fill(v);
                if total > 0 {
                    copy_strided::<T>(out, &os, base, a.into(), a.shape());
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
    autograd::record(&[x.id], id, || PadRule { widths });
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
    let id = engine::run_op_on(OP, &[x.id], at, |o| {
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
    autograd::record(&[x.id], id, || SwapAxesRule { a, b });
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
    let id = engine::run_op_on(OP, &[x.id], at, |o| {
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
    autograd::record(&[x.id], id, || FlipRule { axes });
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
    let id = engine::run_op_on(op, &[x.id], at, |o| {
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
        #[cfg(feature = "gpu")]
        if let Some(ga) = a.gpu() {
            let buf = crate::backend::wgpu::math::tri(ga, k, lower)?;
            return Ok(Output::device(buf, a.shape().clone(), a.dtype));
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
    autograd::record(&[x.id], id, || TriRule { k, lower });
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
    let (shape, dtype) = (x.try_shape()?, x.try_dtype()?);
    let id = engine::full_beside(x.id, shape, value, dtype, at)?;
    Ok(NDArray { id })
}

impl NDArray {
    twins! {
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
        pub fn split,
        /// [`NDArray::split`]. Errors: `InvalidArgument` (`sections` is 0 or does not
        /// divide the axis), `AxisOutOfRange` (also for a 0-d array), `Closed`. Nothing is
        /// created on error.
        pub fn try_split(self, sections: usize, axis: isize) -> Vec<NDArray> {
            split(self, sections, axis, Location::caller())
        }
    }

    twins! {
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
        pub fn repeat,
        /// [`NDArray::repeat`]. Errors: `AxisOutOfRange` (also for a 0-d array),
        /// `InvalidShape` (the result is too large), `Closed`.
        pub fn try_repeat(self, repeats: usize, axis: isize) -> NDArray {
            repeat(self, repeats, axis, Location::caller())
        }
    }

    twins! {
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
        pub fn tile,
        /// [`NDArray::tile`]. Errors: `InvalidShape` (the result is too large), `Closed`.
        pub fn try_tile(self, reps: &[usize]) -> NDArray {
            tile(self, reps, Location::caller())
        }
    }

    twins! {
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
        pub fn pad,
        /// [`NDArray::pad`]. Errors: `InvalidArgument` (not one pair per axis, or a NaN or
        /// infinite value for an integer array), `InvalidShape` (too large), `Closed`.
        pub fn try_pad(self, widths: &[(usize, usize)], value: f64) -> NDArray {
            pad(self, widths, value, Location::caller())
        }
    }

    twins! {
        /// A view with axes `a` and `b` exchanged (negative counts from the end; numpy's
        /// `swapaxes`, PyTorch's `transpose(a, b)`). Differentiable. Panics on error.
        ///
        /// ```
        /// use ndscope::{DType, NDManager};
        /// let m = NDManager::new();
        /// let x = m.zeros([2, 3, 4], DType::F32);
        /// assert_eq!(x.swap_axes(0, -1).shape().dims(), &[4, 3, 2]);
        /// ```
        pub fn swap_axes,
        /// [`NDArray::swap_axes`]. Errors: `AxisOutOfRange`, `Closed`.
        pub fn try_swap_axes(self, a: isize, b: isize) -> NDArray {
            swap_axes(self, a, b, Location::caller())
        }
    }

    twins! {
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
        pub fn flip,
        /// [`NDArray::flip`]. Errors: `AxisOutOfRange`, `InvalidArgument` (an axis
        /// repeated), `Closed`.
        pub fn try_flip(self, axes: &[isize]) -> NDArray {
            flip(self, axes, Location::caller())
        }
    }

    twins! {
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
        pub fn tril,
        /// [`NDArray::tril`]. Errors: `InvalidShape` (fewer than 2 dims), `Closed`.
        pub fn try_tril(self, k: i64) -> NDArray {
            tri(self, k, true, Location::caller())
        }
    }

    twins! {
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
        pub fn triu,
        /// [`NDArray::triu`]. Errors: `InvalidShape` (fewer than 2 dims), `Closed`.
        pub fn try_triu(self, k: i64) -> NDArray {
            tri(self, k, false, Location::caller())
        }
    }

    twins! {
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
        pub fn zeros_like,
        /// [`NDArray::zeros_like`]. Errors: `Closed`, `ManagerClosed`/`ManagerCapped`.
        /// Not differentiable: the values do not depend on `self`.
        pub fn try_zeros_like(self) -> NDArray {
            full_like(self, 0.0, Location::caller())
        }
    }

    twins! {
        /// Ones of `self`'s shape and dtype (Bool: true). Not differentiable. Panics if
        /// `self` is closed.
        pub fn ones_like,
        /// [`NDArray::ones_like`]. Errors: `Closed`, `ManagerClosed`/`ManagerCapped`.
        /// Not differentiable: the values do not depend on `self`.
        pub fn try_ones_like(self) -> NDArray {
            full_like(self, 1.0, Location::caller())
        }
    }

    twins! {
        /// `value` (converted to the dtype: integers truncate, Bool stores `value != 0`) in
        /// an array of `self`'s shape and dtype. Not differentiable. Panics on error.
        pub fn full_like,
        /// [`NDArray::full_like`]. Errors: `InvalidArgument` (a NaN or infinite value for
        /// an integer array), `Closed`, `ManagerClosed`/`ManagerCapped`.
        /// Not differentiable: the values do not depend on `self`.
        pub fn try_full_like(self, value: f64) -> NDArray {
            full_like(self, value, Location::caller())
        }
    }
}
