//! `layer_norm` and `batch_norm` on the device, forward and gradient, composed of the
//! device's reductions and elementwise kernels (the CPU fuses them in
//! `backend/cpu/norm.rs`; the formulas are the same, see `array/nn/norm.rs`'s
//! `NormRule`).
//!
//! Shapes: `x` is the input; the statistics (`mean`, `rstd`) are `x`'s shape with the
//! normalised axes kept as 1s (`stats`), contiguous; `gamma` and `beta` arrive as views
//! that broadcast to `x`'s shape (a `batch_norm` `[C]` parameter laid along axis 1).
//! The device computes in the array's dtype (the CPU's statistics are f64).

use super::GpuBuffer;
use super::kernels::{View, elementwise_with, scalar_bits};
use super::reduce::{Reduce, reduce};
use crate::error::Result;
use crate::layout::Layout;
use crate::shape::Shape;

/// A view of a contiguous buffer of `layout`'s shape.
fn at<'a>(buf: &'a GpuBuffer, layout: &'a Layout, like: &View<'_>) -> View<'a> {
    View {
        buf,
        layout,
        dtype: like.dtype,
    }
}

/// `x * y` (`y` broadcast), or `x` itself without `y`.
fn times(op: &'static str, x: View<'_>, y: Option<View<'_>>) -> Result<Option<GpuBuffer>> {
    match y {
        Some(y) => {
            let shape = x.layout.shape.clone();
            Ok(Some(elementwise_with(
                op,
                &[x, y],
                &shape,
                x.dtype,
                "",
                "x * y",
                0,
            )?))
        }
        None => Ok(None),
    }
}

/// The forward pass: `(x - mean) * rstd * gamma + beta`, and the statistics (`mean`
/// and `rstd = 1 / sqrt(var + eps)`, biased variance, `stats`-shaped). With `given`
/// (a running mean and variance, `stats`-shaped views) the statistics are those, else
/// they are reduced over `axes` (sorted). Also returns the batch's biased variance
/// (`None` with `given`), for a running variance's update.
#[allow(clippy::type_complexity)]
pub(crate) fn normalize(
    op: &'static str,
    x: View<'_>,
    axes: &[usize],
    stats: &Shape,
    (gamma, beta): (Option<View<'_>>, Option<View<'_>>),
    eps: f64,
    given: Option<(View<'_>, View<'_>)>,
) -> Result<(GpuBuffer, GpuBuffer, GpuBuffer, Option<GpuBuffer>)> {
    let shape = x.layout.shape.clone();
    let sl = Layout::contiguous(stats.clone());
    let e = scalar_bits(eps, x.dtype);
    let rsqrt = format!("{}(1) / sqrt(x + s)", super::kernels::wgsl_type(x.dtype));
    let rsqrt = rsqrt.as_str();
    let (mean, rstd, var) = match given {
        Some((m, v)) => {
            let mean = elementwise_with(op, &[m], stats, x.dtype, "", "x", 0)?;
            let rstd = elementwise_with(op, &[v], stats, x.dtype, "", rsqrt, e)?;
            (mean, rstd, None)
        }
        None => {
            let (mean, _) = reduce(op, Reduce::Mean, x, axes)?;
            let sq = elementwise_with(
                op,
                &[x, at(&mean, &sl, &x)],
                &shape,
                x.dtype,
                "",
                "(x - y) * (x - y)",
                0,
            )?;
            let xl = Layout::contiguous(shape.clone());
            let (var, _) = reduce(op, Reduce::Mean, at(&sq, &xl, &x), axes)?;
            let rstd = elementwise_with(op, &[at(&var, &sl, &x)], stats, x.dtype, "", rsqrt, e)?;
            (mean, rstd, Some(var))
        }
    };
    let xhat = elementwise_with(
        op,
        &[x, at(&mean, &sl, &x), at(&rstd, &sl, &x)],
        &shape,
        x.dtype,
        "",
        "(x - y) * z",
        0,
    )?;
    let xl = Layout::contiguous(shape.clone());
    let h = at(&xhat, &xl, &x);
    let y = match (gamma, beta) {
        (None, None) => xhat,
        (Some(g), None) => elementwise_with(op, &[h, g], &shape, x.dtype, "", "x * y", 0)?,
        (None, Some(b)) => elementwise_with(op, &[h, b], &shape, x.dtype, "", "x + y", 0)?,
        (Some(g), Some(b)) => {
            elementwise_with(op, &[h, g, b], &shape, x.dtype, "", "x * y + z", 0)?
        }
    };
    Ok((y, mean, rstd, var))
}

/// `t = (1 - momentum) * t + momentum * scale * batch` in place (a running statistic,
/// `[C]`; `batch` has its `C` elements), as the CPU's `update_running`.
pub(crate) fn update_running(
    op: &'static str,
    t: super::inplace::ViewMut<'_>,
    batch: View<'_>,
    momentum: f64,
    scale: f64,
) -> Result<()> {
    let ty = super::kernels::wgsl_type(t.dtype);
    let bits = [scalar_bits(momentum, t.dtype), scalar_bits(scale, t.dtype)];
    let expr = format!("({ty}(1) - s) * t + s * x * s1");
    super::inplace::assign_n(op, t, &[batch], &expr, &bits)
}

/// The gradients: `dx`, and the sums of `g * xhat` (gamma's gradient) and of `g`
/// (beta's) over the axes each parameter broadcasts along (sorted; `None`: not
/// wanted), row-major over the kept axes (the parameter's own order). `gamma` as in
/// [`normalize`]; `batch_stats`: the statistics came from this batch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn normalize_grad(
    op: &'static str,
    g: View<'_>,
    x: View<'_>,
    (mean, rstd): (View<'_>, View<'_>),
    gamma: Option<View<'_>>,
    axes: &[usize],
    batch_stats: bool,
    (gamma_axes, beta_axes): (Option<&[usize]>, Option<&[usize]>),
) -> Result<(GpuBuffer, Option<GpuBuffer>, Option<GpuBuffer>)> {
    let shape = x.layout.shape.clone();
    let xl = Layout::contiguous(shape.clone());
    let sl = mean.layout;
    let t = x.dtype;
    let xhat = elementwise_with(op, &[x, mean, rstd], &shape, t, "", "(x - y) * z", 0)?;
    let a = at(&xhat, &xl, &x);
    let scaled = times(op, g, gamma)?;
    let b = scaled.as_ref().map_or(g, |s| at(s, &xl, &x));
    let dx = if batch_stats {
        let (mb, _) = reduce(op, Reduce::Mean, b, axes)?;
        let ba = elementwise_with(op, &[b, a], &shape, t, "", "x * y", 0)?;
        let (mba, _) = reduce(op, Reduce::Mean, at(&ba, &xl, &x), axes)?;
        let (mb, mba) = (at(&mb, sl, &x), at(&mba, sl, &x));
        let centred = elementwise_with(op, &[b, mb], &shape, t, "", "x - y", 0)?;
        let h = elementwise_with(
            op,
            &[at(&centred, &xl, &x), a, mba],
            &shape,
            t,
            "",
            "x - y * z",
            0,
        )?;
        elementwise_with(op, &[at(&h, &xl, &x), rstd], &shape, t, "", "x * y", 0)?
    } else {
        elementwise_with(op, &[b, rstd], &shape, t, "", "x * y", 0)?
    };
    let dgamma = match gamma_axes {
        Some(axes) => {
            let ga = elementwise_with(op, &[g, a], &shape, t, "", "x * y", 0)?;
            Some(reduce(op, Reduce::Sum, at(&ga, &xl, &x), axes)?.0)
        }
        None => None,
    };
    let dbeta = match beta_axes {
        Some(axes) => Some(reduce(op, Reduce::Sum, g, axes)?.0),
        None => None,
    };
    Ok((dx, dgamma, dbeta))
}
