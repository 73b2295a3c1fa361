//! Gathers and scatters on the device by element maps the host computes.
//!
//! Every op that moves elements by index (`index_select`, `gather`, `take`,
//! `boolean_mask`, `embedding`, `repeat`, `tile`) and every op that adds them back
//! (`index_add`, `scatter_add` and the gradients above) checks its indices on the host
//! anyway: an index out of range is a typed error before anything is allocated, so the
//! index array is read back whatever its device. The host then knows, for every output
//! element, which buffer elements it takes, and the device runs one of two kernels:
//!
//! - [`pick`]: `out[i] = src[map[i]]`;
//! - [`sum_into`]: `out[j] = base[j] + src[e0] + src[e1] + ...` over the entries of
//!   row `j` of a compressed-sparse-row map, in the order the CPU adds them.
//!
//! The map is what the CPU's own kernel computes when run over positions instead of
//! values ([`positions`]: a kernel generic over its element type, given the buffer
//! `0, 1, 2, ...`, writes the buffer position of each element it would copy), so both
//! devices select the same elements by construction. A scatter becomes a gather over
//! its inverse map ([`Csr`]), so no float atomics are needed (WGSL has none) and every
//! sum runs in the CPU's order, bit for bit.
//!
//! Maps travel in the kernel's parameter block (a block larger than the launch arena
//! gets a buffer of its own), so they take nothing from the device pool. The cost is a
//! host pass and an upload of one word per output element (per source element for a
//! scatter): right for index arrays and gradients of the sizes models use, and
//! bounded by the device's largest binding (else `InvalidArgument`).

use super::GpuBuffer;
use super::kernels::{INDEX_FN, View, grid, index_params, out_buffer, wgsl_type};
use crate::DType;
use crate::error::{NdError, Result};
use crate::shape::Shape;

/// The buffer positions a CPU kernel would read: `kernel(ids, out)` is run with `ids
/// = [0, 1, .., len - 1]` standing for the source buffer's elements, and writes `n`
/// of them (or fewer, trailing zeros) into `out`.
pub(crate) fn positions(
    len: usize,
    n: usize,
    kernel: impl FnOnce(&[u32], &mut [u32]),
) -> Result<Vec<u32>> {
    let ids: Vec<u32> = (0..u32::try_from(len).map_err(|_| too_large("a gather", len))?).collect();
    let mut out = vec![0u32; n];
    kernel(&ids, &mut out);
    Ok(out)
}

/// The number of elements of `v`'s buffer (the length [`positions`] needs).
pub(crate) fn buffer_len(v: &View<'_>) -> usize {
    v.buf.bytes() / super::elem_bytes(v.dtype)
}

fn too_large(op: &'static str, n: usize) -> NdError {
    NdError::invalid(
        op,
        format!("{n} elements are too many for one device gather (at most 2^31)"),
    )
}

/// The parameter words: `head`, then the map's words, checked to fit one binding and
/// the kernel's `i32` words.
fn words(op: &'static str, ctx: &super::Ctx, head: &[u32], maps: &[&[u32]]) -> Result<Vec<u32>> {
    let len = head.len() + maps.iter().map(|m| m.len()).sum::<usize>();
    if len > i32::MAX as usize || (len as u64) * 4 > ctx.max_binding {
        return Err(NdError::invalid(
            op,
            format!(
                "an index map of {len} words is larger than {}'s largest binding ({} bytes)",
                ctx.device_id(),
                ctx.max_binding
            ),
        ));
    }
    let mut w = Vec::with_capacity(len);
    w.extend_from_slice(head);
    for m in maps {
        w.extend_from_slice(m);
    }
    Ok(w)
}

/// A new buffer of `map.len()` elements of `src`'s dtype: element `i` is `src`'s buffer
/// element `map[i]` (positions in the buffer, not the view: see [`positions`]).
pub(crate) fn pick(op: &'static str, src: View<'_>, map: &[u32]) -> Result<GpuBuffer> {
    let ctx = src.buf.ctx();
    let n = map.len();
    let dst = out_buffer(ctx, n, src.dtype, op)?;
    if n == 0 {
        return Ok(dst);
    }
    if n > i32::MAX as usize {
        return Err(too_large(op, n));
    }
    let prm = words(op, ctx, &[n as u32], &[map])?;
    let ty = wgsl_type(src.dtype);
    let key = format!("pick {ty}");
    let pipeline = ctx.pipeline(&key, (1, 1), || {
        format!(
            "@group(0) @binding(0) var<storage, read> prm: array<i32>;
@group(0) @binding(1) var<storage, read> src: array<{ty}>;
@group(0) @binding(2) var<storage, read_write> dst: array<{ty}>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) w: vec3<u32>) {{
    let i = g.x + g.y * w.x * 256u;
    if (i >= u32(prm[0])) {{ return; }}
    dst[i] = src[u32(prm[1u + i])];
}}
"
        )
    });
    ctx.launch(pipeline, &prm, &[src.buf], &[&dst], grid(n));
    Ok(dst)
}

/// A scatter's inverse: for each of `rows` destination elements, the source elements
/// added into it, in the order they came.
pub(crate) struct Csr {
    /// Row `j`'s entries are `entries[ptr[j]..ptr[j + 1]]`.
    ptr: Vec<u32>,
    entries: Vec<u32>,
}

impl Csr {
    /// The map of pairs `(dest[k], src[k])`, kept in `k` order within each row (a
    /// stable counting sort). Every `dest[k]` is below `rows`.
    pub(crate) fn new(op: &'static str, rows: usize, dest: &[u32], src: &[u32]) -> Result<Csr> {
        debug_assert_eq!(dest.len(), src.len());
        if rows >= i32::MAX as usize || dest.len() >= i32::MAX as usize {
            return Err(too_large(op, rows.max(dest.len())));
        }
        let mut ptr = vec![0u32; rows + 1];
        for &d in dest {
            ptr[d as usize + 1] += 1;
        }
        for j in 0..rows {
            ptr[j + 1] += ptr[j];
        }
        let mut fill = ptr.clone();
        let mut entries = vec![0u32; dest.len()];
        for (&d, &s) in dest.iter().zip(src) {
            let at = &mut fill[d as usize];
            entries[*at as usize] = s;
            *at += 1;
        }
        Ok(Csr { ptr, entries })
    }
}

/// A new buffer of `shape`'s elements of `src`'s dtype: element `j` is `base`'s
/// element `j` (`base` broadcast to `shape`, read through its layout; zero without
/// one) plus the `src` buffer elements of `map`'s row `j`, added in order. Integer
/// sums wrap as the CPU's do (U8 modulo 256).
pub(crate) fn sum_into(
    op: &'static str,
    base: Option<View<'_>>,
    src: View<'_>,
    shape: &Shape,
    map: &Csr,
) -> Result<GpuBuffer> {
    let ctx = src.buf.ctx();
    let n = shape.size();
    debug_assert_eq!(map.ptr.len(), n + 1);
    let dst = out_buffer(ctx, n, src.dtype, op)?;
    if n == 0 {
        return Ok(dst);
    }
    let strides = base.as_ref().map(|b| b.layout.broadcast_strides(shape));
    let views: smallvec::SmallVec<[(usize, &[isize]); 1]> = match (&base, &strides) {
        (Some(b), Some(s)) => smallvec::smallvec![(b.layout.offset, &s[..])],
        _ => smallvec::smallvec![],
    };
    let head = index_params(op, ctx, shape, &views, 0)?;
    // The map follows the index words: `ptr` at `m`, the entries after it.
    let m = head.len();
    let prm = words(op, ctx, &head, &[&map.ptr, &map.entries])?;
    let ty = wgsl_type(src.dtype);
    let has_base = base.is_some();
    let wrap = if src.dtype == DType::U8 {
        " & 255u"
    } else {
        ""
    };
    let key = format!("sum_into {ty} {has_base} {m}");
    let pipeline = ctx.pipeline(&key, (1 + usize::from(has_base), 1), || {
        let mut s = String::from("@group(0) @binding(0) var<storage, read> prm: array<i32>;\n");
        let src_binding = if has_base {
            s += &format!("@group(0) @binding(1) var<storage, read> base: array<{ty}>;\n");
            2
        } else {
            1
        };
        s += &format!(
            "@group(0) @binding({src_binding}) var<storage, read> src: array<{ty}>;
@group(0) @binding({}) var<storage, read_write> dst: array<{ty}>;
{INDEX_FN}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) w: vec3<u32>) {{
    let i = g.x + g.y * w.x * 256u;
    let n = u32(prm[0]);
    if (i >= n) {{ return; }}
    var acc = {};
    let end = u32(prm[{m}u + i + 1u]);
    for (var e = u32(prm[{m}u + i]); e < end; e++) {{
        acc = acc + src[u32(prm[{m}u + n + 1u + e])];
    }}
    dst[i] = acc{wrap};
}}
",
            src_binding + 1,
            if has_base {
                "base[at(i, 0u)]".to_string()
            } else {
                format!("{ty}(0)")
            },
        );
        s
    });
    match base {
        Some(b) => ctx.launch(pipeline, &prm, &[b.buf, src.buf], &[&dst], grid(n)),
        None => ctx.launch(pipeline, &prm, &[src.buf], &[&dst], grid(n)),
    }
    Ok(dst)
}

/// A new buffer of `shape`'s elements of `dtype`: each `fill` first (when given), then
/// each part's source written through its destination layout (a view into the new
/// buffer whose shape the source broadcasts to). `concat`, `stack`, `pad` and
/// `broadcast_to` on the device, as `copy_strided` serves them on the CPU.
pub(crate) fn assemble<'a>(
    op: &'static str,
    ctx: &'static super::Ctx,
    shape: &Shape,
    dtype: DType,
    fill: Option<f64>,
    parts: impl IntoIterator<Item = (crate::layout::Layout, View<'a>)>,
) -> Result<GpuBuffer> {
    use super::inplace::{ViewMut, assign, filled};
    let buf = match fill {
        Some(v) => filled(op, ctx, shape, dtype, v)?,
        None => out_buffer(ctx, shape.size(), dtype, op)?,
    };
    for (layout, src) in parts {
        let dst = ViewMut {
            buf: &buf,
            layout: &layout,
            dtype,
        };
        assign(op, dst, Some(src), "x", 0)?;
    }
    Ok(buf)
}
