//! Reductions on the device: sum, mean, max and min over any axes, and the index of
//! the largest or smallest element along an axis (or of the flattened array).
//!
//! One workgroup per output element: its 256 threads stride over the reduced
//! elements (thread `l` takes elements `l`, `l + 256`, ...), then combine in
//! workgroup memory. The input is read in place through its layout, split into the
//! kept dimensions (which output element) and the reduced ones (which element of the
//! reduction, numbered row-major, as the CPU numbers them). Parameter words:
//!
//! ```text
//! [n_out, n_red, offset, kept ndim, reduced ndim, 0, 0, 0,
//!  kept shape[8], kept strides[8], reduced shape[8], reduced strides[8]]
//! ```

use super::kernels::{MAX_DIMS, View, binop_expr, is_nan, out_buffer, unsupported, wgsl_type};
use super::{Ctx, GpuBuffer};
use crate::DType;
use crate::error::{NdError, Result};
use crate::layout::Layout;
use crate::opkind::BinOp;

/// The value reductions with a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reduce {
    Sum,
    /// The product (integers wrap, U8 modulo 256); an empty one is 1.
    Prod,
    Mean,
    Max,
    Min,
}

/// `walk(i, nd, base)`: the offset of the `i`-th element (row-major) over the shape at
/// parameter word `base` and the strides 8 words on; and the bindings.
fn header(t: &str, out: &str) -> String {
    format!(
        "@group(0) @binding(0) var<storage, read> prm: array<i32>;
@group(0) @binding(1) var<storage, read> src: array<{t}>;
@group(0) @binding(2) var<storage, read_write> dst: array<{out}>;
fn walk(i: u32, nd: u32, base: u32) -> i32 {{
    var rem = i;
    var idx = 0;
    for (var j = 0u; j < nd; j++) {{
        let d = nd - 1u - j;
        let s = u32(prm[base + d]);
        idx += i32(rem % s) * prm[base + 8u + d];
        rem = rem / s;
    }}
    return idx;
}}
"
    )
}

/// The parameter words for reducing `a` over `axes` (sorted, distinct), and the
/// number of output elements.
fn params(op: &'static str, a: &View<'_>, axes: &[usize]) -> Result<(Vec<u32>, usize)> {
    let dims = a.layout.shape.dims();
    if dims.len() > MAX_DIMS {
        return Err(NdError::invalid(
            op,
            format!("at most {MAX_DIMS} dimensions on a GPU"),
        ));
    }
    let (mut keep, mut red) = (Vec::new(), Vec::new());
    for (d, &len) in dims.iter().enumerate() {
        let s = a.layout.strides[d] as i32;
        if axes.contains(&d) {
            red.push((len, s));
        } else {
            keep.push((len, s));
        }
    }
    let n_out: usize = keep.iter().map(|k| k.0).product();
    let n_red: usize = red.iter().map(|k| k.0).product();
    let mut prm = [0i32; 8 + 32];
    prm[0] = n_out as i32;
    prm[1] = n_red as i32;
    prm[2] = a.layout.offset as i32;
    prm[3] = keep.len() as i32;
    prm[4] = red.len() as i32;
    for (j, &(len, s)) in keep.iter().enumerate() {
        prm[8 + j] = len as i32;
        prm[16 + j] = s;
    }
    for (j, &(len, s)) in red.iter().enumerate() {
        prm[24 + j] = len as i32;
        prm[32 + j] = s;
    }
    Ok((prm.iter().map(|&w| w as u32).collect(), n_out))
}

/// One workgroup per output element, in a 2-D grid past 65,535.
fn launch(
    ctx: &'static Ctx,
    kernel: &'static super::Kernel,
    prm: &[u32],
    a: &View<'_>,
    dst: &GpuBuffer,
    n_out: usize,
) {
    let x = n_out.min(65_535);
    ctx.launch(
        kernel,
        prm,
        &[a.buf],
        &[dst],
        (x as u32, n_out.div_ceil(x) as u32, 1),
    );
}

/// `kind` of `a` over `axes` (sorted, distinct): the result has `a`'s other
/// dimensions, in order, and the CPU's dtype: `a`'s, or F64 for the mean of integers.
/// Sums wrap in an integer dtype (U8 modulo 256), max and min propagate NaN. The
/// caller refuses what the CPU refuses (Bool sums, max of an empty reduction).
pub(crate) fn reduce(
    op: &'static str,
    kind: Reduce,
    a: View<'_>,
    axes: &[usize],
) -> Result<(GpuBuffer, DType)> {
    let ctx = a.buf.ctx();
    let out = match kind {
        Reduce::Mean if !a.dtype.is_float() => DType::F64,
        _ => a.dtype,
    };
    if kind != Reduce::Max && kind != Reduce::Min && a.dtype == DType::Bool {
        return Err(unsupported(op, ctx));
    }
    let (prm, n_out) = params(op, &a, axes)?;
    let dst = out_buffer(ctx, n_out, out, op)?;
    if n_out == 0 {
        return Ok((dst, out));
    }
    let t = wgsl_type(a.dtype);
    let acc = wgsl_type(out);
    let (comb, fin) = match kind {
        Reduce::Sum if a.dtype == DType::U8 => ("acc + v".to_string(), "acc & 255u"),
        Reduce::Sum => ("acc + v".into(), "acc"),
        Reduce::Prod if a.dtype == DType::U8 => ("acc * v".into(), "acc & 255u"),
        Reduce::Prod => ("acc * v".into(), "acc"),
        Reduce::Mean => ("acc + v".into(), "acc / f(n_red)"),
        // NaN propagates (the CPU's max_of/min_of): `binop_expr` knows how; U8 and
        // Bool, which have no arithmetic there, are plain u32.
        Reduce::Max => (
            binop_expr(BinOp::Maximum, a.dtype, "acc", "v").unwrap_or("max(acc, v)".into()),
            "acc",
        ),
        Reduce::Min => (
            binop_expr(BinOp::Minimum, a.dtype, "acc", "v").unwrap_or("min(acc, v)".into()),
            "acc",
        ),
    };
    // Sums start at 0, products at 1; max and min at the reduction's first element
    // (which exists: the caller refused empty ones).
    let first = matches!(kind, Reduce::Max | Reduce::Min);
    let init = if kind == Reduce::Prod { "f(1)" } else { "f(0)" };
    let key = format!("reduce {kind:?} {t}");
    let kernel = ctx.pipeline(&key, (1, 1), || {
        format!(
            "{}
alias f = {acc};
var<workgroup> part: array<f, 256>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) w: vec3<u32>, @builtin(local_invocation_index) l: u32) {{
    let o = wg.x + wg.y * w.x;
    let n_red = u32(prm[1]);
    var acc = {init};
    if (o < u32(prm[0])) {{
        let base = prm[2] + walk(o, u32(prm[3]), 8u);
        if ({first}) {{
            acc = f(src[base]);
        }}
        for (var r = l; r < n_red; r += 256u) {{
            let v = f(src[base + walk(r, u32(prm[4]), 24u)]);
            acc = {comb};
        }}
    }}
    part[l] = acc;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h = h / 2u) {{
        if (l < h) {{
            let v = part[l + h];
            acc = part[l];
            part[l] = {comb};
        }}
        workgroupBarrier();
    }}
    if (l == 0u && o < u32(prm[0])) {{
        acc = part[0];
        dst[o] = {fin};
    }}
}}
",
            header(t, acc)
        )
    });
    launch(ctx, kernel, &prm, &a, &dst, n_out);
    Ok((dst, out))
}

/// The index (I64, row-major over `axes`) of the largest (`max`) or smallest element
/// of `a` over `axes` (sorted, distinct), as the CPU's `argmax`/`argmin`: the first
/// NaN wins over numbers, and among equal values the first index. The caller refuses
/// an empty reduction.
pub(crate) fn arg_reduce(
    op: &'static str,
    max: bool,
    a: View<'_>,
    axes: &[usize],
) -> Result<GpuBuffer> {
    let ctx = a.buf.ctx();
    let (prm, n_out) = params(op, &a, axes)?;
    let dst = out_buffer(ctx, n_out, DType::I64, op)?;
    if n_out == 0 {
        return Ok(dst);
    }
    let t = wgsl_type(a.dtype);
    let cmp = if max { ">" } else { "<" };
    let key = format!("argreduce {cmp} {t}");
    let kernel = ctx.pipeline(&key, (1, 1), || {
        format!(
            "{}
var<workgroup> pv: array<{t}, 256>;
var<workgroup> pi: array<i32, 256>;
// Whether candidate (v, i) beats (b, j); index -1 is no candidate.
fn wins(v: {t}, i: i32, b: {t}, j: i32) -> bool {{
    if (i < 0) {{ return false; }}
    if (j < 0) {{ return true; }}
    let vn = {};
    let bn = {};
    if (vn || bn) {{ return vn && (!bn || i < j); }}
    if (v == b) {{ return i < j; }}
    return v {cmp} b;
}}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) w: vec3<u32>, @builtin(local_invocation_index) l: u32) {{
    let o = wg.x + wg.y * w.x;
    let n_red = u32(prm[1]);
    var best = {t}(0);
    var bi = -1;
    if (o < u32(prm[0])) {{
        let base = prm[2] + walk(o, u32(prm[3]), 8u);
        for (var r = l; r < n_red; r += 256u) {{
            let v = src[base + walk(r, u32(prm[4]), 24u)];
            if (wins(v, i32(r), best, bi)) {{
                best = v;
                bi = i32(r);
            }}
        }}
    }}
    pv[l] = best;
    pi[l] = bi;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h = h / 2u) {{
        if (l < h && wins(pv[l + h], pi[l + h], pv[l], pi[l])) {{
            pv[l] = pv[l + h];
            pi[l] = pi[l + h];
        }}
        workgroupBarrier();
    }}
    if (l == 0u && o < u32(prm[0])) {{
        dst[o] = i64(pi[0]);
    }}
}}
",
            header(t, "i64"),
            is_nan(a.dtype, "v"),
            is_nan(a.dtype, "b"),
        )
    });
    launch(ctx, kernel, &prm, &a, &dst, n_out);
    Ok(dst)
}

/// `any` (`any == true`: some element of the lane is nonzero) or `all` (every one is)
/// of `a` over `axes` (sorted, distinct), as Bool words of `out_shape`: the elements
/// that decide (nonzero for `any`, zero for `all`) are counted, then the count is
/// compared with 0. NaN is nonzero, as on the CPU; an empty lane is false for `any`
/// and true for `all`.
pub(crate) fn truth(
    op: &'static str,
    a: View<'_>,
    axes: &[usize],
    any: bool,
    out_shape: &crate::Shape,
) -> Result<GpuBuffer> {
    use super::kernels::elementwise_with;
    let t = wgsl_type(a.dtype);
    let nonzero = if a.dtype.is_float() {
        format!("(x != {t}(0) || {})", is_nan(a.dtype, "x"))
    } else {
        format!("(x != {t}(0))")
    };
    let decides = if any {
        format!("select(0i, 1i, {nonzero})")
    } else {
        format!("select(1i, 0i, {nonzero})")
    };
    let shape = a.layout.shape.clone();
    let marks = elementwise_with(op, &[a], &shape, DType::I32, "", &decides, 0)?;
    let ml = Layout::contiguous(shape);
    let mv = View {
        buf: &marks,
        layout: &ml,
        dtype: DType::I32,
    };
    let (count, _) = reduce(op, Reduce::Sum, mv, axes)?;
    let cl = Layout::contiguous(out_shape.clone());
    let cv = View {
        buf: &count,
        layout: &cl,
        dtype: DType::I32,
    };
    let verdict = if any {
        "select(0u, 1u, x != 0i)"
    } else {
        "select(0u, 1u, x == 0i)"
    };
    elementwise_with(op, &[cv], out_shape, DType::Bool, "", verdict, 0)
}
