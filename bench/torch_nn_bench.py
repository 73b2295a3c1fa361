"""The nn workloads of examples/bench.rs (`conv2d_fwd_bwd_us`, `cross_entropy_fwd_bwd_us`)
in PyTorch (one thread) if it can be imported, else in numpy (im2col + matmul forward
and backward; softmax cross-entropy forward and backward written out). Prints one
JSON line; "impl" says which one ran.

conv2d: input [32,16,8,8] f32, 32 filters 3x3, padding 1, stride 1, with bias, loss
sum(y), gradients for the input, the weight and the bias, per iteration.
cross_entropy: logits [32,10] f32, int64 labels, mean over the batch, gradient for the
logits, per iteration.

Usage: python3 bench/torch_nn_bench.py [--quick] [--numpy]
(`--numpy` forces the numpy version even where PyTorch is installed.)
"""
import json
import sys
import time

import numpy as np

N, C, H, W, O, K = 32, 16, 8, 8, 32, 3
BATCH, CLASSES = 32, 10


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


def torch_workloads(quick):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    n = 2 if quick else N
    x = torch.randn(n, C, H, W, requires_grad=True)
    w = (torch.randn(O, C, K, K) * 0.1).requires_grad_()
    b = torch.zeros(O, requires_grad=True)

    def conv():
        for p in (x, w, b):
            p.grad = None
        F.conv2d(x, w, b, stride=1, padding=1).sum().backward()

    logits = torch.randn(BATCH, CLASSES, requires_grad=True)
    labels = torch.randint(0, CLASSES, (BATCH,))

    def ce():
        logits.grad = None
        F.cross_entropy(logits, labels).backward()

    return "torch " + torch.__version__, 1, conv, ce


def numpy_workloads(quick):
    rng = np.random.default_rng(0)
    n = 2 if quick else N
    x = rng.standard_normal((n, C, H, W), dtype=np.float32)
    w = rng.standard_normal((O, C, K, K), dtype=np.float32) * np.float32(0.1)
    b = np.zeros(O, dtype=np.float32)
    pad = 1
    oh, ow = H + 2 * pad - K + 1, W + 2 * pad - K + 1

    def conv():
        # Forward: im2col [C*K*K, n*oh*ow], then one matmul.
        xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        win = np.lib.stride_tricks.sliding_window_view(xp, (K, K), axis=(2, 3))
        col = win.transpose(1, 4, 5, 0, 2, 3).reshape(C * K * K, n * oh * ow)
        wm = w.reshape(O, C * K * K)
        y = (wm @ col).reshape(O, n, oh, ow) + b[:, None, None, None]
        y = y.transpose(1, 0, 2, 3)
        y.sum()
        # Backward of sum(y): the output gradient is ones.
        gy = np.ones((O, n * oh * ow), dtype=np.float32)
        gb = gy.sum(axis=1)
        gw = (gy @ col.T).reshape(O, C, K, K)
        dcol = (wm.T @ gy).reshape(C, K, K, n, oh, ow)
        gxp = np.zeros_like(xp)
        for i in range(K):
            for j in range(K):
                gxp[:, :, i:i + oh, j:j + ow] += dcol[:, i, j].transpose(1, 0, 2, 3)
        gx = gxp[:, :, pad:pad + H, pad:pad + W]
        return gx, gw, gb

    logits = rng.standard_normal((BATCH, CLASSES), dtype=np.float32)
    labels = rng.integers(0, CLASSES, BATCH)
    rows = np.arange(BATCH)

    def ce():
        m = logits.max(axis=1, keepdims=True)
        e = np.exp(logits - m)
        s = e.sum(axis=1, keepdims=True)
        loss = np.mean(np.log(s[:, 0]) + m[:, 0] - logits[rows, labels])
        g = e / s
        g[rows, labels] -= 1
        g *= np.float32(1.0 / BATCH)
        return loss, g

    try:
        from threadpoolctl import threadpool_info

        threads = max((i.get("num_threads") or 1) for i in threadpool_info()) if threadpool_info() else 1
    except ImportError:
        threads = None
    return "numpy " + np.__version__ + " (im2col + matmul; PyTorch not importable)", threads, conv, ce


def main():
    quick = "--quick" in sys.argv
    r = 3 if quick else 15
    impl = None
    if "--numpy" not in sys.argv:
        try:
            impl, threads, conv, ce = torch_workloads(quick)
        except ImportError:
            impl = None
    if impl is None:
        impl, threads, conv, ce = numpy_workloads(quick)
    conv_us = median_ns(r, 2 if quick else 200, conv) / 1e3
    ce_us = median_ns(r, 20 if quick else 20_000, ce) / 1e3
    print(json.dumps({
        "impl": impl,
        "threads": threads,
        "conv2d_fwd_bwd_us": round(conv_us, 1),
        "cross_entropy_fwd_bwd_us": round(ce_us, 3),
    }))


if __name__ == "__main__":
    main()
