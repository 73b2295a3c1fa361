//! Row kernels: one workgroup per row of an axis, its 256 threads striding along the
//! row and combining in workgroup memory ([`ROW_STATS`]): `softmax`/`log_softmax`
//! and `cross_entropy` with its gradient.

use super::GpuBuffer;
use super::kernels::{MAX_DIMS, View, grid, out_buffer, unsupported, wgsl_type};
use super::reduce::{Reduce, reduce};
use crate::DType;
use crate::error::{NdError, Result};
use crate::layout::Layout;
use crate::shape::Shape;

/// WGSL: `row_stats(l, live, ib, stride, len)`, the maximum and the sum of
/// `exp(x - max)` of the row of `src` of `len` elements `stride` apart from `ib`,
/// reduced by the workgroup's 256 threads (`l` is this one) in `part`. Every thread
/// of the workgroup calls it (its barriers); `live` is false past the last row.
const ROW_STATS: &str = "
fn row_stats(l: u32, live: bool, ib: i32, stride: i32, len: u32) -> vec2<f32> {
    var m = bitcast<f32>(0xff800000u);
    if (live) {
        for (var r = l; r < len; r += 256u) {
            m = max(m, src[ib + i32(r) * stride]);
        }
    }
    part[l] = m;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h = h / 2u) {
        if (l < h) {
            part[l] = max(part[l], part[l + h]);
        }
        workgroupBarrier();
    }
    let mx = part[0];
    workgroupBarrier();
    var acc = 0.0;
    if (live) {
        for (var r = l; r < len; r += 256u) {
            acc += exp(src[ib + i32(r) * stride] - mx);
        }
    }
    part[l] = acc;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h = h / 2u) {
        if (l < h) {
            part[l] = part[l] + part[l + h];
        }
        workgroupBarrier();
    }
    return vec2<f32>(mx, part[0]);
}
";

/// WGSL: `walk(i, strides)`, the offset of lane `i` (row-major over the kept
/// dimensions, [`lane_params`]' words 8..16) through the strides at word `strides` (16:
/// the input's, 24: the contiguous output's).
pub(crate) const LANE_WALK: &str = "
fn walk(i: u32, strides: u32) -> i32 {
    var rem = i;
    var idx = 0;
    let nd = u32(prm[3]);
    for (var j = 0u; j < nd; j++) {
        let d = nd - 1u - j;
        let s = u32(prm[8u + d]);
        idx += i32(rem % s) * prm[strides + d];
        rem = rem / s;
    }
    return idx;
}
";

/// The parameter words of a kernel over the lanes of `a` along `axis` (every index but
/// `axis`), and the number of lanes: `[lanes, len, off, nk, stride_in, stride_out, 0, 0,
/// kept shape[8], kept strides in[8], kept strides out[8]]`, the output contiguous in
/// `a`'s shape. Words 6 and 7 are the caller's. `a` is not empty.
pub(crate) fn lane_params(
    op: &'static str,
    a: &View<'_>,
    axis: usize,
) -> Result<([u32; 32], usize)> {
    let dims = a.layout.shape.dims();
    let keep: Vec<usize> = (0..dims.len()).filter(|&d| d != axis).collect();
    if keep.len() > MAX_DIMS {
        return Err(NdError::invalid(
            op,
            format!(
                "at most {MAX_DIMS} dimensions on {}",
                a.buf.ctx().device_id()
            ),
        ));
    }
    let out_strides = a.layout.shape.contiguous_strides();
    let mut prm = [0u32; 32];
    let lanes = a.layout.shape.size() / dims[axis];
    prm[0] = lanes as u32;
    prm[1] = dims[axis] as u32;
    prm[2] = a.layout.offset as u32;
    prm[3] = keep.len() as u32;
    prm[4] = a.layout.strides[axis] as i32 as u32;
    prm[5] = out_strides[axis] as u32;
    for (j, &d) in keep.iter().enumerate() {
        prm[8 + j] = dims[d] as u32;
        prm[16 + j] = a.layout.strides[d] as i32 as u32;
        prm[24 + j] = out_strides[d] as u32;
    }
    Ok((prm, lanes))
}

/// Softmax (`log`: log-softmax) of F32 `a` along `axis`, into a contiguous buffer of
/// `a`'s shape: `exp(x - max) / sum(exp(x - max))`, or `x - max - ln(sum(..))`. One
/// workgroup per row (every index but `axis`): its threads find the row's maximum, then
/// the sum of exponentials, in workgroup memory, then write the row.
pub(crate) fn softmax(op: &'static str, a: View<'_>, axis: usize, log: bool) -> Result<GpuBuffer> {
    let ctx = a.buf.ctx();
    if a.dtype != DType::F32 {
        return Err(unsupported(op, ctx));
    }
    let n = a.layout.shape.size();
    let dst = out_buffer(ctx, n, DType::F32, op)?;
    if n == 0 {
        return Ok(dst);
    }
    let (prm, rows) = lane_params(op, &a, axis)?;
    let write = if log {
        "v - mx - log(tot)"
    } else {
        "exp(v - mx) / tot"
    };
    let pipeline = ctx.pipeline(&format!("softmax {log}"), (1, 1), || {
        format!(
            "@group(0) @binding(0) var<storage, read> prm: array<i32>;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
var<workgroup> part: array<f32, 256>;
{ROW_STATS}
{LANE_WALK}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) w: vec3<u32>, @builtin(local_invocation_index) l: u32) {{
    let o = wg.x + wg.y * w.x;
    let live = o < u32(prm[0]);
    let len = u32(prm[1]);
    let ib = prm[2] + walk(o, 16u);
    let ob = walk(o, 24u);
    let st = row_stats(l, live, ib, prm[4], len);
    let mx = st.x;
    let tot = st.y;
    if (live) {{
        for (var r = l; r < len; r += 256u) {{
            let v = src[ib + i32(r) * prm[4]];
            dst[ob + i32(r) * prm[5]] = {write};
        }}
    }}
}}
"
        )
    });
    let x = rows.min(65_535);
    ctx.launch(
        pipeline,
        &prm,
        &[a.buf],
        &[&dst],
        (x as u32, rows.div_ceil(x) as u32, 1),
    );
    Ok(dst)
}

/// Cross-entropy of F32 logits `x` `[n, c]` against integer `labels` `[n]` (I32, I64 or U8):
/// the mean over rows of `-log_softmax(x)[label]`, as a 0-d buffer, and the softmax
/// `[n, c]` (contiguous) that the gradient needs. One workgroup per row, as
/// [`softmax`]. Labels stay on the device, so they are not checked on the host: a
/// label outside `0..c` makes its row's loss, and so the mean, NaN.
pub(crate) fn cross_entropy(
    op: &'static str,
    x: View<'_>,
    labels: View<'_>,
    (n, c): (usize, usize),
) -> Result<(GpuBuffer, GpuBuffer)> {
    let ctx = x.buf.ctx();
    if x.dtype != DType::F32 || !matches!(labels.dtype, DType::I32 | DType::I64 | DType::U8) {
        return Err(unsupported(op, ctx));
    }
    let soft = out_buffer(ctx, n * c, DType::F32, op)?;
    let rows = out_buffer(ctx, n, DType::F32, op)?;
    if n * c > 0 {
        // [n, c, off_x, row stride, column stride, off_labels, label stride, 0]
        let prm = [
            n as u32,
            c as u32,
            x.layout.offset as u32,
            x.layout.strides[0] as i32 as u32,
            x.layout.strides[1] as i32 as u32,
            labels.layout.offset as u32,
            labels.layout.strides[0] as i32 as u32,
            0,
        ];
        let lt = wgsl_type(labels.dtype);
        let pipeline = ctx.pipeline(&format!("cross_entropy {lt}"), (2, 2), || {
            format!("alias LT = {lt};\n")
                + &String::from(
                "@group(0) @binding(0) var<storage, read> prm: array<i32>;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> lab: array<LT>;
@group(0) @binding(3) var<storage, read_write> soft: array<f32>;
@group(0) @binding(4) var<storage, read_write> loss: array<f32>;
var<workgroup> part: array<f32, 256>;
",
            ) + ROW_STATS
                + "
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) w: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let o = wg.x + wg.y * w.x;
    let live = o < u32(prm[0]);
    let len = u32(prm[1]);
    let ib = prm[2] + i32(o) * prm[3];
    let st = row_stats(l, live, ib, prm[4], len);
    let mx = st.x;
    let tot = st.y;
    if (live) {
        for (var r = l; r < len; r += 256u) {
            soft[o * len + r] = exp(src[ib + i32(r) * prm[4]] - mx) / tot;
        }
        if (l == 0u) {
            let yl = lab[prm[5] + i32(o) * prm[6]];
            if (yl >= LT(0) && yl < LT(len)) {
                loss[o] = log(tot) + mx - src[ib + i32(yl) * prm[4]];
            } else {
                loss[o] = bitcast<f32>(0x7fc00000u);
            }
        }
    }
}
"
        });
        let gx = n.min(65_535);
        ctx.launch(
            pipeline,
            &prm,
            &[x.buf, labels.buf],
            &[&soft, &rows],
            (gx as u32, n.div_ceil(gx) as u32, 1),
        );
    }
    let layout = Layout::contiguous(Shape::from([n]));
    let rows = View {
        buf: &rows,
        layout: &layout,
        dtype: DType::F32,
    };
    let (loss, _) = reduce(op, Reduce::Mean, rows, &[0])?;
    Ok((loss, soft))
}

/// The gradient of [`cross_entropy`] for its logits: `g * (softmax - one_hot(labels))
/// / n`, `[n, c]`, from the saved softmax `p` (contiguous) and the 0-d seed `g`.
pub(crate) fn cross_entropy_grad(
    op: &'static str,
    p: View<'_>,
    labels: View<'_>,
    g: View<'_>,
    (n, c): (usize, usize),
) -> Result<GpuBuffer> {
    let ctx = p.buf.ctx();
    if p.dtype != DType::F32 || !matches!(labels.dtype, DType::I32 | DType::I64 | DType::U8) {
        return Err(unsupported(op, ctx));
    }
    let dst = out_buffer(ctx, n * c, DType::F32, op)?;
    if n * c == 0 {
        return Ok(dst);
    }
    // [n * c, c, off_p, off_labels, label stride, off_g, 1/n bits, 0]
    let prm = [
        (n * c) as u32,
        c as u32,
        p.layout.offset as u32,
        labels.layout.offset as u32,
        labels.layout.strides[0] as i32 as u32,
        g.layout.offset as u32,
        (1.0 / n as f32).to_bits(),
        0,
    ];
    let lt = wgsl_type(labels.dtype);
    let pipeline = ctx.pipeline(&format!("cross_entropy_grad {lt}"), (3, 1), || {
        format!("alias LT = {lt};\n")
            + "@group(0) @binding(0) var<storage, read> prm: array<i32>;
@group(0) @binding(1) var<storage, read> p: array<f32>;
@group(0) @binding(2) var<storage, read> lab: array<LT>;
@group(0) @binding(3) var<storage, read> g: array<f32>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gi: vec3<u32>, @builtin(num_workgroups) w: vec3<u32>) {
    let i = gi.x + gi.y * w.x * 256u;
    if (i >= u32(prm[0])) { return; }
    let c = u32(prm[1]);
    let row = i / c;
    let y = lab[prm[3] + i32(row) * prm[4]];
    let hot = select(0.0, 1.0, y >= LT(0) && y == LT(i % c));
    dst[i] = (p[prm[2] + i32(i)] - hot) * g[prm[5]] * bitcast<f32>(prm[6]);
}
"
    });
    ctx.launch(
        pipeline,
        &prm,
        &[p.buf, labels.buf, g.buf],
        &[&dst],
        grid(n * c),
    );
    Ok(dst)
}
