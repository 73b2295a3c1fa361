//! Convolution and pooling on the device: `conv2d` with its input and weight gradients,
//! `max_pool2d` and `avg_pool2d` with theirs, over the window geometry the CPU uses
//! ([`Geom`]).
//!
//! Every kernel is a *gather*: one thread per element it writes, summing what reaches
//! that element, so no two threads write one place and no atomics are needed (WGSL
//! has no float atomics). `conv2d` sums over a window of each group's input channels;
//! its input gradient sums, for one input element, over the output positions and
//! taps that read it; its weight gradient sums, for one tap, over the batch and every
//! output position. A pool's gradient walks the windows that hold an input element in
//! the same order as the CPU's scatter (rows, then columns), so its sums are the
//! CPU's, bit for bit. Inputs are read through their strides (a transposed or
//! broadcast gradient is not copied first); outputs are contiguous.
//!
//! `max_pool2d` keeps each window's argmax as an I32 index into its plane (`iy * w +
//! ix`, as the CPU's I64 one), since not every adapter offers 64-bit integers.
//!
//! The conv kernels are direct loops, correct for every geometry; they are not tiled
//! (a tiled implicit GEMM is the way to a real GPU's peak, left for later).

use super::GpuBuffer;
use super::kernels::{View, grid, is_nan, out_buffer, unsupported, wgsl_type};
use crate::DType;
use crate::backend::window::{Geom, nchw_strides};
use crate::error::{NdError, Result};
use crate::layout::Layout;

/// Parameter words: the geometry (0..16: n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw,
/// oh, ow, output channels, groups), inputs A (16..21) and B (21..26) as offset and
/// four NCHW strides, input C (26, 27) as offset and stride, the thread count (28).
const WORDS: usize = 32;

/// WGSL shared by every kernel here: the parameter binding and named geometry.
const HEAD: &str = "
@group(0) @binding(0) var<storage, read> prm: array<i32>;
fn thread(g: vec3<u32>, w: vec3<u32>) -> i32 { return i32(g.x + g.y * w.x * 256u); }
fn at_a(n: i32, c: i32, y: i32, x: i32) -> i32 {
    return prm[16] + n * prm[17] + c * prm[18] + y * prm[19] + x * prm[20];
}
fn at_b(n: i32, c: i32, y: i32, x: i32) -> i32 {
    return prm[21] + n * prm[22] + c * prm[23] + y * prm[24] + x * prm[25];
}
";

/// `InvalidArgument` unless every index the kernel computes fits an `i32`: the
/// threads and every element of `bufs` (4 bytes an element at least).
fn check_fits(op: &'static str, bufs: &[&GpuBuffer], threads: usize) -> Result<()> {
    let most = bufs.iter().map(|b| b.bytes() / 4).max().unwrap_or(0);
    if threads.max(most) > i32::MAX as usize {
        return Err(NdError::invalid(
            op,
            "the device's convolution and pooling kernels index with 32-bit integers: an \
             operand or the result has more than 2^31 elements"
                .to_string(),
        ));
    }
    Ok(())
}

/// The parameter block of `g` (`oc` output channels), inputs `a` and `b` (NCHW
/// layouts; 3-D ones are seen with `n` stride 0), `c_in` (a 1-D layout), over
/// `threads` threads.
fn params(
    g: &Geom,
    (oc, groups): (usize, usize),
    a: &Layout,
    b: Option<&Layout>,
    c_in: Option<&Layout>,
    threads: usize,
) -> [u32; WORDS] {
    let mut p = [0u32; WORDS];
    let geom = [
        g.n, g.c, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.oh, g.ow, oc, groups,
    ];
    for (k, v) in geom.into_iter().enumerate() {
        p[k] = v as u32;
    }
    for (at, l) in [(16, Some(a)), (21, b)] {
        if let Some(l) = l {
            let (st, off) = nchw_strides(l);
            p[at] = off as u32;
            for d in 0..4 {
                p[at + 1 + d] = st[d] as i32 as u32;
            }
        }
    }
    if let Some(l) = c_in {
        p[26] = l.offset as u32;
        p[27] = l.strides[0] as i32 as u32;
    }
    p[28] = threads as u32;
    p
}

/// The element type of a float kernel, or `Unsupported`.
fn float_type(op: &'static str, v: &View<'_>) -> Result<&'static str> {
    match v.dtype {
        DType::F32 | DType::F64 => Ok(wgsl_type(v.dtype)),
        _ => Err(unsupported(op, v.buf.ctx())),
    }
}

/// `conv2d` of `x` `[n, c, h, w]` with `wt` `[oc, c/groups, kh, kw]` and an optional
/// `bias` `[oc]`: `[n, oc, oh, ow]`, one thread per output.
pub(crate) fn conv2d(
    x: View<'_>,
    wt: View<'_>,
    bias: Option<View<'_>>,
    g: &Geom,
    (oc, groups): (usize, usize),
) -> Result<GpuBuffer> {
    const OP: &str = "conv2d";
    let (ctx, t) = (x.buf.ctx(), float_type(OP, &x)?);
    let total = g.n * oc * g.l();
    let dst = out_buffer(ctx, total, x.dtype, OP)?;
    if total == 0 {
        return Ok(dst);
    }
    let mut bufs = vec![x.buf, wt.buf];
    bufs.extend(bias.map(|b| b.buf));
    check_fits(OP, &bufs, total)?;
    let prm = params(
        g,
        (oc, groups),
        x.layout,
        Some(wt.layout),
        bias.map(|b| b.layout),
        total,
    );
    let with_bias = bias.is_some();
    let reads = 2 + usize::from(with_bias);
    let pipeline = ctx.pipeline(&format!("conv2d {t} {with_bias}"), (reads, 1), || {
        let (bind, add) = if with_bias {
            (
                "@group(0) @binding(3) var<storage, read> bs: array<T>;\n",
                "acc += bs[prm[26] + o * prm[27]];",
            )
        } else {
            ("", "")
        };
        format!(
            "alias T = {t};
{HEAD}
@group(0) @binding(1) var<storage, read> xs: array<T>;
@group(0) @binding(2) var<storage, read> ws: array<T>;
{bind}@group(0) @binding({reads_plus}) var<storage, read_write> dst: array<T>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gi: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {{
    let i = thread(gi, nw);
    if (i >= prm[28]) {{ return; }}
    let c = prm[1]; let h = prm[2]; let w = prm[3];
    let oh = prm[12]; let ow = prm[13]; let oc = prm[14]; let groups = prm[15];
    let ox = i % ow; var t = i / ow; let oy = t % oh; t = t / oh; let o = t % oc; let n = t / oc;
    let cpg = c / groups;
    let c0 = (o / (oc / groups)) * cpg;
    var acc = T(0);
    for (var cg = 0; cg < cpg; cg++) {{
        for (var ki = 0; ki < prm[4]; ki++) {{
            let iy = oy * prm[6] + ki * prm[10] - prm[8];
            if (iy < 0 || iy >= h) {{ continue; }}
            for (var kj = 0; kj < prm[5]; kj++) {{
                let ix = ox * prm[7] + kj * prm[11] - prm[9];
                if (ix < 0 || ix >= w) {{ continue; }}
                acc += xs[at_a(n, c0 + cg, iy, ix)] * ws[at_b(o, cg, ki, kj)];
            }}
        }}
    }}
    {add}
    dst[i] = acc;
}}
",
            reads_plus = reads + 1
        )
    });
    ctx.launch(pipeline, &prm, &bufs, &[&dst], grid(total));
    Ok(dst)
}

/// `conv2d`'s input gradient `[n, c, h, w]` from the output gradient `gr` and the
/// weight `wt`: each input element sums `gr * w` over the outputs and taps that read it.
pub(crate) fn conv2d_grad_input(
    gr: View<'_>,
    wt: View<'_>,
    g: &Geom,
    groups: usize,
) -> Result<GpuBuffer> {
    const OP: &str = "conv2d_grad_input";
    let (ctx, t) = (gr.buf.ctx(), float_type(OP, &gr)?);
    let oc = wt.layout.shape.dims()[0];
    let total = g.n * g.c * g.h * g.w;
    let dst = out_buffer(ctx, total, gr.dtype, OP)?;
    if total == 0 {
        return Ok(dst);
    }
    check_fits(OP, &[gr.buf, wt.buf], total)?;
    let prm = params(g, (oc, groups), gr.layout, Some(wt.layout), None, total);
    let pipeline = ctx.pipeline(&format!("conv2d_grad_input {t}"), (2, 1), || {
        format!(
            "alias T = {t};
{HEAD}
@group(0) @binding(1) var<storage, read> gs: array<T>;
@group(0) @binding(2) var<storage, read> ws: array<T>;
@group(0) @binding(3) var<storage, read_write> dst: array<T>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gi: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {{
    let i = thread(gi, nw);
    if (i >= prm[28]) {{ return; }}
    let c = prm[1]; let h = prm[2]; let w = prm[3];
    let sh = prm[6]; let sw = prm[7];
    let oh = prm[12]; let ow = prm[13]; let oc = prm[14]; let groups = prm[15];
    let ix = i % w; var t = i / w; let iy = t % h; t = t / h; let ch = t % c; let n = t / c;
    let cpg = c / groups; let opg = oc / groups;
    let cg = ch % cpg; let o0 = (ch / cpg) * opg;
    var acc = T(0);
    for (var ol = 0; ol < opg; ol++) {{
        let o = o0 + ol;
        for (var ki = 0; ki < prm[4]; ki++) {{
            let ty = iy + prm[8] - ki * prm[10];
            if (ty < 0 || ty % sh != 0 || ty / sh >= oh) {{ continue; }}
            for (var kj = 0; kj < prm[5]; kj++) {{
                let tx = ix + prm[9] - kj * prm[11];
                if (tx < 0 || tx % sw != 0 || tx / sw >= ow) {{ continue; }}
                acc += gs[at_a(n, o, ty / sh, tx / sw)] * ws[at_b(o, cg, ki, kj)];
            }}
        }}
    }}
    dst[i] = acc;
}}
"
        )
    });
    ctx.launch(pipeline, &prm, &[gr.buf, wt.buf], &[&dst], grid(total));
    Ok(dst)
}

/// `conv2d`'s weight gradient `[oc, c/groups, kh, kw]` from the input `x` and the output
/// gradient `gr`: each tap sums `x * gr` over the batch and every output position.
pub(crate) fn conv2d_grad_weight(
    x: View<'_>,
    gr: View<'_>,
    g: &Geom,
    groups: usize,
) -> Result<GpuBuffer> {
    const OP: &str = "conv2d_grad_weight";
    let (ctx, t) = (x.buf.ctx(), float_type(OP, &x)?);
    let oc = gr.layout.shape.dims()[1];
    let total = oc * (g.c / groups) * g.kh * g.kw;
    let dst = out_buffer(ctx, total, x.dtype, OP)?;
    if total == 0 {
        return Ok(dst);
    }
    check_fits(OP, &[x.buf, gr.buf], total)?;
    let prm = params(g, (oc, groups), x.layout, Some(gr.layout), None, total);
    let pipeline = ctx.pipeline(&format!("conv2d_grad_weight {t}"), (2, 1), || {
        format!(
            "alias T = {t};
{HEAD}
@group(0) @binding(1) var<storage, read> xs: array<T>;
@group(0) @binding(2) var<storage, read> gs: array<T>;
@group(0) @binding(3) var<storage, read_write> dst: array<T>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gi: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {{
    let i = thread(gi, nw);
    if (i >= prm[28]) {{ return; }}
    let c = prm[1]; let h = prm[2]; let w = prm[3]; let kh = prm[4]; let kw = prm[5];
    let oh = prm[12]; let ow = prm[13]; let oc = prm[14]; let groups = prm[15];
    let cpg = c / groups;
    let kj = i % kw; var t = i / kw; let ki = t % kh; t = t / kh; let cg = t % cpg; let o = t / cpg;
    let ch = (o / (oc / groups)) * cpg + cg;
    var acc = T(0);
    for (var n = 0; n < prm[0]; n++) {{
        for (var oy = 0; oy < oh; oy++) {{
            let iy = oy * prm[6] + ki * prm[10] - prm[8];
            if (iy < 0 || iy >= h) {{ continue; }}
            for (var ox = 0; ox < ow; ox++) {{
                let ix = ox * prm[7] + kj * prm[11] - prm[9];
                if (ix < 0 || ix >= w) {{ continue; }}
                acc += xs[at_a(n, ch, iy, ix)] * gs[at_b(n, o, oy, ox)];
            }}
        }}
    }}
    dst[i] = acc;
}}
"
        )
    });
    ctx.launch(pipeline, &prm, &[x.buf, gr.buf], &[&dst], grid(total));
    Ok(dst)
}

/// `max_pool2d` of `x` (`[n, c, h, w]` or `[c, h, w]`): the output (contiguous, `x`'s
/// dtype) and each window's first maximum as an I32 index `iy * w + ix` into its plane.
/// Padding acts as -inf and NaN wins, as on the CPU.
pub(crate) fn max_pool(x: View<'_>, g: &Geom) -> Result<(GpuBuffer, GpuBuffer)> {
    const OP: &str = "max_pool2d";
    let (ctx, t) = (x.buf.ctx(), float_type(OP, &x)?);
    let total = g.n * g.c * g.l();
    let dst = out_buffer(ctx, total, x.dtype, OP)?;
    let arg = out_buffer(ctx, total, DType::I32, OP)?;
    if total == 0 {
        return Ok((dst, arg));
    }
    check_fits(OP, &[x.buf], total)?;
    let prm = params(g, (g.c, 1), x.layout, None, None, total);
    let nan = is_nan(x.dtype, "v");
    let pipeline = ctx.pipeline(&format!("max_pool2d {t}"), (1, 2), || {
        format!(
            "alias T = {t};
{HEAD}
@group(0) @binding(1) var<storage, read> xs: array<T>;
@group(0) @binding(2) var<storage, read_write> dst: array<T>;
@group(0) @binding(3) var<storage, read_write> arg: array<i32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gi: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {{
    let i = thread(gi, nw);
    if (i >= prm[28]) {{ return; }}
    let c = prm[1]; let h = prm[2]; let w = prm[3];
    let oh = prm[12]; let ow = prm[13];
    let ox = i % ow; var t = i / ow; let oy = t % oh; t = t / oh; let ch = t % c; let n = t / c;
    let y0 = oy * prm[6] - prm[8]; let x0 = ox * prm[7] - prm[9];
    let ylo = max(y0, 0); let yhi = min(y0 + prm[4], h);
    let xlo = max(x0, 0); let xhi = min(x0 + prm[5], w);
    var best = T(bitcast<f32>(0xff800000u));
    var at = ylo * w + xlo;
    var done = false;
    for (var iy = ylo; iy < yhi && !done; iy++) {{
        for (var ix = xlo; ix < xhi; ix++) {{
            let v = xs[at_a(n, ch, iy, ix)];
            if (v > best || {nan}) {{
                best = v;
                at = iy * w + ix;
                if ({nan}) {{ done = true; break; }}
            }}
        }}
    }}
    dst[i] = best;
    arg[i] = at;
}}
"
        )
    });
    ctx.launch(pipeline, &prm, &[x.buf], &[&dst, &arg], grid(total));
    Ok((dst, arg))
}

/// `avg_pool2d` of `x`: each window's sum over its real elements divided by `kh * kw`.
pub(crate) fn avg_pool(x: View<'_>, g: &Geom) -> Result<GpuBuffer> {
    const OP: &str = "avg_pool2d";
    let (ctx, t) = (x.buf.ctx(), float_type(OP, &x)?);
    let total = g.n * g.c * g.l();
    let dst = out_buffer(ctx, total, x.dtype, OP)?;
    if total == 0 {
        return Ok(dst);
    }
    check_fits(OP, &[x.buf], total)?;
    let prm = params(g, (g.c, 1), x.layout, None, None, total);
    let pipeline = ctx.pipeline(&format!("avg_pool2d {t}"), (1, 1), || {
        format!(
            "alias T = {t};
{HEAD}
@group(0) @binding(1) var<storage, read> xs: array<T>;
@group(0) @binding(2) var<storage, read_write> dst: array<T>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gi: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {{
    let i = thread(gi, nw);
    if (i >= prm[28]) {{ return; }}
    let c = prm[1]; let h = prm[2]; let w = prm[3];
    let oh = prm[12]; let ow = prm[13];
    let ox = i % ow; var t = i / ow; let oy = t % oh; t = t / oh; let ch = t % c; let n = t / c;
    let y0 = oy * prm[6] - prm[8]; let x0 = ox * prm[7] - prm[9];
    var sum = T(0);
    for (var iy = max(y0, 0); iy < min(y0 + prm[4], h); iy++) {{
        for (var ix = max(x0, 0); ix < min(x0 + prm[5], w); ix++) {{
            sum += xs[at_a(n, ch, iy, ix)];
        }}
    }}
    dst[i] = sum / T(prm[4] * prm[5]);
}}
"
        )
    });
    ctx.launch(pipeline, &prm, &[x.buf], &[&dst], grid(total));
    Ok(dst)
}

/// A pool's input gradient (contiguous, `n * c * h * w` elements) from the output
/// gradient `gr`: max (`arg`: [`max_pool`]'s indices) sends each output's gradient to
/// its argmax, avg spreads it over its window divided by `kh * kw`. Each input element
/// walks the windows that hold it, rows then columns, as the CPU adds them.
pub(crate) fn pool_grad(gr: View<'_>, arg: Option<&GpuBuffer>, g: &Geom) -> Result<GpuBuffer> {
    let op = if arg.is_some() {
        "max_pool2d_grad"
    } else {
        "avg_pool2d_grad"
    };
    let (ctx, t) = (gr.buf.ctx(), float_type(op, &gr)?);
    let total = g.n * g.c * g.h * g.w;
    let dst = out_buffer(ctx, total, gr.dtype, op)?;
    if total == 0 {
        return Ok(dst);
    }
    check_fits(op, &[gr.buf], total)?;
    let prm = params(g, (g.c, 1), gr.layout, None, None, total);
    let max = arg.is_some();
    let (bind, add) = if max {
        (
            "@group(0) @binding(2) var<storage, read> arg: array<i32>;\n",
            "if (arg[((n * c + ch) * oh + oy) * ow + ox] == me) { acc += gs[at_a(n, ch, oy, ox)]; }",
        )
    } else {
        ("", "acc += gs[at_a(n, ch, oy, ox)] / div;")
    };
    let reads = 1 + usize::from(max);
    let pipeline = ctx.pipeline(&format!("{op} {t}"), (reads, 1), || {
        format!(
            "alias T = {t};
{HEAD}
@group(0) @binding(1) var<storage, read> gs: array<T>;
{bind}@group(0) @binding({out}) var<storage, read_write> dst: array<T>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gi: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {{
    let i = thread(gi, nw);
    if (i >= prm[28]) {{ return; }}
    let c = prm[1]; let h = prm[2]; let w = prm[3]; let kh = prm[4]; let kw = prm[5];
    let sh = prm[6]; let sw = prm[7]; let ph = prm[8]; let pw = prm[9];
    let oh = prm[12]; let ow = prm[13];
    let ix = i % w; var t = i / w; let iy = t % h; t = t / h; let ch = t % c; let n = t / c;
    let me = iy * w + ix;
    let div = T(kh * kw);
    // The windows holding (iy, ix): oy * sh - ph <= iy < oy * sh - ph + kh.
    let ly = iy + ph - kh + 1; let lx = ix + pw - kw + 1;
    let oylo = select(0, (ly + sh - 1) / sh, ly > 0);
    let oxlo = select(0, (lx + sw - 1) / sw, lx > 0);
    let oyhi = min(oh - 1, (iy + ph) / sh);
    let oxhi = min(ow - 1, (ix + pw) / sw);
    var acc = T(0);
    for (var oy = oylo; oy <= oyhi; oy++) {{
        for (var ox = oxlo; ox <= oxhi; ox++) {{
            {add}
        }}
    }}
    dst[i] = acc;
}}
",
            out = reads + 1
        )
    });
    let mut reads_v = vec![gr.buf];
    reads_v.extend(arg);
    ctx.launch(pipeline, &prm, &reads_v, &[&dst], grid(total));
    Ok(dst)
}
