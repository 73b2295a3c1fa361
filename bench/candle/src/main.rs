//! The workloads of ndscope's `examples/bench.rs` that have a candle-core counterpart,
//! measured the same way (median over repeats of a timing loop; the same sizes, loop
//! and step counts). Prints one JSON line with `--json`, else a table; `--quick` is a
//! smoke run whose figures mean nothing; `--only NAME` runs one workload (the others
//! are `null`; `--only parallel` runs the four `parallel_2t_*` ones).
//!
//! Differences forced by the API: candle tensors are freed on drop (there are no
//! scopes), and candle's ops return new tensors, so the manual-gradient loops rebind the
//! parameters (`w = (w - g * lr)?`), while the autograd loops keep them in `Var`s
//! updated with `Var::set`, as candle-nn's SGD does.
//!
//! candle's CPU matmul hands every product, even [10,2]x[2,1], to rayon when it has more
//! than one thread (`RAYON_NUM_THREADS`, default the core count); on the 2-core project
//! machine that costs ~75 µs per training step. Every workload here is tiny, so
//! `bench/compare.sh` runs this program with `RAYON_NUM_THREADS=1` (candle's best
//! setting for them) unless told otherwise; the JSON line reports it as `threads`.

use candle_core::{DType, Device, Result, Tensor, Var};
use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

/// Rows of the linear-regression data set.
const N: usize = 1000;
/// Minibatch size of the linear-regression loop.
const BATCH: usize = 10;
/// SGD learning rate of the linear-regression loop.
const LR: f64 = 0.03;

const CPU: Device = Device::Cpu;

/// Median of the per-iteration times (ns) over `repeats` loops of `iters` calls.
fn median_ns(repeats: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..iters.clamp(1, 1000) {
        f(); // warm up
    }
    let mut v: Vec<f64> = (0..repeats)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The README's data set: X [N,2] ~ N(0,1), y = X·[2,-3.4] + 4.2 + N(0,0.01).
fn make_data() -> Result<(Tensor, Tensor)> {
    let true_w = Tensor::new(&[[2.0f32], [-3.4]], &CPU)?;
    let x = Tensor::randn(0f32, 1.0, (N, 2), &CPU)?;
    let y = ((x.matmul(&true_w)? + 4.2)? + Tensor::randn(0f32, 0.01, (N, 1), &CPU)?)?;
    Ok((x, y))
}

/// `steps` SGD steps of the README's loop on (x, y) with the gradient written by hand
/// (the loss is still computed, as autograd's forward pass does).
fn linreg_steps_manual(
    (x, y): &(Tensor, Tensor),
    (w, b): &mut (Tensor, Tensor),
    steps: usize,
) -> Result<()> {
    for step in 0..steps {
        let i = (step % (N / BATCH)) * BATCH;
        let (xb, yb) = (x.narrow(0, i, BATCH)?, y.narrow(0, i, BATCH)?);
        let err = xb.matmul(w)?.broadcast_add(b)?.sub(&yb)?;
        black_box((err.sqr()? / 2.0)?);
        let gw = xb.t()?.matmul(&err)?;
        let gb = err.sum(0)?;
        *w = (&*w - (gw * (LR / BATCH as f64))?)?;
        *b = (&*b - (gb * (LR / BATCH as f64))?)?;
    }
    Ok(())
}

/// `steps` SGD steps of the README's loop, gradients from `backward`.
fn linreg_steps_autograd(
    (x, y): &(Tensor, Tensor),
    (w, b): &(Var, Var),
    steps: usize,
) -> Result<()> {
    for step in 0..steps {
        let i = (step % (N / BATCH)) * BATCH;
        let (xb, yb) = (x.narrow(0, i, BATCH)?, y.narrow(0, i, BATCH)?);
        let l = (xb.matmul(w)?.broadcast_add(b)?.sub(&yb)?.sqr()? / 2.0)?;
        let grads = l.backward()?;
        let gw = grads.get(w).expect("w's gradient");
        let gb = grads.get(b).expect("b's gradient");
        w.set(&(w.as_tensor() - (gw * (LR / BATCH as f64))?)?)?;
        b.set(&(b.as_tensor() - (gb * (LR / BATCH as f64))?)?)?;
    }
    Ok(())
}

/// `steps` steps with fresh parameters (w ~ N(0,0.01) [2,1], b = 0 [1]), after a short
/// warm-up; returns the (start, end) of the timed part, the start after `barrier`.
fn train(
    data: &(Tensor, Tensor),
    steps: usize,
    autograd: bool,
    barrier: &Barrier,
) -> Result<(Instant, Instant)> {
    let w = Tensor::randn(0f32, 0.01, (2, 1), &CPU)?;
    let b = Tensor::zeros(1, DType::F32, &CPU)?;
    if autograd {
        let p = (Var::from_tensor(&w)?, Var::from_tensor(&b)?);
        linreg_steps_autograd(data, &p, steps.min(20))?;
        barrier.wait();
        let t0 = Instant::now();
        linreg_steps_autograd(data, &p, steps)?;
        Ok((t0, Instant::now()))
    } else {
        let mut p = (w, b);
        linreg_steps_manual(data, &mut p, steps.min(20))?;
        barrier.wait();
        let t0 = Instant::now();
        linreg_steps_manual(data, &mut p, steps)?;
        Ok((t0, Instant::now()))
    }
}

/// Seconds for `threads` threads, started together, to each run `steps` steps with their
/// own parameters, on `shared` data or (None) on a data set each thread creates itself;
/// from the first start to the last finish.
fn parallel_secs(
    threads: usize,
    steps: usize,
    autograd: bool,
    shared: Option<&(Tensor, Tensor)>,
) -> f64 {
    let barrier = Barrier::new(threads);
    let times: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let own;
                    let data = match shared {
                        Some(d) => d,
                        None => {
                            own = make_data().expect("data");
                            &own
                        }
                    };
                    train(data, steps, autograd, &barrier).expect("training")
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

/// Throughput of two threads over that of one. Steps are calibrated so one thread alone
/// runs for about 0.4 s; the median of `reps` timings of each is taken.
fn parallel_speedup(
    quick: bool,
    reps: usize,
    autograd: bool,
    shared: Option<&(Tensor, Tensor)>,
) -> f64 {
    let steps = if quick {
        10
    } else {
        let probe = 1000;
        let t = parallel_secs(1, probe, autograd, shared);
        ((0.4 / t * probe as f64) as usize).clamp(probe, 20_000_000)
    };
    let (mut one, mut two) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        one.push(parallel_secs(1, steps, autograd, shared));
        two.push(parallel_secs(2, steps, autograd, shared));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    2.0 * median(&mut one) / median(&mut two)
}

fn fmt(v: Option<f64>, prec: usize, json: bool) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.prec$}"),
        _ if json => "null".to_string(),
        _ => "-".to_string(),
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|a| a == "--json");
    let quick = args.iter().any(|a| a == "--quick");
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    let run = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let r = if quick { 1 } else { 15 };
    let it = |n: usize| if quick { (n / 1000).max(1) } else { n };

    let a = Tensor::rand(0f32, 1.0, 10, &CPU)?;
    let b = Tensor::rand(0f32, 1.0, 10, &CPU)?;
    let add10_ns = run("add10").then(|| {
        median_ns(r, it(200_000), || {
            let c = (&a + &b).expect("add");
            drop(black_box(c));
        })
    });

    // ndscope's `linreg`: 9 ops on [64,2] data.
    let linreg_us = run("linreg").then(|| {
        let xs = Tensor::randn(0f32, 1.0, (64, 2), &CPU).expect("xs");
        let ys = Tensor::randn(0f32, 1.0, (64, 1), &CPU).expect("ys");
        let mut w = Tensor::zeros((2, 1), DType::F32, &CPU).expect("w");
        median_ns(r, it(20_000), || {
            let step = || -> Result<Tensor> {
                let err = (xs.matmul(&w)? - &ys)?;
                black_box(err.sqr()?.mean_all()?);
                let grad = (xs.t()?.matmul(&err)? * (2.0 / 64.0))?;
                &w - (grad * 0.01)?
            };
            w = step().expect("linreg step");
        }) / 1e3
    });

    let linreg_autograd_us = run("linreg_autograd").then(|| {
        let data = make_data().expect("data");
        let p = (
            Var::randn(0f32, 0.01, (2, 1), &CPU).expect("w"),
            Var::zeros(1, DType::F32, &CPU).expect("b"),
        );
        let steps = if quick { 10 } else { N / BATCH };
        median_ns(r, it(20), || {
            linreg_steps_autograd(&data, &p, steps).expect("training")
        }) / 1e3
            / steps as f64
    });

    let par_reps = if quick { 1 } else { 5 };
    let par = |name: &str, autograd: bool, shared: bool| {
        (run("parallel") || run(name)).then(|| {
            let data = shared.then(|| make_data().expect("data"));
            parallel_speedup(quick, par_reps, autograd, data.as_ref())
        })
    };
    let par_indep = par("parallel_2t_speedup_independent", false, false);
    let par_shared = par("parallel_2t_speedup_shared", false, true);
    let par_indep_ag = par("parallel_2t_speedup_independent_autograd", true, false);
    let par_shared_ag = par("parallel_2t_speedup_shared_autograd", true, true);

    let rows: &[(&str, &str, Option<f64>, usize, &str)] = &[
        ("add10_ns", "add10", add10_ns, 1, "ns"),
        ("linreg_step_us", "linreg step (manual)", linreg_us, 3, "us"),
        (
            "linreg_autograd_step_us",
            "linreg step (autograd)",
            linreg_autograd_us,
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
    ];
    // The threads candle gives gemm (RAYON_NUM_THREADS, else the core count).
    let threads = candle_core::utils::get_num_threads();
    if json {
        let fields: Vec<String> = rows
            .iter()
            .map(|(key, _, v, prec, _)| format!("\"{key}\":{}", fmt(*v, *prec, true)))
            .collect();
        println!(
            "{{\"impl\":\"candle-core\",\"threads\":{threads},{}}}",
            fields.join(",")
        );
    } else {
        println!("{:<38} {threads}", "threads");
        for (_, label, v, prec, unit) in rows {
            println!("{label:<38} {} {unit}", fmt(*v, *prec, false));
        }
    }
    Ok(())
}
