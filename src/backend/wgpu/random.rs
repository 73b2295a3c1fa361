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

#[cfg(test)]
mod tests {
    use super::*;

    /// Philox4x32-10 on the host, as Random123's reference (`philox4x32_R(10, ...)`).
    fn philox(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
        let (mut c, mut k) = (ctr, key);
        for _ in 0..10 {
            let p0 = u64::from(0xD251_1F53u32) * u64::from(c[0]);
            let p1 = u64::from(0xCD9E_8D57u32) * u64::from(c[2]);
            c = [
                (p1 >> 32) as u32 ^ c[1] ^ k[0],
                p1 as u32,
                (p0 >> 32) as u32 ^ c[3] ^ k[1],
                p0 as u32,
            ];
            k = [
                k[0].wrapping_add(0x9E37_79B9),
                k[1].wrapping_add(0xBB67_AE85),
            ];
        }
        c
    }

    /// The host reference gives Random123's known answers (its `kat_vectors`).
    #[test]
    fn host_philox_gives_the_known_answers() {
        assert_eq!(
            philox([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    /// The device's uniforms are the reference's words, top 24 bits over 2^24, for
    /// every thread's counter (`(t, 0, 0, 0)`) and a key with both words set.
    #[test]
    fn device_philox_matches_the_reference() {
        let Some(ctx) = (0..super::super::adapters().len()).find_map(|i| super::super::ctx(i).ok())
        else {
            assert!(
                std::env::var("NDSCOPE_REQUIRE_GPU").as_deref() != Ok("1"),
                "NDSCOPE_REQUIRE_GPU=1 but no GPU adapter was found"
            );
            eprintln!("no GPU adapter: skipped");
            return;
        };
        for key in [0u64, 0x0123_4567_89ab_cdef] {
            let n = 4 * 300 + 3; // more than a workgroup of threads; a partial last one
            let buf = random(ctx, n, Dist::Uniform(0.0, 1.0), key).unwrap();
            let bytes = super::super::download(&buf, n, DType::F32).unwrap();
            let got: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                .collect();
            for (i, &g) in got.iter().enumerate() {
                let t = (i / 4) as u32;
                let r = philox([t, 0, 0, 0], [key as u32, (key >> 32) as u32])[i % 4];
                let want = (r >> 8) as f32 / (1u32 << 24) as f32;
                assert_eq!(g, want, "key {key:#x}, element {i}");
            }
        }
    }
}
