//! Convolution and pooling over NCHW arrays: `conv2d` (im2col + gemm, with groups,
//! stride, padding and dilation), `max_pool2d` and `avg_pool2d`. Each is one fused
//! kernel with its gradient rule beside it; the backward passes are internal ops of
//! their own (`conv2d_grad_input` is col2im over `Wᵀ·G`, `conv2d_grad_weight` is
//! `G·colᵀ`), run unrecorded by the tape.
//!
//! The kernels are plain functions over slices and a [`Layout`](crate::layout::Layout),
//! in [`crate::backend::cpu::conv`] and [`crate::backend::cpu::pool2d`] (the window
//! geometry in [`crate::backend::window`]); the input is read through its strides
//! (a transposed or sliced view is not copied first).

use super::NDArray;
use super::nn::{Saved, float_operands};
use crate::DType;
use crate::autograd::{self, Backward, BackwardCtx, Grads};
use crate::backend::cpu;
use crate::backend::cpu::conv::{
    conv2d_grad_input_kernel, conv2d_grad_weight_kernel, conv2d_kernel,
};
use crate::backend::cpu::new_filled;
use crate::backend::cpu::new_overwritten;
use crate::backend::cpu::pool2d::{
    avg_pool_grad_kernel, avg_pool_kernel, max_pool_grad_kernel, max_pool_kernel,
};
use crate::backend::window::Geom;
use crate::dtype::dispatch_float;
use crate::engine::{self, ArrayId, Buffer, Operand, Output};
use crate::error::{NdError, Result, SourceLocation, twins};
use crate::shape::Shape;
use smallvec::{SmallVec, smallvec};
use std::panic::Location;

/// One output size: `(len + 2p - d(k-1) - 1) / s + 1`, or `None` if the (dilated)
/// window does not fit in the padded input.
fn out_len(len: usize, k: usize, s: usize, p: usize, d: usize) -> Option<usize> {
    let span = d.checked_mul(k - 1)?.checked_add(1)?;
    let padded = len.checked_add(p.checked_mul(2)?)?;
    (padded >= span).then(|| (padded - span) / s + 1)
}

/// Sliding-window parameters as given by the caller.
#[derive(Clone, Copy)]
struct Window {
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
}

impl Window {
    /// Validate the parameters against the spatial size `[h, w]` and build the geometry.
    fn geom(&self, op: &'static str, n: usize, c: usize, hw: [usize; 2]) -> Result<Geom> {
        let Window {
            kernel,
            stride,
            padding,
            dilation,
        } = *self;
        for (what, v) in [
            ("kernel", kernel),
            ("stride", stride),
            ("dilation", dilation),
        ] {
            if v.contains(&0) {
                return Err(NdError::invalid(
                    op,
                    format!("{what} {v:?} must be positive"),
                ));
            }
        }
        let oh = out_len(hw[0], kernel[0], stride[0], padding[0], dilation[0]);
        let ow = out_len(hw[1], kernel[1], stride[1], padding[1], dilation[1]);
        let (Some(oh), Some(ow)) = (oh, ow) else {
            return Err(NdError::invalid(
                op,
                format!(
                    "the window (kernel {kernel:?}, dilation {dilation:?}) is larger than the \
                     padded input (spatial size {hw:?}, padding {padding:?})"
                ),
            ));
        };
        Ok(Geom {
            n,
            c,
            h: hw[0],
            w: hw[1],
            kh: kernel[0],
            kw: kernel[1],
            sh: stride[0],
            sw: stride[1],
            ph: padding[0],
            pw: padding[1],
            dh: dilation[0],
            dw: dilation[1],
            oh,
            ow,
        })
    }
}

/// Validate conv2d's operands and build the geometry.
fn conv2d_geom(
    x: &Operand<'_>,
    w: &Operand<'_>,
    bias: Option<&Operand<'_>>,
    win: &Window,
    groups: usize,
) -> Result<Geom> {
    const OP: &str = "conv2d";
    let mut others: SmallVec<[&Operand<'_>; 2]> = smallvec![w];
    others.extend(bias);
    float_operands(OP, x, &others)?;
    let (xs, ws) = (x.shape().dims(), w.shape().dims());
    if xs.len() != 4 {
        return Err(NdError::invalid(
            OP,
            format!(
                "the input must be 4-D [N, C, H, W], got shape {}",
                x.shape()
            ),
        ));
    }
    if ws.len() != 4 {
        return Err(NdError::invalid(
            OP,
            format!(
                "the weight must be 4-D [O, C/groups, kh, kw], got shape {}",
                w.shape()
            ),
        ));
    }
    if groups == 0 || xs[1] % groups != 0 || ws[0] % groups != 0 {
        return Err(NdError::invalid(
            OP,
            format!(
                "groups = {groups} must be positive and divide both the input channels \
                 (input shape {}) and the output channels (weight shape {})",
                x.shape(),
                w.shape()
            ),
        ));
    }
    if ws[1] != xs[1] / groups {
        return Err(NdError::invalid(
            OP,
            format!(
                "the weight shape {} needs C/groups = {} input channels per group, but the \
                 input shape {} has C = {} and groups = {groups}",
                w.shape(),
                ws[1],
                x.shape(),
                xs[1]
            ),
        ));
    }
    if let Some(b) = bias
        && b.shape().dims() != [ws[0]]
    {
        return Err(NdError::invalid(
            OP,
            format!(
                "the bias must have shape [{}] (one per output channel of weight shape {}), \
                 got shape {}",
                ws[0],
                w.shape(),
                b.shape()
            ),
        ));
    }
    let win = Window {
        kernel: [ws[2], ws[3]],
        ..*win
    };
    if win.kernel.contains(&0) {
        return Err(NdError::invalid(
            OP,
            format!("the weight shape {} has an empty kernel", w.shape()),
        ));
    }
    let g = win.geom(OP, xs[0], xs[1], [xs[2], xs[3]])?;
    let shape = Shape::from([g.n, ws[0], g.oh, g.ow]);
    if shape.checked_size().is_none() {
        return Err(NdError::shape(
            OP,
            format!("the result shape {shape} overflows usize"),
        ));
    }
    Ok(g)
}

#[allow(clippy::too_many_arguments)]
fn conv2d_impl(
    x: NDArray,
    weight: NDArray,
    bias: Option<NDArray>,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    at: SourceLocation,
) -> Result<NDArray> {
    const OP: &str = "conv2d";
    let win = Window {
        kernel: [1, 1],
        stride,
        padding,
        dilation,
    };
    let mut ids: SmallVec<[ArrayId; 3]> = smallvec![x.id, weight.id];
    ids.extend(bias.map(|b| b.id));
    let mut geom = None;
    let id = engine::run_op_on(OP, &ids, at, |o| {
        let (xo, wo, bo) = (&o[0], &o[1], o.get(2));
        let g = conv2d_geom(xo, wo, bo, &win, groups)?;
        let o_count = wo.shape().dims()[0];
        let shape = Shape::from([g.n, o_count, g.oh, g.ow]);
        #[cfg(feature = "gpu")]
        if let (Some(gx), Some(gw)) = (xo.gpu(), wo.gpu()) {
            let gb = bo.and_then(Operand::gpu);
            let buf = crate::backend::wgpu::conv::conv2d(gx, gw, gb, &g, (o_count, groups))?;
            geom = Some(g);
            return Ok(Output::device(buf, shape, xo.dtype));
        }
        let buf = dispatch_float!(xo.dtype, T => conv2d_kernel::<T>(xo.into(), wo.into(), bo.map(Into::into), &g, o_count, groups)?,
            else return Err(engine::unsupported(OP, xo)));
        geom = Some(g);
        Ok(Output::New {
            buf,
            shape,
            dtype: xo.dtype,
        })
    })?;
    if let Some(g) = geom {
        autograd::record(&ids, id, || Conv2dRule { g, groups });
    }
    Ok(NDArray { id })
}

/// `conv2d`'s gradient: input `col2im(Wᵀ·G)`, weight `G·colᵀ`, bias `sum(G)` over
/// N, H, W.
struct Conv2dRule {
    g: Geom,
    groups: usize,
}

impl Backward for Conv2dRule {
    fn name(&self) -> &'static str {
        "conv2d"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0b011, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, gr: NDArray) -> Result<Grads> {
        let (g, groups) = (self.g, self.groups);
        let here = Location::caller();
        let (x, w) = (cx.input(0), cx.input(1));
        let dx = if cx.need(0) {
            let id = engine::run_op_on("conv2d_grad_input", &[gr.id, w.id], here, |o| {
                let shape = Shape::from([g.n, g.c, g.h, g.w]);
                #[cfg(feature = "gpu")]
                if let (Some(gg), Some(gw)) = (o[0].gpu(), o[1].gpu()) {
                    use crate::backend::wgpu::conv::conv2d_grad_input;
                    let buf = conv2d_grad_input(gg, gw, &g, groups)?;
                    return Ok(Output::device(buf, shape, o[0].dtype));
                }
                let buf = dispatch_float!(o[0].dtype,
                    T => conv2d_grad_input_kernel::<T>((&o[0]).into(), (&o[1]).into(), &g, groups)?,
                    else return Err(engine::unsupported("conv2d_grad_input", &o[0])));
                Ok(Output::New {
                    buf,
                    shape,
                    dtype: o[0].dtype,
                })
            })?;
            Some(NDArray { id })
        } else {
            None
        };
        let dw = if cx.need(1) {
            let shape = cx.shapes[1].clone();
            let id = engine::run_op_on("conv2d_grad_weight", &[x.id, gr.id], here, |o| {
                #[cfg(feature = "gpu")]
                if let (Some(gx), Some(gg)) = (o[0].gpu(), o[1].gpu()) {
                    use crate::backend::wgpu::conv::conv2d_grad_weight;
                    let buf = conv2d_grad_weight(gx, gg, &g, groups)?;
                    return Ok(Output::device(buf, shape, o[0].dtype));
                }
                let buf = dispatch_float!(o[0].dtype,
                    T => conv2d_grad_weight_kernel::<T>((&o[0]).into(), (&o[1]).into(), &g, groups)?,
                    else return Err(engine::unsupported("conv2d_grad_weight", &o[0])));
                Ok(Output::New {
                    buf,
                    shape,
                    dtype: o[0].dtype,
                })
            })?;
            Some(NDArray { id })
        } else {
            None
        };
        let db = if cx.ids.len() > 2 && cx.need(2) {
            Some(gr.try_sum_axes(&[0, 2, 3], false)?)
        } else {
            None
        };
        Ok(smallvec![dx, dw, db])
    }
}

// ---- pooling ----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pool {
    Max,
    Avg,
}

impl Pool {
    fn name(self) -> &'static str {
        match self {
            Pool::Max => "max_pool2d",
            Pool::Avg => "avg_pool2d",
        }
    }
}

/// Validate a pool's input and window; returns the geometry and the output shape.
fn pool_geom(op: &'static str, x: &Operand<'_>, win: &Window) -> Result<(Geom, Shape)> {
    float_operands(op, x, &[])?;
    let d = x.shape().dims();
    let (n, c, h, w) = match *d {
        [n, c, h, w] => (n, c, h, w),
        [c, h, w] => (1, c, h, w),
        _ => {
            return Err(NdError::invalid(
                op,
                format!(
                    "the input must be 3-D [C, H, W] or 4-D [N, C, H, W], got shape {}",
                    x.shape()
                ),
            ));
        }
    };
    if win.kernel.contains(&0) {
        return Err(NdError::invalid(
            op,
            format!("kernel {:?} must be positive", win.kernel),
        ));
    }
    if win.padding[0] > win.kernel[0] / 2 || win.padding[1] > win.kernel[1] / 2 {
        return Err(NdError::invalid(
            op,
            format!(
                "padding {:?} must be at most half the kernel {:?} (as in PyTorch)",
                win.padding, win.kernel
            ),
        ));
    }
    let g = win.geom(op, n, c, [h, w])?;
    let mut dims = d.to_vec();
    let nd = dims.len();
    dims[nd - 2] = g.oh;
    dims[nd - 1] = g.ow;
    let shape = Shape::from(&dims[..]);
    if shape.checked_size().is_none() {
        return Err(NdError::shape(
            op,
            format!("the result shape {shape} overflows usize"),
        ));
    }
    Ok((g, shape))
}

fn pool_impl(
    x: NDArray,
    kind: Pool,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    at: SourceLocation,
) -> Result<NDArray> {
    let op = kind.name();
    let win = Window {
        kernel,
        stride,
        padding,
        dilation: [1, 1],
    };
    let mut saved: Option<(Geom, Shape, Option<Buffer>)> = None;
    #[cfg(feature = "gpu")]
    let mut saved_gpu: Option<crate::backend::wgpu::GpuBuffer> = None;
    let id = engine::run_op_on(op, &[x.id], at, |o| {
        let a = &o[0];
        let (g, shape) = pool_geom(op, a, &win)?;
        #[cfg(feature = "gpu")]
        if let Some(ga) = a.gpu() {
            use crate::backend::wgpu::conv::{avg_pool, max_pool};
            let buf = match kind {
                Pool::Max => {
                    let (out, arg) = max_pool(ga, &g)?;
                    saved_gpu = Some(arg);
                    out
                }
                Pool::Avg => avg_pool(ga, &g)?,
            };
            saved = Some((g, shape.clone(), None));
            return Ok(Output::device(buf, shape, a.dtype));
        }
        let total = shape.size();
        let mut arg = None;
        let buf = dispatch_float!(a.dtype, T => match kind {
            Pool::Max => {
                let mut out = None;
                let idx = new_overwritten::<i64>(total, |idx| {
                    out = Some(new_overwritten::<T>(total, |out| {
                        max_pool_kernel::<T>(a.data::<T>(), a.layout, &g, out, idx)
                    }));
                })?;
                arg = Some(idx);
                out.expect("filled above")?
            }
            Pool::Avg => new_overwritten::<T>(total, |out| {
                avg_pool_kernel::<T>(a.data::<T>(), a.layout, &g, out)
            })?,
        }, else return Err(engine::unsupported(op, a)));
        saved = Some((g, shape.clone(), arg));
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    if let Some((g, shape, arg)) = saved {
        autograd::record(&[x.id], id, || {
            // The argmax: I64 on the host, I32 on a device (see wgpu::conv::max_pool).
            #[cfg(feature = "gpu")]
            if let Some(b) = saved_gpu {
                let argmax = Some(Saved::on_device(id, b, shape, DType::I32));
                return PoolRule { kind, g, argmax };
            }
            let argmax = arg.map(|b| Saved::new(id, b, shape, DType::I64));
            PoolRule { kind, g, argmax }
        });
    }
    Ok(NDArray { id })
}

/// The gradient of a pool: max routes each output's gradient to its argmax, avg
/// spreads it evenly over the window (padding included in the divisor).
struct PoolRule {
    kind: Pool,
    g: Geom,
    argmax: Option<Saved>,
}

impl Backward for PoolRule {
    fn name(&self) -> &'static str {
        self.kind.name()
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn extra(&self) -> SmallVec<[ArrayId; 2]> {
        self.argmax.iter().flat_map(|s| s.ids()).collect()
    }
    fn backward(&self, cx: &BackwardCtx<'_>, gr: NDArray) -> Result<Grads> {
        let g = self.g;
        let shape = cx.shapes[0].clone();
        let op = match self.kind {
            Pool::Max => "max_pool2d_grad",
            Pool::Avg => "avg_pool2d_grad",
        };
        let mut ids: SmallVec<[ArrayId; 2]> = smallvec![gr.id];
        if let Some(s) = &self.argmax {
            ids.push(s.get(op)?.id);
        }
        let kind = self.kind;
        let id = engine::run_op_on(op, &ids, Location::caller(), |o| {
            let gv = &o[0];
            #[cfg(feature = "gpu")]
            if let Some(gg) = gv.gpu() {
                let arg = o.get(1).and_then(Operand::gpu);
                let buf = crate::backend::wgpu::conv::pool_grad(gg, arg.map(|a| a.buf), &g)?;
                return Ok(Output::device(buf, shape.clone(), gv.dtype));
            }
            let buf = dispatch_float!(gv.dtype, T => {
                let gd = cpu::to_vec::<T>(gv);
                let plane = g.h * g.w;
                let lsz = g.l();
                new_filled::<T>(shape.size(), |dx| {
                    if plane == 0 || lsz == 0 {
                        return;
                    }
                    match kind {
                        Pool::Max => {
                            let arg = cpu::to_vec::<i64>(&o[1]);
                            max_pool_grad_kernel(&gd, &arg, &g, dx)
                        }
                        Pool::Avg => avg_pool_grad_kernel(&gd, &g, dx),
                    }
                })?
            }, else return Err(engine::unsupported(op, gv)));
            Ok(Output::New {
                buf,
                shape: shape.clone(),
                dtype: gv.dtype,
            })
        })?;
        Ok(smallvec![Some(NDArray { id })])
    }
}

impl NDArray {
    twins! {
        /// 2-D convolution (cross-correlation, as PyTorch's `conv2d`) of an NCHW input
        /// `[N, C, H, W]` with OIHW weights `[O, C/groups, kh, kw]` and an optional bias
        /// `[O]`: the result is `[N, O, oh, ow]` with `oh = (H + 2*padding[0] -
        /// dilation[0]*(kh-1) - 1) / stride[0] + 1` (likewise `ow`). Zero padding; `groups`
        /// splits the channels into independent groups. Computed as im2col + gemm;
        /// differentiable in the input, the weight and the bias. F32/F64 only. Panics on
        /// failure.
        ///
        /// ```
        /// use ndscope::{DType, NDManager};
        /// let m = NDManager::new();
        /// let x = m.arange(0.0, 16.0, 1.0, DType::F32).reshape([1, 1, 4, 4]);
        /// let w = m.ones([2, 1, 3, 3], DType::F32);          // two 3x3 box filters
        /// let b = m.create(&[0.0f32, 100.0], [2]);
        /// let y = x.conv2d(w, Some(b), [1, 1], [0, 0], [1, 1], 1);
        /// assert_eq!(y.shape().dims(), &[1, 2, 2, 2]);
        /// assert_eq!(y.to_vec::<f32>()?, vec![45.0, 54.0, 81.0, 90.0, 145.0, 154.0, 181.0, 190.0]);
        /// # m.close();
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        #[allow(clippy::too_many_arguments)]
        pub fn conv2d,
        /// [`NDArray::conv2d`]. Errors: `UnsupportedDType` (not F32/F64), `DTypeMismatch`
        /// (weight or bias), `InvalidArgument` (not 4-D, channels or groups that do not
        /// match, a bias that is not `[O]`, a zero stride/dilation/groups, a window larger
        /// than the padded input; the message names the shapes), `InvalidShape`, `Closed`.
        #[allow(clippy::too_many_arguments)]
        pub fn try_conv2d(self, weight: NDArray, bias: Option<NDArray>, stride: [usize; 2], padding: [usize; 2], dilation: [usize; 2], groups: usize) -> NDArray {
            conv2d_impl(
                self,
                weight,
                bias,
                stride,
                padding,
                dilation,
                groups,
                Location::caller(),
            )
        }
    }

    twins! {
        /// 2-D max pooling over the last two axes of `[N, C, H, W]` (or `[C, H, W]`), as
        /// PyTorch's `max_pool2d` (padding acts as -inf, so a window's maximum is over its
        /// real elements; NaN propagates; `padding` at most half the kernel; floor output
        /// size). The gradient goes to each window's first maximum. F32/F64 only. Panics on
        /// failure.
        ///
        /// ```
        /// use ndscope::{DType, NDManager};
        /// let m = NDManager::new();
        /// let x = m.arange(0.0, 16.0, 1.0, DType::F32).reshape([1, 1, 4, 4]);
        /// let y = x.max_pool2d([2, 2], [2, 2], [0, 0]);
        /// assert_eq!(y.to_vec::<f32>()?, vec![5.0, 7.0, 13.0, 15.0]);
        /// # m.close();
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn max_pool2d,
        /// [`NDArray::max_pool2d`]. Errors: `UnsupportedDType` (not F32/F64),
        /// `InvalidArgument` (not 3-D/4-D, a zero kernel or stride, padding over half the
        /// kernel, a window larger than the padded input), `Closed`.
        pub fn try_max_pool2d(self, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> NDArray {
            pool_impl(self, Pool::Max, kernel, stride, padding, Location::caller())
        }
    }

    twins! {
        /// 2-D average pooling over the last two axes of `[N, C, H, W]` (or `[C, H, W]`), as
        /// PyTorch's `avg_pool2d` with its default `count_include_pad=True`: every window
        /// sums its real elements and divides by `kernel[0] * kernel[1]`, padding counted as
        /// zeros. F32/F64 only. Panics on failure.
        ///
        /// ```
        /// use ndscope::{DType, NDManager};
        /// let m = NDManager::new();
        /// let x = m.arange(0.0, 16.0, 1.0, DType::F32).reshape([1, 1, 4, 4]);
        /// let y = x.avg_pool2d([2, 2], [2, 2], [0, 0]);
        /// assert_eq!(y.to_vec::<f32>()?, vec![2.5, 4.5, 10.5, 12.5]);
        /// # m.close();
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn avg_pool2d,
        /// [`NDArray::avg_pool2d`]. Errors: as [`NDArray::try_max_pool2d`].
        pub fn try_avg_pool2d(self, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> NDArray {
            pool_impl(self, Pool::Avg, kernel, stride, padding, Location::caller())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::conv::{col2im, im2col};
    use crate::layout::Layout;

    fn geom(h: usize, w: usize, k: usize, s: usize, p: usize, d: usize) -> Geom {
        Window {
            kernel: [k, k],
            stride: [s, s],
            padding: [p, p],
            dilation: [d, d],
        }
        .geom("t", 1, 1, [h, w])
        .unwrap()
    }

    #[test]
    fn im2col_then_col2im_is_the_adjoint() {
        // <im2col(x), c> == <x, col2im(c)> for random x and c: a strided geometry, and
        // "same" ones (col2im's plane-run path, which zeroes the wrapped edges of c).
        for (k, s, p, d) in [(3, 2, 1, 2), (3, 1, 1, 1), (3, 1, 2, 2), (2, 1, 1, 2)] {
            let g = geom(5, 4, k, s, p, d);
            let x: Vec<f64> = (0..20).map(|i| (i as f64 * 0.37).sin()).collect();
            let l = Layout::contiguous(Shape::from([1, 1, 5, 4]));
            let mut col = vec![0.0; k * k * g.l()];
            im2col(&x, &l, &g, 0, 1, 0, 1, &mut col);
            let mut c: Vec<f64> = (0..col.len()).map(|i| (i as f64 * 0.71).cos()).collect();
            let lhs: f64 = col.iter().zip(&c).map(|(a, b)| a * b).sum();
            let mut dx = vec![0.0; 20];
            col2im(&mut c, &g, 0, 1, 0, 1, &mut dx);
            let rhs: f64 = x.iter().zip(&dx).map(|(a, b)| a * b).sum();
            assert!((lhs - rhs).abs() < 1e-12, "{k} {s} {p} {d}: {lhs} vs {rhs}");
        }
    }
}
