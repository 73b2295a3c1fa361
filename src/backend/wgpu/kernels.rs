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

/// The WGSL type of `d`'s elements on the device.
pub(crate) fn wgsl_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::U8 | DType::Bool => "u32",
    }
}

/// The WGSL that reads a kernel's scalar, of type `t`, from parameter words `w` (low)
/// and `w + 1` (high; 64-bit types only). See [`scalar_bits`].
pub(crate) fn scalar_wgsl(t: &str, w: usize) -> String {
    match t {
        "f64" | "i64" => format!(
            "bitcast<{t}>(u64(u32(prm[{w}])) | (u64(u32(prm[{}])) << 32u))",
            w + 1
        ),
        _ => format!("bitcast<{t}>(prm[{w}])"),
    }
}

/// The bits of `v` converted to `dtype` (as the CPU's casts), as a kernel's scalar
/// words 2 and 3 read them ([`scalar_wgsl`]).
pub(crate) fn scalar_bits(v: f64, dtype: DType) -> u64 {
    match dtype {
        DType::F32 => u64::from((v as f32).to_bits()),
        DType::F64 => v.to_bits(),
        DType::I32 => u64::from((v as i32) as u32),
        DType::I64 => (v as i64) as u64,
        DType::U8 => u64::from(v as u8),
        DType::Bool => u64::from(v != 0.0),
    }
}

pub(super) fn unsupported(op: &'static str, ctx: &Ctx) -> NdError {
    NdError::Unsupported {
        op,
        device: ctx.device_id(),
    }
}

/// The output buffer of `n` elements of `dtype` (`UnsupportedDTypeOn` where the
/// device has no such arrays).
pub(super) fn out_buffer(
    ctx: &'static Ctx,
    n: usize,
    dtype: DType,
    op: &'static str,
) -> Result<GpuBuffer> {
    ctx.check_dtype(op, dtype)?;
    ctx.alloc((n * elem_bytes(dtype)) as u64)
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

/// A kernel's parameter words, inline up to 64 (three inputs and eight 64-bit
/// scalars), so building them allocates nothing.
pub(crate) type Params = SmallVec<[u32; 64]>;

/// The parameter words of [`INDEX_FN`]: `n` elements over `shape`, input `k` read at
/// `inputs[k].0 + sum(idx[d] * inputs[k].1[d])`, and a scalar's bits (words 2 and 3,
/// see [`scalar_bits`]). `op` names the caller in the error for more than [`MAX_DIMS`]
/// dimensions.
pub(crate) fn index_params(
    op: &'static str,
    ctx: &Ctx,
    shape: &Shape,
    inputs: &[(usize, &[isize])],
    scalar: u64,
) -> Result<Params> {
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
    let mut prm: Params = smallvec::smallvec![0; 12 + 9 * inputs.len()];
    prm[0] = shape.size() as u32;
    prm[1] = nd as u32;
    prm[2] = scalar as u32;
    prm[3] = (scalar >> 32) as u32;
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
    scalar: u64,
) -> Result<GpuBuffer> {
    elementwise_with(op, inputs, shape, out, "", expr, scalar)
}

/// [`elementwise`] with WGSL functions `funcs` that `expr` may call (the same names
/// must always mean the same functions: the pipeline is cached by the op and `expr`).
pub(crate) fn elementwise_with(
    op: &'static str,
    inputs: &[View<'_>],
    shape: &Shape,
    out: DType,
    funcs: &str,
    expr: &str,
    scalar: u64,
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
    let ts: SmallVec<[&str; 3]> = inputs.iter().map(|v| wgsl_type(v.dtype)).collect();
    // The kernel is a function of the op, `expr` and the types (an op's `funcs` is
    // fixed, or follows from `expr`); its key is written into a reused string, so a
    // launch allocates nothing here.
    thread_local!(static KEY: std::cell::RefCell<String> = Default::default());
    let pipeline = KEY.with_borrow_mut(|key| {
        key.clear();
        for part in ["ew ", op, " ", expr] {
            key.push_str(part);
        }
        for t in ts.iter().chain([&wgsl_type(out)]) {
            key.push(' ');
            key.push_str(t);
        }
        elementwise_pipeline(ctx, key, inputs.len(), &ts, out, funcs, expr)
    });
    let reads: SmallVec<[&GpuBuffer; 3]> = inputs.iter().map(|v| v.buf).collect();
    ctx.launch(pipeline, &prm, &reads, &[&dst], grid(n));
    Ok(dst)
}

/// The elementwise kernel of `key`: inputs of types `ts`, output `out`, `funcs` and
/// `expr` as [`elementwise_with`] takes them.
fn elementwise_pipeline(
    ctx: &Ctx,
    key: &str,
    n_in: usize,
    ts: &[&str],
    out: DType,
    funcs: &str,
    expr: &str,
) -> &'static super::Kernel {
    ctx.pipeline(key, (n_in, 1), || {
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
            n_in + 1,
            wgsl_type(out)
        );
        src += INDEX_FN;
        src += funcs;
        src += "@compute @workgroup_size(256)\nfn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) w: vec3<u32>) {\n";
        src += "    let i = g.x + g.y * w.x * 256u;\n    if (i >= u32(prm[0])) { return; }\n";
        src += &format!("    let s = {};\n", scalar_wgsl(ts[0], 2));
        for (k, name) in names.iter().enumerate().take(n_in) {
            src += &format!("    let {name} = in{k}[at(i, {k}u)];\n");
        }
        src += &format!("    dst[i] = {expr};\n}}\n");
        src
    })
}

/// The WGSL of `op` over operands `x` and `y` in type `t`; `None` where the device has
/// no kernel.
pub(crate) fn binop_expr(op: BinOp, t: DType, x: &str, y: &str) -> Option<String> {
    let float = t.is_float();
    if !numeric(t) && t != DType::U8 {
        return None;
    }
    // U8 words wrap modulo 256, as the CPU's `u8` arithmetic.
    let wrap = |e: String| {
        if t == DType::U8 {
            format!("(({e}) & 255u)")
        } else {
            e
        }
    };
    Some(match op {
        BinOp::Add => wrap(format!("{x} + {y}")),
        BinOp::Sub => wrap(format!("{x} - {y}")),
        BinOp::Mul => wrap(format!("{x} * {y}")),
        BinOp::Div if float => format!("{x} / {y}"),
        // An integer division by zero is 0 (the CPU's rule); WGSL's `i32::MIN / -1` is
        // `i32::MIN`, the CPU's wrapping division.
        BinOp::Div => {
            let ty = wgsl_type(t);
            format!("select({x} / {y}, {ty}(0), {y} == {ty}(0))")
        }
        // Vulkan's pow, exp, log and the like take 32-bit floats only.
        BinOp::Pow if t == DType::F32 => format!("pow({x}, {y})"),
        // NaN propagates (the CPU's max_of/min_of): only NaN differs from itself.
        BinOp::Maximum | BinOp::Minimum if float => {
            let f = if op == BinOp::Maximum { "max" } else { "min" };
            let (xn, yn) = (is_nan(t, x), is_nan(t, y));
            format!("select(select({f}({x}, {y}), {y}, {yn}), {x}, {xn})")
        }
        BinOp::Maximum => format!("max({x}, {y})"),
        BinOp::Minimum => format!("min({x}, {y})"),
        _ => return None,
    })
}

/// WGSL that is true where `x`, of dtype `t`, is NaN. Not `x != x`: the SPIR-V a
/// WGSL `!=` becomes is an ordered comparison on some drivers (llvmpipe), false for
/// NaN, so the bits are tested (an F64 through its F32 conversion, which keeps NaN).
pub(crate) fn is_nan(t: DType, x: &str) -> String {
    match t {
        DType::F32 => format!("((bitcast<u32>({x}) & 0x7fffffffu) > 0x7f800000u)"),
        DType::F64 => format!("((bitcast<u32>(f32({x})) & 0x7fffffffu) > 0x7f800000u)"),
        _ => "false".into(),
    }
}

fn numeric(t: DType) -> bool {
    matches!(t, DType::F32 | DType::F64 | DType::I32 | DType::I64)
}

/// `a op b`, broadcast to `shape`.
pub(crate) fn binary(op: BinOp, a: View<'_>, b: View<'_>, shape: &Shape) -> Result<GpuBuffer> {
    let ctx = a.buf.ctx();
    let expr = binop_static(op, a.dtype, "x", "y").ok_or_else(|| unsupported(op.name(), ctx))?;
    elementwise(op.name(), &[a, b], shape, a.dtype, expr, 0)
}

/// [`binop_expr`] of operands named by literals, built once and kept for the process
/// (a bounded set, as the pipelines: one per op, dtype and operand order), so a launch
/// formats nothing.
fn binop_static(op: BinOp, t: DType, x: &'static str, y: &'static str) -> Option<&'static str> {
    type Entry = (
        (BinOp, DType, &'static str, &'static str),
        Option<&'static str>,
    );
    static MADE: parking_lot::Mutex<Vec<Entry>> = parking_lot::Mutex::new(Vec::new());
    let key = (op, t, x, y);
    let mut made = MADE.lock();
    if let Some((_, e)) = made.iter().find(|(k, _)| *k == key) {
        return *e;
    }
    let e = binop_expr(op, t, x, y).map(|s| &*Box::leak(s.into_boxed_str()));
    made.push((key, e));
    e
}

/// `a op s` (or `s op a` when `left`).
/// `bits`: the scalar in `a`'s dtype ([`scalar_bits`]).
pub(crate) fn binary_scalar(op: BinOp, a: View<'_>, bits: u64, left: bool) -> Result<GpuBuffer> {
    let ctx = a.buf.ctx();
    let (x, y) = if left { ("s", "x") } else { ("x", "s") };
    let expr = binop_static(op, a.dtype, x, y).ok_or_else(|| unsupported(op.name(), ctx))?;
    elementwise(op.name(), &[a], &a.layout.shape, a.dtype, expr, bits)
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
pub(crate) fn compare_scalar(op: CmpOp, a: View<'_>, s_bits: u64) -> Result<GpuBuffer> {
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
    let float = a.dtype.is_float();
    // Vulkan's exp, log, sin, tanh and the like take 32-bit floats only.
    let f32 = a.dtype == DType::F32;
    let ty = wgsl_type(a.dtype);
    let expr = match op {
        UnOp::Abs if numeric(a.dtype) => "abs(x)".to_string(),
        UnOp::Neg if numeric(a.dtype) => "-x".into(),
        UnOp::Square if numeric(a.dtype) => "x * x".into(),
        // NaN propagates, as on the CPU.
        UnOp::Relu if numeric(a.dtype) => format!("select(x, {ty}(0), x < {ty}(0))"),
        UnOp::Exp if f32 => "exp(x)".into(),
        UnOp::Log if f32 => "log(x)".into(),
        UnOp::Sqrt if float => "sqrt(x)".into(),
        UnOp::Sin if f32 => "sin(x)".into(),
        UnOp::Cos if f32 => "cos(x)".into(),
        UnOp::Tanh if f32 => "tanh(x)".into(),
        UnOp::Sigmoid if f32 => "1.0 / (1.0 + exp(-x))".into(),
        _ => return Err(unsupported(op.name(), ctx)),
    };
    elementwise(op.name(), &[a], &a.layout.shape, a.dtype, &expr, 0)
}

/// A contiguous copy of `a` in dtype `to` (`to == a.dtype`: a plain copy of the view).
pub(crate) fn convert(op: &'static str, a: View<'_>, to: DType) -> Result<GpuBuffer> {
    let expr = match (a.dtype, to) {
        (f, t) if f == t => "x".to_string(),
        (f, DType::Bool) => format!("u32(x != {}(0))", wgsl_type(f)),
        (f, DType::U8) if f.is_float() => {
            let t = wgsl_type(f);
            format!("u32(clamp(x, {t}(0), {t}(255)))")
        }
        (_, DType::U8) => "u32(x) & 255u".into(),
        (_, t) => format!("{}(x)", wgsl_type(t)),
    };
    elementwise(op, &[a], &a.layout.shape, to, &expr, 0)
}

/// One operand of [`matmul`]: its buffer and the element strides of its rows and
/// columns (a transposed view just swaps them).
pub(crate) struct MatView<'a> {
    pub buf: &'a GpuBuffer,
    pub rs: isize,
    pub cs: isize,
}

/// `out[b] = A[b] (m x k) @ B[b] (k x n)` for each batch `b`, whose matrices start at
/// `offsets[b]` (elements of A, of B); `out` is `[batches, m, n]`, contiguous. F32,
/// F64, I32 and I64 (integers wrap).
///
/// Tiled in workgroup memory and in registers: a workgroup of 16x16 threads computes a
/// 64x64 block of the output, stepping through `k` 16 at a time; each step stages a
/// 64x16 block of A and a 16x64 block of B (1,024 elements each, 4 per thread, out of
/// range read as 0), and each thread accumulates a 4x4 grid of outputs (rows `ty +
/// 16 i`, columns `tx + 16 j`, so neighbouring threads write neighbouring columns)
/// from 4 + 4 staged values per `k`: 16 multiply-adds per 8 reads of workgroup memory,
/// where one output per thread makes it 1 per 2.
pub(crate) fn matmul(
    op: &'static str,
    a: MatView<'_>,
    b: MatView<'_>,
    (m, n, k): (usize, usize, usize),
    offsets: &[(isize, isize)],
    dtype: DType,
) -> Result<GpuBuffer> {
    let ctx = a.buf.ctx();
    if !numeric(dtype) || offsets.len() > 65_535 {
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
    let t = wgsl_type(dtype);
    let key = format!("matmul {t}");
    let pipeline = ctx.pipeline(&key, (2, 1), || {
        format!(
            "@group(0) @binding(0) var<storage, read> prm: array<i32>;
@group(0) @binding(1) var<storage, read> a: array<{t}>;
@group(0) @binding(2) var<storage, read> b: array<{t}>;
@group(0) @binding(3) var<storage, read_write> dst: array<{t}>;
var<workgroup> ta: array<array<{t}, 64>, 16>;
var<workgroup> tb: array<array<{t}, 64>, 16>;
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let m = u32(prm[0]);
    let n = u32(prm[1]);
    let k = u32(prm[2]);
    let row0 = wg.y * 64u;
    let col0 = wg.x * 64u;
    let oa = prm[8u + 2u * wg.z];
    let ob = prm[9u + 2u * wg.z];
    var acc: array<{t}, 16>;
    for (var q = 0u; q < 16u; q++) {{
        acc[q] = {t}(0);
    }}
    for (var t = 0u; t < k; t += 16u) {{
        for (var e = 0u; e < 4u; e++) {{
            let idx = li + 256u * e;
            // A: 64 rows by 16 of k, consecutive threads along k.
            let ar = row0 + idx / 16u;
            let ak = t + idx % 16u;
            ta[idx % 16u][idx / 16u] = select({t}(0), a[oa + i32(ar) * prm[4] + i32(ak) * prm[5]], ar < m && ak < k);
            // B: 16 of k by 64 columns, consecutive threads along the columns.
            let bk = t + idx / 64u;
            let bc = col0 + idx % 64u;
            tb[idx / 64u][idx % 64u] = select({t}(0), b[ob + i32(bk) * prm[6] + i32(bc) * prm[7]], bk < k && bc < n);
        }}
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk++) {{
            var ra: array<{t}, 4>;
            var rb: array<{t}, 4>;
            for (var i = 0u; i < 4u; i++) {{
                ra[i] = ta[kk][l.y + 16u * i];
                rb[i] = tb[kk][l.x + 16u * i];
            }}
            for (var i = 0u; i < 4u; i++) {{
                for (var j = 0u; j < 4u; j++) {{
                    acc[4u * i + j] += ra[i] * rb[j];
                }}
            }}
        }}
        workgroupBarrier();
    }}
    for (var i = 0u; i < 4u; i++) {{
        let r = row0 + l.y + 16u * i;
        for (var j = 0u; j < 4u; j++) {{
            let c = col0 + l.x + 16u * j;
            if (r < m && c < n) {{
                dst[wg.z * m * n + r * n + c] = acc[4u * i + j];
            }}
        }}
    }}
}}
"
        )
    });
    let groups = (
        n.div_ceil(64) as u32,
        m.div_ceil(64) as u32,
        offsets.len() as u32,
    );
    ctx.launch(pipeline, &prm, &[a.buf, b.buf], &[&dst], groups);
    Ok(dst)
}
