//! GPU arrays (feature `gpu`): every GPU op against the CPU op on the same inputs
//! (broadcasting, views with offsets, steps, flips and transposes, zero-size arrays),
//! typed errors across devices, and device memory that scopes free on time.
//!
//! Needs an adapter: Mesa's software Vulkan driver ("llvmpipe") stands in where there
//! is no GPU. Without one these tests print that they skip, unless
//! `NDSCOPE_REQUIRE_GPU=1`, which makes them fail (CI sets it).
#![cfg(feature = "gpu")]

use ndscope::{
    DType, Device, NDArray, NDManager, NDScope, NdError, devices, driver_memory, empty_cache,
    memory_on,
};
use std::sync::Mutex;

/// An op under test, applied to CPU and GPU inputs alike.
type Op = fn(&[NDArray]) -> NDArray;

/// GPU tests share one device's counters: they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn gpu() -> Option<Device> {
    let found = devices().into_iter().find(|d| d.device != Device::Cpu);
    match found {
        Some(d) => Some(d.device),
        None if std::env::var("NDSCOPE_REQUIRE_GPU").as_deref() == Ok("1") => {
            panic!(
                "NDSCOPE_REQUIRE_GPU=1 but no GPU adapter was found (install mesa-vulkan-drivers)"
            )
        }
        None => {
            eprintln!("no GPU adapter: skipped");
            None
        }
    }
}

fn vals(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed
        .wrapping_mul(2862933555777941757)
        .wrapping_add(3037000493);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(2862933555777941757).wrapping_add(3037000493);
            ((x >> 35) % 2001) as f32 / 250.0 - 4.0
        })
        .collect()
}

fn close(what: &str, got: &[f32], want: &[f32], rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = g == w || (g.is_nan() && w.is_nan()) || (g - w).abs() <= rel * (1.0 + w.abs());
        assert!(ok, "{what}[{i}]: gpu {g}, cpu {w}");
    }
}

/// `f` on the CPU arrays and on their GPU copies, compared.
fn same(what: &str, d: Device, inputs: &[&NDArray], rel: f32, f: impl Fn(&[NDArray]) -> NDArray) {
    let cpu: Vec<NDArray> = inputs.iter().map(|a| **a).collect();
    let gpu: Vec<NDArray> = cpu.iter().map(|a| a.to_device(d)).collect();
    let (want, got) = (f(&cpu), f(&gpu));
    assert_eq!(got.device(), d, "{what}: result device");
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    match want.dtype() {
        DType::F32 => close(
            what,
            &got.to_vec::<f32>().unwrap(),
            &want.to_vec::<f32>().unwrap(),
            rel,
        ),
        DType::F64 => {
            let (g, w) = (got.to_vec::<f64>().unwrap(), want.to_vec::<f64>().unwrap());
            assert_eq!(g.len(), w.len(), "{what}: length");
            for (i, (g, w)) in g.iter().zip(&w).enumerate() {
                let ok = g == w
                    || (g.is_nan() && w.is_nan())
                    || (g - w).abs() <= f64::from(rel) * 1e-6 * (1.0 + w.abs());
                assert!(ok, "{what}[{i}]: gpu {g}, cpu {w}");
            }
        }
        DType::I32 => assert_eq!(
            got.to_vec::<i32>().unwrap(),
            want.to_vec::<i32>().unwrap(),
            "{what}"
        ),
        DType::I64 => assert_eq!(
            got.to_vec::<i64>().unwrap(),
            want.to_vec::<i64>().unwrap(),
            "{what}"
        ),
        DType::Bool => assert_eq!(
            got.to_vec::<bool>().unwrap(),
            want.to_vec::<bool>().unwrap(),
            "{what}"
        ),
        DType::U8 => assert_eq!(
            got.to_vec::<u8>().unwrap(),
            want.to_vec::<u8>().unwrap(),
            "{what}"
        ),
    }
}

/// Whether `d` holds `t` arrays (I64 and F64 need the adapter's 64-bit shaders).
fn holds(d: Device, t: DType) -> bool {
    devices()
        .into_iter()
        .any(|i| i.device == d && i.dtypes.contains(&t))
}

#[test]
fn every_dtype_goes_up_and_comes_back() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let m = NDManager::new();
    let f = m.create(&vals(10, 1), [2, 5]);
    let i = m.create(&[1i32, -2, 3, i32::MAX, i32::MIN, 0], [3, 2]);
    let u = m.create(&[0u8, 1, 200, 255], [4]);
    let b = m.create(&[true, false, true], [3]);
    let z = m.zeros([0, 3], DType::F32);
    for a in [f, i, u, b, z] {
        let g = a.to_device(d);
        assert_eq!(g.device(), d);
        assert_eq!(g.to_string(), a.to_string(), "Display reads the device");
        let back = g.to_device(Device::Cpu);
        assert_eq!(back.device(), Device::Cpu);
        assert_eq!(back.to_string(), a.to_string());
    }
    // A view goes up as its elements (a contiguous copy).
    let t = f.transpose().get("::-1");
    assert_eq!(
        t.to_device(d).to_vec::<f32>().unwrap(),
        t.to_vec::<f32>().unwrap()
    );
    // I64 and F64 where the adapter offers them (llvmpipe does); see
    // `without_64bit_shaders_i64_and_f64_are_refused` for where it does not.
    let l = m.create(&[1i64 << 40, -3, i64::MAX, i64::MIN], [2, 2]);
    let x = m.create(&[0.1f64, -1e300, f64::MIN_POSITIVE, 1.0 / 3.0], [4]);
    for a in [l, x] {
        assert!(holds(d, a.dtype()), "llvmpipe offers {}", a.dtype());
        let g = a.to_device(d);
        assert_eq!(g.to_string(), a.to_string());
        assert_eq!(g.to_device(Device::Cpu).to_string(), a.to_string());
    }
    m.close();
}

#[test]
fn a_manager_on_a_gpu_creates_there() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let m = NDManager::new_on(d);
    assert_eq!(m.device(), d);
    let sub = m.new_sub_manager();
    assert_eq!(sub.device(), d);
    let a = m.create(&[1.0f32, 2.0, 3.0], [3]);
    let z = sub.zeros([2, 2], DType::I32);
    let r = m.arange(0.0, 4.0, 1.0, DType::F32);
    for x in [a, z, r] {
        assert_eq!(x.device(), d);
    }
    assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(z.to_vec::<i32>().unwrap(), vec![0; 4]);
    assert_eq!((r * 2.0).to_vec::<f32>().unwrap(), vec![0.0, 2.0, 4.0, 6.0]);
    m.close();
}

#[test]
fn elementwise_ops_match_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let m = NDManager::new();
    let a = m.create(&vals(24, 2), [2, 3, 4]);
    let b = m.create(&vals(4, 3), [4]);
    let c = m.create(&vals(6, 4), [2, 3, 1]);
    let pos = m.create(&vals(24, 5), [2, 3, 4]).abs() + 0.5;
    let t = m.create(&vals(12, 6), [3, 4]).transpose(); // [4,3], strides [1,4]
    let s = m.create(&vals(30, 7), [5, 6]).get("1::2, ::-2"); // offset, step 2, flipped
    let e = m.zeros([0, 4], DType::F32);
    let cases: [(&str, &[&NDArray], Op); 14] = [
        ("add", &[&a, &b], |x| x[0] + x[1]),
        ("sub", &[&a, &c], |x| x[0] - x[1]),
        ("mul", &[&c, &b], |x| x[0] * x[1]),
        ("div", &[&a, &pos], |x| x[0] / x[1]),
        ("pow", &[&pos, &b], |x| x[0].pow(x[1])),
        ("maximum", &[&a, &c], |x| x[0].maximum(x[1])),
        ("minimum", &[&a, &b], |x| x[0].minimum(x[1])),
        ("transposed", &[&t, &b.get(":3")], |x| x[0] * x[1] + 1.0),
        ("stepped", &[&s, &s], |x| x[0] - x[1] * 2.0),
        ("scalars", &[&a], |x| 2.0 - (x[0] * 0.5) / 3.0),
        ("zero-size", &[&e, &b], |x| x[0] + x[1]),
        ("compare", &[&a, &b], |x| x[0].gt(x[1])),
        ("eq", &[&c, &c], |x| x[0].eq(x[1])),
        ("reshape of a view", &[&t], |x| x[0].reshape([12]) + 0.0),
    ];
    for (what, inputs, f) in cases {
        same(what, d, inputs, 1e-5, f);
    }
    let unary: [(&str, Op); 11] = [
        ("abs", |x| x[0].abs()),
        ("neg", |x| -x[0]),
        ("square", |x| x[0].square()),
        ("relu", |x| x[0].relu()),
        ("exp", |x| x[0].exp()),
        ("log", |x| x[0].abs().log()),
        ("sqrt", |x| x[0].abs().sqrt()),
        ("sin", |x| x[0].sin()),
        ("cos", |x| x[0].cos()),
        ("tanh", |x| x[0].tanh()),
        ("sigmoid", |x| x[0].sigmoid()),
    ];
    for (what, f) in unary {
        same(what, d, &[&a], 1e-5, f);
        same(what, d, &[&s], 1e-5, f);
    }
    // Integers match exactly.
    let i = m.create(&[5i32, -7, 3, 0, 12, -1], [2, 3]);
    let j = m.create(&[2i32, 3, -4], [3]);
    let ints: [(&str, Op); 6] = [
        ("i32 add", |x| x[0] + x[1]),
        ("i32 sub", |x| x[0] - x[1]),
        ("i32 mul", |x| x[0] * x[1]),
        ("i32 max", |x| x[0].maximum(x[1])),
        ("i32 scalar", |x| x[0] * 3 + 1),
        ("i32 le", |x| x[0].le(x[1])),
    ];
    for (what, f) in ints {
        same(what, d, &[&i, &j], 0.0, f);
    }
    m.close();
}

#[test]
fn reductions_match_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let m = NDManager::new();
    let a = m.create(&vals(2 * 3 * 50, 8), [2, 3, 50]);
    let t = a.permute(&[2, 0, 1]); // a strided view
    let big = m.create(&vals(70_000, 9), [70_000]);
    let cases: [(&str, Op); 8] = [
        ("sum all", |x| x[0].sum()),
        ("mean all", |x| x[0].mean()),
        ("max all", |x| x[0].max()),
        ("min all", |x| x[0].min()),
        ("sum axis", |x| x[0].sum_axes(&[-1], false)),
        ("mean axes", |x| x[0].mean_axes(&[0, 2], true)),
        ("max axis", |x| x[0].max_axes(&[1], false)),
        ("min axis", |x| x[0].min_axes(&[0], false)),
    ];
    for (what, f) in cases {
        same(what, d, &[&a], 1e-4, f);
        same(what, d, &[&t], 1e-4, f);
    }
    same("sum of 70,000", d, &[&big], 1e-4, |x| x[0].sum());
    m.close();
}

#[test]
fn matmul_matches_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let m = NDManager::new();
    let a = m.create(&vals(37 * 19, 11), [37, 19]);
    let b = m.create(&vals(19 * 23, 12), [19, 23]);
    let bt = m.create(&vals(23 * 19, 13), [23, 19]).transpose(); // [19,23], strides [1,19]
    let v = m.create(&vals(19, 14), [19]);
    let s = m.create(&vals(3 * 5 * 19, 15), [3, 1, 5, 19]);
    let t = m.create(&vals(2 * 19 * 4, 16), [2, 19, 4]);
    let cases: [(&str, &[&NDArray], Op); 6] = [
        ("2-d", &[&a, &b], |x| x[0].matmul(x[1])),
        ("transposed rhs", &[&a, &bt], |x| x[0].matmul(x[1])),
        ("matrix @ vector", &[&a, &v], |x| x[0].matmul(x[1])),
        ("vector @ matrix", &[&v, &b], |x| x[0].matmul(x[1])),
        ("batches broadcast", &[&s, &t], |x| x[0].matmul(x[1])),
        ("a view's rows", &[&a, &b], |x| {
            x[0].get("1::3").matmul(x[1])
        }),
    ];
    for (what, inputs, f) in cases {
        same(what, d, inputs, 1e-4, f);
    }
    m.close();
}

#[test]
fn devices_do_not_mix_and_missing_kernels_say_so() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let m = NDManager::new();
    let c = m.create(&[1.0f32, 2.0], [2]);
    let g = m.create(&[3.0f32, 4.0], [2]).to_device(d);
    let gi = g.to_dtype(DType::I32);
    let (cpu0, gpu0) = (memory_on(Device::Cpu), memory_on(d));
    match c.try_add(g).unwrap_err() {
        NdError::DeviceMismatch {
            op,
            lhs_device,
            rhs_device,
            ..
        } => {
            assert_eq!((op, lhs_device, rhs_device), ("add", Device::Cpu, d));
        }
        e => panic!("expected DeviceMismatch, got {e}"),
    }
    // An op with no kernel on a GPU for a dtype (integer pow).
    let e = gi.try_pow(gi).unwrap_err();
    assert!(
        matches!(e, NdError::Unsupported { op: "pow", device } if device == d),
        "{e}"
    );
    assert!(e.to_string().contains(&d.to_string()), "{e}");
    // In place as well: a host input for a device target is refused, nothing written.
    assert!(matches!(
        g.try_addi(c).unwrap_err(),
        NdError::DeviceMismatch { .. }
    ));
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![3.0, 4.0]);
    // Nothing was allocated by the failures.
    assert_eq!(memory_on(Device::Cpu).live_bytes, cpu0.live_bytes);
    assert_eq!(memory_on(d).live_bytes, gpu0.live_bytes);
    m.close();
}

#[test]
fn scopes_free_device_memory_and_empty_cache_returns_it() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let m = NDManager::new_on(d);
    let w = m.create(&vals(1 << 16, 10), [1 << 16]);
    empty_cache();
    let base = memory_on(d);
    let driver0 = driver_memory(d);
    for _ in 0..5 {
        let _s = NDScope::new();
        let mut x = w;
        for _ in 0..10 {
            x = (x * 0.5 + w).relu();
        }
        assert!(memory_on(d).live_bytes > base.live_bytes);
    }
    let after = memory_on(d);
    assert_eq!(
        after.live_bytes, base.live_bytes,
        "the scopes freed every intermediate"
    );
    assert_eq!(after.live_buffers, base.live_buffers);
    assert!(after.cached_bytes > 0, "freed buffers wait in the pool");
    let grown = driver_memory(d);
    empty_cache();
    assert_eq!(memory_on(d).cached_bytes, 0);
    if let (Some(b0), Some(g), Some(e)) = (driver0, grown, driver_memory(d)) {
        assert!(g > b0, "the loop took driver memory: {b0} -> {g}");
        assert!(e <= b0, "empty_cache gave it back: {b0} -> {e}");
    }
    // Closing the manager frees its arrays on the device too.
    m.close();
    assert_eq!(memory_on(d).live_bytes, base.live_bytes - (1 << 18));
}

/// The launch path caches bind groups by buffer and packs each batch's parameter words
/// into one arena at dynamic offsets. Results must not see another launch's words or
/// buffers: the same buffers with a different scalar per launch across many batches
/// (a stale offset or group would repeat a scalar), freed and reused results, a
/// parameter block too large for the arena (a matmul of 700 batches), and launches
/// after `empty_cache` destroyed the buffers that cached groups named.
#[test]
fn cached_launches_read_their_own_parameters_and_buffers() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let g = NDManager::new_on(d);
    let a = g.create(&vals(10, 1), [10]);
    let host = a.to_vec::<f32>().unwrap();
    // 700 launches: more than a batch (submitted past a count) many times over, on the
    // same input buffer and, once each result closes, the same output buffer.
    let mut sums = [0.0f32; 10];
    for i in 0..700 {
        let c = a + i as f32;
        if i % 7 == 0 {
            // Read now and then: a read submits mid-batch.
            let v = c.to_vec::<f32>().unwrap();
            for (j, x) in v.iter().enumerate() {
                assert_eq!(*x, host[j] + i as f32, "launch {i}, element {j}");
            }
        }
        sums.iter_mut()
            .zip(c.to_vec::<f32>().unwrap())
            .for_each(|(s, x)| *s += x);
        c.close();
    }
    for (j, s) in sums.iter().enumerate() {
        let want: f32 = (0..700).map(|i| host[j] + i as f32).sum();
        assert!(
            (s - want).abs() <= 1e-3 * want.abs(),
            "sum {j}: {s} vs {want}"
        );
    }
    // Queued without reads in between: each result is read only at the end.
    let kept: Vec<NDArray> = (0..300).map(|i| a * (i as f32)).collect();
    for (i, k) in kept.iter().enumerate() {
        let v = k.to_vec::<f32>().unwrap();
        assert_eq!(v[3], host[3] * i as f32, "queued launch {i}");
    }
    // A parameter block past the arena's binding: 700 batches of 2x3 @ 3x2.
    let m = NDManager::new();
    let x = m.create(&vals(700 * 6, 2), [700, 2, 3]);
    let y = m.create(&vals(700 * 6, 3), [700, 3, 2]);
    same("700 batches", d, &[&x, &y], 1e-4, |v| v[0].matmul(v[1]));
    // After the cache is emptied, new buffers (and new bind groups) serve the same ops.
    for k in kept {
        k.close();
    }
    empty_cache();
    let c = a + 1.0;
    assert_eq!(c.to_vec::<f32>().unwrap()[0], host[0] + 1.0);
    m.close();
    g.close();
}

/// `where` (three inputs broadcast together, any dtype) and `softmax`/`log_softmax`
/// (rows longer than a workgroup, any axis of a strided view, large logits) against
/// the CPU.
#[test]
fn where_and_softmax_match_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let m = NDManager::new();
    let a = m.create(&vals(24, 2), [2, 3, 4]);
    let b = m.create(&vals(4, 3), [4]);
    let cond = m.create(&vals(3, 4), [3, 1]).gt(0.0);
    let wide = m.create(&vals(5 * 700, 5), [5, 700]) * 3.0;
    let t = m.create(&vals(12 * 9, 6), [12, 9]).transpose(); // [9,12], strides [1,9]
    let s = m.create(&vals(30, 7), [5, 6]).get("1::2, ::-2"); // offset, step 2, flipped
    let big = m.create(&vals(40, 8), [4, 10]) * 400.0; // exp would overflow unshifted
    let e = m.zeros([0, 4], DType::F32);
    let cases: [(&str, &[&NDArray], Op); 13] = [
        ("where broadcast", &[&cond, &a, &b], |x| {
            x[0].where_(x[1], x[2])
        }),
        (
            "where of views",
            &[&cond, &t.get(":3, :4"), &t.get("4:7, 1:2")],
            |x| x[0].where_(x[1], x[2]),
        ),
        ("where zero-size", &[&e, &e], |x| {
            x[0].gt(0.0).where_(x[0], x[1])
        }),
        ("softmax last", &[&a], |x| x[0].softmax(-1)),
        ("softmax middle", &[&a], |x| x[0].softmax(1)),
        ("softmax first", &[&a], |x| x[0].softmax(0)),
        ("softmax 700 wide", &[&wide], |x| x[0].softmax(1)),
        ("log_softmax 700 wide", &[&wide], |x| x[0].log_softmax(-1)),
        ("softmax transposed", &[&t], |x| x[0].softmax(1)),
        ("log_softmax stepped", &[&s], |x| x[0].log_softmax(1)),
        ("softmax large", &[&big], |x| x[0].softmax(1)),
        ("log_softmax large", &[&big], |x| x[0].log_softmax(0)),
        ("softmax zero-size", &[&e], |x| x[0].softmax(1)),
    ];
    for (what, inputs, f) in cases {
        same(what, d, inputs, 1e-5, f);
    }
    // Integers and Bool select exactly.
    let i = m.create(&[5i32, -7, 3, 0, 12, -1], [2, 3]);
    let j = m.create(&[2i32, 3, -4], [3]);
    same("where i32", d, &[&i, &j], 0.0, |x| {
        x[0].gt(x[1]).where_(x[0], x[1])
    });
    same("where bool", d, &[&i, &j], 0.0, |x| {
        x[0].gt(0).where_(x[0].lt(x[1]), x[1].ge(0))
    });
    m.close();
}

/// `cross_entropy` against the CPU: rows wider than a workgroup, a transposed view of
/// the logits, I32, I64 and U8 labels. A label out of range is not read back to the host
/// on a GPU: the loss is NaN.
#[test]
fn cross_entropy_matches_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let m = NDManager::new();
    let wide = m.create(&vals(6 * 300, 21), [6, 300]) * 4.0;
    let labels: Vec<i32> = vec![0, 299, 17, 150, 3, 42];
    let l32 = m.create(&labels, [6]);
    let l8 = m.create(
        &labels.iter().map(|&v| (v % 9) as u8).collect::<Vec<_>>(),
        [6],
    );
    let t = m.create(&vals(9 * 6, 22), [9, 6]).transpose(); // [6, 9]
    same("wide, i32 labels", d, &[&wide, &l32], 1e-5, |x| {
        x[0].cross_entropy(x[1])
    });
    same("transposed, u8 labels", d, &[&t, &l8], 1e-5, |x| {
        x[0].cross_entropy(x[1])
    });
    if holds(d, DType::I64) {
        let l64 = m.create(
            &labels.iter().map(|&v| i64::from(v)).collect::<Vec<_>>(),
            [6],
        );
        same("wide, i64 labels", d, &[&wide, &l64], 1e-5, |x| {
            x[0].cross_entropy(x[1])
        });
        // The gradient reads the labels too. (A collector zeroes every gradient when
        // it opens: each is read before the next opens.)
        let gm = NDManager::new_on(d);
        let wv = vals(6 * 300, 21);
        let (w, c) = (gm.create(&wv, [6, 300]), m.create(&wv, [6, 300]));
        let grads: Vec<Vec<f32>> = [(w, l64.to_device(d)), (c, l64)]
            .into_iter()
            .map(|(a, l)| {
                a.set_requires_gradient(true);
                let gc = ndscope::GradientCollector::new();
                gc.backward(a.cross_entropy(l)).unwrap();
                a.gradient().to_vec::<f32>().unwrap()
            })
            .collect();
        close("i64 labels' gradient", &grads[0], &grads[1], 1e-5);
        gm.close();
    }
    let g = t.to_device(d);
    // Out of range, also beyond 32 bits (not truncated into range).
    let bad = m.create(&[0i32, 1, 9, 2, 3, 4], [6]).to_device(d);
    let bad64 = m
        .create(&[0i64, 1, (1 << 32) + 2, 2, 3, 4], [6])
        .to_device(d);
    for bad in [bad, bad64] {
        let loss = g.cross_entropy(bad).to_scalar::<f32>().unwrap();
        assert!(
            loss.is_nan(),
            "a label out of range gives NaN on the device, got {loss}"
        );
    }
    let fl = m.zeros([6], DType::F32).to_device(d);
    assert!(matches!(
        g.try_cross_entropy(fl),
        Err(NdError::UnsupportedDType { .. })
    ));
    m.close();
}

/// `random_uniform` and `random_normal` on a GPU manager draw on the device (Philox):
/// reproducible after `random::seed`, different from call to call, in range, with the
/// moments of their distributions (1M samples: mean and variance within 5 standard
/// errors), and every count of elements (not a multiple of the four a thread draws).
#[test]
fn random_draws_on_the_device_are_seeded_and_distributed() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let g = NDManager::new_on(d);
    ndscope::random::seed(11);
    let a = g.random_uniform(-1.0, 3.0, [1 << 20], DType::F32);
    let b = g.random_uniform(-1.0, 3.0, [1 << 20], DType::F32);
    ndscope::random::seed(11);
    let a2 = g.random_uniform(-1.0, 3.0, [1 << 20], DType::F32);
    assert_eq!(a.device(), d);
    let (va, vb) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    assert_eq!(va, a2.to_vec::<f32>().unwrap(), "same seed, same draws");
    assert_ne!(va[..64], vb[..64], "the next call draws anew");
    assert!(va.iter().all(|&v| (-1.0..3.0).contains(&v)), "in [-1, 3)");
    let n = va.len() as f64;
    let mean = va.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = va.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    // U[-1,3): mean 1, variance 16/12; the mean's standard error sqrt(var/n).
    assert!(
        (mean - 1.0).abs() < 5.0 * (16.0 / 12.0 / n).sqrt(),
        "mean {mean}"
    );
    assert!((var - 16.0 / 12.0).abs() < 0.01, "variance {var}");
    let z = g
        .random_normal(2.0, 0.5, [1 << 20], DType::F32)
        .to_vec::<f32>()
        .unwrap();
    assert!(z.iter().all(|v| v.is_finite()));
    let mean = z.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = z.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    assert!((mean - 2.0).abs() < 5.0 * (0.25 / n).sqrt(), "mean {mean}");
    assert!((var - 0.25).abs() < 0.005, "variance {var}");
    let within = z.iter().filter(|&&v| (v - 2.0).abs() < 0.5).count() as f64 / n;
    assert!((within - 0.6827).abs() < 0.005, "within one sd: {within}");
    for len in [0, 1, 3, 5, 1023] {
        let r = g
            .random_normal(0.0, 1.0, [len], DType::F32)
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(r.len(), len);
        assert!(r.iter().all(|v| v.is_finite()));
    }
    assert!(matches!(
        g.try_random_normal(0.0, -1.0, [3], DType::F32),
        Err(NdError::InvalidArgument { .. })
    ));
    g.close();
}

/// I64 and F64 on the device (where the adapter offers them): arithmetic beyond 32
/// bits and 24-bit mantissas, scalars of 64 bits, casts, comparisons, reductions and
/// matmul, exactly as the CPU. Math that Vulkan gives 32-bit floats only is refused.
#[test]
fn i64_and_f64_match_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    if !holds(d, DType::F64) || !holds(d, DType::I64) {
        eprintln!("{d} has no 64-bit shaders: skipped");
        return;
    }
    let m = NDManager::new();
    let x = m.create(&[0.1f64, 1e-300, 3.0, -2.5, 1e15 + 0.5, 7.0], [2, 3]);
    let y = m.create(&[3.0f64, 1.0 / 3.0, -1e-3], [3]);
    let big: Vec<i64> = (0..12).map(|i| (i - 5) * 3_000_000_007).collect();
    let i = m.create(&big, [3, 4]);
    let j = m.create(&[1i64 << 33, -7, 5, 1 << 40], [4]);
    let f = m.create(&vals(60, 3), [3, 4, 5]);
    let cases: [(&str, &[&NDArray], Op); 20] = [
        ("f64 add broadcast", &[&x, &y], |v| v[0] + v[1]),
        ("f64 div", &[&x, &y], |v| v[0] / v[1]),
        ("f64 maximum", &[&x, &y], |v| v[0].maximum(v[1])),
        ("f64 scalar", &[&x], |v| v[0] * 0.1 + 1e-17),
        ("f64 sqrt abs", &[&x], |v| v[0].abs().sqrt()),
        ("f64 relu neg", &[&x], |v| (-v[0]).relu()),
        ("f64 compare", &[&x, &y], |v| v[0].gt(v[1])),
        ("f64 compare scalar", &[&x], |v| v[0].le(0.1)),
        ("f64 sum mean", &[&x], |v| {
            v[0].sum_axes(&[1], false) + v[0].mean()
        }),
        ("f64 max min", &[&x], |v| {
            v[0].max_axes(&[0], false) - v[0].min()
        }),
        ("f64 matmul", &[&x, &y], |v| v[0].matmul(v[1])),
        ("f64 to f32", &[&x], |v| v[0].to_dtype(DType::F32)),
        ("f32 to f64", &[&f], |v| v[0].to_dtype(DType::F64) * 1e-10),
        ("i64 arithmetic", &[&i, &j], |v| v[0] * 3 - v[1] + v[0]),
        ("i64 scalar beyond i32", &[&i], |v| v[0] + 5_000_000_000i64),
        ("i64 compare", &[&i, &j], |v| v[0].ge(v[1])),
        ("i64 sums and extremes", &[&i], |v| {
            v[0].sum_axes(&[0], false) + v[0].max_axes(&[1], true) - v[0].min()
        }),
        ("i64 mean is f64", &[&i], |v| v[0].mean_axes(&[1], false)),
        ("i64 matmul", &[&i, &j], |v| v[0].matmul(v[1])),
        ("i64 to f64 and i32", &[&i], |v| {
            v[0].to_dtype(DType::F64) + v[0].to_dtype(DType::I32).to_dtype(DType::F64)
        }),
    ];
    for (what, inputs, f) in cases {
        same(what, d, inputs, 0.0, f);
    }
    // I32 reductions and matmul too (sums wrap as on the CPU).
    let k = m.create(&[i32::MAX, 5, -3, 9, i32::MIN, 2], [3, 2]);
    same("i32 sum wraps", d, &[&k], 0.0, |v| {
        v[0].sum_axes(&[0], false)
    });
    same("i32 max min", d, &[&k], 0.0, |v| {
        v[0].max() - v[0].min_axes(&[1], false)
    });
    same("i32 matmul", d, &[&k, &k], 0.0, |v| {
        v[0].transpose().matmul(v[1])
    });
    // Vulkan has exp, log and tanh for 32-bit floats only: refused, not wrong.
    let g = x.to_device(d);
    let e = g.try_exp().unwrap_err();
    assert!(
        matches!(e, NdError::Unsupported { op: "exp", device } if device == d),
        "{e}"
    );
    m.close();
}

/// `argmax`/`argmin` on the device as on the CPU: over every axis and the flattened
/// array, rows wider than a workgroup, ties (the first index), NaN (the first NaN
/// wins), views, integer and U8 inputs.
#[test]
fn arg_reductions_match_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    if !holds(d, DType::I64) {
        eprintln!("{d} has no 64-bit integers: skipped");
        return;
    }
    let m = NDManager::new();
    let a = m.create(&vals(2 * 3 * 50, 21), [2, 3, 50]);
    // Few distinct values: many ties.
    let ties: Vec<f32> = vals(4 * 600, 22)
        .iter()
        .map(|&v| if v > 3.0 { 1.0 } else { 0.0 })
        .collect();
    let ties = m.create(&ties, [4, 600]);
    let mut nan = vals(4 * 300, 24);
    nan[7] = f32::NAN;
    nan[300 + 290] = f32::NAN;
    nan[300 + 299] = f32::NAN;
    nan[900 + 299] = f32::NAN;
    let nan = m.create(&nan, [4, 300]);
    let i = m.create(&[3i32, 9, 9, -2, 9, 0], [2, 3]);
    let u = m.create(&[4u8, 200, 200, 7, 0, 255], [3, 2]);
    let cases: [(&str, &[&NDArray], Op); 16] = [
        ("argmax flat", &[&a], |v| v[0].argmax()),
        ("argmin flat", &[&a], |v| v[0].argmin()),
        ("argmax axis 0", &[&a], |v| v[0].argmax_axis(0, false)),
        ("argmin axis 1 keep", &[&a], |v| v[0].argmin_axis(1, true)),
        ("argmax last", &[&a], |v| v[0].argmax_axis(-1, false)),
        ("argmax of a view", &[&a], |v| {
            v[0].permute(&[2, 0, 1]).get("::-3").argmax_axis(0, false)
        }),
        ("argmax ties", &[&ties], |v| v[0].argmax_axis(1, false)),
        ("argmin ties flat", &[&ties], |v| v[0].argmin()),
        ("argmax nan", &[&nan], |v| v[0].argmax_axis(1, false)),
        ("argmin nan", &[&nan], |v| v[0].argmin_axis(1, false)),
        ("argmax nan flat", &[&nan], |v| v[0].argmax()),
        ("argmax i32", &[&i], |v| v[0].argmax_axis(1, false)),
        ("argmin i32 flat", &[&i], |v| v[0].argmin()),
        ("argmax u8", &[&u], |v| v[0].argmax_axis(0, true)),
        // NaN propagates through max, min and maximum as on the CPU.
        ("max min nan", &[&nan], |v| {
            v[0].max_axes(&[1], false) + v[0].min_axes(&[0], false).sum()
        }),
        ("maximum nan", &[&nan], |v| v[0].maximum(v[0].get("::-1"))),
    ];
    for (what, inputs, f) in cases {
        same(what, d, inputs, 0.0, f);
    }
    // An empty axis with other elements left is an error there as here.
    let e = m.zeros([3, 0], DType::F32).to_device(d);
    assert!(matches!(
        e.try_argmax_axis(1, false).unwrap_err(),
        NdError::InvalidArgument { .. }
    ));
    same("argmax of nothing", d, &[&e], 0.0, |v| {
        v[0].argmax_axis(0, false)
    });
    m.close();
}

/// An adapter without 64-bit shaders (forced with `NDSCOPE_GPU_NO_64BIT=1`, in a child
/// process since the adapters are listed once per process): `devices()` says so, and
/// making an I64 or F64 array there, by any road, is `UnsupportedDTypeOn` naming the
/// device, with nothing allocated on it.
#[test]
fn without_64bit_shaders_i64_and_f64_are_refused() {
    const NAME: &str = "without_64bit_shaders_i64_and_f64_are_refused";
    if std::env::var("NDSCOPE_GPU_NO_64BIT").as_deref() != Ok("1") {
        let Some(_) = gpu() else { return };
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env("NDSCOPE_GPU_NO_64BIT", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "child failed:\n{text}");
        assert!(text.contains("1 passed"), "child ran nothing:\n{text}");
        return;
    }
    let Some(d) = gpu() else { return };
    assert!(!holds(d, DType::I64) && !holds(d, DType::F64));
    assert!(holds(d, DType::F32) && holds(d, DType::U8));
    let m = NDManager::new();
    let g = NDManager::new_on(d);
    let x = m.create(&[1.0f64, 2.0], [2]);
    let f = m.create(&[1.0f32, 2.0], [2]).to_device(d);
    let before = memory_on(d).live_bytes;
    let errors = [
        ("to_device", DType::F64, x.try_to_device(d).unwrap_err()),
        (
            "create",
            DType::I64,
            g.try_create(&[1i64, 2], [2]).unwrap_err(),
        ),
        (
            "to_dtype",
            DType::F64,
            f.try_to_dtype(DType::F64).unwrap_err(),
        ),
        ("argmax", DType::I64, f.try_argmax().unwrap_err()),
    ];
    for (op, dtype, e) in errors {
        match &e {
            NdError::UnsupportedDTypeOn {
                op: o,
                dtype: t,
                device,
            } => assert_eq!((*o, *t, *device), (op, dtype, d), "{e}"),
            _ => panic!("{op}: expected UnsupportedDTypeOn, got {e}"),
        }
        assert!(e.to_string().contains(&d.to_string()), "{e}");
    }
    assert_eq!(memory_on(d).live_bytes, before);
    g.close();
    m.close();
}

/// The more elementwise math (`erf` to `sign`) on the device against the CPU: every op
/// forward on F32 (with infinities, zeros and NaN among the inputs), its gradient
/// through a collector, the F64 subset, and the integer forms.
#[test]
fn more_unary_math_and_gradients_match_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let m = NDManager::new();
    let mut v = vals(300, 41);
    v.extend([0.0, -0.0, 2.5, -2.5, 0.5, 1e-6, -1e-6, 30.0, -30.0]);
    let x = m.create(&v, [v.len()]);
    let special = m.create(
        &[f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.0, -0.0],
        [5],
    );
    let pos = (x.abs() + 0.25).get("::3"); // a stepped view, > 0
    type Un = fn(NDArray) -> NDArray;
    let ops: [(&str, Un, bool); 13] = [
        ("erf", |a| a.erf(), true),
        ("gelu", |a| a.gelu(), true),
        ("silu", |a| a.silu(), true),
        ("softplus", |a| a.softplus(), true),
        ("leaky_relu", |a| a.leaky_relu(0.1), true),
        ("reciprocal", |a| a.reciprocal(), false),
        ("rsqrt", |a| a.rsqrt(), false),
        ("log1p", |a| a.log1p(), false),
        ("expm1", |a| a.expm1(), true),
        ("floor", |a| a.floor(), true),
        ("ceil", |a| a.ceil(), true),
        ("round", |a| a.round(), true),
        ("sign", |a| a.sign(), true),
    ];
    for (what, f, anywhere) in ops {
        let input = if anywhere { x } else { pos };
        same(what, d, &[&input], 1e-5, |a| f(a[0]));
        if anywhere {
            same(
                &format!("{what} of inf, nan, zeros"),
                d,
                &[&special],
                1e-5,
                |a| f(a[0]),
            );
        }
        if !matches!(what, "floor" | "ceil" | "round" | "sign") {
            // The gradient, on a leaf of each device (a collector zeroes gradients
            // when it opens: each is read before the next opens).
            let gm = NDManager::new_on(d);
            let vals_in = input.to_vec::<f32>().unwrap();
            let n = vals_in.len();
            let grads: Vec<Vec<f32>> = [gm.create(&vals_in, [n]), m.create(&vals_in, [n])]
                .into_iter()
                .map(|a| {
                    a.set_requires_gradient(true);
                    let gc = ndscope::GradientCollector::new();
                    gc.backward((f(a) * 1.5).sum()).unwrap();
                    a.gradient().to_vec::<f32>().unwrap()
                })
                .collect();
            close(&format!("{what}'"), &grads[0], &grads[1], 1e-5);
            gm.close();
        }
    }
    if holds(d, DType::F64) {
        let x64 = x.to_dtype(DType::F64) * 1.000000001;
        let f64_ops: [(&str, Un); 6] = [
            ("f64 leaky_relu", |a| a.leaky_relu(0.25)),
            ("f64 reciprocal", |a| a.reciprocal()),
            ("f64 floor ceil", |a| a.floor() + a.ceil()),
            ("f64 round", |a| a.round()),
            ("f64 sign", |a| a.sign()),
            ("f64 rsqrt", |a| a.abs().rsqrt()),
        ];
        for (what, f) in f64_ops {
            same(what, d, &[&x64], 0.0, |a| f(a[0]));
        }
        // round: ties to even, just past a tie (llvmpipe's own f64 round gave 0 for
        // -0.5000000005 on an AVX2 CPU), beyond 2^52; a zero's sign is not compared.
        let edge = [
            0.5,
            1.5,
            2.5,
            -0.5,
            -1.5,
            -2.5,
            0.5000000005,
            -0.5000000005,
            2.4999999999,
            -0.3,
            0.3,
            -0.0,
            4503599627370497.0,
            -9007199254740993.0,
            1e300,
        ];
        let e64 = m.create(&edge[..], [edge.len()]);
        let want: Vec<f64> = edge.iter().map(|v: &f64| v.round_ties_even()).collect();
        let got = e64.to_device(d).round().to_vec::<f64>().unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "f64 round of {}: gpu {g}, cpu {w}", edge[i]);
        }
        let e = x64.to_device(d).try_erf().unwrap_err();
        assert!(matches!(e, NdError::Unsupported { op: "erf", .. }), "{e}");
    }
    let i = m.create(&[-3i32, 0, 7, i32::MIN], [4]);
    let u = m.create(&[0u8, 3, 255], [3]);
    for a in [&i, &u] {
        same("int sign", d, &[a], 0.0, |a| a[0].sign());
        same("int round", d, &[a], 0.0, |a| a[0].round());
    }
    // What the CPU refuses, the device refuses alike.
    let e = i.to_device(d).try_erf().unwrap_err();
    assert!(matches!(e, NdError::UnsupportedDType { .. }), "{e}");
    m.close();
}

/// U8 arithmetic wraps modulo 256 on the device as on the CPU, and integer division
/// by zero gives 0 there too (`i32::MIN / -1` wraps).
#[test]
fn u8_arithmetic_and_integer_division_match_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let (cm, gm) = (NDManager::new(), NDManager::new_on(d));
    let p: Vec<u8> = (0..16).map(|i| (i * 41 + 200) as u8).collect();
    let q: Vec<u8> = (0..16).map(|i| (i * 13) as u8).collect();
    let f = |m: &NDManager| {
        let (a, b) = (m.create(&p, [4, 4]), m.create(&q, [4, 4]));
        [
            a + b,
            a - b,
            a * b,
            a / b,
            a * 3,
            250 - a,
            a.transpose() / 7,
        ]
        .map(|r| r.to_vec::<u8>().unwrap())
    };
    assert_eq!(f(&gm), f(&cm));
    let ints = [i32::MIN, -7, -1, 0, 1, 7, i32::MAX, 5];
    let divs = [-1i32, 2, 0, 3, 0, -2, 1, -5];
    let g = |m: &NDManager| {
        let (a, b) = (m.create(&ints, [8]), m.create(&divs, [8]));
        let wide = a.to_dtype(DType::I64) / b.to_dtype(DType::I64);
        (
            (a / b).to_vec::<i32>().unwrap(),
            (a / 0).to_vec::<i32>().unwrap(),
            wide.to_vec::<i64>().unwrap(),
        )
    };
    assert_eq!(g(&gm), g(&cm));
    cm.close();
    gm.close();
}
