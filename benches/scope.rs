//! Scope overhead: the cost per array of registering it in an `NDScope` and freeing it
//! when the scope closes, against the same allocations freed one by one without a
//! scope. Target: under 20 ns per array on top of the allocation.

use criterion::{Criterion, criterion_group, criterion_main};
use ndscope::{DType, NDManager, NDScope};

const N: usize = 1000;

fn scope_overhead(c: &mut Criterion) {
    let m = NDManager::new();
    let mut g = c.benchmark_group("scope_1000_arrays");
    g.bench_function("no_scope_create_close", |b| {
        let mut v = Vec::with_capacity(N);
        b.iter(|| {
            for _ in 0..N {
                v.push(m.zeros([4], DType::F32));
            }
            for a in v.drain(..) {
                a.close();
            }
        });
    });
    g.bench_function("scope_create_then_close_scope", |b| {
        b.iter(|| {
            let _s = NDScope::new();
            for _ in 0..N {
                m.zeros([4], DType::F32);
            }
        });
    });
    g.finish();
    m.close();
}

criterion_group!(benches, scope_overhead);
criterion_main!(benches);
