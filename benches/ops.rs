//! Criterion benchmarks of the workloads (see `BENCHMARKS.md`; the quick
//! one-line summary is `cargo run --release --example bench -- --json`).

use criterion::{Criterion, criterion_group, criterion_main};
use ndscope::{DType, NDManager};
use std::hint::black_box;

fn small_ops(c: &mut Criterion) {
    let m = NDManager::new();
    let a = m.random_uniform(0.0, 1.0, [10], DType::F32);
    let b = m.random_uniform(0.0, 1.0, [10], DType::F32);
    c.bench_function("add10", |bench| {
        bench.iter(|| black_box(a + b).close());
    });
    let x = m.random_uniform(0.0, 1.0, [1000, 2], DType::F32);
    let w = m.random_uniform(0.0, 1.0, [2, 1], DType::F32);
    c.bench_function("matmul_1000x2x1", |bench| {
        bench.iter(|| black_box(x.matmul(w)).close());
    });
    // Op latency must not depend on how many arrays are live elsewhere.
    let other = NDManager::new();
    for _ in 0..1_000_000 {
        other.zeros([1], DType::F32);
    }
    c.bench_function("add10_with_1M_live", |bench| {
        bench.iter(|| black_box(a + b).close());
    });
    other.close();
    m.close();
}

fn large_ops(c: &mut Criterion) {
    let m = NDManager::new();
    let n = 1 << 24;
    let a = m.random_uniform(0.0, 1.0, [n], DType::F32);
    let b = m.random_uniform(0.0, 1.0, [n], DType::F32);
    let mut g = c.benchmark_group("large");
    g.sample_size(20);
    g.bench_function("add16M", |bench| {
        bench.iter(|| black_box(a + b).close());
    });
    g.bench_function("sum16M", |bench| {
        bench.iter(|| black_box(a.sum()).close());
    });
    let k = 2048;
    let ma = m.random_uniform(0.0, 1.0, [k, k], DType::F32);
    let mb = m.random_uniform(0.0, 1.0, [k, k], DType::F32);
    g.sample_size(10);
    g.bench_function("matmul2048", |bench| {
        bench.iter(|| black_box(ma.matmul(mb)).close());
    });
    g.finish();
    m.close();
}

criterion_group!(benches, small_ops, large_ops);
criterion_main!(benches);
