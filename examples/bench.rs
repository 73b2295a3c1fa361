//! Micro-benchmarks behind the performance table in `BENCHMARKS.md`.
//!
//! Run: `cargo run --release --example bench -- --json` (one JSON line; without
//! `--json` a readable table). `--quick` is a smoke run for CI (tiny sizes and few
//! repeats, so it also runs in debug builds and under valgrind): its figures mean
//! nothing.
//! Every figure is the median over repeats of a timing loop.

use ndscope::{DType, NDArray, NDManager};
use std::hint::black_box;
use std::time::Instant;

/// Median of the per-iteration times (ns) over `repeats` loops of `iters` calls.
fn median_ns(repeats: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..iters.clamp(1, 1000) {
        f(); // warm up (caches, pool)
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

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    let quick = std::env::args().any(|a| a == "--quick");
    let r = if quick { 1 } else { 15 };
    // Iteration counts and sizes shrink by this factor in quick mode.
    let it = |n: usize| if quick { (n / 1000).max(1) } else { n };
    // `--only NAME` runs one workload (for profiling); the others report 0.
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    let run = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let m = NDManager::new();

    let a = m.random_uniform(0.0, 1.0, [10], DType::F32);
    let b = m.random_uniform(0.0, 1.0, [10], DType::F32);
    let add10_ns = if run("add10") {
        median_ns(r, it(200_000), op_then_close(|| a + b))
    } else {
        0.0
    };

    // The same op with 1,000,000 arrays live in another manager: must cost the same.
    let add10_1m_live_ns = if run("add10_1M_live") {
        let other = NDManager::new();
        for _ in 0..it(1_000_000) {
            other.zeros([1], DType::F32);
        }
        let t = median_ns(r, it(200_000), op_then_close(|| a + b));
        other.close();
        t
    } else {
        0.0
    };

    // Scope overhead: 1000 small arrays created in a scope and freed by its close,
    // against the same arrays created and closed one by one.
    let (scoped_ns, unscoped_ns) = if run("scope") {
        let scoped = median_ns(r, it(200), || {
            let _s = ndscope::NDScope::new();
            for _ in 0..1000 {
                m.zeros([4], DType::F32);
            }
        }) / 1000.0;
        let unscoped = median_ns(r, it(200), || {
            for _ in 0..1000 {
                m.zeros([4], DType::F32).close();
            }
        }) / 1000.0;
        (scoped, unscoped)
    } else {
        (0.0, 0.0)
    };

    let x = m.random_uniform(0.0, 1.0, [1000, 2], DType::F32);
    let w = m.random_uniform(0.0, 1.0, [2, 1], DType::F32);
    let matmul_small_us = if run("matmul_small") {
        median_ns(r, it(20_000), op_then_close(|| x.matmul(w))) / 1e3
    } else {
        0.0
    };

    // One linear-regression step, gradient written by hand (autograd lands separately):
    // 9 ops on [64,2] data inside a scope.
    let linreg_us = if run("linreg") {
        let xs = m.random_normal(0.0, 1.0, [64, 2], DType::F32);
        let ys = m.random_normal(0.0, 1.0, [64, 1], DType::F32);
        let w = m.zeros([2, 1], DType::F32);
        median_ns(r, it(20_000), || {
            let _s = ndscope::NDScope::new();
            let err = xs.matmul(w) - ys;
            black_box(err.square().mean());
            let grad = xs.transpose().matmul(err) * (2.0 / 64.0);
            w.try_subi(grad * 0.01).expect("same shape");
        }) / 1e3
    } else {
        0.0
    };

    let n = if quick { 1usize << 12 } else { 1usize << 24 };
    let big = run("add16M") || run("sum16M");
    let big_n = if big { n } else { 1 };
    let big_a = m.random_uniform(0.0, 1.0, [big_n], DType::F32);
    let big_b = m.random_uniform(0.0, 1.0, [big_n], DType::F32);
    let add16m_ms = if run("add16M") {
        median_ns(r, 10, op_then_close(|| big_a + big_b)) / 1e6
    } else {
        0.0
    };
    let add16m_gbps = (3 * 4 * n) as f64 / (add16m_ms * 1e6);

    let sum16m_ms = if run("sum16M") {
        median_ns(r, 20, op_then_close(|| big_a.sum())) / 1e6
    } else {
        0.0
    };

    let k = match (run("matmul2048"), quick) {
        (false, _) => 1,
        (true, true) => 64,
        (true, false) => 2048,
    };
    let ma = m.random_uniform(0.0, 1.0, [k, k], DType::F32);
    let mb = m.random_uniform(0.0, 1.0, [k, k], DType::F32);
    let mm_r = if quick { 1 } else { 5 };
    let matmul2048_ms = if run("matmul2048") {
        median_ns(mm_r, 2, op_then_close(|| ma.matmul(mb))) / 1e6
    } else {
        f64::NAN
    };
    let gflops = 2.0 * (k as f64).powi(3) / (matmul2048_ms * 1e6);

    let threads = rayon::current_num_threads();
    let rss = peak_rss_mb();
    if json {
        println!(
            "{{\"impl\":\"ndscope\",\"threads\":{threads},\"add10_ns\":{add10_ns:.1},\
             \"add10_1M_live_ns\":{add10_1m_live_ns:.1},\"scope_array_ns\":{scoped_ns:.1},\
             \"no_scope_array_ns\":{unscoped_ns:.1},\
             \"matmul_1000x2x1_us\":{matmul_small_us:.3},\"add16M_ms\":{add16m_ms:.3},\
             \"add16M_GBps\":{add16m_gbps:.2},\"matmul2048_ms\":{matmul2048_ms:.2},\
             \"matmul2048_GFLOPs\":{gflops:.1},\"sum16M_ms\":{sum16m_ms:.3},\"linreg_step_us\":{linreg_us:.3},\
             \"peak_rss_mb\":{rss:.1}}}"
        );
    } else {
        println!("threads                 {threads}");
        println!("add10                   {add10_ns:.1} ns");
        println!("add10, 1M arrays live    {add10_1m_live_ns:.1} ns");
        println!("array in scope / closed {scoped_ns:.1} / {unscoped_ns:.1} ns");
        println!("matmul [1000,2]x[2,1]   {matmul_small_us:.3} us");
        println!("add 16M f32             {add16m_ms:.3} ms ({add16m_gbps:.2} GB/s)");
        println!("matmul 2048^3 f32       {matmul2048_ms:.2} ms ({gflops:.1} GFLOP/s)");
        println!("sum 16M f32             {sum16m_ms:.3} ms");
        println!("linreg step (manual)    {linreg_us:.3} us");
        println!("peak RSS                {rss:.1} MiB");
    }
    m.close();
}
