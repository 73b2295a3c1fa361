//! Statistics on the device, composed of the device's own reduction and elementwise
//! kernels inside one op (no engine op runs, so nothing is recorded or registered on
//! the way): `var` and `std` in two passes (the mean, then the mean of squared
//! deviations: population variance, as the CPU's Welford pass), `logsumexp` (the
//! maximum, then the sum of `exp(x - max)`), and `norm` (the largest magnitude, then
//! the sum of squares scaled by it, so F32 squares neither overflow nor underflow).
//!
//! Each returns a contiguous buffer over the kept dimensions, in order (the reduced
//! shape with or without kept dims has the same elements). The CPU accumulates in
//! f64; the device in the array's dtype, so F32 results agree to F32 rounding.

use super::GpuBuffer;
use super::inplace::filled;
use super::kernels::{View, elementwise_with, unary, unsupported, wgsl_type};
use super::reduce::{Reduce, reduce};
use crate::DType;
use crate::error::Result;
use crate::layout::Layout;
use crate::opkind::UnOp;
use crate::shape::Shape;

/// WGSL: whether `v` (F32) is infinite or NaN.
const NOT_FINITE: &str =
    "fn not_finite(v: f32) -> bool { return (bitcast<u32>(v) & 0x7fffffffu) >= 0x7f800000u; }\n";

/// `a`'s shape with the `axes` kept as 1.
fn kept(a: &View<'_>, axes: &[usize]) -> Shape {
    let dims: Vec<usize> = (0..a.layout.shape.ndim())
        .map(|d| {
            if axes.contains(&d) {
                1
            } else {
                a.layout.shape.dims()[d]
            }
        })
        .collect();
    Shape::from(&dims[..])
}

/// Population variance (`std`: its square root) of float `a` over `axes`, scaled by
/// each lane's largest deviation `s` so the squares stay in range: `var = s² ·
/// mean(((x - mean) / s)²)`, `std = s · sqrt(..)` (the CPU sums in f64; an F32 lane of
/// ±1e30 has a finite std). An empty lane gives NaN, as on the CPU.
pub(crate) fn var(op: &'static str, a: View<'_>, axes: &[usize], std: bool) -> Result<GpuBuffer> {
    let ctx = a.buf.ctx();
    let shape = &a.layout.shape;
    let out_shape = kept(&a, axes);
    let count: usize = axes.iter().map(|&d| shape.dims()[d]).product();
    if count == 0 {
        return filled(op, ctx, &out_shape, a.dtype, f64::NAN);
    }
    let t = a.dtype;
    let kl = Layout::contiguous(out_shape.clone());
    let cl = Layout::contiguous(shape.clone());
    let at = |buf, layout| View {
        buf,
        layout,
        dtype: t,
    };
    let (mean, _) = reduce(op, Reduce::Mean, a, axes)?;
    let dev = elementwise_with(op, &[a, at(&mean, &kl)], shape, t, "", "abs(x - y)", 0)?;
    let (smax, _) = reduce(op, Reduce::Max, at(&dev, &cl), axes)?;
    let w = wgsl_type(t);
    let q = elementwise_with(
        op,
        &[a, at(&mean, &kl), at(&smax, &kl)],
        shape,
        t,
        "",
        &format!("select(((x - y) / z) * ((x - y) / z), {w}(0), z == {w}(0))"),
        0,
    )?;
    let (qm, _) = reduce(op, Reduce::Mean, at(&q, &cl), axes)?;
    let expr = if std { "sqrt(x) * y" } else { "x * y * y" };
    elementwise_with(
        op,
        &[at(&qm, &kl), at(&smax, &kl)],
        &out_shape,
        t,
        "",
        expr,
        0,
    )
}

/// `log(sum(exp(a)))` over `axes`, stable (F32): `m + log(sum(exp(a - m)))` with `m`
/// the lane's maximum; a lane whose maximum is infinite or NaN gives that maximum, an
/// empty lane -inf, as on the CPU.
pub(crate) fn logsumexp(op: &'static str, a: View<'_>, axes: &[usize]) -> Result<GpuBuffer> {
    let ctx = a.buf.ctx();
    if a.dtype != DType::F32 {
        return Err(unsupported(op, ctx));
    }
    let out_shape = kept(&a, axes);
    let count: usize = axes.iter().map(|&d| a.layout.shape.dims()[d]).product();
    if count == 0 {
        return filled(op, ctx, &out_shape, a.dtype, f64::NEG_INFINITY);
    }
    let (m, _) = reduce(op, Reduce::Max, a, axes)?;
    let ml = Layout::contiguous(out_shape.clone());
    let mv = View {
        buf: &m,
        layout: &ml,
        dtype: a.dtype,
    };
    let shape = &a.layout.shape;
    // An infinite or NaN maximum shifts by 0 (no inf - inf); the result is it anyway.
    let e = elementwise_with(
        op,
        &[a, mv],
        shape,
        a.dtype,
        NOT_FINITE,
        "exp(x - select(y, 0.0, not_finite(y)))",
        0,
    )?;
    let el = Layout::contiguous(shape.clone());
    let ev = View {
        buf: &e,
        layout: &el,
        dtype: a.dtype,
    };
    let (s, _) = reduce(op, Reduce::Sum, ev, axes)?;
    drop(e);
    let sv = View {
        buf: &s,
        layout: &ml,
        dtype: a.dtype,
    };
    elementwise_with(
        op,
        &[sv, mv],
        &out_shape,
        a.dtype,
        NOT_FINITE,
        "select(log(x) + y, y, not_finite(y))",
        0,
    )
}

/// The L2 norm of all of float `a`, as a one-element buffer: `amax * sqrt(sum((a /
/// amax)^2))`; 0 for an empty or all-zero array, and `amax` itself when it is
/// infinite or NaN (as on the CPU).
pub(crate) fn norm(op: &'static str, a: View<'_>) -> Result<GpuBuffer> {
    let ctx = a.buf.ctx();
    let shape = &a.layout.shape;
    let one = Shape::from(&[1usize][..]);
    if shape.size() == 0 {
        return filled(op, ctx, &one, a.dtype, 0.0);
    }
    let all: Vec<usize> = (0..shape.ndim()).collect();
    let ab = unary(UnOp::Abs, a)?;
    let cl = Layout::contiguous(shape.clone());
    let (amax, _) = reduce(
        op,
        Reduce::Max,
        View {
            buf: &ab,
            layout: &cl,
            dtype: a.dtype,
        },
        &all,
    )?;
    drop(ab);
    let ones = Shape::from(vec![1usize; shape.ndim()].as_slice());
    let ml = Layout::contiguous(ones);
    let mv = View {
        buf: &amax,
        layout: &ml,
        dtype: a.dtype,
    };
    let q = elementwise_with(op, &[a, mv], shape, a.dtype, "", "(x / y) * (x / y)", 0)?;
    let (s, _) = reduce(
        op,
        Reduce::Sum,
        View {
            buf: &q,
            layout: &cl,
            dtype: a.dtype,
        },
        &all,
    )?;
    drop(q);
    let ol = Layout::contiguous(one.clone());
    let (sv, mv1) = (
        View {
            buf: &s,
            layout: &ol,
            dtype: a.dtype,
        },
        View {
            buf: &amax,
            layout: &ol,
            dtype: a.dtype,
        },
    );
    let t = if a.dtype == DType::F32 { "f32" } else { "f64" };
    // Infinite or NaN, tested by the bits (a software driver may compile float
    // comparisons as if neither existed); an F64 scaled by 2^-1000 first, so that
    // only inf and NaN stay out of f32's range.
    let big = if a.dtype == DType::F32 {
        "(bitcast<u32>(y) & 0x7fffffffu) >= 0x7f800000u"
    } else {
        "(bitcast<u32>(f32(y * f64(9.332636185032189e-302))) & 0x7fffffffu) >= 0x7f800000u"
    };
    let expr = format!("select(y * sqrt(x), y, y == {t}(0) || {big})");
    elementwise_with(op, &[sv, mv1], &one, a.dtype, "", &expr, 0)
}

/// The cumulative sum of `a` along `axis` (`reverse`: from the end), in `a`'s dtype
/// (integers wrap, U8 modulo 256), into a contiguous buffer of `a`'s shape. One thread
/// per lane walks it in order, so the sums are the CPU's sequential ones; a single
/// long lane is one thread's work (a parallel scan is left for later).
pub(crate) fn cumsum(
    op: &'static str,
    a: View<'_>,
    axis: usize,
    reverse: bool,
) -> Result<GpuBuffer> {
    use super::kernels::{grid, out_buffer};
    use super::rows::{LANE_WALK, lane_params};
    let ctx = a.buf.ctx();
    let t = a.dtype;
    if t == DType::Bool {
        return Err(unsupported(op, ctx));
    }
    let n = a.layout.shape.size();
    let dst = out_buffer(ctx, n, t, op)?;
    if n == 0 {
        return Ok(dst);
    }
    let (mut prm, lanes) = lane_params(op, &a, axis)?;
    let w = wgsl_type(t);
    let wrap = if t == DType::U8 { " & 255u" } else { "" };
    let pipeline = ctx.pipeline(&format!("cumsum {w} {wrap}"), (1, 1), || {
        format!(
            "@group(0) @binding(0) var<storage, read> prm: array<i32>;
@group(0) @binding(1) var<storage, read> src: array<{w}>;
@group(0) @binding(2) var<storage, read_write> dst: array<{w}>;
{LANE_WALK}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {{
    let o = g.x + g.y * nw.x * 256u;
    if (o >= u32(prm[0])) {{ return; }}
    let len = u32(prm[1]);
    let ib = prm[2] + walk(o, 16u);
    let ob = walk(o, 24u);
    var acc = {w}(0);
    for (var k = 0u; k < len; k++) {{
        let r = select(k, len - 1u - k, prm[6] != 0);
        acc = (acc + src[ib + i32(r) * prm[4]]){wrap};
        dst[ob + i32(r) * prm[5]] = acc;
    }}
}}
"
        )
    });
    prm[6] = u32::from(reverse);
    ctx.launch(pipeline, &prm, &[a.buf], &[&dst], grid(lanes));
    Ok(dst)
}
