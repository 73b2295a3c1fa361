//! Random numbers on the device: a counter-based generator, so every thread draws its
//! own numbers from the key and its index, with no state between launches.

use super::kernels::{grid, out_buffer};
use super::{Ctx, GpuBuffer};
use crate::DType;
use crate::error::Result;

/// A distribution that [`random`] samples.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Dist {
    /// U[low, high).
    Uniform(f32, f32),
    /// N(loc, scale^2).
    Normal(f32, f32),
}

/// `n` F32 samples of `dist` on the device: Philox4x32-10 (Salmon et al., "Parallel
/// random numbers: as easy as 1, 2, 3", 2011; cuRAND's and PyTorch's generator) keyed
/// by `key`, thread `t` enciphering the counter `(t, 0, 0, 0)` into four 32-bit words:
/// four uniforms (24 bits each), or two Box-Muller pairs.
pub(crate) fn random(ctx: &'static Ctx, n: usize, dist: Dist, key: u64) -> Result<GpuBuffer> {
    let dst = out_buffer(ctx, n, DType::F32, "random")?;
    if n == 0 {
        return Ok(dst);
    }
    let (kind, a, b) = match dist {
        Dist::Uniform(lo, hi) => (0, lo, hi),
        Dist::Normal(loc, scale) => (1, loc, scale),
    };
    // [n, key low, key high, kind, a, b, 0, 0]
    let prm = [
        n as u32,
        key as u32,
        (key >> 32) as u32,
        kind,
        a.to_bits(),
        b.to_bits(),
        0,
        0,
    ];
    let pipeline = ctx.pipeline("random philox", (0, 1), || {
        "@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
// (high, low) words of the 64-bit product a * b.
fn mulhilo(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu; let a1 = a >> 16u;
    let b0 = b & 0xffffu; let b1 = b >> 16u;
    let p00 = a0 * b0; let p01 = a0 * b1; let p10 = a1 * b0; let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>(p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u), a * b);
}
fn philox(ctr: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var c = ctr;
    var k = key;
    for (var r = 0u; r < 10u; r++) {
        let p0 = mulhilo(0xD2511F53u, c.x);
        let p1 = mulhilo(0xCD9E8D57u, c.z);
        c = vec4<u32>(p1.x ^ c.y ^ k.x, p1.y, p0.x ^ c.w ^ k.y, p0.y);
        k = k + vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
    }
    return c;
}
// A uniform in [0, 1) from the top 24 bits.
fn unit(x: u32) -> f32 {
    return f32(x >> 8u) * 5.9604645e-8;
}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) w: vec3<u32>) {
    let t = g.x + g.y * w.x * 256u;
    let n = prm[0];
    if (t * 4u >= n) { return; }
    let r = philox(vec4<u32>(t, 0u, 0u, 0u), vec2<u32>(prm[1], prm[2]));
    let a = bitcast<f32>(prm[4]);
    let b = bitcast<f32>(prm[5]);
    var v: array<f32, 4>;
    if (prm[3] == 0u) {
        v = array<f32, 4>(unit(r.x), unit(r.y), unit(r.z), unit(r.w));
        for (var j = 0u; j < 4u; j++) {
            v[j] = a + (b - a) * v[j];
        }
    } else {
        // Box-Muller: u1 in (0, 1], so the log is finite.
        let r0 = sqrt(-2.0 * log(1.0 - unit(r.x)));
        let r1 = sqrt(-2.0 * log(1.0 - unit(r.z)));
        let t0 = 6.2831855 * unit(r.y);
        let t1 = 6.2831855 * unit(r.w);
        v = array<f32, 4>(r0 * cos(t0), r0 * sin(t0), r1 * cos(t1), r1 * sin(t1));
        for (var j = 0u; j < 4u; j++) {
            v[j] = a + b * v[j];
        }
    }
    for (var j = 0u; j < 4u; j++) {
        if (t * 4u + j < n) {
            dst[t * 4u + j] = v[j];
        }
    }
}
"
        .to_string()
    });
    ctx.launch(pipeline, &prm, &[], &[&dst], grid(n.div_ceil(4)));
    Ok(dst)
}
