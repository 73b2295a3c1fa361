//! WGSL kernels over strided views.
//!
//! Every kernel reads its inputs through a [`View`] (a device buffer plus the
//! [`Layout`] that maps indices into it), so broadcast, stepped, reversed and
//! transposed views need no copy, and writes a new contiguous buffer. A kernel's
//! source is generated per op and dtype from one template and compiled once
//! ([`Ctx::pipeline`]). Parameters go in a small storage block of `i32` words:
//!
//! ```text
//! [n, ndim, scalar, 0, shape[8], (off_k, strides_k[8]) for each input k]
//! ```
//!
//! An element `i < n` of the output is split into indices over `shape` (row-major),
//! and input `k` reads `off_k + sum(idx[d] * strides_k[d])` ([`INDEX_FN`], words from
//! [`index_params`]).

use super::{Ctx, GpuBuffer, elem_bytes};
use crate::DType;
use crate::error::{NdError, Result};
use crate::layout::Layout;
use crate::opkind::{BinOp, CmpOp, UnOp};
use crate::shape::Shape;
use smallvec::SmallVec;

/// The most dimensions a kernel takes.
pub(crate) const MAX_DIMS: usize = 8;
const WG: u32 = 256;

/// A kernel input: a device buffer read through a layout.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    pub buf: &'a GpuBuffer,
    pub layout: &'a Layout,
    pub dtype: DType,
}

/// The reductions with a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reduce {
    Sum,
    Mean,
    Max,
    Min,
}

/// The WGSL type of `d`'s elements on the device.
pub(crate) fn wgsl_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::I32 => "i32",
        _ => "u32",
    }
}

pub(super) fn unsupported(op: &'static str, ctx: &Ctx) -> NdError {
    NdError::Unsupported {
        op,
        device: ctx.device_id(),
    }
}

/// The output buffer of `n` elements of `dtype`.
pub(super) fn out_buffer(
    ctx: &'static Ctx,
    n: usize,
    dtype: DType,
    op: &'static str,
) -> Result<GpuBuffer> {
    let eb = elem_bytes(dtype).ok_or_else(|| unsupported(op, ctx))?;
    ctx.alloc((n * eb) as u64)
}

/// Workgroups for `n` threads of [`WG`]: a 2-D grid past 65,535 groups.
pub(super) fn grid(n: usize) -> (u32, u32, u32) {
    let groups = n.div_ceil(WG as usize).max(1);
    let x = groups.min(65_535);
    (x as u32, groups.div_ceil(x) as u32, 1)
}

/// `at(i, k)`: the element of input `k` that output element `i` reads (see the module
/// docs for the parameter words).
pub(crate) const INDEX_FN: &str = "
fn at(i: u32, k: u32) -> i32 {
    let nd = u32(prm[1]);
    var rem = i;
    var idx = prm[12u + 9u * k];
    for (var j = 0u; j < nd; j++) {
        let d = nd - 1u - j;
        let s = u32(prm[4u + d]);
        idx += i32(rem % s) * prm[13u + 9u * k + d];
        rem = rem / s;
    }
    return idx;
}
";

/// The parameter words of [`INDEX_FN`]: `n` elements over `shape`, input `k` read at
/// `inputs[k].0 + sum(idx[d] * inputs[k].1[d])`, and a scalar's bits. `op` names the
/// caller in the error for more than [`MAX_DIMS`] dimensions.
pub(crate) fn index_params(
    op: &'static str,
    ctx: &Ctx,
    shape: &Shape,
    inputs: &[(usize, &[isize])],
    scalar: u32,
) -> Result<SmallVec<[u32; 40]>> {
    let nd = shape.ndim();
    if nd > MAX_DIMS {
        return Err(NdError::invalid(
            op,
            format!(
                "{} supports at most {MAX_DIMS} dimensions, got {nd}",
                ctx.device_id()
            ),
        ));
    }
    let mut prm: SmallVec<[u32; 40]> = smallvec::smallvec![0; 12 + 9 * inputs.len()];
    prm[0] = shape.size() as u32;
    prm[1] = nd as u32;
    prm[2] = scalar;
    for (d, &len) in shape.dims().iter().enumerate() {
        prm[4 + d] = len as u32;
    }
    for (k, (off, strides)) in inputs.iter().enumerate() {
        prm[12 + 9 * k] = *off as u32;
        for (d, &st) in strides.iter().enumerate() {
            prm[13 + 9 * k + d] = st as i32 as u32;
        }
    }
    Ok(prm)
}

/// Run the elementwise kernel `expr` (over `x`, and `y` for two inputs; `s` is the
/// scalar) on `inputs` broadcast to `shape`, into a new buffer of `out`.
fn elementwise(
    op: &'static str,
    inputs: &[View<'_>],
    shape: &Shape,
    out: DType,
    expr: &str,
    scalar: u32,
) -> Result<GpuBuffer> {
    let ctx = inputs[0].buf.ctx();
    let strides: SmallVec<[_; 3]> = inputs
        .iter()
        .map(|v| v.layout.broadcast_strides(shape))
        .collect();
    let views: SmallVec<[(usize, &[isize]); 3]> = inputs
        .iter()
        .zip(&strides)
        .map(|(v, s)| (v.layout.offset, &s[..]))
        .collect();
    let prm = index_params(op, ctx, shape, &views, scalar)?;
    let n = shape.size();
    let dst = out_buffer(ctx, n, out, op)?;
    if n == 0 {
        return Ok(dst);
    }
    let ts: Vec<&str> = inputs.iter().map(|v| wgsl_type(v.dtype)).collect();
    let key = format!("ew {expr} {ts:?} {}", wgsl_type(out));
    let pipeline = ctx.pipeline(&key, (inputs.len(), 1), || {
        let mut src = String::from("@group(0) @binding(0) var<storage, read> prm: array<i32>;\n");
        let names = ["x", "y", "z"];
        for (k, t) in ts.iter().enumerate() {
            src += &format!(
                "@group(0) @binding({}) var<storage, read> in{k}: array<{t}>;\n",
                k + 1
            );
        }
        src += &format!(
            "@group(0) @binding({}) var<storage, read_write> dst: array<{}>;\n",
            inputs.len() + 1,
            wgsl_type(out)
        );
        src += INDEX_FN;
        src += "@compute @workgroup_size(256)\nfn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) w: vec3<u32>) {\n";
        src += "    let i = g.x + g.y * w.x * 256u;\n    if (i >= u32(prm[0])) { return; }\n";
        src += &format!("    let s = bitcast<{}>(prm[2]);\n", ts[0]);
        for (k, name) in names.iter().enumerate().take(inputs.len()) {
            src += &format!("    let {name} = in{k}[at(i, {k}u)];\n");
        }
        src += &format!("    dst[i] = {expr};\n}}\n");
        src
    });
    let reads: SmallVec<[&GpuBuffer; 3]> = inputs.iter().map(|v| v.buf).collect();
    ctx.launch(pipeline, &prm, &reads, &[&dst], grid(n));
    Ok(dst)
}

/// The WGSL of `op` over operands `x` and `y` in type `t`; `None` where the device has
/// no kernel.
pub(crate) fn binop_expr(op: BinOp, t: DType, x: &str, y: &str) -> Option<String> {
    let f32 = t == DType::F32;
    if !numeric(t) {
        return None;
    }
    Some(match op {
        BinOp::Add => format!("{x} + {y}"),
        BinOp::Sub => format!("{x} - {y}"),
        BinOp::Mul => format!("{x} * {y}"),
        BinOp::Div if f32 => format!("{x} / {y}"),
        BinOp::Pow if f32 => format!("pow({x}, {y})"),
        // NaN propagates (the CPU's max_of/min_of): only NaN differs from itself.
        BinOp::Maximum if f32 => {
            format!("select(select(max({x}, {y}), {y}, {y} != {y}), {x}, {x} != {x})")
        }
        BinOp::Minimum if f32 => {
            format!("select(select(min({x}, {y}), {y}, {y} != {y}), {x}, {x} != {x})")
        }
        BinOp::Maximum => format!("max({x}, {y})"),
        BinOp::Minimum => format!("min({x}, {y})"),
        _ => return None,
    })
}

fn numeric(t: DType) -> bool {
    matches!(t, DType::F32 | DType::I32)
}

/// `a op b`, broadcast to `shape`.
pub(crate) fn binary(op: BinOp, a: View<'_>, b: View<'_>, shape: &Shape) -> Result<GpuBuffer> {
    let ctx = a.buf.ctx();
    let expr = binop_expr(op, a.dtype, "x", "y")
        .filter(|_| numeric(a.dtype))
        .ok_or_else(|| unsupported(op.name(), ctx))?;
    elementwise(op.name(), &[a, b], shape, a.dtype, &expr, 0)
}

/// `a op s` (or `s op a` when `left`).
pub(crate) fn binary_scalar(op: BinOp, a: View<'_>, s: f64, left: bool) -> Result<GpuBuffer> {
    let ctx = a.buf.ctx();
    let (x, y) = if left { ("s", "x") } else { ("x", "s") };
    let expr = binop_expr(op, a.dtype, x, y)
        .filter(|_| numeric(a.dtype))
        .ok_or_else(|| unsupported(op.name(), ctx))?;
    // The scalar in the array's dtype, as the CPU casts it.
    let bits = match a.dtype {
        DType::F32 => (s as f32).to_bits(),
        _ => (s as i32) as u32,
    };
    elementwise(op.name(), &[a], &a.layout.shape, a.dtype, &expr, bits)
}

fn cmp_symbol(op: CmpOp) -> &'static str {
    match op {
        CmpOp::Eq => "==",
        CmpOp::Ne => "!=",
        CmpOp::Gt => ">",
        CmpOp::Ge => ">=",
        CmpOp::Lt => "<",
        CmpOp::Le => "<=",
    }
}

/// `a cmp b` to Bool, broadcast to `shape`.
pub(crate) fn compare(op: CmpOp, a: View<'_>, b: View<'_>, shape: &Shape) -> Result<GpuBuffer> {
    let sym = cmp_symbol(op);
    elementwise(
        op.name(),
        &[a, b],
        shape,
        DType::Bool,
        &format!("u32(x {sym} y)"),
        0,
    )
}

/// `a cmp s` to Bool, `s` given as its bits in `a`'s type (the caller decides how the
/// scalar converts; see the op's docs).
pub(crate) fn compare_scalar(op: CmpOp, a: View<'_>, s_bits: u32) -> Result<GpuBuffer> {
    let expr = format!("u32(x {} s)", cmp_symbol(op));
    elementwise(op.name(), &[a], &a.layout.shape, DType::Bool, &expr, s_bits)
}

/// `x` where `cond` (Bool) is true, else `y`, broadcast to `shape`.
pub(crate) fn select(cond: View<'_>, x: View<'_>, y: View<'_>, shape: &Shape) -> Result<GpuBuffer> {
    // Inputs are x, y, z in the kernel: the condition first.
    elementwise(
        "where",
        &[cond, x, y],
        shape,
        x.dtype,
        "select(z, y, x != 0u)",
        0,
    )
}

/// Elementwise math of `op`.
pub(crate) fn unary(op: UnOp, a: View<'_>) -> Result<GpuBuffer> {
    let ctx = a.buf.ctx();
    let float = a.dtype == DType::F32;
    let ty = wgsl_type(a.dtype);
    let expr = match op {
        UnOp::Abs if numeric(a.dtype) => "abs(x)".to_string(),
        UnOp::Neg if numeric(a.dtype) => "-x".into(),
        UnOp::Square if numeric(a.dtype) => "x * x".into(),
        // NaN propagates, as on the CPU.
        UnOp::Relu if numeric(a.dtype) => format!("select(x, {ty}(0), x < {ty}(0))"),
        UnOp::Exp if float => "exp(x)".into(),
        UnOp::Log if float => "log(x)".into(),
        UnOp::Sqrt if float => "sqrt(x)".into(),
        UnOp::Sin if float => "sin(x)".into(),
        UnOp::Cos if float => "cos(x)".into(),
        UnOp::Tanh if float => "tanh(x)".into(),
        UnOp::Sigmoid if float => "1.0 / (1.0 + exp(-x))".into(),
        _ => return Err(unsupported(op.name(), ctx)),
    };
    elementwise(op.name(), &[a], &a.layout.shape, a.dtype, &expr, 0)
}

/// A contiguous copy of `a` in dtype `to` (`to == a.dtype`: a plain copy of the view).
pub(crate) fn convert(op: &'static str, a: View<'_>, to: DType) -> Result<GpuBuffer> {
    let ctx = a.buf.ctx();
    if elem_bytes(a.dtype).is_none() || elem_bytes(to).is_none() {
        return Err(unsupported(op, ctx));
    }
    let expr = match (a.dtype, to) {
        (f, t) if f == t => "x".to_string(),
        (f, DType::Bool) => format!("u32(x != {}(0))", wgsl_type(f)),
        (DType::F32, DType::U8) => "u32(clamp(x, 0.0, 255.0))".into(),
        (_, DType::U8) => "u32(x) & 255u".into(),
        (_, t) => format!("{}(x)", wgsl_type(t)),
    };
    elementwise(op, &[a], &a.layout.shape, to, &expr, 0)
}

/// `kind` of `a` over `axes` (sorted, distinct); the result has `a`'s other dimensions,
/// in order. F32 only. One workgroup per output element: its threads stride over the
/// reduced elements and combine in workgroup memory.
pub(crate) fn reduce(
    op: &'static str,
    kind: Reduce,
    a: View<'_>,
    axes: &[usize],
) -> Result<GpuBuffer> {
    let ctx = a.buf.ctx();
    if a.dtype != DType::F32 {
        return Err(unsupported(op, ctx));
    }
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
    let dst = out_buffer(ctx, n_out, DType::F32, op)?;
    if n_out == 0 {
        return Ok(dst);
    }
    // [n_out, n_red, off, nk, nr, pad*3, keep shape[8], keep strides[8], red shape[8], red strides[8]]
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
    let (init, comb, fin) = match kind {
        Reduce::Sum => ("0.0", "acc + v", "acc"),
        Reduce::Mean => ("0.0", "acc + v", "acc / f32(n_red)"),
        Reduce::Max => (
            "bitcast<f32>(0xff800000u)",
            "select(select(max(acc, v), v, v != v), acc, acc != acc)",
            "acc",
        ),
        Reduce::Min => (
            "bitcast<f32>(0x7f800000u)",
            "select(select(min(acc, v), v, v != v), acc, acc != acc)",
            "acc",
        ),
    };
    let key = format!("reduce {kind:?}");
    let pipeline = ctx.pipeline(&key, (1, 1), || {
        format!(
            "@group(0) @binding(0) var<storage, read> prm: array<i32>;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
var<workgroup> part: array<f32, 256>;
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
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) w: vec3<u32>, @builtin(local_invocation_index) l: u32) {{
    let o = wg.x + wg.y * w.x;
    let n_red = u32(prm[1]);
    var acc = {init};
    if (o < u32(prm[0])) {{
        let base = prm[2] + walk(o, u32(prm[3]), 8u);
        for (var r = l; r < n_red; r += 256u) {{
            let v = src[base + walk(r, u32(prm[4]), 24u)];
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
"
        )
    });
    let prm: Vec<u32> = prm.iter().map(|&w| w as u32).collect();
    let x = n_out.min(65_535);
    ctx.launch(
        pipeline,
        &prm,
        &[a.buf],
        &[&dst],
        (x as u32, n_out.div_ceil(x) as u32, 1),
    );
    Ok(dst)
}

/// One operand of [`matmul`]: its buffer and the element strides of its rows and
/// columns (a transposed view just swaps them).
pub(crate) struct MatView<'a> {
    pub buf: &'a GpuBuffer,
    pub rs: isize,
    pub cs: isize,
}

/// `out[b] = A[b] (m x k) @ B[b] (k x n)` for each batch `b`, whose matrices start at
/// `offsets[b]` (elements of A, of B); `out` is `[batches, m, n]`, contiguous. F32 only.
/// Tiled: each 16x16 workgroup stages 16x16 blocks of A and B in workgroup memory.
pub(crate) fn matmul(
    op: &'static str,
    a: MatView<'_>,
    b: MatView<'_>,
    (m, n, k): (usize, usize, usize),
    offsets: &[(isize, isize)],
    dtype: DType,
) -> Result<GpuBuffer> {
    let ctx = a.buf.ctx();
    if dtype != DType::F32 || offsets.len() > 65_535 {
        return Err(unsupported(op, ctx));
    }
    let dst = out_buffer(ctx, offsets.len() * m * n, dtype, op)?;
    if m * n == 0 || offsets.is_empty() {
        return Ok(dst);
    }
    let mut prm: Vec<u32> = [m, n, k, 0]
        .iter()
        .map(|&v| v as u32)
        .chain([a.rs, a.cs, b.rs, b.cs].iter().map(|&s| s as i32 as u32))
        .collect();
    for &(oa, ob) in offsets {
        prm.push(oa as i32 as u32);
        prm.push(ob as i32 as u32);
    }
    let pipeline = ctx.pipeline("matmul f32", (2, 1), || {
        "@group(0) @binding(0) var<storage, read> prm: array<i32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;
var<workgroup> ta: array<array<f32, 16>, 16>;
var<workgroup> tb: array<array<f32, 16>, 16>;
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let m = u32(prm[0]);
    let n = u32(prm[1]);
    let k = u32(prm[2]);
    let row = wg.y * 16u + l.y;
    let col = wg.x * 16u + l.x;
    let oa = prm[8u + 2u * wg.z];
    let ob = prm[9u + 2u * wg.z];
    var acc = 0.0;
    for (var t = 0u; t < k; t += 16u) {
        let ka = t + l.x;
        let kb = t + l.y;
        ta[l.y][l.x] = select(0.0, a[oa + i32(row) * prm[4] + i32(ka) * prm[5]], row < m && ka < k);
        tb[l.y][l.x] = select(0.0, b[ob + i32(kb) * prm[6] + i32(col) * prm[7]], kb < k && col < n);
        workgroupBarrier();
        for (var i = 0u; i < 16u; i++) {
            acc += ta[l.y][i] * tb[i][l.x];
        }
        workgroupBarrier();
    }
    if (row < m && col < n) {
        dst[wg.z * m * n + row * n + col] = acc;
    }
}
"
        .to_string()
    });
    let groups = (
        n.div_ceil(16) as u32,
        m.div_ceil(16) as u32,
        offsets.len() as u32,
    );
    ctx.launch(pipeline, &prm, &[a.buf, b.buf], &[&dst], groups);
    Ok(dst)
}
