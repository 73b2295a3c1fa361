//! Autograd and in-place updates on a GPU (feature `gpu`): gradients computed and
//! accumulated on the device match the CPU's, in-place ops write device arrays
//! (through views, with aliasing inputs), a few SGD steps on the device land where the
//! CPU's land, and scopes give device memory back.
//!
//! Needs an adapter (Mesa's "llvmpipe" stands in); without one the tests skip, unless
//! `NDSCOPE_REQUIRE_GPU=1`, which makes them fail (CI sets it).
#![cfg(feature = "gpu")]

use ndscope::{DType, Device, GradientCollector, NDArray, NDManager, NDScope, devices, memory_on};
use std::sync::Mutex;

/// GPU tests share one device's counters: they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn gpu() -> Option<Device> {
    let found = devices().into_iter().find(|d| d.device != Device::Cpu);
    match found {
        Some(d) => Some(d.device),
        None if std::env::var("NDSCOPE_REQUIRE_GPU").as_deref() == Ok("1") => {
            panic!("NDSCOPE_REQUIRE_GPU=1 but no GPU adapter was found")
        }
        None => {
            eprintln!("no GPU adapter: skipped");
            None
        }
    }
}

fn vals(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % 2001) as f32 / 500.0 - 2.0
        })
        .collect()
}

fn close(what: &str, got: NDArray, want: NDArray, rel: f32) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (g, w) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    for (i, (g, w)) in g.iter().zip(&w).enumerate() {
        assert!(
            (g - w).abs() <= rel * (1.0 + w.abs()),
            "{what}[{i}]: gpu {g}, cpu {w}"
        );
    }
}

#[test]
fn in_place_ops_write_device_arrays() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let (cm, gm) = (NDManager::new(), NDManager::new_on(d));
    let a = vals(24, 1);
    let b = vals(6, 2);
    let (ca, ga) = (cm.create(&a, [4, 6]), gm.create(&a, [4, 6]));
    let (cb, gb) = (cm.create(&b, [6]), gm.create(&b, [6]));
    for (x, y) in [(ca, cb), (ga, gb)] {
        x.try_addi(y).unwrap(); // broadcast row
        x.try_muli(0.5).unwrap(); // scalar
        x.get("1:4:2, ::-2").try_subi(3.0).unwrap(); // a stepped, reversed view
        x.try_addi(x).unwrap(); // an input that is the target: copied out first
        x.get("0").try_divi(x.get("3")).unwrap(); // views of one buffer
    }
    assert_eq!(ga.device(), d);
    close("in place", ga, ca, 1e-5);
    // Integers too, exactly.
    let ci = cm.arange(0.0, 12.0, 1.0, DType::I32).reshape([3, 4]);
    let gi = ci.to_device(d);
    for x in [ci, gi] {
        x.try_addi(x.get(":, 1:2")).unwrap();
        x.try_muli(3.0).unwrap();
    }
    assert_eq!(gi.to_vec::<i32>().unwrap(), ci.to_vec::<i32>().unwrap());
    // Devices do not mix in place either, and nothing is written.
    let e = ga.try_addi(cb).unwrap_err();
    assert!(matches!(e, ndscope::NdError::DeviceMismatch { .. }), "{e}");
    close("after refusal", ga, ca, 1e-5);
    gm.close();
    cm.close();
}

/// The gradients of `loss(params, data)` for the same values on the CPU and the GPU.
fn grads_match(
    what: &str,
    d: Device,
    params: &[(Vec<f32>, Vec<usize>)],
    data: &[(Vec<f32>, Vec<usize>)],
    loss: impl Fn(&[NDArray], &[NDArray]) -> NDArray,
) {
    let mut out = Vec::new();
    for dev in [Device::Cpu, d] {
        let m = NDManager::new_on(dev);
        let ps: Vec<NDArray> = params
            .iter()
            .map(|(v, s)| {
                let p = m.create(v, s.as_slice());
                p.set_requires_gradient(true);
                p
            })
            .collect();
        let xs: Vec<NDArray> = data
            .iter()
            .map(|(v, s)| m.create(v, s.as_slice()))
            .collect();
        // Twice, so the second pass also proves the gradients were zeroed on the device.
        for _ in 0..2 {
            let gc = GradientCollector::new();
            gc.backward(loss(&ps, &xs)).unwrap();
        }
        let gs: Vec<NDArray> = ps
            .iter()
            .map(|p| {
                assert_eq!(p.gradient().device(), dev, "{what}: gradient's device");
                p.gradient().to_device(Device::Cpu)
            })
            .collect();
        out.push((m, gs));
    }
    for (i, (c, g)) in out[0].1.iter().zip(&out[1].1).enumerate() {
        close(&format!("{what}: gradient {i}"), *g, *c, 1e-4);
    }
    for (m, _) in out {
        m.close();
    }
}

#[test]
fn linear_regression_gradients_match_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    grads_match(
        "linreg",
        d,
        &[(vals(2, 3), vec![2, 1]), (vec![0.5], vec![1])],
        &[(vals(40, 4), vec![20, 2]), (vals(20, 5), vec![20, 1])],
        |p, x| {
            let err = x[0].matmul(p[0]) + p[1] - x[1];
            (err * err).sum() / 20.0
        },
    );
}

#[test]
fn mlp_gradients_match_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    grads_match(
        "mlp",
        d,
        &[
            (vals(8 * 16, 6), vec![8, 16]),
            (vals(16, 7), vec![16]),
            (vals(16 * 3, 8), vec![16, 3]),
            (vals(3, 9), vec![3]),
        ],
        &[(vals(10 * 8, 10), vec![10, 8]), (vals(30, 11), vec![10, 3])],
        |p, x| {
            let h = (x[0].matmul(p[0]) + p[1]).sigmoid();
            let o = h.matmul(p[2]) + p[3];
            let e = (o - x[1]).tanh();
            (e * e).mean() + p[0].square().sum() * 0.01
        },
    );
}

/// A classifier's head: log-softmax and softmax over the classes (their gradients
/// from the output alone), and `where` (a ReLU written as a select, its gradient
/// through the condition's branches), all on the device.
#[test]
fn softmax_and_where_gradients_match_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    grads_match(
        "softmax head",
        d,
        &[(vals(6 * 5, 12), vec![6, 5]), (vals(5, 13), vec![5])],
        &[(vals(8 * 6, 14), vec![8, 6]), (vals(8 * 5, 15), vec![8, 5])],
        |p, x| {
            let h = x[0].matmul(p[0]) + p[1];
            let zero = h.manager().zeros([1], ndscope::DType::F32);
            let r = h.gt(0.0).where_(h, zero);
            let nll = -(r.log_softmax(1) * x[1].softmax(1)).sum() / 8.0;
            nll + (h.softmax(0) * x[1]).sum()
        },
    );
}

/// `cross_entropy`'s gradient on the device (from the softmax its kernel saved) against
/// the CPU's, through a linear layer, labels I32.
#[test]
fn cross_entropy_gradients_match_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let labels = [3i32, 0, 4, 4, 1, 2, 0, 3];
    let mut out = Vec::new();
    for dev in [Device::Cpu, d] {
        let m = NDManager::new_on(dev);
        let w = m.create(&vals(6 * 5, 16), [6, 5]);
        w.set_requires_gradient(true);
        let x = m.create(&vals(8 * 6, 17), [8, 6]);
        let y = m.create(&labels, [8]);
        for _ in 0..2 {
            let gc = GradientCollector::new();
            let loss = x.matmul(w).cross_entropy(y) * 3.0;
            gc.backward(loss).unwrap();
        }
        assert_eq!(w.gradient().device(), dev);
        out.push((m, w.gradient().to_device(Device::Cpu)));
    }
    close("cross_entropy gradient", out[1].1, out[0].1, 1e-4);
    for (m, _) in out {
        m.close();
    }
}

#[test]
fn a_parameter_moved_to_the_device_gets_its_gradient_there() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let m = NDManager::new();
    let p = m.create(&[1.0f32, 2.0], [2]).to_device(d);
    p.set_requires_gradient(true);
    assert_eq!(p.gradient().device(), d);
    {
        let gc = GradientCollector::new();
        gc.backward((p * p).sum()).unwrap();
    }
    assert_eq!(p.gradient().to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    // A lazy gradient (a scaled sum of ones) is added on the device as well.
    {
        let gc = GradientCollector::accumulating();
        gc.backward((p * 3.0).sum()).unwrap();
    }
    assert_eq!(p.gradient().to_vec::<f32>().unwrap(), vec![5.0, 7.0]);
    m.close();
}

#[test]
fn sgd_on_the_device_follows_the_cpu_and_scopes_free_its_intermediates() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let x = vals(64 * 3, 12);
    let y = vals(64, 13);
    let mut finals = Vec::new();
    for dev in [Device::Cpu, d] {
        let data = NDManager::new_on(dev);
        let params = NDManager::new_on(dev);
        let (xs, ys) = (data.create(&x, [64, 3]), data.create(&y, [64, 1]));
        let w = params.zeros([3, 1], DType::F32);
        let b = params.zeros([1], DType::F32);
        w.set_requires_gradient(true);
        b.set_requires_gradient(true);
        let base = memory_on(dev).live_bytes;
        for _ in 0..5 {
            let scope = NDScope::new();
            {
                let gc = GradientCollector::new();
                let err = xs.matmul(w) + b - ys;
                gc.backward((err * err).mean()).unwrap();
            }
            let mut w2 = w;
            let mut b2 = b;
            w2 -= w.gradient() * 0.1;
            b2 -= b.gradient() * 0.1;
            drop(scope);
            // Every intermediate of the step is gone: exactly the baseline is live.
            assert_eq!(
                memory_on(dev).live_bytes,
                base,
                "{dev}: live bytes after a step"
            );
        }
        finals.push((w.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap()));
        params.close();
        data.close();
    }
    let m = NDManager::new();
    for (what, k) in [("w after 5 steps", 0), ("b after 5 steps", 1)] {
        let pick = |f: &(Vec<f32>, Vec<f32>)| if k == 0 { f.0.clone() } else { f.1.clone() };
        let (g, c) = (pick(&finals[1]), pick(&finals[0]));
        let n = g.len();
        close(what, m.create(&g, [n]), m.create(&c, [n]), 1e-4);
    }
    m.close();
}

#[test]
fn a_closed_device_array_says_where_it_lived() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let gm = NDManager::new_on(d);
    let (a, v) = {
        let _scope = NDScope::new();
        let a = gm.zeros([4], DType::F32);
        (a, a.get("1:3")) // a view shares the buffer
    };
    for x in [a, v] {
        let e = x.try_add(1.0).unwrap_err();
        let ndscope::NdError::Closed(info) = &e else {
            panic!("expected Closed, got {e}")
        };
        assert_eq!(info.device, d);
        assert!(
            e.to_string().contains(&format!(" on {d} was closed")),
            "{e}"
        );
    }
    // A host array's message stays as it was: no device named.
    let cm = NDManager::new();
    let c = cm.zeros([2], DType::F32);
    c.close();
    let e = c.try_add(1.0).unwrap_err();
    assert!(!e.to_string().contains(" on cpu"), "{e}");
    cm.close();
    gm.close();
}

/// Sgd (plain, momentum with dampening, Nesterov with weight decay), Adam and AdamW
/// step parameters on the device as on the CPU: each update is one fused kernel per
/// array on the parameter's device (their state lives there too). A steady step
/// allocates no device memory: the live buffers and the pool's cached bytes are the
/// same after it as before.
#[test]
fn optimizers_step_on_the_device_as_on_the_cpu() {
    use ndscope::optim::{Adam, AdamConfig, AdamW, Optimizer, Sgd, SgdConfig};
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    type Make = fn(&NDManager, &[NDArray]) -> Box<dyn Optimizer>;
    let makers: [(&str, Make); 5] = [
        ("sgd", |m, p| {
            Box::new(Sgd::new(
                m,
                p,
                SgdConfig {
                    lr: 0.1,
                    ..SgdConfig::default()
                },
            ))
        }),
        ("sgd momentum", |m, p| {
            let c = SgdConfig {
                lr: 0.05,
                momentum: 0.9,
                dampening: 0.1,
                ..SgdConfig::default()
            };
            Box::new(Sgd::new(m, p, c))
        }),
        ("sgd nesterov decay", |m, p| {
            let c = SgdConfig {
                lr: 0.05,
                momentum: 0.8,
                nesterov: true,
                weight_decay: 0.01,
                ..SgdConfig::default()
            };
            Box::new(Sgd::new(m, p, c))
        }),
        ("adam", |m, p| {
            let c = AdamConfig {
                lr: 0.01,
                weight_decay: 0.02,
                ..AdamConfig::default()
            };
            Box::new(Adam::new(m, p, c))
        }),
        ("adamw", |m, p| {
            Box::new(AdamW::new(m, p, AdamConfig::adamw()))
        }),
    ];
    let (x, y) = (vals(32 * 5, 31), vals(32 * 2, 32));
    let (w0, b0) = (vals(5 * 2, 33), vals(2, 34));
    for (what, make) in makers {
        let mut finals = Vec::new();
        for dev in [Device::Cpu, d] {
            let m = NDManager::new_on(dev);
            let (xs, ys) = (m.create(&x, [32, 5]), m.create(&y, [32, 2]));
            let (w, b) = (m.create(&w0, [5, 2]), m.create(&b0, [2]));
            w.set_requires_gradient(true);
            b.set_requires_gradient(true);
            let mut opt = make(&m, &[w, b]);
            for step in 0..4 {
                let _scope = NDScope::new();
                {
                    let gc = GradientCollector::new();
                    let err = xs.matmul(w) + b - ys;
                    gc.backward((err * err).mean()).unwrap();
                }
                let before = memory_on(dev);
                opt.try_step().unwrap();
                if dev == d && step > 0 {
                    let after = memory_on(dev);
                    assert_eq!(
                        after.live_buffers, before.live_buffers,
                        "{what}: live buffers"
                    );
                    assert_eq!(
                        after.cached_bytes, before.cached_bytes,
                        "{what}: cached bytes"
                    );
                }
            }
            assert_eq!(w.device(), dev);
            finals.push((w.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap()));
            m.close();
        }
        let m = NDManager::new();
        let (c, g) = (&finals[0], &finals[1]);
        close(
            &format!("{what}: w"),
            m.create(&g.0, [10]),
            m.create(&c.0, [10]),
            1e-5,
        );
        close(
            &format!("{what}: b"),
            m.create(&g.1, [2]),
            m.create(&c.1, [2]),
            1e-5,
        );
        // And the steps moved the parameters.
        assert!(
            c.0.iter().zip(&w0).any(|(a, b)| (a - b).abs() > 1e-3),
            "{what}"
        );
        m.close();
    }
}

/// A small deterministic generator for geometries.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// `conv2d` on the device against the CPU over random geometries (groups, stride,
/// padding, dilation, with and without bias, a transposed input), forward and the
/// gradients of the input, the weight and the bias; the geometries the CPU refuses
/// get the same error on the device, with nothing left allocated there. The cases of
/// issue 29 (kernel columns that only ever land in the padding) are among them.
#[test]
fn conv2d_matches_the_cpu_forward_and_backward() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let base = memory_on(d).live_bytes;
    let mut r = Lcg(29);
    // (x shape, w shape, stride, padding, dilation, groups)
    type Case = (
        [usize; 4],
        [usize; 4],
        [usize; 2],
        [usize; 2],
        [usize; 2],
        usize,
    );
    let mut cases: Vec<Case> = vec![
        ([1, 1, 1, 1], [1, 1, 1, 3], [1, 1], [0, 2], [1, 2], 1),
        ([1, 1, 3, 1], [1, 1, 2, 3], [2, 1], [1, 2], [2, 2], 1),
        ([2, 4, 6, 5], [6, 2, 3, 3], [1, 1], [1, 1], [1, 1], 2),
        ([1, 2, 2, 2], [1, 2, 3, 3], [1, 1], [0, 0], [1, 1], 1), // window too large
    ];
    for _ in 0..24 {
        let groups = 1 + r.below(2);
        let (c, o) = (groups * (1 + r.below(3)), groups * (1 + r.below(3)));
        cases.push((
            [1 + r.below(3), c, 1 + r.below(7), 1 + r.below(7)],
            [o, c / groups, 1 + r.below(3), 1 + r.below(3)],
            [1 + r.below(3), 1 + r.below(3)],
            [r.below(3), r.below(3)],
            [1 + r.below(3), 1 + r.below(2)],
            groups,
        ));
    }
    let (mut ran, mut refused) = (0, 0);
    for (k, &(xs, ws, stride, padding, dilation, groups)) in cases.iter().enumerate() {
        let what = format!(
            "case {k}: x {xs:?} w {ws:?} s {stride:?} p {padding:?} d {dilation:?} g {groups}"
        );
        let bias = k % 2 == 0;
        let nx: usize = xs.iter().product();
        let nw: usize = ws.iter().product();
        let (vx, vw, vb) = (
            vals(nx, 100 + k as u64),
            vals(nw, 200 + k as u64),
            vals(ws[0], 300 + k as u64),
        );
        let mut got = Vec::new();
        for dev in [Device::Cpu, d] {
            let m = NDManager::new_on(dev);
            // Odd cases read the input through a transposed view.
            let x = if k % 2 == 1 {
                m.create(&vx, [xs[0], xs[1], xs[3], xs[2]]).swap_axes(2, 3)
            } else {
                m.create(&vx, xs)
            };
            let w = m.create(&vw, ws);
            let b = m.create(&vb, [ws[0]]);
            for p in [x, w, b] {
                p.set_requires_gradient(true);
            }
            let gc = GradientCollector::new();
            let y = x.try_conv2d(w, bias.then_some(b), stride, padding, dilation, groups);
            let y = match y {
                Ok(y) => y,
                Err(e) => {
                    got.push(Err(e.to_string()));
                    drop(gc);
                    m.close();
                    continue;
                }
            };
            // A gradient that is not all ones, read through a broadcast.
            let wt = m.create(
                &vals(y.shape().dims()[3], 400 + k as u64),
                [y.shape().dims()[3]],
            );
            gc.backward((y * wt).sum()).unwrap();
            let to_cpu = |a: NDArray| a.to_device(Device::Cpu);
            let mut outs = vec![to_cpu(y), to_cpu(x.gradient()), to_cpu(w.gradient())];
            if bias {
                outs.push(to_cpu(b.gradient()));
            }
            assert_eq!(y.device(), dev, "{what}");
            got.push(Ok((m, outs)));
        }
        match (&got[0], &got[1]) {
            (Ok((_, c)), Ok((_, g))) => {
                ran += 1;
                for (i, (g, c)) in g.iter().zip(c).enumerate() {
                    close(&format!("{what}: output {i}"), *g, *c, 1e-4);
                }
            }
            (Err(c), Err(g)) => {
                refused += 1;
                assert_eq!(g, c, "{what}: the same error");
            }
            _ => panic!("{what}: the CPU and the GPU disagree on success"),
        }
        for (m, _) in got.into_iter().flatten() {
            m.close();
        }
    }
    assert!(ran >= 20 && refused >= 1, "{ran} ran, {refused} refused");
    assert_eq!(memory_on(d).live_bytes, base, "nothing left on the device");
}

/// Max and average pooling on the device against the CPU: 4-D and 3-D inputs, ties,
/// NaN and -inf (forward), a transposed input, random kernel, stride and padding;
/// gradients from a loss that weighs each output differently.
#[test]
fn pooling_matches_the_cpu_forward_and_backward() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let base = memory_on(d).live_bytes;
    let mut r = Lcg(7);
    for k in 0..24 {
        let kernel = [1 + r.below(3), 1 + r.below(3)];
        let stride = [1 + r.below(3), 1 + r.below(3)];
        let padding = [r.below(kernel[0] / 2 + 1), r.below(kernel[1] / 2 + 1)];
        let dims: Vec<usize> = if k % 3 == 2 {
            vec![2, 3 + r.below(5), 3 + r.below(5)]
        } else {
            vec![1 + r.below(2), 2, 3 + r.below(5), 3 + r.below(5)]
        };
        let n: usize = dims.iter().product();
        // Halves: many ties.
        let mut v: Vec<f32> = vals(n, 500 + k)
            .iter()
            .map(|x| (x * 2.0).round() / 2.0)
            .collect();
        let special = k % 4 == 3;
        if special {
            v[n / 3] = f32::NAN;
            v[n / 2] = f32::NEG_INFINITY;
        }
        for max in [true, false] {
            let what =
                format!("case {k} max {max}: {dims:?} k {kernel:?} s {stride:?} p {padding:?}");
            let mut got = Vec::new();
            for dev in [Device::Cpu, d] {
                let m = NDManager::new_on(dev);
                let x = if k % 2 == 1 {
                    let mut t = dims.clone();
                    let nd = t.len();
                    t.swap(nd - 1, nd - 2);
                    m.create(&v, t.as_slice()).swap_axes(-1, -2)
                } else {
                    m.create(&v, dims.as_slice())
                };
                x.set_requires_gradient(true);
                let gc = GradientCollector::new();
                let y = if max {
                    x.max_pool2d(kernel, stride, padding)
                } else {
                    x.avg_pool2d(kernel, stride, padding)
                };
                let last = *y.shape().dims().last().unwrap();
                let wt = m.create(&vals(last, 600 + k), [last]);
                let mut outs = vec![y.to_device(Device::Cpu)];
                if !special {
                    gc.backward((y * wt).sum()).unwrap();
                    outs.push(x.gradient().to_device(Device::Cpu));
                }
                got.push((m, outs));
            }
            for (i, (g, c)) in got[1].1.iter().zip(&got[0].1).enumerate() {
                let (g, c) = (g.to_vec::<f32>().unwrap(), c.to_vec::<f32>().unwrap());
                assert_eq!(g.len(), c.len(), "{what}: output {i}");
                for (j, (g, c)) in g.iter().zip(&c).enumerate() {
                    let same = g == c
                        || (g.is_nan() && c.is_nan())
                        || (g - c).abs() <= 1e-6 * (1.0 + c.abs());
                    assert!(same, "{what}: output {i}[{j}]: gpu {g}, cpu {c}");
                }
            }
            for (m, _) in got {
                m.close();
            }
        }
    }
    assert_eq!(memory_on(d).live_bytes, base, "nothing left on the device");
}

/// A small CNN (conv2d, ReLU, max-pool, flatten, linear) in a sub-manager of `m`.
fn small_cnn(m: &NDManager) -> ndscope::nn::Sequential {
    use ndscope::nn::{Conv2d, Flatten, Linear, MaxPool2d, Relu, Sequential};
    Sequential::new(m)
        .add_with(|mm| Conv2d::builder(1, 4, 3).padding(1).build(mm))
        .add(Relu::new())
        .add(MaxPool2d::new(2))
        .add(Flatten::new())
        .add_with(|mm| Linear::new(mm, 4 * 3 * 3, 5))
}

/// One Adam step of `model` on a batch of `x`, `y` (uploaded to `dev`), in a scope.
fn adam_step(
    model: &ndscope::nn::Sequential,
    opt: &mut ndscope::optim::Adam,
    x: NDArray,
    y: NDArray,
    dev: Device,
) {
    use ndscope::nn::Module;
    use ndscope::optim::Optimizer;
    let _s = NDScope::new();
    let gc = GradientCollector::new();
    let loss = model
        .forward(x.to_device(dev))
        .cross_entropy(y.to_device(dev));
    gc.backward(loss).unwrap();
    drop(gc);
    opt.step();
}

/// `Module::to_device` moves a trained model's parameters (same handles, same
/// sub-managers) and `Optimizer::to_device` its state; training goes on there as on
/// the CPU. Checkpoints cross devices both ways with the same predictions, a parameter
/// a view shares is refused with nothing moved, and device memory returns to its
/// baseline once the model is closed.
#[test]
fn a_model_and_its_optimizer_move_and_checkpoints_cross_devices() {
    use ndscope::nn::{self, Module};
    use ndscope::optim::{Adam, AdamConfig, Optimizer};
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let base = memory_on(d).live_bytes;
    let dir = std::env::temp_dir();
    let (ckpt_cpu, ckpt_gpu) = (
        dir.join(format!(
            "ndscope-move-cpu-{}.safetensors",
            std::process::id()
        )),
        dir.join(format!(
            "ndscope-move-gpu-{}.safetensors",
            std::process::id()
        )),
    );
    let m = NDManager::new();
    let x = m.create(&vals(6 * 36, 40), [6, 1, 6, 6]);
    let y = m.create(&[0i64, 3, 1, 4, 2, 0], [6]);
    ndscope::random::seed(3);
    let model = small_cnn(&m);
    let mut opt = Adam::new(&m, &model.parameters(), AdamConfig::default());
    for _ in 0..2 {
        adam_step(&model, &mut opt, x, y, Device::Cpu);
    }
    nn::save_with_optimizer(&ckpt_cpu, &model, &opt);
    let params = model.parameters();
    let arrays = model.manager().memory().live_arrays;

    // Move: the same handles, now on the device, in the same sub-managers.
    model.to_device(d);
    opt.to_device(d);
    assert_eq!(model.parameters(), params, "the same handles");
    for p in model.parameters() {
        assert_eq!(p.device(), d);
        assert_eq!(p.gradient().device(), d, "the gradient moved with it");
    }
    for (_, s) in opt.named_state() {
        assert_eq!(s.device(), d);
    }
    assert_eq!(model.manager().memory().live_arrays, arrays);

    // A twin on the CPU from the checkpoint: one more step on each lands in one place.
    let twin = small_cnn(&m);
    let mut twin_opt = Adam::new(&m, &twin.parameters(), AdamConfig::default());
    nn::load_with_optimizer(&ckpt_cpu, &twin, &mut twin_opt);
    adam_step(&model, &mut opt, x, y, d);
    adam_step(&twin, &mut twin_opt, x, y, Device::Cpu);
    let (gp, cp) = (model.parameters(), twin.parameters());
    for (i, (g, c)) in gp.iter().zip(&cp).enumerate() {
        close(
            &format!("parameter {i} after a step on each"),
            g.to_device(Device::Cpu),
            *c,
            1e-4,
        );
    }

    // A GPU model's checkpoint loads into a CPU model, and a CPU one into a GPU model,
    // with the same predictions.
    nn::save(&ckpt_gpu, &model);
    let on_cpu = small_cnn(&m);
    nn::load(&ckpt_gpu, &on_cpu);
    let gm = NDManager::new_on(d);
    let on_gpu = small_cnn(&gm);
    nn::save(&ckpt_cpu, &twin);
    nn::load(&ckpt_cpu, &on_gpu);
    ndscope::scope(|| {
        let xg = x.to_device(d);
        close(
            "gpu -> cpu checkpoint",
            on_cpu.forward(x),
            model.forward(xg).to_device(Device::Cpu),
            1e-6,
        );
        close(
            "cpu -> gpu checkpoint",
            on_gpu.forward(xg).to_device(Device::Cpu),
            twin.forward(x),
            1e-6,
        );
    });

    // A parameter that a view shares cannot move (the view would stay behind).
    let p = model.parameters()[0];
    let _view = p.get("0");
    let e = p.try_move_to_device(Device::Cpu).unwrap_err();
    assert!(
        matches!(e, ndscope::NdError::InvalidArgument { .. }) && e.to_string().contains("view"),
        "{e}"
    );
    assert_eq!(p.device(), d, "nothing moved");

    for f in [&ckpt_cpu, &ckpt_gpu] {
        std::fs::remove_file(f).unwrap();
    }
    gm.close();
    m.close();
    assert_eq!(
        memory_on(d).live_bytes,
        base,
        "device memory back at its baseline"
    );
}

/// `var`, `std`, `logsumexp` and `norm` on the device against the CPU: over one axis,
/// several, all, with kept dims, through a transposed view; their gradients; and the
/// special lanes (constant, -inf, inf, NaN, empty) forward.
#[test]
fn statistics_match_the_cpu_forward_and_backward() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let base = memory_on(d).live_bytes;
    grads_match(
        "statistics",
        d,
        &[(vals(4 * 5 * 3, 70), vec![4, 5, 3])],
        &[],
        |p, _| {
            let x = p[0];
            let t = x.swap_axes(0, 2); // [3, 5, 4], read through strides
            x.var_axes(&[1], false).sum()
                + t.std_axes(&[0, 2], true).sum() * 2.0
                + x.logsumexp_axes(&[2], false).sum()
                + t.logsumexp().sum() * 0.5
                + x.norm() * 3.0
                + x.var().sum()
        },
    );
    // Special lanes, forward: the device gives what the CPU gives.
    let inf = f32::INFINITY;
    let rows: [[f32; 4]; 6] = [
        [1.0, 1.0, 1.0, 1.0],
        [-inf, -inf, -inf, -inf],
        [inf, 1.0, 2.0, 3.0],
        [f32::NAN, 1.0, 2.0, 3.0],
        [1e30, -1e30, 3e29, 0.0],
        [0.0, 0.0, 0.0, 0.0],
    ];
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    let (cm, gm) = (NDManager::new(), NDManager::new_on(d));
    let (c, g) = (cm.create(&flat, [6, 4]), gm.create(&flat, [6, 4]));
    // Each statistic's values, read back.
    type Stat = fn(NDArray) -> Vec<f32>;
    let stats: [(&str, Stat); 5] = [
        ("var", |x| x.var_axes(&[1], false).to_vec().unwrap()),
        ("std", |x| x.std_axes(&[1], true).to_vec().unwrap()),
        ("logsumexp", |x| {
            x.logsumexp_axes(&[1], false).to_vec().unwrap()
        }),
        ("norm of each row", |x| {
            (0..6)
                .map(|i| x.get(&i.to_string()).norm().to_scalar::<f32>().unwrap())
                .collect()
        }),
        ("empty lanes", |x| {
            x.get(":, 0:0")
                .logsumexp_axes(&[1], false)
                .to_vec()
                .unwrap()
        }),
    ];
    for (what, f) in stats {
        let (want, got) = (f(c), f(g));
        assert_eq!(want.len(), got.len(), "{what}");
        for (i, (w, v)) in want.iter().zip(&got).enumerate() {
            let same =
                w == v || (w.is_nan() && v.is_nan()) || (w - v).abs() <= 1e-5 * (1.0 + w.abs());
            assert!(same, "{what}[{i}]: gpu {v}, cpu {w}");
        }
    }
    // F64 (where the adapter holds it): var, std and norm; logsumexp is F32 on a GPU.
    if devices()
        .iter()
        .any(|i| i.device == d && i.dtypes.contains(&DType::F64))
    {
        let v: Vec<f64> = vals(12, 71).iter().map(|&x| x as f64 * 1e200).collect();
        let (c, g) = (cm.create(&v, [3, 4]), gm.create(&v, [3, 4]));
        let (w, x) = (
            c.norm().to_scalar::<f64>().unwrap(),
            g.norm().to_scalar::<f64>().unwrap(),
        );
        assert!((w - x).abs() <= 1e-12 * w, "f64 norm: gpu {x}, cpu {w}");
        let (w, x) = (
            c.std().to_scalar::<f64>().unwrap(),
            g.std().to_scalar::<f64>().unwrap(),
        );
        assert!((w - x).abs() <= 1e-12 * w, "f64 std: gpu {x}, cpu {w}");
        let e = g.try_logsumexp().unwrap_err();
        assert!(matches!(e, ndscope::NdError::Unsupported { .. }), "{e}");
    }
    cm.close();
    gm.close();
    assert_eq!(memory_on(d).live_bytes, base);
}

/// Dropout and `masked_fill` on the device: dropout's mask is drawn on the host, so a
/// seed gives the CPU's result and gradient exactly; `masked_fill` with a broadcast
/// mask, its gradient, and its refusals (a mask that is not Bool, one that does not
/// broadcast) with the CPU's messages and nothing left on the device.
#[test]
fn dropout_and_masked_fill_match_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let base = memory_on(d).live_bytes;
    let mut out = Vec::new();
    for dev in [Device::Cpu, d] {
        let m = NDManager::new_on(dev);
        let x = m.create(&vals(6 * 7, 80), [6, 7]);
        x.set_requires_gradient(true);
        let mask = m.create(&[true, false, false, true, false, true, true], [7]);
        ndscope::random::seed(5);
        let gc = GradientCollector::new();
        let y = x.dropout(0.3, true) * 2.0 + x.masked_fill(mask, -5.0) * x;
        gc.backward(y.sum()).unwrap();
        drop(gc);
        let (y, g) = (
            y.to_device(Device::Cpu),
            x.gradient().to_device(Device::Cpu),
        );
        let errors: Vec<String> = [
            x.try_masked_fill(m.create(&[1.0f32; 7], [7]), 0.0),
            x.try_masked_fill(m.create(&[true; 6], [6]), 0.0),
        ]
        .into_iter()
        .map(|r| r.unwrap_err().to_string())
        .collect();
        out.push((m, y, g, errors));
    }
    close("dropout + masked_fill", out[1].1, out[0].1, 1e-6);
    close("their gradient", out[1].2, out[0].2, 1e-6);
    for (c, g) in out[0].3.iter().zip(&out[1].3) {
        // The same error, the device named where the CPU's says cpu (array ids differ).
        let no_ids = |s: &str| {
            let mut out = String::new();
            let mut skip = false;
            for ch in s.chars() {
                skip = (skip && ch.is_ascii_digit()) || ch == '#';
                if !skip || ch == '#' {
                    out.push(ch);
                }
            }
            out
        };
        assert_eq!(no_ids(&g.replace(&d.to_string(), "cpu")), no_ids(c));
    }
    for (m, ..) in out {
        m.close();
    }
    assert_eq!(memory_on(d).live_bytes, base);
}

/// The rules whose gradient makes constants (std's and norm's zero guards, logsumexp,
/// prod, clip, get, masked_fill, dropout) make them beside the data: an array moved to
/// the device keeps its CPU manager, and its gradients still run on the device and
/// match the CPU's. Also `prod` (with zeros, and integers that wrap) and `clip` (with
/// NaN, and integer bounds) forward on the device.
#[test]
fn rule_constants_follow_a_moved_array_to_its_device() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let base = memory_on(d).live_bytes;
    let mut v = vals(4 * 6, 90);
    v[7] = 0.0; // prod's gradient at a zero
    let mut out = Vec::new();
    for dev in [Device::Cpu, d] {
        let m = NDManager::new(); // on the CPU, whatever `dev`
        let x = m.create(&v, [4, 6]);
        x.move_to_device(dev);
        x.set_requires_gradient(true);
        let mask = m.create(&[false, true, false, false, true, false], [6]);
        mask.move_to_device(dev);
        ndscope::random::seed(9);
        let gc = GradientCollector::new();
        let y = x.std_axes(&[1], false).sum()
            + x.norm()
            + x.logsumexp_axes(&[0], false).sum()
            + x.prod_axes(&[1], false).sum()
            + x.clip(-0.5, 0.7).sum()
            + x.get("1:3, ::2").sum() * 3.0
            + (x.masked_fill(mask, 2.0) * x).sum()
            + x.dropout(0.5, true).sum();
        gc.backward(y).unwrap();
        drop(gc);
        assert_eq!(x.gradient().device(), dev);
        let g = x.gradient().to_device(Device::Cpu);
        out.push((m, g));
    }
    close("gradient of a moved array", out[1].1, out[0].1, 1e-4);
    for (m, _) in out {
        m.close();
    }
    // prod and clip forward, exactly where the arithmetic is exact.
    let (cm, gm) = (NDManager::new(), NDManager::new_on(d));
    let ints: Vec<i32> = (0..12).map(|i| i * 7919 - 40_000).collect();
    let bytes: Vec<u8> = (0..12).map(|i| (i * 37 + 3) as u8).collect();
    let floats = [1.5f32, -2.0, f32::NAN, 0.25, 3.0, -0.0];
    for (c, g) in [
        (cm.create(&ints, [3, 4]), gm.create(&ints, [3, 4])),
        (cm.create(&bytes, [3, 4]), gm.create(&bytes, [3, 4])),
    ] {
        for f in [
            |a: NDArray| a.prod_axes(&[1], false),
            |a: NDArray| a.prod(),
            |a: NDArray| a.clip(-30_000.5, 100.7),
        ] {
            let (want, got) = (
                f(c).to_dtype(DType::I64),
                f(g).to_device(Device::Cpu).to_dtype(DType::I64),
            );
            assert_eq!(
                got.to_vec::<i64>().unwrap(),
                want.to_vec::<i64>().unwrap(),
                "{}",
                c.dtype()
            );
        }
    }
    let (c, g) = (cm.create(&floats, [6]), gm.create(&floats, [6]));
    let (want, got) = (
        c.clip(-1.0, 2.0).to_vec::<f32>().unwrap(),
        g.clip(-1.0, 2.0).to_vec::<f32>().unwrap(),
    );
    for (w, x) in want.iter().zip(&got) {
        assert!(
            w == x || (w.is_nan() && x.is_nan()),
            "clip: gpu {x}, cpu {w}"
        );
    }
    assert!(
        g.prod().to_scalar::<f32>().unwrap().is_nan(),
        "NaN propagates"
    );
    cm.close();
    gm.close();
    assert_eq!(memory_on(d).live_bytes, base);
}

/// `cumsum` on the device: along each axis, through a transposed view, integers that
/// wrap (U8 modulo 256), and its gradient (the sum in the other direction).
#[test]
fn cumsum_matches_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    grads_match(
        "cumsum",
        d,
        &[(vals(3 * 4 * 5, 95), vec![3, 4, 5])],
        &[(vals(3 * 4 * 5, 96), vec![3, 4, 5])],
        |p, w| {
            let t = p[0].swap_axes(0, 2);
            // (The gradient is the reverse cumulative sum, on the device too.)
            (p[0].cumsum(1) * w[0]).sum()
                + (p[0].cumsum(-1) * w[0]).sum()
                + (t.cumsum(0) * w[0].swap_axes(0, 2)).sum()
        },
    );
    let (cm, gm) = (NDManager::new(), NDManager::new_on(d));
    let bytes: Vec<u8> = (0..24).map(|i| (i * 53 + 7) as u8).collect();
    let ints: Vec<i32> = (0..24).map(|i: i32| i.wrapping_mul(400_000_000)).collect();
    for (c, g) in [
        (cm.create(&bytes, [4, 6]), gm.create(&bytes, [4, 6])),
        (cm.create(&ints, [4, 6]), gm.create(&ints, [4, 6])),
    ] {
        for axis in [0, 1, -2] {
            let f = |a: NDArray| {
                let y = a.cumsum(axis).to_dtype(DType::I64);
                y.to_device(Device::Cpu).to_vec::<i64>().unwrap()
            };
            assert_eq!(f(g), f(c), "{} axis {axis}", c.dtype());
            let (gt, ct) = (g.transpose().cumsum(axis), c.transpose().cumsum(axis));
            assert_eq!(f(gt), f(ct), "{} transposed, axis {axis}", c.dtype());
        }
    }
    cm.close();
    gm.close();
}

/// `tril` and `triu` on the device: offsets inside, at and beyond the matrix, batches
/// of matrices, a transposed view, integers, and the gradient (the same triangle).
#[test]
fn tril_and_triu_match_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    grads_match(
        "tril/triu",
        d,
        &[(vals(2 * 3 * 4, 97), vec![2, 3, 4])],
        &[(vals(2 * 3 * 4, 98), vec![2, 3, 4])],
        |p, w| {
            (p[0].tril(0) * w[0]).sum()
                + (p[0].triu(1) * w[0]).sum()
                + (p[0].swap_axes(1, 2).tril(-1) * w[0].swap_axes(1, 2)).sum()
        },
    );
    let (cm, gm) = (NDManager::new(), NDManager::new_on(d));
    let ints: Vec<i32> = (1..=20).collect();
    let (c, g) = (cm.create(&ints, [4, 5]), gm.create(&ints, [4, 5]));
    for k in [-5i64, -1, 0, 2, 4, 99, i64::MIN, i64::MAX] {
        for lower in [true, false] {
            let f = |a: NDArray| if lower { a.tril(k) } else { a.triu(k) };
            assert_eq!(
                f(g).to_vec::<i32>().unwrap(),
                f(c).to_vec::<i32>().unwrap(),
                "k {k} lower {lower}"
            );
        }
    }
    cm.close();
    gm.close();
}

/// The ops that move elements by index or copy them into a new layout, on the device:
/// `index_select`, `gather`, `scatter_add`, `take`, `boolean_mask`, `embedding`,
/// `repeat`, `tile`, `pad`, `concat`, `stack` and `broadcast_to`, forward and every
/// gradient (the scatters among them: repeated indices add up in the CPU's order), over
/// transposed and stepped views, with device index arrays of three dtypes.
#[test]
fn indexing_and_copies_match_the_cpu_forward_and_backward() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let base = memory_on(d).live_bytes;
    grads_match(
        "indexing",
        d,
        &[
            (vals(4 * 5, 110), vec![4, 5]),
            (vals(6 * 3, 111), vec![6, 3]),
        ],
        &[
            (vals(4 * 5, 112), vec![4, 5]),
            (vals(8 * 7, 113), vec![8, 7]),
        ],
        |p, w| {
            let (x, t, m) = (p[0], p[1], p[0].manager());
            let ids = m.create(&[3i64, 0, 3, 1], [4]);
            let rows = m.create(&[2u8, 5, 2, 2, 0, 1], [2, 3]);
            let cols = m.create(&[4i32, 0, 1, 1, 2, 2, 3, 0], [4, 2]);
            let flat = m.create(&[19i64, 0, 19, 7], [2, 2]);
            let mask = m.create(&[true, false, true, true], [4]);
            let xt = x.transpose(); // [5, 4] through strides
            let sq = |a: NDArray| (a * a).sum();
            (x.index_select(0, ids) * w[0]).sum()
                + sq(xt.index_select(1, ids))
                + sq(x
                    .get("::-1, ::2")
                    .index_select(1, m.create(&[2i32, 2], [2])))
                + sq(x.gather(1, cols))
                + sq(x.scatter_add(1, cols, x.get(":, 1:3") * 3.0))
                + sq(x.take(flat))
                + sq(xt.take(flat))
                + sq(x.boolean_mask(mask))
                + sq(t.embedding(rows))
                + sq(t.get("::2").embedding(ids.get("1:2")))
                + sq(x.repeat(2, 1))
                + sq(xt.repeat(3, 0))
                + (x.tile(&[2, 1, 1]).sum_axes(&[0], false) * w[0]).sum()
                + sq(xt.pad(&[(1, 0), (0, 2)], 0.5))
                + (NDArray::concat(&[x, x * 2.0, xt.transpose()], 1).pad(&[(2, 2), (0, 0)], 0.0)
                    * w[1].tile(&[1, 3]).get(":, 0:15"))
                .sum()
                + sq(NDArray::stack(&[x, x.get("::-1")], 1))
                + sq(t.get("0").broadcast_to([4, 3]))
        },
    );
    // Integer, U8 and Bool arrays are copied exactly.
    let (cm, gm) = (NDManager::new(), NDManager::new_on(d));
    let ints: Vec<i32> = (0..12).map(|i: i32| i.wrapping_mul(700_000_001)).collect();
    let bytes: Vec<u8> = (0..12).map(|i| (i * 37 + 3) as u8).collect();
    let bools: Vec<bool> = (0..12).map(|i| i % 3 == 1).collect();
    let pairs = [
        (cm.create(&ints, [3, 4]), gm.create(&ints, [3, 4])),
        (cm.create(&bytes, [3, 4]), gm.create(&bytes, [3, 4])),
        (cm.create(&bools, [3, 4]), gm.create(&bools, [3, 4])),
    ];
    for (c, g) in pairs {
        let f = |a: NDArray| {
            let m = a.manager();
            let ix = m.create(&[2i64, 0, 2], [3]);
            let parts = [
                a.index_select(1, ix),
                a.take(ix),
                a.gather(0, m.create(&[2i64, 1, 0, 0], [1, 4])),
                a.boolean_mask(m.create(&[true, false, true], [3])),
                a.repeat(2, 0).transpose(),
                a.tile(&[2, 2]),
                a.pad(&[(1, 1), (0, 1)], 1.0),
                NDArray::concat(&[a, a.get("::-1")], 0),
                NDArray::stack(&[a, a], 0),
                a.get("0").broadcast_to([2, 4]),
            ];
            parts
                .iter()
                .map(|p| {
                    let v = p.to_dtype(DType::I64).to_device(Device::Cpu);
                    (p.shape(), v.to_vec::<i64>().unwrap())
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(f(g), f(c), "{}", c.dtype());
        if c.dtype() != DType::Bool {
            let add = |a: NDArray| {
                let m = a.manager();
                let ix = m.create(&[1i64, 1, 1, 0], [1, 4]);
                let v = a.scatter_add(0, ix, a.get("0:1") * 200);
                v.to_dtype(DType::I64)
                    .to_device(Device::Cpu)
                    .to_vec::<i64>()
                    .unwrap()
            };
            assert_eq!(add(g), add(c), "scatter_add {}", c.dtype());
        }
    }
    cm.close();
    gm.close();
    assert_eq!(memory_on(d).live_bytes, base);
}

/// An error's message without the arrays' identities (`#id` and where each was
/// created), which differ between the CPU's arrays and the device's.
fn gist(e: &ndscope::NdError) -> String {
    let (mut out, mut rest) = (String::new(), e.to_string());
    while let Some(i) = rest.find(" (created at ") {
        out += &rest[..i];
        let j = rest[i..].find(')').map_or(rest.len(), |j| i + j + 1);
        rest = rest[j..].to_string();
    }
    out += &rest;
    out.split(' ')
        .filter(|w| !(w.starts_with('#') && w[1..].chars().all(|c| c.is_ascii_digit())))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Hostile index arrays and masks on the device get the CPU's typed errors, word for
/// word but the arrays' identities, and leave nothing allocated on either side.
#[test]
fn bad_indices_on_the_device_are_refused_as_on_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let (cm, gm) = (NDManager::new(), NDManager::new_on(d));
    let x = vals(12, 120);
    let (c, g) = (cm.create(&x, [3, 4]), gm.create(&x, [3, 4]));
    type Bad = fn(NDArray) -> ndscope::NdError;
    let cases: [(&str, Bad); 12] = [
        ("index past the axis", |a| {
            let ix = a.manager().create(&[0i64, 4], [2]);
            a.try_index_select(1, ix).unwrap_err()
        }),
        ("negative index", |a| {
            let ix = a.manager().create(&[-1i32], [1]);
            a.try_index_select(0, ix).unwrap_err()
        }),
        ("float indices", |a| {
            let ix = a.manager().create(&[0.0f32], [1]);
            a.try_take(ix).unwrap_err()
        }),
        ("take past the end", |a| {
            let ix = a.manager().create(&[12i64], [1]);
            a.try_take(ix).unwrap_err()
        }),
        ("gather index", |a| {
            let ix = a.manager().create(&[0i64, 9], [1, 2]);
            a.try_gather(1, ix).unwrap_err()
        }),
        ("gather shape", |a| {
            let ix = a.manager().create(&[0i64, 1], [2]);
            a.try_gather(1, ix).unwrap_err()
        }),
        ("scatter index", |a| {
            let ix = a.manager().create(&[5u8], [1, 1]);
            a.try_scatter_add(0, ix, a).unwrap_err()
        }),
        ("mask dtype", |a| {
            let mk = a.manager().create(&[1i32, 0, 1], [3]);
            a.try_boolean_mask(mk).unwrap_err()
        }),
        ("mask shape", |a| {
            let mk = a.manager().create(&[true, false], [2]);
            a.try_boolean_mask(mk).unwrap_err()
        }),
        ("embedding id", |a| {
            let ix = a.manager().create(&[3i64], [1]);
            a.try_embedding(ix).unwrap_err()
        }),
        ("concat shapes", |a| {
            NDArray::try_concat(&[a, a.get(":, 0:2")], 0).unwrap_err()
        }),
        ("pad widths", |a| a.try_pad(&[(1, 1)], 0.0).unwrap_err()),
    ];
    for (what, f) in cases {
        let (c0, g0) = (memory_on(Device::Cpu).live_bytes, memory_on(d).live_bytes);
        let (ec, eg) = (f(c), f(g));
        assert_eq!(gist(&eg), gist(&ec), "{what}");
        assert_eq!(
            std::mem::discriminant(&eg),
            std::mem::discriminant(&ec),
            "{what}"
        );
        // The index array made for the case is the only thing left, on each side.
        let (c1, g1) = (memory_on(Device::Cpu).live_bytes, memory_on(d).live_bytes);
        assert!(
            c1 - c0 <= 64 && g1 - g0 <= 64,
            "{what}: {c0}->{c1}, {g0}->{g1}"
        );
    }
    // An index array on the other device is a DeviceMismatch.
    let e = g.try_take(cm.create(&[0i64], [1])).unwrap_err();
    assert!(matches!(e, ndscope::NdError::DeviceMismatch { .. }), "{e}");
    cm.close();
    gm.close();
}

/// Logical ops, `one_hot` and `stop_gradient` on the device.
#[test]
fn logical_ops_one_hot_and_stop_gradient_run_on_the_device() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let (cm, gm) = (NDManager::new(), NDManager::new_on(d));
    let p: Vec<bool> = (0..12).map(|i| i % 2 == 0).collect();
    let q: Vec<bool> = (0..4).map(|i| i % 3 == 0).collect();
    let out = |m: &NDManager| {
        let (a, b) = (m.create(&p, [3, 4]), m.create(&q, [4]));
        let rs = [
            a.logical_and(b),
            a.logical_or(b),
            a.transpose().logical_xor(a.transpose().get("::-1")),
            a.logical_not(),
        ];
        let hot = m.create(&[2i64, 0, 3], [3]).one_hot(4, DType::F32);
        let ids = m.create(&[1u8, 1], [2, 1]).one_hot(3, DType::I32);
        let y = m.create(&[1.0f32, 2.0], [2]).stop_gradient();
        assert_eq!(y.device(), m.create(&[0.0f32], [1]).device());
        (
            rs.map(|r| (r.device(), r.to_vec::<bool>().unwrap())),
            hot.to_vec::<f32>().unwrap(),
            ids.to_vec::<i32>().unwrap(),
            y.to_vec::<f32>().unwrap(),
        )
    };
    let (c, g) = (out(&cm), out(&gm));
    for (i, (rc, rg)) in c.0.iter().zip(&g.0).enumerate() {
        assert_eq!((rc.0, rg.0), (Device::Cpu, d), "logical {i}");
        assert_eq!(rg.1, rc.1, "logical {i}");
    }
    assert_eq!((g.1, g.2, g.3), (c.1, c.2, c.3));
    let e = gm
        .create(&[4i64], [1])
        .try_one_hot(4, DType::F32)
        .unwrap_err();
    assert!(e.to_string().contains("class index 4"), "{e}");
    cm.close();
    gm.close();
}

/// `mse_loss` and `binary_cross_entropy_with_logits` on the device: forward over views,
/// both gradients, logits of any magnitude, and an empty input (NaN on both sides).
#[test]
fn elementwise_losses_match_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    grads_match(
        "losses",
        d,
        &[
            (vals(3 * 4, 130), vec![3, 4]),
            (vals(3 * 4, 131), vec![3, 4]),
        ],
        &[],
        |p, _| {
            let t = p[1].sigmoid();
            p[0].mse_loss(p[1]) * 2.0
                + p[0].transpose().mse_loss(t.transpose())
                + (p[0] * 30.0).binary_cross_entropy_with_logits(t)
                + p[0].get("::-1").binary_cross_entropy_with_logits(t) * 0.5
        },
    );
    let (cm, gm) = (NDManager::new(), NDManager::new_on(d));
    let x = [-1e4f32, -30.0, -1.0, 0.0, 2.5, 1e4];
    let t = [0.0f32, 1.0, 0.25, 0.5, 1.0, 0.0];
    let f = |m: &NDManager| {
        let (a, b) = (m.create(&x, [6]), m.create(&t, [6]));
        let e = m.create(&[0.0f32; 0], [0]);
        [
            a.mse_loss(b),
            a.binary_cross_entropy_with_logits(b),
            e.mse_loss(e),
            e.binary_cross_entropy_with_logits(e),
        ]
        .map(|l| l.to_scalar::<f32>().unwrap())
    };
    let (want, got) = (f(&cm), f(&gm));
    for (w, g) in want.iter().zip(&got) {
        assert!(
            (w.is_nan() && g.is_nan()) || (w - g).abs() <= 1e-5 * (1.0 + w.abs()),
            "cpu {want:?}, gpu {got:?}"
        );
    }
    // Shapes must match on the device as on the CPU.
    let e = gm
        .create(&x, [6])
        .try_mse_loss(gm.create(&x, [2, 3]))
        .unwrap_err();
    assert!(matches!(e, ndscope::NdError::ShapeMismatch { .. }), "{e}");
    cm.close();
    gm.close();
}

/// `any` and `all` on the device, over every dtype, axes, views, empty lanes, NaN
/// (nonzero), -0.0 (zero) and integers that are nonzero only in their high bits.
#[test]
fn any_and_all_match_the_cpu() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let (cm, gm) = (NDManager::new(), NDManager::new_on(d));
    let f: Vec<f32> = vec![
        0.0,
        -0.0,
        f32::NAN,
        0.0,
        1e-30,
        0.0,
        0.0,
        0.0,
        -2.0,
        3.0,
        1.0,
        4.0,
    ];
    let ints: Vec<i64> = vec![0, 0, 0, 1 << 40, 0, 0, 0, 0, 5, -1, 7, 9];
    let bytes: Vec<u8> = vec![0, 0, 0, 0, 0, 255, 0, 0, 1, 2, 3, 4];
    let bools: Vec<bool> = bytes.iter().map(|&b| b != 0).collect();
    for (c, g) in [
        (cm.create(&f, [3, 4]), gm.create(&f, [3, 4])),
        (cm.create(&ints, [3, 4]), gm.create(&ints, [3, 4])),
        (cm.create(&bytes, [3, 4]), gm.create(&bytes, [3, 4])),
        (cm.create(&bools, [3, 4]), gm.create(&bools, [3, 4])),
    ] {
        let all = |a: NDArray| {
            [
                a.any(),
                a.all(),
                a.any_axes(&[1], false),
                a.all_axes(&[1], true),
                a.any_axes(&[0], false),
                a.all_axes(&[0], false),
                a.transpose().get("::-1").all_axes(&[0], false),
                a.get(":, 0:0").any_axes(&[1], false),
                a.get(":, 0:0").all_axes(&[1], false),
            ]
            .map(|r| (r.shape(), r.to_vec::<bool>().unwrap()))
        };
        assert_eq!(all(g), all(c), "{}", c.dtype());
    }
    cm.close();
    gm.close();
}

/// `layer_norm` and `batch_norm` on the device: forward and every gradient (with and
/// without gamma and beta, over views, parameters that broadcast), `batch_norm` in
/// training (its running statistics updated in place, as on the CPU) and in inference
/// (given statistics, the fixed-statistics gradient).
#[test]
fn normalisations_match_the_cpu_forward_and_backward() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let base = memory_on(d).live_bytes;
    grads_match(
        "layer_norm",
        d,
        &[
            (vals(2 * 3 * 4, 140), vec![2, 3, 4]),
            (vals(4, 141), vec![4]),
            (vals(3, 142), vec![3, 1]),
        ],
        &[(vals(2 * 3 * 4, 143), vec![2, 3, 4])],
        |p, w| {
            let (x, gamma, beta) = (p[0], p[1], p[2]);
            (x.layer_norm(&[-1], Some(gamma), Some(beta), 1e-5) * w[0]).sum()
                + (x.layer_norm(&[1, 2], Some(beta), None, 1e-3) * w[0]).sum()
                + (x.swap_axes(0, 2).layer_norm(&[0], None, None, 0.0) * w[0].swap_axes(0, 2)).sum()
        },
    );
    grads_match(
        "batch_norm",
        d,
        &[
            (vals(4 * 3 * 2 * 2, 144), vec![4, 3, 2, 2]),
            (vals(3, 145), vec![3]),
            (vals(3, 146), vec![3]),
        ],
        &[(vals(4 * 3 * 2 * 2, 147), vec![4, 3, 2, 2])],
        |p, w| {
            let (x, gamma, beta) = (p[0], p[1], p[2]);
            let m = x.manager();
            let (rm, rv) = (m.zeros([3], DType::F32), m.ones([3], DType::F32));
            let given = (
                m.create(&[0.5f32, -1.0, 0.0], [3]),
                m.create(&[2.0f32, 0.5, 1.0], [3]),
            );
            (x.batch_norm(rm, rv, Some(gamma), Some(beta), true, 0.1, 1e-5) * w[0]).sum()
                + (x.batch_norm(given.0, given.1, Some(gamma), None, false, 0.1, 1e-5) * w[0]).sum()
                + (x.get(":, :, ::-1")
                    .batch_norm(rm, rv, None, Some(beta), true, 0.3, 1e-5)
                    * w[0])
                    .sum()
        },
    );
    // The running statistics after three training steps, and an inference pass.
    let (cm, gm) = (NDManager::new(), NDManager::new_on(d));
    let stats = |m: &NDManager| {
        let (rm, rv) = (m.zeros([3], DType::F32), m.ones([3], DType::F32));
        let g = m.create(&[1.5f32, 0.5, -1.0], [3]);
        for k in 0..3 {
            let x = m.create(&vals(5 * 3 * 4, 150 + k), [5, 3, 4]);
            x.batch_norm(rm, rv, Some(g), None, true, 0.2, 1e-5);
        }
        let x = m.create(&vals(2 * 3 * 4, 160), [2, 3, 4]);
        let y = x.batch_norm(rm, rv, Some(g), Some(g), false, 0.2, 1e-5);
        [rm, rv, y].map(|a| a.to_vec::<f32>().unwrap())
    };
    let (want, got) = (stats(&cm), stats(&gm));
    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
        for (a, b) in w.iter().zip(g) {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                "{k}: cpu {w:?}, gpu {g:?}"
            );
        }
    }
    // Refusals as on the CPU: parameters of the wrong shape, a batch of one per channel.
    let x = gm.create(&vals(6, 170), [2, 3]);
    let e = x
        .try_batch_norm(
            gm.zeros([2], DType::F32),
            gm.ones([3], DType::F32),
            None,
            None,
            true,
            0.1,
            1e-5,
        )
        .unwrap_err();
    assert!(e.to_string().contains("must have shape [3]"), "{e}");
    let e = x
        .get("0:1")
        .try_batch_norm(
            gm.zeros([3], DType::F32),
            gm.ones([3], DType::F32),
            None,
            None,
            true,
            0.1,
            1e-5,
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("more than 1 value per channel"),
        "{e}"
    );
    cm.close();
    gm.close();
    assert_eq!(memory_on(d).live_bytes, base);
}
