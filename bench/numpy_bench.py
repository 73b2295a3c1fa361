"""The micro-benchmarks of examples/bench.rs in numpy; prints one JSON line."""
import json
import resource
import sys
import time

import numpy as np


def median_ns(repeats, iters, f):
    for _ in range(min(iters, 1000)):
        f()
    times = []
    for _ in range(repeats):
        t = time.perf_counter_ns()
        for _ in range(iters):
            f()
        times.append((time.perf_counter_ns() - t) / iters)
    times.sort()
    return times[len(times) // 2]


def main():
    quick = "--quick" in sys.argv
    r = 3 if quick else 15
    rng = np.random.default_rng(0)
    a = rng.random(10, dtype=np.float32)
    b = rng.random(10, dtype=np.float32)
    add10 = median_ns(r, 200_000, lambda: a + b)
    x = rng.random((1000, 2), dtype=np.float32)
    w = rng.random((2, 1), dtype=np.float32)
    mm_small = median_ns(r, 20_000, lambda: x @ w) / 1e3
    xs = rng.standard_normal((64, 2), dtype=np.float32)
    ys = rng.standard_normal((64, 1), dtype=np.float32)
    wl = np.zeros((2, 1), dtype=np.float32)

    def linreg():
        err = xs @ wl - ys
        (err * err).mean()
        grad = xs.T @ err * np.float32(2.0 / 64.0)
        wl.__isub__(grad * np.float32(0.01))

    linreg_us = median_ns(r, 20_000, linreg) / 1e3
    n = 1 << 24
    big_a = rng.random(n, dtype=np.float32)
    big_b = rng.random(n, dtype=np.float32)
    add16 = median_ns(r, 10, lambda: big_a + big_b) / 1e6
    sum16 = median_ns(r, 20, lambda: big_a.sum()) / 1e6
    col = rng.random((1000 if quick else 100_000, 1), dtype=np.float32)
    bias = rng.random(1, dtype=np.float32)
    col_bias = median_ns(r, 200, lambda: col + bias) / 1e3
    st = 64 if quick else 1000
    ta = rng.random((st, st), dtype=np.float32)
    tb = rng.random((st, st), dtype=np.float32)
    t_scale = median_ns(r, 50, lambda: ta.T * np.float32(2.0)) / 1e3
    t_add = median_ns(r, 50, lambda: ta.T + tb) / 1e3
    side = 64 if quick else 4096
    mat = rng.random((side, side), dtype=np.float32)
    axis_gbps = [4 * side * side / median_ns(r, 20, lambda ax=ax: mat.sum(axis=ax)) for ax in (0, 1)]
    k = 2048
    ma = rng.random((k, k), dtype=np.float32)
    mb = rng.random((k, k), dtype=np.float32)
    mm = median_ns(1 if quick else 5, 2, lambda: ma @ mb) / 1e6
    try:
        from threadpoolctl import threadpool_info

        blas = [(i.get("internal_api"), i.get("architecture"), i.get("num_threads")) for i in threadpool_info()]
    except ImportError:
        blas = "threadpoolctl not installed"
    print(json.dumps({
        "impl": "numpy " + np.__version__,
        "blas": str(blas),
        "add10_ns": round(add10, 1),
        "matmul_1000x2x1_us": round(mm_small, 3),
        "add16M_ms": round(add16, 3),
        "add16M_GBps": round(3 * 4 * n / (add16 * 1e6), 2),
        "matmul2048_ms": round(mm, 2),
        "matmul2048_GFLOPs": round(2 * k**3 / (mm * 1e6), 1),
        "sum16M_ms": round(sum16, 3),
        "sum16M_GBps": round(4 * n / (sum16 * 1e6), 2),
        "add_col_bias_us": round(col_bias, 2),
        "transposed_scale_us": round(t_scale, 1),
        "transposed_add_us": round(t_add, 1),
        "sum_axis0_GBps": round(axis_gbps[0], 1),
        "sum_axis1_GBps": round(axis_gbps[1], 1),
        "linreg_step_us": round(linreg_us, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }))


if __name__ == "__main__":
    main()
