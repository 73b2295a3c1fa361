//! In-place updates on the device: `t = f(t, x, s)` over every element a target view
//! selects, with `x` (optional) broadcast to the target's shape and `s` a scalar.
//!
//! One generated kernel serves every in-place op (`+=` and friends with an array or a
//! scalar, a gradient's `g += scale * v`, filling with a value): the target is bound
//! `read_write` and indexed through its own layout (a slice or a stepped view writes
//! only its elements), the input is read through its layout. Parameters as the
//! elementwise kernels' ([`index_params`]), the target as input 0 and `x` as input 1.
//!
//! The input may not share the target's buffer (wgpu refuses a buffer bound for
//! reading and writing in one dispatch): the engine copies such an input out first,
//! as it does on the CPU.

use super::GpuBuffer;
use super::kernels::{
    INDEX_FN, View, binop_expr, index_params, scalar_bits, scalar_wgsl, wgsl_type,
};
use crate::DType;
use crate::error::{NdError, Result};
use crate::layout::Layout;
use crate::opkind::BinOp;

/// The target of an in-place kernel: a device buffer written through a layout.
pub(crate) struct ViewMut<'a> {
    pub buf: &'a GpuBuffer,
    pub layout: &'a Layout,
    pub dtype: DType,
}

/// `t = expr` for every element of `t`, where `expr` reads `t` (the target's current
/// value), `x` (the input's, when there is one) and `s` (the scalar whose bits are
/// `scalar`, in the target's type). `op` names the caller in errors.
pub(crate) fn assign(
    op: &'static str,
    t: ViewMut<'_>,
    x: Option<View<'_>>,
    expr: &str,
    scalar: u64,
) -> Result<()> {
    match x {
        Some(x) => assign_n(op, t, &[x], expr, &[scalar]),
        None => assign_n(op, t, &[], expr, &[scalar]),
    }
}

/// `t = expr` for every element of `t`, where `expr` reads `t`, the inputs as `x` and
/// `y` (each broadcast to `t`'s shape), and the scalars (bits in `t`'s type, see
/// [`scalar_bits`]) as `s` (the first) and `s1`, `s2`, ... (the rest, whose words
/// follow the inputs' in the parameter block). At most two inputs.
pub(crate) fn assign_n(
    op: &'static str,
    t: ViewMut<'_>,
    inputs: &[View<'_>],
    expr: &str,
    scalars: &[u64],
) -> Result<()> {
    debug_assert!(inputs.len() <= 2);
    let ctx = t.buf.ctx();
    let shape = &t.layout.shape;
    let strides: smallvec::SmallVec<[_; 2]> = inputs
        .iter()
        .map(|x| x.layout.broadcast_strides(shape))
        .collect();
    let mut views: smallvec::SmallVec<[(usize, &[isize]); 3]> =
        smallvec::smallvec![(t.layout.offset, &t.layout.strides[..])];
    for (x, s) in inputs.iter().zip(&strides) {
        views.push((x.layout.offset, &s[..]));
    }
    let mut prm = index_params(
        op,
        ctx,
        shape,
        &views,
        scalars.first().copied().unwrap_or(0),
    )?;
    // Scalar j >= 1 at words `extra + 2 (j - 1)`, low then high.
    let extra = prm.len();
    for &w in scalars.iter().skip(1) {
        prm.extend([w as u32, (w >> 32) as u32]);
    }
    let n = shape.size();
    if n == 0 {
        return Ok(());
    }
    let ty = wgsl_type(t.dtype);
    let tys: smallvec::SmallVec<[&str; 2]> = inputs.iter().map(|x| wgsl_type(x.dtype)).collect();
    // The pipeline's key, written into a reused string: an optimizer's steady step
    // allocates nothing here.
    thread_local!(static KEY: std::cell::RefCell<String> = Default::default());
    let pipeline = KEY.with_borrow_mut(|key| {
        use std::fmt::Write;
        key.clear();
        let _ = write!(
            key,
            "inplace {expr} {ty} {} {}",
            scalars.len(),
            inputs.len()
        );
        for t in &tys {
            key.push(' ');
            key.push_str(t);
        }
        ctx.pipeline(key, (inputs.len(), 1), || {
            let mut src =
                String::from("@group(0) @binding(0) var<storage, read> prm: array<i32>;\n");
            for (k, xt) in tys.iter().enumerate() {
                src += &format!(
                    "@group(0) @binding({}) var<storage, read> in{k}: array<{xt}>;\n",
                    k + 1
                );
            }
            src += &format!(
                "@group(0) @binding({}) var<storage, read_write> dst: array<{ty}>;\n",
                1 + inputs.len()
            );
            src += INDEX_FN;
            src += "
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) w: vec3<u32>) {
    let i = g.x + g.y * w.x * 256u;
    if (i >= u32(prm[0])) { return; }
";
            src += &format!(
                "    let s = {};\n    let ti = at(i, 0u);\n    let t = dst[ti];\n",
                scalar_wgsl(ty, 2)
            );
            for j in 1..scalars.len() {
                src += &format!("    let s{j} = {};\n", scalar_wgsl(ty, extra + 2 * (j - 1)));
            }
            for (k, name) in ["x", "y"].iter().enumerate().take(inputs.len()) {
                src += &format!("    let {name} = in{k}[at(i, {}u)];\n", k + 1);
            }
            src += &format!("    dst[ti] = {expr};\n}}\n");
            src
        })
    });
    let groups = n.div_ceil(256);
    let gx = groups.min(65_535);
    let grid = (gx as u32, groups.div_ceil(gx) as u32, 1);
    let reads: smallvec::SmallVec<[&GpuBuffer; 2]> = inputs.iter().map(|x| x.buf).collect();
    ctx.launch(pipeline, &prm, &reads, &[t.buf], grid);
    Ok(())
}

/// `t = t op x` (`x` broadcast to `t`'s shape), or `t = t op s` without `x`.
pub(crate) fn binary(op: BinOp, t: ViewMut<'_>, x: Option<View<'_>>, s: f64) -> Result<()> {
    let y = if x.is_some() { "x" } else { "s" };
    let Some(expr) = binop_expr(op, t.dtype, "t", y) else {
        return Err(NdError::Unsupported {
            op: op.name(),
            device: t.buf.device(),
        });
    };
    let bits = scalar_bits(s, t.dtype);
    assign(op.name(), t, x, &expr, bits)
}

/// `t += scale * x` (`x` broadcast to `t`'s shape), or `t += scale` without `x`: a
/// gradient's accumulation.
pub(crate) fn add_scaled(
    op: &'static str,
    t: ViewMut<'_>,
    x: Option<View<'_>>,
    scale: f64,
) -> Result<()> {
    let expr = if x.is_some() { "t + s * x" } else { "t + s" };
    let bits = scalar_bits(scale, t.dtype);
    assign(op, t, x, expr, bits)
}

/// `t = v` for every element of `t`.
pub(crate) fn fill(op: &'static str, t: ViewMut<'_>, v: f64) -> Result<()> {
    let bits = scalar_bits(v, t.dtype);
    assign(op, t, None, "s", bits)
}

/// A new buffer of `shape`'s elements of `dtype`, each `v`.
pub(crate) fn filled(
    op: &'static str,
    ctx: &'static super::Ctx,
    shape: &crate::Shape,
    dtype: DType,
    v: f64,
) -> Result<GpuBuffer> {
    let buf = super::kernels::out_buffer(ctx, shape.size(), dtype, op)?;
    let layout = Layout::contiguous(shape.clone());
    fill(
        op,
        ViewMut {
            buf: &buf,
            layout: &layout,
            dtype,
        },
        v,
    )?;
    Ok(buf)
}
