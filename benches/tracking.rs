//! The price of always-on tracking (creation sites and tombstones for use-after-close
//! errors) on the smallest op: `a + b` on 10 f32 elements, then `close()`, in one
//! scope. Run it twice and compare:
//!
//! ```sh
//! cargo bench --bench tracking
//! cargo bench --bench tracking --features untracked   # tombstones compiled out
//! ```
//!
//! Target: tracking costs under 5% of the per-op time (figures in BENCHMARKS.md).

use criterion::{Criterion, criterion_group, criterion_main};
use ndscope::{DType, NDManager, NDScope};
use std::hint::black_box;

fn add10_close(c: &mut Criterion) {
    let m = NDManager::new();
    let a = m.ones([10], DType::F32);
    let b = m.ones([10], DType::F32);
    let name = if cfg!(feature = "untracked") {
        "add10_close_untracked"
    } else {
        "add10_close_tracked"
    };
    let _s = NDScope::new();
    c.bench_function(name, |bench| {
        bench.iter(|| {
            let x = black_box(a + b);
            x.close();
        })
    });
    m.close();
}

criterion_group!(benches, add10_close);
criterion_main!(benches);
