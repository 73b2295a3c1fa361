"""The nn workloads of examples/bench.rs (`conv2d_fwd_bwd_us`, `cross_entropy_fwd_bwd_us`)
in PyTorch (one thread) if it can be imported, else in numpy (im2col + matmul forward
and backward; softmax cross-entropy forward and backward written out). Prints one
JSON line; "impl" says which one ran.

conv2d: input [32,16,8,8] f32, 32 filters 3x3, padding 1, stride 1, with bias, loss
sum(y), gradients for the input, the weight and the bias, per iteration.
cross_entropy: logits [32,10] f32, int64 labels, mean over the batch, gradient for the
logits, per iteration.

With PyTorch it also times the CNN layers of examples/bench.rs (forward, then backward
of sum(y) with gradients for the input and every parameter), on [32,16,8,8] (the
digits CNN's first activation) and, as `*_big_*`, on [32,64,32,32]: max_pool2d 2x2
stride 2, batch_norm in training (running statistics updated, gamma and beta [C]),
layer_norm over [C,H,W] (gamma and beta [C,H,W]), and conv2d_big: 64 filters 3x3,
padding 1, bias. The numpy fallback prints none of these.

Usage: python3 bench/torch_nn_bench.py [--quick] [--numpy] [--only KEY[,KEY...]]
(`--numpy` forces the numpy version even where PyTorch is installed; `--only` times
just the named keys, e.g. `--only layernorm_big_fwd_bwd_us`, and prints null for the
others.)
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

    def layer(shape, f, params):
        x = torch.randn(*shape, requires_grad=True)
        ps = [p.requires_grad_() for p in params]

        def run():
            x.grad = None
            for p in ps:
                p.grad = None
            f(x, ps).sum().backward()

        return run

    def bn(shape):
        c = shape[1]
        rm, rv = torch.zeros(c), torch.ones(c)
        return layer(shape, lambda x, p: F.batch_norm(x, rm, rv, p[0], p[1], True, 0.1, 1e-5),
                     [torch.ones(c), torch.zeros(c)])

    def ln(shape):
        g = shape[1:]
        return layer(shape, lambda x, p: F.layer_norm(x, g, p[0], p[1], 1e-5),
                     [torch.ones(*g), torch.zeros(*g)])

    def small(shape):
        return (2,) + tuple(shape[1:]) if quick else tuple(shape)

    digits, big = small((32, 16, 8, 8)), small((32, 64, 32, 32))
    pool = lambda x, p: F.max_pool2d(x, 2, 2)
    layers = {
        "maxpool2d_fwd_bwd_us": (layer(digits, pool, []), 5_000),
        "maxpool2d_big_fwd_bwd_us": (layer(big, pool, []), 50),
        "batchnorm2d_fwd_bwd_us": (bn(digits), 5_000),
        "batchnorm2d_big_fwd_bwd_us": (bn(big), 50),
        "layernorm_fwd_bwd_us": (ln(digits), 5_000),
        "layernorm_big_fwd_bwd_us": (ln(big), 50),
        "conv2d_big_fwd_bwd_us": (layer(big, lambda x, p: F.conv2d(x, p[0], p[1], padding=1),
                                        [torch.randn(64, 64, 3, 3) * 0.05, torch.zeros(64)]), 10),
    }
    return "torch " + torch.__version__, 1, conv, ce, layers


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
    return "numpy " + np.__version__ + " (im2col + matmul; PyTorch not importable)", threads, conv, ce, {}


def main():
    quick = "--quick" in sys.argv
    r = 3 if quick else 15
    impl = None
    if "--numpy" not in sys.argv:
        try:
            impl, threads, conv, ce, layers = torch_workloads(quick)
        except ImportError:
            impl = None
    if impl is None:
        impl, threads, conv, ce, layers = numpy_workloads(quick)
    only = None
    if "--only" in sys.argv:
        only = set(sys.argv[sys.argv.index("--only") + 1].split(","))
    wanted = lambda key: only is None or key in only
    out = {"impl": impl, "threads": threads, "conv2d_fwd_bwd_us": None, "cross_entropy_fwd_bwd_us": None}
    if wanted("conv2d_fwd_bwd_us"):
        out["conv2d_fwd_bwd_us"] = round(median_ns(r, 2 if quick else 200, conv) / 1e3, 1)
    if wanted("cross_entropy_fwd_bwd_us"):
        out["cross_entropy_fwd_bwd_us"] = round(median_ns(r, 20 if quick else 20_000, ce) / 1e3, 3)
    for key, (f, iters) in layers.items():
        if wanted(key):
            out[key] = round(median_ns(r, max(1, iters // 1000) if quick else iters, f) / 1e3, 1)
        else:
            out[key] = None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
