//! Micro-benchmarks behind the performance table in `BENCHMARKS.md`.
//!
//! Run: `cargo run --release --example bench -- --json` (one JSON line; without
//! `--json` a readable table). `--quick` is a smoke run for CI (tiny sizes and few
//! repeats, so it also runs in debug builds and under valgrind): its figures mean
//! nothing.
//! Every figure is the median over repeats of a timing loop. `--only NAME` runs one
//! workload, `--only A,B,C` several (for profiling; `--only parallel` runs the four
//! `parallel_2t_*` ones); the figures of workloads not run are `null` in the JSON line
//! and `-` in the table.
//!
//! `linreg_autograd_step_us` and `parallel_2t_*` run the README's linear-regression
//! loop (`examples/linear_regression.rs`): X [1000,2] ~ N(0,1), y = X·[2,-3.4] + 4.2 +
//! noise, minibatches of 10, squared loss / 2, SGD with lr 0.03, one scope per epoch
//! (100 steps). `parallel_2t_speedup_*` is the total throughput of two threads that each
//! train their own parameters, started together by a barrier, divided by the throughput
//! of one thread running the same loop alone (2.0 = perfect scaling): `independent`
//! gives each thread its own data set created on that thread, `shared` one data set
//! created on the main thread and read by both; without `_autograd` the gradient is
//! written by hand, with it `GradientCollector` computes it. `bench/candle` measures
//! the same workloads in candle-core.
//!
//! `add_col_bias_us` adds a [1] array to a [100000,1] column (a bias added to an
//! `[n,1]` product), F32. `transposed_scale_us` multiplies a transposed [1000,1000] F32
//! view by 2, `transposed_add_us` adds it to a plain [1000,1000] array (each includes
//! the transposed view and the close of the result).
//!
//! `conv2d_fwd_bwd_us` is one `conv2d` forward and backward inside a fresh
//! `GradientCollector` and scope: input [32,16,8,8] F32, 32 filters 3×3, padding 1,
//! stride 1, with bias, loss `sum`, gradients for the input, the weight and the bias.
//! `cross_entropy_fwd_bwd_us` is the same for `cross_entropy` of [32,10] F32 logits
//! with I64 labels (gradient for the logits). `bench/torch_nn_bench.py` measures both
//! in PyTorch (one thread) or, without PyTorch, numpy (im2col + matmul).
//! The CNN layers, each forward plus the backward of `sum` with gradients for the
//! input and every parameter, on the digits CNN's first activation [32,16,8,8] and
//! (`_big_`) on [32,64,32,32]: `maxpool2d_fwd_bwd_us` (2×2, stride 2),
//! `batchnorm2d_fwd_bwd_us` (training, running statistics updated, gamma and beta
//! `[C]`), `layernorm_fwd_bwd_us` (over C, H and W, gamma and beta `[C,H,W]`), and
//! `conv2d_big_fwd_bwd_us` ([32,64,32,32], 64 filters 3×3, padding 1, bias). PyTorch
//! only (the numpy fallback prints none of them).
//!
//! Built with `--features gpu`, on the first GPU that `devices()` lists:
//! `gpu_add10_enqueue_ns` is the host cost of queueing an add of two [10] F32 arrays on
//! the device and closing the result (no wait): the calling thread's CPU time per op.
//! `gpu_add10_enqueue_wall_ns` is the wall time of the same loop; on a software driver
//! (llvmpipe) it also holds the "GPU" executing on the same cores. `gpu_add16M_GBps`
//! (3 x 64 MiB moved) and `gpu_sum16M_GBps` (64 MiB read) and `gpu_matmul2048_GFLOPs`
//! (F32) time the op plus `synchronize`; `gpu_linreg_step_us` is one step of the
//! README's loop with autograd, data and parameters on the device (an epoch of 100
//! steps, then `synchronize`); `gpu_digits_mlp_us_per_step` a training step of the
//! digits MLP (64-128-10, ReLU, cross-entropy, Adam) on a batch of 32 on the device
//! (50 steps, then `synchronize`); `gpu_digits_cnn_us_per_step` the same for the
//! digits CNN (10 steps); `gpu_conv2d_fwd_bwd_us` is `conv2d_fwd_bwd_us` on the device,
//! with a `synchronize` in each repeat. Without a GPU they are `null`.
//!
//! `scope_open_close_ns` opens an empty `NDScope` and drops it. `scope_escape_ns` runs
//! `ndscope::scope(|| m.zeros([4], F32))` inside an open scope (the array escapes to
//! it) and closes the returned array: a scope's open and close, one array made, one
//! escape and one close.
//!
//! `add16M_GBps` counts 3 x 64 MiB moved by `add16M`, `sum16M_GBps` 64 MiB read by
//! `sum16M`; `plain_add16M_GBps` and `plain_sum16M_GBps` (workload `plain16M`) time
//! plain Rust loops over the same sizes, split across as many scoped threads as
//! ndscope's kernel pool has, into an output already written once: the machine's
//! memory bandwidth as a plain program sees it, the bar for the two ndscope rows.
//!
//! Memory, after every workload: `peak_rss_mb` is the process's peak resident set
//! (`VmHWM`); `peak_live_mb` the peak of the bytes held by live arrays
//! (`memory().peak_bytes`, each buffer counted at the size its array asked for; the
//! pool's blocks are rounded up to size classes of at least 64 bytes, so a million
//! live one-element f32 arrays read 3.8 MiB here and hold 61 MiB of blocks); `cached_mb` the
//! bytes the caching pool holds for reuse at the end (`memory().cached_bytes`).

use ndscope::{DType, GradientCollector, NDArray, NDManager, NDScope};
use std::future::Future;
use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

/// Rows of the linear-regression data set.
const N: usize = 1000;
/// Minibatch size of the linear-regression loop.
const BATCH: usize = 10;
/// SGD learning rate of the linear-regression loop.
const LR: f64 = 0.03;

/// Median of the per-iteration times (ns) over `repeats` loops of `iters` calls.
fn median_ns(repeats: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..iters.clamp(1, 1000) {
        f(); // warm up (caches, pool)
    }
    let v: Vec<f64> = (0..repeats)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    median(v)
}

/// `out = a + b` by a plain loop, `part` elements per scoped thread: the machine's
/// bandwidth bar for `add16M`.
fn plain_add(out: &mut [f32], a: &[f32], b: &[f32], part: usize) {
    std::thread::scope(|s| {
        for ((o, x), y) in out.chunks_mut(part).zip(a.chunks(part)).zip(b.chunks(part)) {
            s.spawn(move || {
                for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
                    *o = x + y;
                }
            });
        }
    });
}

/// The sum of `a` by a plain loop (16 independent lanes, so it vectorises), `part`
/// elements per scoped thread: the machine's bandwidth bar for `sum16M`.
fn plain_sum(a: &[f32], part: usize) -> f32 {
    std::thread::scope(|s| {
        let parts: Vec<_> = a
            .chunks(part)
            .map(|c| {
                s.spawn(move || {
                    let mut lanes = [0f32; 16];
                    let mut it = c.chunks_exact(16);
                    for ch in &mut it {
                        for (l, &v) in lanes.iter_mut().zip(ch) {
                            *l += v;
                        }
                    }
                    lanes.iter().sum::<f32>() + it.remainder().iter().sum::<f32>()
                })
            })
            .collect();
        parts.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

/// The median of `v` (not empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn op_then_close(f: impl Fn() -> NDArray) -> impl FnMut() {
    move || {
        let c = f();
        black_box(c);
        c.close();
    }
}

/// The README's data set in `m`: X [N,2] ~ N(0,1), y = X·[2,-3.4] + 4.2 + N(0,0.01).
fn make_data(m: &NDManager) -> (NDArray, NDArray) {
    let true_w = m.create(&[2.0f32, -3.4], [2, 1]);
    let x = m.random_normal(0.0, 1.0, [N, 2], DType::F32);
    let y = x.matmul(true_w) + 4.2 + m.random_normal(0.0, 0.01, [N, 1], DType::F32);
    (x, y)
}

/// Minibatch index strings "0:10", "10:20", ... (one epoch).
fn batches() -> Vec<String> {
    (0..N)
        .step_by(BATCH)
        .map(|i| format!("{i}:{}", i + BATCH))
        .collect()
}

/// `steps` SGD steps of the README's loop on (x, y), updating w [2,1] and b [1] in
/// place, one scope per epoch. `autograd`: the gradient comes from a
/// `GradientCollector` (w and b must require gradients); else it is written by hand
/// (the loss is still computed, as the collector's forward pass does).
fn linreg_steps(
    (x, y): (NDArray, NDArray),
    (w, b): (NDArray, NDArray),
    slices: &[String],
    steps: usize,
    autograd: bool,
) {
    let mut done = 0;
    while done < steps {
        let n = (steps - done).min(slices.len());
        let _epoch = NDScope::new();
        for s in &slices[..n] {
            let (xb, yb) = (x.get(s), y.get(s));
            let (gw, gb) = if autograd {
                {
                    let gc = GradientCollector::new();
                    let l = (xb.matmul(w) + b - yb).square() / 2.0;
                    gc.backward(l).expect("backward");
                }
                (w.gradient(), b.gradient())
            } else {
                let err = xb.matmul(w) + b - yb;
                black_box(err.square() / 2.0);
                (xb.transpose().matmul(err), err.sum_axes(&[0], false))
            };
            let (mut w, mut b) = (w, b);
            w -= gw * (LR / BATCH as f64);
            b -= gb * (LR / BATCH as f64);
        }
        done += n;
    }
}

/// Fresh parameters (w ~ N(0,0.01) [2,1], b = 0 [1]) in `m`.
fn new_params(m: &NDManager, autograd: bool) -> (NDArray, NDArray) {
    let w = m.random_normal(0.0, 0.01, [2, 1], DType::F32);
    let b = m.zeros([1], DType::F32);
    if autograd {
        w.set_requires_gradient(true);
        b.set_requires_gradient(true);
    }
    (w, b)
}

/// Seconds for `threads` threads, started together, to each run `steps` steps of the
/// loop with their own parameters, on `shared` data or (None) on a data set each thread
/// creates itself; from the first start to the last finish.
fn parallel_secs(
    threads: usize,
    steps: usize,
    autograd: bool,
    shared: Option<(NDArray, NDArray)>,
) -> f64 {
    let barrier = Barrier::new(threads);
    let slices = batches();
    let times: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mine = NDManager::new();
                    let data = shared.unwrap_or_else(|| make_data(&mine));
                    let params = new_params(&mine, autograd);
                    // Warm up this thread's pools and caches.
                    linreg_steps(data, params, &slices, steps.min(20), autograd);
                    barrier.wait();
                    let t0 = Instant::now();
                    linreg_steps(data, params, &slices, steps, autograd);
                    let t1 = Instant::now();
                    mine.close();
                    (t0, t1)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a training thread panicked"))
            .collect()
    });
    let start = times.iter().map(|t| t.0).min().expect("a thread");
    let end = times.iter().map(|t| t.1).max().expect("a thread");
    (end - start).as_secs_f64()
}

/// Throughput of two threads over that of one (see the module docs). Steps are
/// calibrated so one thread alone runs for about 0.4 s; the median of `reps` timings
/// of each is taken.
fn parallel_speedup(
    quick: bool,
    reps: usize,
    autograd: bool,
    shared: Option<(NDArray, NDArray)>,
) -> f64 {
    let steps = if quick {
        3
    } else {
        let probe = 1000;
        let t = parallel_secs(1, probe, autograd, shared);
        ((0.4 / t * probe as f64) as usize).clamp(probe, 20_000_000)
    };
    let mut one = Vec::with_capacity(reps);
    let mut two = Vec::with_capacity(reps);
    for _ in 0..reps {
        one.push(parallel_secs(1, steps, autograd, shared));
        two.push(parallel_secs(2, steps, autograd, shared));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // (2 * steps / two) / (steps / one)
    2.0 * median(&mut one) / median(&mut two)
}

/// `v` formatted with `prec` decimals; `null` (JSON) or `-` (table) when absent or not
/// finite.
fn fmt(v: Option<f64>, prec: usize, json: bool) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.prec$}"),
        _ if json => "null".to_string(),
        _ => "-".to_string(),
    }
}

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    let quick = std::env::args().any(|a| a == "--quick");
    let r = if quick { 1 } else { 15 };
    let args: Vec<String> = std::env::args().collect();
    // Iteration counts and sizes shrink by this factor in quick mode.
    // `--iters N` fixes every timing loop's iteration count (for callgrind profiles).
    let iters: Option<usize> = args
        .iter()
        .position(|a| a == "--iters")
        .and_then(|i| args.get(i + 1)?.parse().ok());
    let it = |n: usize| match iters {
        Some(k) => k,
        None if quick => (n / 1000).max(1),
        None => n,
    };
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    let run = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|k| k == name))
    };
    // Run `f` only if the workload is selected.
    let maybe = |name: &str, f: &mut dyn FnMut() -> f64| run(name).then(f);
    let m = NDManager::new();

    let a = m.random_uniform(0.0, 1.0, [10], DType::F32);
    let b = m.random_uniform(0.0, 1.0, [10], DType::F32);
    let add10_ns = maybe("add10", &mut || {
        median_ns(r, it(200_000), op_then_close(|| a + b))
    });

    // The same op with 1,000,000 arrays live in another manager: must cost the same.
    let add10_1m_live_ns = maybe("add10_1M_live", &mut || {
        let other = NDManager::new();
        for _ in 0..it(1_000_000) {
            other.zeros([1], DType::F32);
        }
        let t = median_ns(r, it(200_000), op_then_close(|| a + b));
        other.close();
        t
    });

    // Scope overhead: 1000 small arrays created in a scope and freed by its close,
    // against the same arrays created and closed one by one.
    let (scoped_ns, unscoped_ns) = if run("scope") {
        let scoped = median_ns(r, it(200), || {
            let _s = NDScope::new();
            for _ in 0..1000 {
                m.zeros([4], DType::F32);
            }
        }) / 1000.0;
        let unscoped = median_ns(r, it(200), || {
            for _ in 0..1000 {
                m.zeros([4], DType::F32).close();
            }
        }) / 1000.0;
        (Some(scoped), Some(unscoped))
    } else {
        (None, None)
    };

    // A scope's own cost: an empty scope opened and closed; and `scope(|| ..)` returning
    // one [4] array (so it escapes to the enclosing scope, here an open one), the array
    // then closed. The escape's own share is roughly `scope_escape_ns` minus
    // `scope_open_close_ns` minus `no_scope_array_ns`.
    let scope_open_close_ns = maybe("scope_open_close", &mut || {
        median_ns(r, it(200_000), || {
            black_box(NDScope::new());
        })
    });
    let scope_escape_ns = maybe("scope_escape", &mut || {
        let _outer = NDScope::new();
        median_ns(r, it(200_000), || {
            let a = ndscope::scope(|| m.zeros([4], DType::F32));
            black_box(a).close();
        })
    });

    // What a poll of a `scope_async` future adds to the inner future's poll (entering
    // the task's scope and leaving it), for a future that creates nothing: a wrapped
    // and a bare always-pending future, polled alike.
    let scope_async_poll_ns = maybe("scope_async_poll", &mut || {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let mut bare = std::pin::pin!(std::future::pending::<()>());
        let bare_ns = median_ns(r, it(2_000_000), || {
            black_box(bare.as_mut().poll(&mut cx).is_pending());
        });
        let mut wrapped = std::pin::pin!(ndscope::scope_async(std::future::pending::<()>()));
        let wrapped_ns = median_ns(r, it(2_000_000), || {
            black_box(wrapped.as_mut().poll(&mut cx).is_pending());
        });
        (wrapped_ns - bare_ns).max(0.0)
    });

    let x = m.random_uniform(0.0, 1.0, [1000, 2], DType::F32);
    let w = m.random_uniform(0.0, 1.0, [2, 1], DType::F32);
    let matmul_small_us = maybe("matmul_small", &mut || {
        median_ns(r, it(20_000), op_then_close(|| x.matmul(w))) / 1e3
    });

    // One linear-regression step, gradient written by hand: 9 ops on [64,2] data inside
    // a scope (numpy_bench.py and bench/candle run the same step).
    let linreg_us = maybe("linreg", &mut || {
        let xs = m.random_normal(0.0, 1.0, [64, 2], DType::F32);
        let ys = m.random_normal(0.0, 1.0, [64, 1], DType::F32);
        let w = m.zeros([2, 1], DType::F32);
        median_ns(r, it(20_000), || {
            let _s = NDScope::new();
            let err = xs.matmul(w) - ys;
            black_box(err.square().mean());
            let grad = xs.transpose().matmul(err) * (2.0 / 64.0);
            w.try_subi(grad * 0.01).expect("same shape");
        }) / 1e3
    });

    // One step of the README's loop with GradientCollector, one thread (epochs of 100
    // steps, each in a scope; 3 in quick mode).
    let linreg_autograd_us = maybe("linreg_autograd", &mut || {
        let data = make_data(&m);
        let params = new_params(&m, true);
        let slices = batches();
        let steps = if quick { 3 } else { slices.len() };
        median_ns(r, it(20), || {
            linreg_steps(data, params, &slices, steps, true)
        }) / 1e3
            / steps as f64
    });

    // conv2d forward + backward (input, weight and bias gradients); see the module docs.
    let conv2d_us = maybe("conv2d", &mut || {
        let batch = if quick { 2 } else { 32 };
        let x = m.random_normal(0.0, 1.0, [batch, 16, 8, 8], DType::F32);
        let w = m.random_normal(0.0, 0.1, [32, 16, 3, 3], DType::F32);
        let b = m.zeros([32], DType::F32);
        for p in [x, w, b] {
            p.set_requires_gradient(true);
        }
        let t = median_ns(r, it(2_000), || {
            let _s = NDScope::new();
            let gc = GradientCollector::new();
            let y = x.conv2d(w, Some(b), [1, 1], [1, 1], [1, 1], 1);
            gc.backward(y.sum()).expect("recorded");
        }) / 1e3;
        // Closed so that later collectors do not zero their gradients.
        for p in [x, w, b] {
            p.close();
        }
        t
    });

    // The CNN layers of issue 29: forward, then backward of `sum`, in a fresh scope and
    // collector, with gradients for the input and every parameter; on the digits CNN's
    // first activation [32,16,8,8] and on [32,64,32,32] (batch 2 in quick mode).
    let layer_us = |shape: [usize; 4],
                    iters: usize,
                    f: &dyn Fn(NDArray, &[NDArray]) -> NDArray,
                    params: &[NDArray]| {
        let shape = if quick {
            [2, shape[1], shape[2], shape[3]]
        } else {
            shape
        };
        let x = m.random_normal(0.0, 1.0, shape, DType::F32);
        x.set_requires_gradient(true);
        for p in params {
            p.set_requires_gradient(true);
        }
        let t = median_ns(r, it(iters), || {
            let _s = NDScope::new();
            let gc = GradientCollector::new();
            gc.backward(f(x, params).sum()).expect("recorded");
        }) / 1e3;
        x.close();
        for p in params {
            p.close();
        }
        t
    };
    let maxpool = |x: NDArray, _: &[NDArray]| x.max_pool2d([2, 2], [2, 2], [0, 0]);
    let batchnorm = |x: NDArray, p: &[NDArray]| {
        x.batch_norm(p[0], p[1], Some(p[2]), Some(p[3]), true, 0.1, 1e-5)
    };
    let layernorm =
        |x: NDArray, p: &[NDArray]| x.layer_norm(&[1, 2, 3], Some(p[0]), Some(p[1]), 1e-5);
    // Running statistics (no gradient; `layer_us` sets it on every parameter, which
    // batch_norm refuses for statistics the tape depends on, so they are made here).
    let bn_params = |c: usize| {
        let stats = [m.zeros([c], DType::F32), m.ones([c], DType::F32)];
        let affine = [m.ones([c], DType::F32), m.zeros([c], DType::F32)];
        (stats, affine)
    };
    let bn_us = |shape: [usize; 4], iters: usize| {
        let (stats, affine) = bn_params(shape[1]);
        let f = |x: NDArray, p: &[NDArray]| batchnorm(x, &[stats[0], stats[1], p[0], p[1]]);
        let t = layer_us(shape, iters, &f, &affine);
        stats.iter().for_each(|s| s.close());
        t
    };
    let ln_us = |shape: [usize; 4], iters: usize| {
        let g = [shape[1], shape[2], shape[3]];
        let p = [m.ones(g, DType::F32), m.zeros(g, DType::F32)];
        layer_us(shape, iters, &layernorm, &p)
    };
    const DIGITS_ACT: [usize; 4] = [32, 16, 8, 8];
    const BIG_ACT: [usize; 4] = [32, 64, 32, 32];
    let maxpool_us = maybe("maxpool2d", &mut || {
        layer_us(DIGITS_ACT, 5_000, &maxpool, &[])
    });
    let maxpool_big_us = maybe("maxpool2d_big", &mut || {
        layer_us(BIG_ACT, 50, &maxpool, &[])
    });
    let batchnorm_us = maybe("batchnorm2d", &mut || bn_us(DIGITS_ACT, 5_000));
    let batchnorm_big_us = maybe("batchnorm2d_big", &mut || bn_us(BIG_ACT, 50));
    let layernorm_us = maybe("layernorm", &mut || ln_us(DIGITS_ACT, 5_000));
    let layernorm_big_us = maybe("layernorm_big", &mut || ln_us(BIG_ACT, 50));
    let conv2d_big_us = maybe("conv2d_big", &mut || {
        let w = m.random_normal(0.0, 0.05, [64, 64, 3, 3], DType::F32);
        let b = m.zeros([64], DType::F32);
        let conv =
            |x: NDArray, p: &[NDArray]| x.conv2d(p[0], Some(p[1]), [1, 1], [1, 1], [1, 1], 1);
        layer_us(BIG_ACT, 10, &conv, &[w, b])
    });

    // cross_entropy forward + backward on [32,10] logits.
    let cross_entropy_us = maybe("cross_entropy", &mut || {
        let logits = m.random_normal(0.0, 1.0, [32, 10], DType::F32);
        let labels = m.random_integer(0, 10, [32], DType::I64);
        logits.set_requires_gradient(true);
        let t = median_ns(r, it(50_000), || {
            let _s = NDScope::new();
            let gc = GradientCollector::new();
            gc.backward(logits.cross_entropy(labels)).expect("recorded");
        }) / 1e3;
        logits.close();
        labels.close();
        t
    });

    // Two threads each training vs one thread alone (see the module docs).
    let par_reps = if quick { 1 } else { 5 };
    let par = |name: &str, autograd: bool, shared: bool| {
        (run("parallel") || run(name)).then(|| {
            let data = NDManager::new();
            let shared = shared.then(|| make_data(&data));
            let s = parallel_speedup(quick, par_reps, autograd, shared);
            data.close();
            s
        })
    };
    let par_indep = par("parallel_2t_speedup_independent", false, false);
    let par_shared = par("parallel_2t_speedup_shared", false, true);
    let par_indep_ag = par("parallel_2t_speedup_independent_autograd", true, false);
    let par_shared_ag = par("parallel_2t_speedup_shared_autograd", true, true);

    let n = if quick { 1usize << 12 } else { 1usize << 24 };
    let big = run("add16M") || run("sum16M");
    let big_n = if big { n } else { 1 };
    let big_a = m.random_uniform(0.0, 1.0, [big_n], DType::F32);
    let big_b = m.random_uniform(0.0, 1.0, [big_n], DType::F32);
    let add16m_ms = maybe("add16M", &mut || {
        median_ns(r, 10, op_then_close(|| big_a + big_b)) / 1e6
    });
    let add16m_gbps = add16m_ms.map(|ms| (3 * 4 * n) as f64 / (ms * 1e6));

    // The machine's bar for the two rows above: plain Rust loops over the same sizes,
    // split across as many threads as ndscope's kernels use, into a warm output.
    let plain = run("plain16M");
    let (pa, pb) = if plain {
        (
            (0..n).map(|i| i as f32).collect::<Vec<f32>>(),
            vec![1.5f32; n],
        )
    } else {
        (Vec::new(), Vec::new())
    };
    let mut pout = vec![0f32; pa.len()];
    let plain_threads = rayon::current_num_threads();
    let part = pa.len().div_ceil(plain_threads).max(1);
    let plain_add16m_gbps = maybe("plain16M", &mut || {
        let ms = median_ns(r, 10, || plain_add(&mut pout, &pa, &pb, part)) / 1e6;
        (3 * 4 * n) as f64 / (ms * 1e6)
    });
    let plain_sum16m_gbps = maybe("plain16M", &mut || {
        let ms = median_ns(r, 20, || {
            black_box(plain_sum(&pa, part));
        }) / 1e6;
        (4 * n) as f64 / (ms * 1e6)
    });

    // A column plus a broadcast scalar (`x.matmul(w) + b` with a [n,1] product).
    let col_n = if quick { 1000 } else { 100_000 };
    let col_n = if run("add_col_bias") { col_n } else { 1 };
    let col = m.random_uniform(0.0, 1.0, [col_n, 1], DType::F32);
    let bias = m.random_uniform(0.0, 1.0, [1], DType::F32);
    let add_col_bias_us = maybe("add_col_bias", &mut || {
        median_ns(r, 200, op_then_close(|| col + bias)) / 1e3
    });

    // Elementwise ops on a transposed view ([1000,1000]^T, strides [1,1000]): scaled,
    // and added to a plain [1000,1000] array.
    let side_t = if quick { 64 } else { 1000 };
    let side_t = if run("transposed_scale") || run("transposed_add") {
        side_t
    } else {
        1
    };
    let ta = m.random_uniform(0.0, 1.0, [side_t, side_t], DType::F32);
    let tb = m.random_uniform(0.0, 1.0, [side_t, side_t], DType::F32);
    let transposed_scale_us = maybe("transposed_scale", &mut || {
        median_ns(r, 50, op_then_close(|| ta.transpose() * 2.0)) / 1e3
    });
    let transposed_add_us = maybe("transposed_add", &mut || {
        median_ns(r, 50, op_then_close(|| ta.transpose() + tb)) / 1e3
    });

    let sum16m_ms = maybe("sum16M", &mut || {
        median_ns(r, 20, op_then_close(|| big_a.sum())) / 1e6
    });

    // A [4096, 4096] matrix summed over its rows (axis 0: the reduced axis is the
    // outer one) and over its columns (axis 1), in bytes read per second.
    let side = if quick { 64 } else { 4096 };
    let sums = run("sum_axis0") || run("sum_axis1");
    let mat = m.random_uniform(
        0.0,
        1.0,
        if sums { [side, side] } else { [1, 1] },
        DType::F32,
    );
    let axis_gbps = |axis: isize| {
        let ms = median_ns(r, 20, op_then_close(|| mat.sum_axes(&[axis], false))) / 1e6;
        (4 * side * side) as f64 / (ms * 1e6)
    };
    let sum_axis0_gbps = maybe("sum_axis0", &mut || axis_gbps(0));
    let sum_axis1_gbps = maybe("sum_axis1", &mut || axis_gbps(1));

    let k = match (run("matmul2048"), quick) {
        (false, _) => 1,
        (true, true) => 64,
        (true, false) => 2048,
    };
    let ma = m.random_uniform(0.0, 1.0, [k, k], DType::F32);
    let mb = m.random_uniform(0.0, 1.0, [k, k], DType::F32);
    let mm_r = if quick { 1 } else { 5 };
    let matmul2048_ms = maybe("matmul2048", &mut || {
        median_ns(mm_r, 2, op_then_close(|| ma.matmul(mb))) / 1e6
    });
    let gflops = matmul2048_ms.map(|ms| 2.0 * (k as f64).powi(3) / (ms * 1e6));

    let gpu = if run("gpu") {
        gpu_keys(quick, r)
    } else {
        [None; GPU_KEYS]
    };
    let threads = rayon::current_num_threads();
    let rss = peak_rss_mb();
    let mem = ndscope::memory();
    const MIB: f64 = (1 << 20) as f64;
    // (JSON key, table label, value, decimals, unit)
    let rows: &[(&str, &str, Option<f64>, usize, &str)] = &[
        ("add10_ns", "add10", add10_ns, 1, "ns"),
        (
            "add10_1M_live_ns",
            "add10, 1M arrays live",
            add10_1m_live_ns,
            1,
            "ns",
        ),
        ("scope_array_ns", "array in scope", scoped_ns, 1, "ns"),
        ("no_scope_array_ns", "array closed", unscoped_ns, 1, "ns"),
        (
            "scope_open_close_ns",
            "empty scope open + close",
            scope_open_close_ns,
            1,
            "ns",
        ),
        (
            "scope_escape_ns",
            "scope returning a [4] array, closed",
            scope_escape_ns,
            1,
            "ns",
        ),
        (
            "scope_async_poll_ns",
            "scope_async poll overhead",
            scope_async_poll_ns,
            1,
            "ns",
        ),
        (
            "matmul_1000x2x1_us",
            "matmul [1000,2]x[2,1]",
            matmul_small_us,
            3,
            "us",
        ),
        ("add16M_ms", "add 16M f32", add16m_ms, 3, "ms"),
        (
            "add_col_bias_us",
            "add [100000,1] + [1] f32",
            add_col_bias_us,
            2,
            "us",
        ),
        (
            "transposed_scale_us",
            "[1000,1000]^T * 2 f32",
            transposed_scale_us,
            1,
            "us",
        ),
        (
            "transposed_add_us",
            "[1000,1000]^T + [1000,1000] f32",
            transposed_add_us,
            1,
            "us",
        ),
        (
            "sum_axis0_GBps",
            "sum [4096,4096] over axis 0",
            sum_axis0_gbps,
            1,
            "GB/s",
        ),
        (
            "sum_axis1_GBps",
            "sum [4096,4096] over axis 1",
            sum_axis1_gbps,
            1,
            "GB/s",
        ),
        (
            "add16M_GBps",
            "add 16M f32, bandwidth",
            add16m_gbps,
            2,
            "GB/s",
        ),
        (
            "plain_add16M_GBps",
            "plain loop: add 16M f32",
            plain_add16m_gbps,
            2,
            "GB/s",
        ),
        ("matmul2048_ms", "matmul 2048^3 f32", matmul2048_ms, 2, "ms"),
        (
            "matmul2048_GFLOPs",
            "matmul 2048^3 f32, rate",
            gflops,
            1,
            "GFLOP/s",
        ),
        ("sum16M_ms", "sum 16M f32", sum16m_ms, 3, "ms"),
        (
            "sum16M_GBps",
            "sum 16M f32, bandwidth",
            sum16m_ms.map(|ms| (4 * n) as f64 / (ms * 1e6)),
            2,
            "GB/s",
        ),
        (
            "plain_sum16M_GBps",
            "plain loop: sum 16M f32",
            plain_sum16m_gbps,
            2,
            "GB/s",
        ),
        ("linreg_step_us", "linreg step (manual)", linreg_us, 3, "us"),
        (
            "linreg_autograd_step_us",
            "linreg step (autograd)",
            linreg_autograd_us,
            3,
            "us",
        ),
        (
            "conv2d_fwd_bwd_us",
            "conv2d [32,16,8,8] 3x3x32 fwd+bwd",
            conv2d_us,
            1,
            "us",
        ),
        (
            "conv2d_big_fwd_bwd_us",
            "conv2d [32,64,32,32] 3x3x64 fwd+bwd",
            conv2d_big_us,
            0,
            "us",
        ),
        (
            "maxpool2d_fwd_bwd_us",
            "max_pool2d 2x2 [32,16,8,8] fwd+bwd",
            maxpool_us,
            1,
            "us",
        ),
        (
            "maxpool2d_big_fwd_bwd_us",
            "max_pool2d 2x2 [32,64,32,32] fwd+bwd",
            maxpool_big_us,
            0,
            "us",
        ),
        (
            "batchnorm2d_fwd_bwd_us",
            "batch_norm [32,16,8,8] fwd+bwd",
            batchnorm_us,
            1,
            "us",
        ),
        (
            "batchnorm2d_big_fwd_bwd_us",
            "batch_norm [32,64,32,32] fwd+bwd",
            batchnorm_big_us,
            0,
            "us",
        ),
        (
            "layernorm_fwd_bwd_us",
            "layer_norm [16,8,8] of [32,..] fwd+bwd",
            layernorm_us,
            1,
            "us",
        ),
        (
            "layernorm_big_fwd_bwd_us",
            "layer_norm [64,32,32] of [32,..] fwd+bwd",
            layernorm_big_us,
            0,
            "us",
        ),
        (
            "cross_entropy_fwd_bwd_us",
            "cross_entropy [32,10] fwd+bwd",
            cross_entropy_us,
            3,
            "us",
        ),
        (
            "parallel_2t_speedup_independent",
            "2 threads / 1, own data",
            par_indep,
            2,
            "x",
        ),
        (
            "parallel_2t_speedup_shared",
            "2 threads / 1, shared data",
            par_shared,
            2,
            "x",
        ),
        (
            "parallel_2t_speedup_independent_autograd",
            "2 threads / 1, own data, autograd",
            par_indep_ag,
            2,
            "x",
        ),
        (
            "parallel_2t_speedup_shared_autograd",
            "2 threads / 1, shared data, autograd",
            par_shared_ag,
            2,
            "x",
        ),
        (
            "gpu_add10_enqueue_ns",
            "gpu: queue add10 (thread CPU)",
            gpu[0],
            0,
            "ns",
        ),
        (
            "gpu_add10_enqueue_wall_ns",
            "gpu: queue add10 (wall)",
            gpu[1],
            0,
            "ns",
        ),
        ("gpu_add16M_GBps", "gpu: add 16M f32", gpu[2], 1, "GB/s"),
        ("gpu_sum16M_GBps", "gpu: sum 16M f32", gpu[3], 1, "GB/s"),
        (
            "gpu_matmul2048_GFLOPs",
            "gpu: matmul 2048 f32",
            gpu[4],
            1,
            "GFLOP/s",
        ),
        (
            "gpu_linreg_step_us",
            "gpu: linreg step (autograd)",
            gpu[5],
            1,
            "us",
        ),
        (
            "gpu_digits_mlp_us_per_step",
            "gpu: digits MLP step (Adam)",
            gpu[6],
            1,
            "us",
        ),
        (
            "gpu_digits_cnn_us_per_step",
            "gpu: digits CNN step (Adam)",
            gpu[7],
            1,
            "us",
        ),
        (
            "gpu_conv2d_fwd_bwd_us",
            "gpu: conv2d [32,16,8,8] 3x3x32 fwd+bwd",
            gpu[8],
            1,
            "us",
        ),
        ("peak_rss_mb", "peak RSS", Some(rss), 1, "MiB"),
        (
            "peak_live_mb",
            "peak of live array bytes",
            Some(mem.peak_bytes as f64 / MIB),
            1,
            "MiB",
        ),
        (
            "cached_mb",
            "bytes the pool holds for reuse at the end",
            Some(mem.cached_bytes as f64 / MIB),
            1,
            "MiB",
        ),
    ];
    if json {
        let fields: Vec<String> = rows
            .iter()
            .map(|(key, _, v, prec, _)| format!("\"{key}\":{}", fmt(*v, *prec, true)))
            .collect();
        println!(
            "{{\"impl\":\"ndscope\",\"threads\":{threads},{}}}",
            fields.join(",")
        );
    } else {
        println!("{:<38} {threads}", "threads");
        for (_, label, v, prec, unit) in rows {
            println!("{label:<38} {} {unit}", fmt(*v, *prec, false));
        }
    }
    m.close();
}

/// The GPU keys (see the module docs), on the first GPU; `None` without one.
#[cfg(feature = "gpu")]
fn gpu_keys(quick: bool, r: usize) -> [Option<f64>; GPU_KEYS] {
    use ndscope::{Device, devices, synchronize};
    let Some(d) = devices().into_iter().find(|d| d.device != Device::Cpu) else {
        return [None; GPU_KEYS];
    };
    let d = d.device;
    let m = NDManager::new_on(d);
    let it = |n: usize| if quick { 2 } else { n };
    let (a, b) = (m.ones([10], DType::F32), m.ones([10], DType::F32));
    // The calling thread's CPU time per queued op (the host cost), and the wall time of
    // the same loop, which on a software driver also holds the "GPU" running on the
    // same cores.
    let (mut cpu, mut wall) = (Vec::new(), Vec::new());
    let iters = it(20_000);
    for _ in 0..iters.min(1000) {
        (a + b).close(); // warm up (the pipeline, the pool, bind groups)
    }
    for _ in 0..r {
        synchronize(d).expect("the device");
        let (c0, t0) = (cpu_time::ThreadTime::now(), Instant::now());
        for _ in 0..iters {
            let c = a + b;
            black_box(c);
            c.close();
        }
        cpu.push(c0.elapsed().as_nanos() as f64 / iters as f64);
        wall.push(t0.elapsed().as_nanos() as f64 / iters as f64);
    }
    synchronize(d).expect("the device");
    let n = if quick { 1 << 10 } else { 1 << 24 };
    let (x, y) = (m.ones([n], DType::F32), m.ones([n], DType::F32));
    let timed = |f: &dyn Fn() -> NDArray| {
        // Few repeats: on a software driver a 2048 matmul takes seconds.
        median_ns(r.min(3), 1, || {
            let c = f();
            synchronize(d).expect("the device");
            c.close();
        })
    };
    let add = timed(&|| x + y);
    let sum = timed(&|| x.sum());
    let k = if quick { 64 } else { 2048 };
    let (p, q) = (m.ones([k, k], DType::F32), m.ones([k, k], DType::F32));
    let mm = timed(&|| p.matmul(q));
    // The README's loop with autograd, data and parameters on the device: one epoch of
    // 100 steps, then a wait for the device.
    let data = make_data(&m);
    let params = new_params(&m, true);
    let slices = batches();
    let steps = if quick { 3 } else { slices.len() };
    let linreg = median_ns(r.min(5), it(3), || {
        linreg_steps(data, params, &slices, steps, true);
        synchronize(d).expect("the device");
    }) / 1e3
        / steps as f64;
    let mlp = gpu_digits_step_us(&m, d, false, quick, r);
    let cnn = gpu_digits_step_us(&m, d, true, quick, r);
    // conv2d forward and backward as `conv2d_fwd_bwd_us`, then a wait for the device.
    let conv = {
        let batch = if quick { 2 } else { 32 };
        let x = m.random_normal(0.0, 1.0, [batch, 16, 8, 8], DType::F32);
        let w = m.random_normal(0.0, 0.1, [32, 16, 3, 3], DType::F32);
        let b = m.zeros([32], DType::F32);
        for p in [x, w, b] {
            p.set_requires_gradient(true);
        }
        let t = median_ns(r.min(5), it(20), || {
            let _s = NDScope::new();
            let gc = GradientCollector::new();
            let y = x.conv2d(w, Some(b), [1, 1], [1, 1], [1, 1], 1);
            gc.backward(y.sum()).expect("recorded");
            synchronize(d).expect("the device");
        }) / 1e3;
        for p in [x, w, b] {
            p.close();
        }
        t
    };
    m.close();
    let bytes = (n * 4) as f64;
    [
        Some(median(cpu)),
        Some(median(wall)),
        Some(3.0 * bytes / add),
        Some(bytes / sum),
        Some(2.0 * (k * k * k) as f64 / mm),
        Some(linreg),
        Some(mlp),
        Some(cnn),
        Some(conv),
    ]
}

/// Microseconds per training step of the digits MLP (`cnn`: the digits CNN) on device
/// `d` (batches of 32 drawn on the device, I64 labels), Adam's state there too.
#[cfg(feature = "gpu")]
fn gpu_digits_step_us(m: &NDManager, d: ndscope::Device, cnn: bool, quick: bool, r: usize) -> f64 {
    use ndscope::nn::{Conv2d, Flatten, Linear, MaxPool2d, Module, Relu, Sequential};
    use ndscope::optim::{Adam, AdamConfig, Optimizer};
    let model = if cnn {
        // As examples/digits --model cnn.
        Sequential::new(m)
            .add_with(|mm| Conv2d::builder(1, 16, 3).padding(1).build(mm))
            .add(Relu::new())
            .add(MaxPool2d::new(2))
            .add_with(|mm| Conv2d::builder(16, 32, 3).padding(1).build(mm))
            .add(Relu::new())
            .add(MaxPool2d::new(2))
            .add(Flatten::new())
            .add_with(|mm| Linear::new(mm, 32 * 2 * 2, 10))
    } else {
        Sequential::new(m)
            .add_with(|mm| Linear::new(mm, 64, 128))
            .add(Relu::new())
            .add_with(|mm| Linear::new(mm, 128, 10))
    };
    let mut opt = Adam::new(m, &model.parameters(), AdamConfig::default());
    let x = m.random_uniform(0.0, 16.0, [32, 64], DType::F32);
    let x = if cnn { x.reshape([32, 1, 8, 8]) } else { x };
    let labels: Vec<i64> = (0..32).map(|i| i % 10).collect();
    let y = m.create(&labels, [32]);
    let steps = match (quick, cnn) {
        (true, _) => 2,
        (false, true) => 10,
        (false, false) => 50,
    };
    let mut step = || {
        let _s = NDScope::new();
        let gc = GradientCollector::new();
        gc.backward(model.forward(x).cross_entropy(y))
            .expect("backward");
        drop(gc);
        opt.step();
    };
    step(); // warm up (pipelines, the pool, bind groups)
    median_ns(r.min(5), 1, || {
        for _ in 0..steps {
            step();
        }
        ndscope::synchronize(d).expect("the device");
    }) / 1e3
        / steps as f64
}

#[cfg(not(feature = "gpu"))]
fn gpu_keys(_: bool, _: usize) -> [Option<f64>; GPU_KEYS] {
    [None; GPU_KEYS]
}

/// How many figures [`gpu_keys`] gives.
const GPU_KEYS: usize = 9;
