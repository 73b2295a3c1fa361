//! The normalisations, `layer_norm` and `batch_norm` (with its in-place update of
//! the running statistics), and their shared gradient rule.

use super::{Saved, float_operands};
use crate::array::NDArray;
use crate::array::reduce::{normalize_axes, reduced_shape};
use crate::autograd::{self, Backward, BackwardCtx, Grads, LazyGrad, LazyGrads};
use crate::backend::cpu;
use crate::backend::cpu::nn::buffer_of;
use crate::backend::cpu::norm::{
    Affine, SumInto, normalize_grad_kernel, normalize_kernel, update_running,
};
use crate::dtype::{Native, dispatch_float};
use crate::engine::{self, ArrayId, Operand, Output};
use crate::error::{NdError, Result, SourceLocation, twins};
use crate::layout::{Layout, Strides};
use crate::shape::{Dims, Shape};
use smallvec::{SmallVec, smallvec};
use std::panic::Location;

/// The gradient of `layer_norm` and `batch_norm`. Inputs: `x`, then `gamma` and `beta`
/// where given. With batch statistics (`layer_norm`, `batch_norm` in training),
/// `dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))` with
/// `dxhat = g * gamma` and means over the normalised axes; with fixed statistics
/// (`batch_norm` in inference) `dx = g * gamma * rstd`. `dgamma = g * xhat` and
/// `dbeta = g`, summed to the parameter's shape. One fused kernel computes them all
/// (`normalize_grad_kernel`: two passes over each group).
struct NormRule {
    op: &'static str,
    /// The normalised axes.
    axes: SmallVec<[isize; 4]>,
    /// `batch_norm`: gamma and beta are `[C]`, along axis 1 of `x`.
    channel: bool,
    /// The statistics were computed from this batch (not given).
    batch_stats: bool,
    has_gamma: bool,
    has_beta: bool,
    mean: Saved,
    rstd: Saved,
}

impl Backward for NormRule {
    fn name(&self) -> &'static str {
        self.op
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (if self.has_gamma { 0b11 } else { 0b01 }, false)
    }
    fn extra(&self) -> SmallVec<[ArrayId; 2]> {
        let mut v = self.mean.ids();
        v.extend(self.rstd.ids());
        v
    }
    /// The kernels read `g` through its strides, so `sum`'s all-ones gradient comes as
    /// a stride-0 view ([`LazyGrad::strided_array`]), not a filled array.
    fn backward_lazy(&self, cx: &BackwardCtx<'_>, g: LazyGrad) -> Result<LazyGrads> {
        let g = g.strided_array(cx.env)?;
        autograd::with_array(self, cx, g)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let (x, mean, rstd) = (
            cx.input(0),
            self.mean.get(self.op)?,
            self.rstd.get(self.op)?,
        );
        let gamma = self.has_gamma.then(|| cx.input(1));
        let beta_at = 1 + self.has_gamma as usize;
        // The shapes of the parameters whose gradients are wanted.
        let want = |has: bool, i: usize| (has && cx.need(i)).then(|| cx.shapes[i].clone());
        let (want_gamma, want_beta) = (want(self.has_gamma, 1), want(self.has_beta, beta_at));
        let (channel, batch_stats, axes) = (self.channel, self.batch_stats, &self.axes);
        let mut ids: SmallVec<[ArrayId; 5]> = smallvec![g.id, x.id, mean.id, rstd.id];
        ids.extend(gamma.map(|a| a.id));
        let op = if channel {
            "batch_norm_grad"
        } else {
            "layer_norm_grad"
        };
        // One pass for every gradient: dx, and gamma's and beta's sums.
        let mut sums = None;
        let id = engine::run_op_on(op, &ids, Location::caller(), |o| {
            let (gv, xv) = (&o[0], &o[1]);
            let shape = xv.shape().clone();
            let nd = shape.ndim();
            let red: SmallVec<[bool; 4]> = (0..nd as isize)
                .map(|d| axes.iter().any(|&a| a == d || a + nd as isize == d))
                .collect();
            #[cfg(feature = "gpu")]
            if let (Some(gg), Some(xg), Some(mg), Some(rg)) =
                (gv.gpu(), xv.gpu(), o[2].gpu(), o[3].gpu())
            {
                let norm: SmallVec<[usize; 4]> = (0..nd).filter(|&d| red[d]).collect();
                // The axes a parameter of shape `p` broadcasts along.
                let along = |p: &Option<Shape>| -> Option<SmallVec<[usize; 4]>> {
                    let p = p.as_ref()?;
                    Some(if channel {
                        (0..nd).filter(|&d| d != 1).collect()
                    } else {
                        let lead = nd - p.ndim();
                        (0..nd)
                            .filter(|&d| d < lead || p.dims()[d - lead] == 1)
                            .collect()
                    })
                };
                let (ga, ba) = (along(&want_gamma), along(&want_beta));
                let gl = o.get(4).map(|p| param_layout(p, o[2].shape(), channel));
                let gamma = o.get(4).zip(gl.as_ref()).and_then(|(p, l)| laid(p, l));
                let (dx, dg, db) = crate::backend::wgpu::norm::normalize_grad(
                    op,
                    gg,
                    xg,
                    (mg, rg),
                    gamma,
                    &norm,
                    batch_stats,
                    (ga.as_deref(), ba.as_deref()),
                )?;
                sums = Some(((ParamSum::Device(dg), ParamSum::Device(db)), xv.dtype));
                return Ok(Output::device(dx, shape, xv.dtype));
            }
            // Where a parameter's gradient is summed (a dummy cell when not wanted).
            let into = |p: &Option<Shape>| -> (Strides, usize) {
                match p {
                    None => (Strides::from_elem(0, nd), 1),
                    Some(s) if channel => {
                        let mut st = Strides::from_elem(0, nd);
                        st[1] = 1;
                        (st, s.size())
                    }
                    Some(s) => (
                        Layout::contiguous(s.clone()).broadcast_strides(&shape),
                        s.size(),
                    ),
                }
            };
            let ((gs, gn), (bs, bn)) = (into(&want_gamma), into(&want_beta));
            let targets = [
                SumInto {
                    strides: &gs,
                    size: gn,
                },
                SumInto {
                    strides: &bs,
                    size: bn,
                },
            ];
            let out = dispatch_float!(xv.dtype, T => {
                let one = [T::ONE];
                let gm = o.get(4).map_or_else(
                    || Affine::constant(&one, nd),
                    |p| Affine::of(p.into(), &shape, channel),
                );
                let stat = |v: &Operand<'_>| -> Vec<f64> {
                    cpu::to_vec::<T>(v).iter().map(|e| e.to_f64()).collect()
                };
                let (mv, rv) = (stat(&o[2]), stat(&o[3]));
                normalize_grad_kernel::<T>(xv.into(), gv.into(), &red, &gm, (&mv, &rv), batch_stats, targets)?
            }, else return Err(engine::unsupported(op, xv)));
            sums = Some((
                (ParamSum::Host(out.dgamma), ParamSum::Host(out.dbeta)),
                xv.dtype,
            ));
            Ok(Output::New {
                buf: out.dx,
                shape,
                dtype: xv.dtype,
            })
        })?;
        let dx = NDArray { id };
        let Some(((dgamma, dbeta), dtype)) = sums else {
            unreachable!("set by the op");
        };
        let mut grads: Grads = smallvec![None];
        if cx.need(0) {
            grads[0] = Some(dx);
        } else {
            dx.close();
        }
        // A parameter's gradient from its sums (beside `g`).
        let param = |sum: ParamSum, shape: Shape| -> Result<NDArray> {
            let id = engine::run_op_on(op, &[g.id], Location::caller(), |_| match sum {
                ParamSum::Host(v) => {
                    let buf = dispatch_float!(dtype, T => buffer_of::<T>(&v)?,
                        else unreachable!("a float dtype, checked by the op"));
                    Ok(Output::New { buf, shape, dtype })
                }
                #[cfg(feature = "gpu")]
                ParamSum::Device(Some(buf)) => Ok(Output::device(buf, shape, dtype)),
                #[cfg(feature = "gpu")]
                ParamSum::Device(None) => unreachable!("summed where wanted"),
            })?;
            Ok(NDArray { id })
        };
        if self.has_gamma {
            grads.push(want_gamma.map(|s| param(dgamma, s)).transpose()?);
        }
        if self.has_beta {
            grads.push(want_beta.map(|s| param(dbeta, s)).transpose()?);
        }
        Ok(grads)
    }
}

/// One parameter's gradient sum (gamma's or beta's), where the gradient pass computed
/// it.
enum ParamSum {
    Host(cpu::PoolVec<f64>),
    #[cfg(feature = "gpu")]
    Device(Option<crate::backend::wgpu::GpuBuffer>),
}

/// The layout of a parameter `p` as it broadcasts to the input: a `batch_norm` `[C]`
/// laid along axis 1 of `stats` (`[1, C, 1, ..]`), else its own.
#[cfg(feature = "gpu")]
fn param_layout(p: &Operand<'_>, stats: &Shape, channel: bool) -> Layout {
    if !channel {
        return p.layout.clone();
    }
    let mut strides = Strides::from_elem(0, stats.ndim());
    strides[1] = p.layout.strides[0];
    Layout {
        shape: stats.clone(),
        strides,
        offset: p.layout.offset,
    }
}

/// `p`'s device view through layout `l` (`None` on the host).
#[cfg(feature = "gpu")]
fn laid<'a>(p: &'a Operand<'_>, l: &'a Layout) -> Option<crate::backend::wgpu::kernels::View<'a>> {
    p.gpu()
        .map(|v| crate::backend::wgpu::kernels::View { layout: l, ..v })
}

/// `eps` must be finite and non-negative.
fn check_eps(op: &'static str, eps: f64) -> Result<()> {
    if !(eps >= 0.0 && eps.is_finite()) {
        return Err(NdError::invalid(
            op,
            format!("eps = {eps} must be finite and non-negative"),
        ));
    }
    Ok(())
}

fn layer_norm_impl(
    x: NDArray,
    axes: &[isize],
    gamma: Option<NDArray>,
    beta: Option<NDArray>,
    eps: f64,
    at: SourceLocation,
) -> Result<NDArray> {
    const OP: &str = "layer_norm";
    check_eps(OP, eps)?;
    let mut ids: SmallVec<[ArrayId; 3]> = smallvec![x.id];
    ids.extend(gamma.map(|a| a.id));
    ids.extend(beta.map(|a| a.id));
    let mut saved = None;
    let id = engine::run_op_on(OP, &ids, at, |o| {
        let a = &o[0];
        let (go, bo) = (
            gamma.map(|_| &o[1]),
            beta.map(|_| &o[1 + gamma.is_some() as usize]),
        );
        let others: SmallVec<[&Operand<'_>; 2]> = go.iter().chain(bo.iter()).copied().collect();
        float_operands(OP, a, &others)?;
        let norm = normalize_axes(OP, a, Some(axes))?;
        if norm.is_empty() {
            return Err(NdError::invalid(OP, "no axes to normalise over"));
        }
        let shape = a.shape().clone();
        for p in &others {
            if Shape::broadcast(p.shape(), &shape).as_ref() != Some(&shape) {
                return Err(NdError::ShapeMismatch {
                    op: OP,
                    lhs: a.desc(),
                    rhs: p.desc(),
                });
            }
        }
        let red: SmallVec<[bool; 4]> = (0..shape.ndim()).map(|d| norm.contains(&d)).collect();
        let stats_shape = reduced_shape(&shape, &norm, true);
        #[cfg(feature = "gpu")]
        if let Some(g) = a.gpu() {
            let params = (go.and_then(|p| p.gpu()), bo.and_then(|p| p.gpu()));
            let (y, mean, rstd, _) = crate::backend::wgpu::norm::normalize(
                OP,
                g,
                &norm,
                &stats_shape,
                params,
                eps,
                None,
            )?;
            saved = Some((Stats::Device(mean, rstd), stats_shape, a.dtype));
            return Ok(Output::device(y, shape, a.dtype));
        }
        let (buf, mean, var) = dispatch_float!(a.dtype, T => {
            let (one, zero) = ([T::ONE], [T::ZERO]);
            let gm = go.map_or_else(|| Affine::constant(&one, shape.ndim()), |p| Affine::of(p.into(), &shape, false));
            let bt = bo.map_or_else(|| Affine::constant(&zero, shape.ndim()), |p| Affine::of(p.into(), &shape, false));
            let (buf, mean, var) = normalize_kernel::<T>(a.into(), &red, &gm, &bt, eps, None)?;
            let rstd: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
            (buf, buffer_of::<T>(&mean)?, buffer_of::<T>(&rstd)?)
        }, else return Err(engine::unsupported(OP, a)));
        saved = Some((Stats::Host(mean, var), stats_shape, a.dtype));
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    if let Some((stats, stats_shape, dtype)) = saved {
        autograd::record(&ids, id, || {
            let (mean, rstd) = stats.saved(id, &stats_shape, dtype);
            NormRule {
                op: OP,
                axes: axes.iter().copied().collect(),
                channel: false,
                batch_stats: true,
                has_gamma: gamma.is_some(),
                has_beta: beta.is_some(),
                mean,
                rstd,
            }
        });
    }
    Ok(NDArray { id })
}

/// `batch_norm`'s batch mean and biased variance, where the op computed them (the
/// device's mean is in [`Stats`]; its variance is `None` with given statistics).
enum Batch {
    Host(Vec<f64>, Vec<f64>),
    #[cfg(feature = "gpu")]
    Device(Option<crate::backend::wgpu::GpuBuffer>),
}

/// One batch statistic a running statistic is updated from.
enum Stat<'a> {
    Host(&'a [f64]),
    #[cfg(feature = "gpu")]
    Device(&'a crate::backend::wgpu::GpuBuffer),
}

/// A forward pass's statistics (mean and rstd), where the op computed them.
enum Stats {
    Host(crate::engine::Buffer, crate::engine::Buffer),
    #[cfg(feature = "gpu")]
    Device(
        crate::backend::wgpu::GpuBuffer,
        crate::backend::wgpu::GpuBuffer,
    ),
}

impl Stats {
    /// The statistics as arrays beside the op's result `id`, for its gradient.
    fn saved(self, id: ArrayId, shape: &Shape, dtype: crate::DType) -> (Saved, Saved) {
        match self {
            Stats::Host(m, r) => (
                Saved::new(id, m, shape.clone(), dtype),
                Saved::new(id, r, shape.clone(), dtype),
            ),
            #[cfg(feature = "gpu")]
            Stats::Device(m, r) => (
                Saved::on_device(id, m, shape.clone(), dtype),
                Saved::on_device(id, r, shape.clone(), dtype),
            ),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn batch_norm_impl(
    x: NDArray,
    running_mean: NDArray,
    running_var: NDArray,
    gamma: Option<NDArray>,
    beta: Option<NDArray>,
    training: bool,
    momentum: f64,
    eps: f64,
    at: SourceLocation,
) -> Result<NDArray> {
    const OP: &str = "batch_norm";
    check_eps(OP, eps)?;
    if !momentum.is_finite() {
        return Err(NdError::invalid(
            OP,
            format!("momentum = {momentum} must be finite"),
        ));
    }
    if training {
        autograd::check_inplace(OP, running_mean.id)?;
        autograd::check_inplace(OP, running_var.id)?;
    }
    let mut ids: SmallVec<[ArrayId; 5]> = smallvec![x.id, running_mean.id, running_var.id];
    ids.extend(gamma.map(|a| a.id));
    ids.extend(beta.map(|a| a.id));
    let mut saved = None;
    let id = engine::run_op_on(OP, &ids, at, |o| {
        let (a, rm, rv) = (&o[0], &o[1], &o[2]);
        let (go, bo) = (
            gamma.map(|_| &o[3]),
            beta.map(|_| &o[3 + gamma.is_some() as usize]),
        );
        let mut others: SmallVec<[&Operand<'_>; 4]> = smallvec![rm, rv];
        others.extend(go.iter().chain(bo.iter()).copied());
        float_operands(OP, a, &others)?;
        let shape = a.shape().clone();
        let dims = shape.dims();
        if dims.len() < 2 {
            return Err(NdError::invalid(
                OP,
                format!(
                    "the input must be [N, C] or [N, C, ...] (channels on axis 1), got shape {shape}"
                ),
            ));
        }
        let c = dims[1];
        for p in &others {
            if p.shape().dims() != [c] {
                return Err(NdError::invalid(
                    OP,
                    format!(
                        "the running statistics, gamma and beta must have shape [{c}] (the \
                         channels of input shape {shape}), got shape {} ({})",
                        p.shape(),
                        p.desc()
                    ),
                ));
            }
        }
        let per_channel = shape.size() / c.max(1);
        if training && per_channel <= 1 && shape.size() > 0 {
            return Err(NdError::invalid(
                OP,
                format!(
                    "expected more than 1 value per channel when training, got input shape {shape}"
                ),
            ));
        }
        let red: SmallVec<[bool; 4]> = (0..dims.len()).map(|d| d != 1).collect();
        let mut stats_dims = Dims::from_elem(1, dims.len());
        stats_dims[1] = c;
        #[cfg(feature = "gpu")]
        if let Some(g) = a.gpu() {
            let stats = Shape(stats_dims);
            let lay = |p: &Operand<'_>| param_layout(p, &stats, true);
            let (rml, rvl, gl, bl) = (lay(rm), lay(rv), go.map(lay), bo.map(lay));
            let params = (
                go.zip(gl.as_ref()).and_then(|(p, l)| laid(p, l)),
                bo.zip(bl.as_ref()).and_then(|(p, l)| laid(p, l)),
            );
            let given = if training {
                None
            } else {
                laid(rm, &rml).zip(laid(rv, &rvl))
            };
            let axes: SmallVec<[usize; 4]> = (0..dims.len()).filter(|&d| d != 1).collect();
            let (y, mean, rstd, var) =
                crate::backend::wgpu::norm::normalize(OP, g, &axes, &stats, params, eps, given)?;
            let batch = Batch::Device(var);
            saved = Some((
                Stats::Device(mean, rstd),
                stats,
                a.dtype,
                batch,
                per_channel,
            ));
            return Ok(Output::device(y, shape, a.dtype));
        }
        let given = (!training).then(|| {
            let read = |o: &Operand<'_>| -> Vec<f64> {
                dispatch_float!(o.dtype, T => cpu::to_vec::<T>(o).iter().map(|v| v.to_f64()).collect(), else Vec::new())
            };
            (read(rm), read(rv))
        });
        let (buf, mean, var) = dispatch_float!(a.dtype, T => {
            let (one, zero) = ([T::ONE], [T::ZERO]);
            let gm = go.map_or_else(|| Affine::constant(&one, dims.len()), |p| Affine::of(p.into(), &shape, true));
            let bt = bo.map_or_else(|| Affine::constant(&zero, dims.len()), |p| Affine::of(p.into(), &shape, true));
            normalize_kernel::<T>(a.into(), &red, &gm, &bt, eps, given)?
        }, else return Err(engine::unsupported(OP, a)));
        let rstd: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
        let (mb, rb) = dispatch_float!(a.dtype, T => (buffer_of::<T>(&mean)?, buffer_of::<T>(&rstd)?),
            else unreachable!("checked above"));
        saved = Some((
            Stats::Host(mb, rb),
            Shape(stats_dims),
            a.dtype,
            Batch::Host(mean, var),
            per_channel,
        ));
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    let Some((stats, stats_shape, dtype, batch, count)) = saved else {
        unreachable!("set by the op");
    };
    if training && count > 1 {
        // PyTorch's rule: running = (1 - momentum) * running + momentum * batch, with the
        // unbiased batch variance for running_var.
        let unbias = count as f64 / (count - 1) as f64;
        let update = |target: NDArray, batch: Stat<'_>, scale: f64| {
            engine::run_inplace_on(OP, target.id, &[], |mut t, _| match batch {
                Stat::Host(batch) => {
                    dispatch_float!(t.dtype, T => {
                        update_running::<T>((&mut t).into(), batch, momentum, scale)
                    }, else unreachable!("checked by the op"));
                    Ok(())
                }
                #[cfg(feature = "gpu")]
                Stat::Device(buf) => {
                    let tv = t.gpu().expect("on the input's device: checked by the op");
                    let l = Layout::contiguous(tv.layout.shape.clone());
                    let bv = crate::backend::wgpu::kernels::View {
                        buf,
                        layout: &l,
                        dtype: tv.dtype,
                    };
                    crate::backend::wgpu::norm::update_running(OP, tv, bv, momentum, scale)
                }
            })
        };
        let (m, v) = match (&batch, &stats) {
            (Batch::Host(m, v), _) => (Stat::Host(m), Stat::Host(v)),
            #[cfg(feature = "gpu")]
            (Batch::Device(Some(v)), Stats::Device(m, _)) => (Stat::Device(m), Stat::Device(v)),
            #[cfg(feature = "gpu")]
            _ => unreachable!("a device pass computed its batch statistics"),
        };
        if let Err(e) = update(running_mean, m, 1.0).and_then(|_| update(running_var, v, unbias)) {
            engine::close_array(id, at);
            return Err(e);
        }
    }
    drop(batch); // the device's variance buffer, once the update is queued
    let mut rec: SmallVec<[ArrayId; 3]> = smallvec![x.id];
    rec.extend(gamma.map(|a| a.id));
    rec.extend(beta.map(|a| a.id));
    let ndim = stats_shape.ndim();
    autograd::record(&rec, id, || {
        let (mean, rstd) = stats.saved(id, &stats_shape, dtype);
        NormRule {
            op: OP,
            axes: (0..ndim as isize).filter(|&d| d != 1).collect(),
            channel: true,
            batch_stats: training,
            has_gamma: gamma.is_some(),
            has_beta: beta.is_some(),
            mean,
            rstd,
        }
    });
    Ok(NDArray { id })
}

impl NDArray {
    twins! {
        /// Layer normalisation over `axes` (negative counts from the end): every group of
        /// elements that agree on the other axes becomes `(x - mean) / sqrt(var + eps)`,
        /// with the group's mean and biased variance as PyTorch's `layer_norm`, then
        /// `* gamma + beta` where given. `gamma` and `beta` broadcast to `x`'s shape (PyTorch's
        /// `normalized_shape` is the trailing axes, e.g. `axes = [-1]` with gamma `[D]`; for
        /// other axes give them 1s on the kept axes, e.g. `[C, 1]`). Differentiable in `x`,
        /// `gamma` and `beta`. F32/F64 only. Panics on failure.
        ///
        /// ```
        /// use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[1.0f64, 2.0, 3.0, 5.0, 5.0, 5.0], [2, 3]);
        /// let y = x.layer_norm(&[-1], None, None, 1e-5).to_vec::<f64>()?;
        /// let r = 1.0 / (2.0f64 / 3.0 + 1e-5).sqrt();   // 1 / sqrt(var + eps) of [1, 2, 3]
        /// assert!((y[0] + r).abs() < 1e-12 && y[1].abs() < 1e-12 && (y[2] - r).abs() < 1e-12);
        /// assert_eq!(&y[3..], &[0.0, 0.0, 0.0]);       // a constant row
        /// # m.close();
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn layer_norm,
        /// [`NDArray::layer_norm`]. Errors: `UnsupportedDType` (not F32/F64),
        /// `DTypeMismatch`, `AxisOutOfRange`, `InvalidArgument` (no axes, a repeated axis,
        /// a negative or NaN `eps`), `ShapeMismatch` (gamma or beta does not broadcast to
        /// `x`'s shape), `Closed`.
        pub fn try_layer_norm(self, axes: &[isize], gamma: Option<NDArray>, beta: Option<NDArray>, eps: f64) -> NDArray {
            layer_norm_impl(self, axes, gamma, beta, eps, Location::caller())
        }
    }

    twins! {
        /// Batch normalisation of `[N, C]` or `[N, C, ...]` (channels on axis 1), as
        /// PyTorch's `batch_norm`. Training: each channel is normalised with the batch's
        /// mean and biased variance (over every axis but 1), and the running statistics
        /// `[C]` are updated **in place**: `running = (1 - momentum) * running + momentum *
        /// batch`, with the unbiased batch variance for `running_var`. Inference: the
        /// running statistics normalise and are left unchanged. Then `* gamma + beta`
        /// (`[C]` each) where given. Differentiable in `x`, `gamma` and `beta` (the running
        /// statistics get no gradient). F32/F64 only. Panics on failure.
        ///
        /// ```
        /// use ndscope::{DType, NDManager};
        /// let m = NDManager::new();
        /// let x = m.create(&[1.0f64, 10.0, 3.0, 30.0], [2, 2]);   // 2 samples, 2 channels
        /// let (rm, rv) = (m.zeros([2], DType::F64), m.ones([2], DType::F64));
        /// let y = x.batch_norm(rm, rv, None, None, true, 0.1, 0.0);
        /// let close = |a: Vec<f64>, b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
        /// assert!(close(y.to_vec::<f64>()?, &[-1.0, -1.0, 1.0, 1.0]));
        /// assert!(close(rm.to_vec::<f64>()?, &[0.2, 2.0]));    // 0.9 * 0 + 0.1 * batch mean
        /// // 0.9 * 1 + 0.1 * unbiased batch variance (2 and 200)
        /// assert!(close(rv.to_vec::<f64>()?, &[1.1, 20.9]));
        /// # m.close();
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        #[allow(clippy::too_many_arguments)]
        pub fn batch_norm,
        /// [`NDArray::batch_norm`]. Errors: `UnsupportedDType` (not F32/F64),
        /// `DTypeMismatch`, `InvalidArgument` (fewer than 2 axes, statistics or gamma/beta
        /// not `[C]`, one value per channel in training, a negative or NaN `eps`, a
        /// non-finite momentum, running statistics the recording tape depends on), `Closed`.
        /// On error nothing is updated.
        #[allow(clippy::too_many_arguments)]
        pub fn try_batch_norm(self, running_mean: NDArray, running_var: NDArray, gamma: Option<NDArray>, beta: Option<NDArray>, training: bool, momentum: f64, eps: f64) -> NDArray {
            batch_norm_impl(
                self,
                running_mean,
                running_var,
                gamma,
                beta,
                training,
                momentum,
                eps,
                Location::caller(),
            )
        }
    }
}
