//! The more elementwise math on the device (`opkind::Fn1`: `erf` to `sign`), forward
//! and derivative, as the CPU's `array/unary.rs` computes them.
//!
//! Vulkan's `exp`, `log` and the like take 32-bit floats only, so the transcendental
//! functions (`erf`, `gelu`, `silu`, `softplus`, `log1p`, `expm1`) run on F32 arrays;
//! `leaky_relu`, `reciprocal`, `rsqrt`, `floor`, `ceil`, `round` and `sign` on F64 too,
//! and the integer forms (identity, `sign`) on I32, I64 and U8. WGSL has no `erf`: `erfc`
//! is Abramowitz and Stegun's 7.1.26 (absolute error at most 1.5e-7, about one f32
//! ulp of 1), `log1p` and `expm1` Kahan's corrections of `log(1 + x)` and `exp(x) - 1`.

use super::GpuBuffer;
use super::kernels::{View, elementwise_with, is_nan, scalar_bits, unsupported, wgsl_type};
use crate::DType;
use crate::error::Result;
use crate::opkind::Fn1;
use crate::shape::Shape;

/// The helpers the expressions call (F32).
const FUNCS: &str = "
fn erfc_pos(z: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.3275911 * z);
    let p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return p * exp(-z * z);
}
fn erfc_(z: f32) -> f32 {
    return select(2.0 - erfc_pos(-z), erfc_pos(z), z >= 0.0);
}
fn erf_(x: f32) -> f32 {
    return sign(x) * (1.0 - erfc_pos(abs(x)));
}
fn log1p_(u: f32) -> f32 {
    let w = 1.0 + u;
    if (w == 1.0) { return u; }
    return log(w) * u / (w - 1.0);
}
fn expm1_(x: f32) -> f32 {
    let e = exp(x);
    if (e == 1.0) { return x; }
    if (e - 1.0 == -1.0) { return -1.0; }
    if (inf_(e)) { return e; }
    return (e - 1.0) * x / log(e);
}
fn sigmoid_(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}
fn inf_(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u;
}
fn gelu_(x: f32) -> f32 {
    if (inf_(x) && x < 0.0) { return 0.0; }
    return 0.5 * x * erfc_(-x * 0.70710678118654752);
}
fn dgelu_(x: f32) -> f32 {
    if (inf_(x)) { return select(0.0, 1.0, x > 0.0); }
    return 0.5 * erfc_(-x * 0.70710678118654752) + x * 0.39894228040143268 * exp(-0.5 * x * x);
}
fn silu_(x: f32) -> f32 {
    if (inf_(x) && x < 0.0) { return 0.0; }
    return x / (1.0 + exp(-x));
}
fn dsilu_(x: f32) -> f32 {
    if (inf_(x)) { return select(0.0, 1.0, x > 0.0); }
    let s = sigmoid_(x);
    return s * (1.0 + x * (1.0 - s));
}
";

/// `op` of `x` as WGSL in type `t` (`s`: leaky_relu's slope); `None` where the device
/// has no kernel for that dtype.
fn forward_expr(op: Fn1, d: DType) -> Option<String> {
    let t = wgsl_type(d);
    let (f32, float) = (d == DType::F32, d.is_float());
    let int = matches!(d, DType::I32 | DType::I64);
    let sign = format!("select(select({t}(0), {t}(-1), x < {t}(0)), {t}(1), x > {t}(0))");
    Some(match op {
        Fn1::Erf if f32 => "erf_(x)".into(),
        Fn1::Gelu if f32 => "gelu_(x)".into(),
        Fn1::Silu if f32 => "silu_(x)".into(),
        Fn1::Softplus if f32 => "max(x, 0.0) + log1p_(exp(-abs(x)))".into(),
        Fn1::Log1p if f32 => "log1p_(x)".into(),
        Fn1::Expm1 if f32 => "expm1_(x)".into(),
        Fn1::LeakyRelu if float => format!("select(x * s, x, x > {t}(0))"),
        Fn1::Reciprocal if float => format!("{t}(1) / x"),
        Fn1::Rsqrt if float => format!("{t}(1) / sqrt(x)"),
        Fn1::Floor if float => "floor(x)".into(),
        Fn1::Ceil if float => "ceil(x)".into(),
        // Round half to even (as round_ties_even), through `floor`: `x - floor(x)` is
        // exact, so the choice between `f` and `f + 1` is too. Not WGSL's `round`:
        // Mesa's llvmpipe on an AVX2-only CPU rounded the f64 -0.5000000005 to 0.
        // A zero result may come back as +0 where the CPU gives -0 (llvmpipe does not
        // keep the sign of zeros, even through `x * 0`).
        Fn1::Round if float => {
            let (f, r) = ("floor(x)", "(x - floor(x))");
            format!(
                "select(select({f}, {f} + {t}(1), {r} > {t}(0.5)), \
                 {f} + ({f} - {t}(2) * floor({f} * {t}(0.5))), {r} == {t}(0.5))"
            )
        }
        // NaN stays NaN; -0 and 0 give 0.
        Fn1::Sign if float => format!("select({sign}, x, {})", is_nan(d, "x")),
        Fn1::Floor | Fn1::Ceil | Fn1::Round if int || d == DType::U8 => "x".into(),
        Fn1::Sign if int => sign,
        Fn1::Sign if d == DType::U8 => "select(0u, 1u, x > 0u)".into(),
        _ => return None,
    })
}

/// `f'(x)` as WGSL (F32 or F64 as [`forward_expr`]).
fn deriv_expr(op: Fn1, d: DType) -> Option<String> {
    let t = wgsl_type(d);
    let (f32, float) = (d == DType::F32, d.is_float());
    Some(match op {
        Fn1::Erf if f32 => "1.1283791670955126 * exp(-x * x)".into(),
        Fn1::Gelu if f32 => "dgelu_(x)".into(),
        Fn1::Silu if f32 => "dsilu_(x)".into(),
        Fn1::Softplus if f32 => "sigmoid_(x)".into(),
        Fn1::Log1p if f32 => "1.0 / (1.0 + x)".into(),
        Fn1::Expm1 if f32 => "exp(x)".into(),
        Fn1::LeakyRelu if float => format!("select(s, {t}(1), x > {t}(0))"),
        Fn1::Reciprocal if float => format!("-(({t}(1) / x) * ({t}(1) / x))"),
        Fn1::Rsqrt if float => {
            format!("{t}(-0.5) * ({t}(1) / sqrt(x)) * ({t}(1) / sqrt(x)) * ({t}(1) / sqrt(x))")
        }
        _ => return None,
    })
}

/// `op` of `a` (`alpha`: leaky_relu's slope), in `a`'s dtype.
pub(crate) fn forward(op: Fn1, a: View<'_>, alpha: f64) -> Result<GpuBuffer> {
    let ctx = a.buf.ctx();
    let expr = forward_expr(op, a.dtype).ok_or_else(|| unsupported(op.name(), ctx))?;
    let s = scalar_bits(alpha, a.dtype);
    let shape = a.layout.shape.clone();
    elementwise_with(op.name(), &[a], &shape, a.dtype, FUNCS, &expr, s)
}

/// The gradient `g * f'(x)` of `op`, broadcast to `shape`.
pub(crate) fn backward(
    op: Fn1,
    x: View<'_>,
    g: View<'_>,
    shape: &Shape,
    alpha: f64,
) -> Result<GpuBuffer> {
    let ctx = x.buf.ctx();
    let name = op.backward_name();
    let d = deriv_expr(op, x.dtype).ok_or_else(|| unsupported(name, ctx))?;
    let s = scalar_bits(alpha, x.dtype);
    elementwise_with(
        name,
        &[x, g],
        shape,
        x.dtype,
        FUNCS,
        &format!("y * ({d})"),
        s,
    )
}

/// `unset` where the Bool `mask` (broadcast to `a`'s shape) is not set, `set` where it
/// is: WGSL over `x` (`a`'s element) and `s` (`scalar` in `a`'s dtype).
/// `masked_fill` is `("x", "s")`, dropout's forward `("0", "x * s")` (the mask keeps).
pub(crate) fn masked(
    op: &'static str,
    a: View<'_>,
    mask: View<'_>,
    (unset, set): (&str, &str),
    scalar: f64,
) -> Result<GpuBuffer> {
    let s = scalar_bits(scalar, a.dtype);
    let shape = a.layout.shape.clone();
    let expr = format!("select({unset}, {set}, y != 0u)");
    elementwise_with(op, &[a, mask], &shape, a.dtype, "", &expr, s)
}

/// `a` clamped to `[lo, hi]` (bounds already in range of `a`'s dtype; NaN stays NaN,
/// as the CPU's `max_of`/`min_of`), in two passes.
pub(crate) fn clip(a: View<'_>, lo: f64, hi: f64) -> Result<GpuBuffer> {
    use crate::opkind::BinOp;
    let (t, shape) = (a.dtype, a.layout.shape.clone());
    let bound = |op: BinOp, f: &str| {
        super::kernels::binop_expr(op, t, "x", "s")
            .filter(|_| t.is_float())
            .unwrap_or_else(|| format!("{f}(x, s)"))
    };
    let low = elementwise_with(
        "clip",
        &[a],
        &shape,
        t,
        "",
        &bound(BinOp::Maximum, "max"),
        scalar_bits(lo, t),
    )?;
    let l = crate::layout::Layout::contiguous(shape.clone());
    let lv = View {
        buf: &low,
        layout: &l,
        dtype: t,
    };
    let expr = bound(BinOp::Minimum, "min");
    elementwise_with("clip", &[lv], &shape, t, "", &expr, scalar_bits(hi, t))
}

/// `tril` (`lower`) or `triu` of `a` (at least 2-D) with diagonal offset `k`: the
/// elements with `col - row <= k` (`>= k` for `triu`) of each matrix of the last two
/// axes, zeros elsewhere, into a contiguous buffer. `k` travels in the scalar's words
/// (clamped to `i32`, beyond which every matrix is whole or empty alike).
pub(crate) fn tri(a: View<'_>, k: i64, lower: bool) -> Result<GpuBuffer> {
    let (t, shape) = (a.dtype, a.layout.shape.clone());
    let op = if lower { "tril" } else { "triu" };
    let k = k.clamp(i64::from(i32::MIN) + 1, i64::from(i32::MAX) - 1) as i32;
    let cmp = if lower { "<=" } else { ">=" };
    // `col - row` of output element `i`.
    const FUNCS: &str = "fn tri_diag(i: u32) -> i32 {
    let nd = u32(prm[1]);
    let cols = u32(prm[4u + nd - 1u]);
    let rows = u32(prm[4u + nd - 2u]);
    return i32(i % cols) - i32((i / cols) % rows);
}
";
    let expr = format!("select({}(0), x, tri_diag(i) {cmp} prm[2])", wgsl_type(t));
    elementwise_with(op, &[a], &shape, t, FUNCS, &expr, u64::from(k as u32))
}

/// The mean over every element of an elementwise loss of `x` and target `t` (one
/// shape): `mse_loss`'s `(x - t)^2` (F32, F64) or
/// `binary_cross_entropy_with_logits`' `max(x, 0) - x t + log1p(exp(-|x|))` (F32: it
/// exponentiates). A 0-d buffer. The device sums in the array's dtype, the CPU in f64.
pub(crate) fn mean_loss(
    op: &'static str,
    bce: bool,
    x: View<'_>,
    t: View<'_>,
) -> Result<GpuBuffer> {
    use super::reduce::{Reduce, reduce};
    let ctx = x.buf.ctx();
    let expr = match (bce, x.dtype) {
        (false, _) => "(x - y) * (x - y)".to_string(),
        (true, DType::F32) => "max(x, 0.0) - x * y + log1p_(exp(-abs(x)))".to_string(),
        _ => return Err(unsupported(op, ctx)),
    };
    let shape = x.layout.shape.clone();
    let terms = elementwise_with(op, &[x, t], &shape, x.dtype, FUNCS, &expr, 0)?;
    let flat = crate::layout::Layout::contiguous(Shape::from([shape.size()]));
    let all = View {
        buf: &terms,
        layout: &flat,
        dtype: x.dtype,
    };
    let (mean, _) = reduce(op, Reduce::Mean, all, &[0])?;
    Ok(mean)
}
