"""The digits MLP of examples/digits.rs in numpy, as a peer measured where PyTorch
cannot be installed (bench/digits_torch.py is the PyTorch version of both models).

Same data and split (data/digits.csv.gz, pixels / 16; the first 1437 samples train,
the last 360 test), same model (64-128-10, ReLU; PyTorch's default initialisation:
weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in))), same optimizer (Adam, lr 1e-3,
betas (0.9, 0.999), eps 1e-8, PyTorch's update rule), batches of 32 in the same
order (ndscope's seeded SplitMix64 Fisher-Yates permutation, reimplemented below; the
last batch of an epoch has 29 samples), mean cross-entropy, float32, one BLAS thread.
Forward and backward are written out by hand (no autograd).

Prints one JSON line with the keys of the example's --json: impl ("numpy"), model,
epochs, steps, us_per_step, test_accuracy, live_bytes_per_epoch. numpy has no
allocator counter, so live_bytes_per_epoch is the process's resident set size after
each epoch (live_bytes_kind "rss"): it shows whether memory stays flat, not what
ndscope's figure counts.

Usage: python3 bench/digits_numpy.py [--epochs N] [--seed S] [--quick]
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import gzip  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DIGITS = os.path.join(HERE, "..", "data", "digits.csv.gz")
TEST, BATCH, LR = 360, 32, 1e-3
BETAS, EPS = (0.9, 0.999), 1e-8
M64 = (1 << 64) - 1


# ---------------------------------------------------------------- data and order


def load_digits():
    """(x float32 [1797, 64] in [0, 1], y int64 [1797]), as ndscope::data::load_digits."""
    with gzip.open(DIGITS, "rt") as f:
        a = np.loadtxt(f, delimiter=",")
    return (a[:, :64] / 16.0).astype(np.float32), a[:, 64].astype(np.int64)


def _splitmix(state):
    """One SplitMix64 step: (new state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def permutation(n, seed, epoch):
    """ndscope::data's permutation of 0..n for (seed, epoch) (src/data.rs)."""
    key = _splitmix(seed & M64)[1] ^ _splitmix((~epoch) & M64)[1]
    state, p = key, list(range(n))
    for i in range(n - 1, 0, -1):
        bound = i + 1
        threshold = ((-bound) & M64) % bound
        while True:
            state, x = _splitmix(state)
            m = x * bound
            if (m & M64) >= threshold:
                j = m >> 64
                break
        p[i], p[j] = p[j], p[i]
    return p


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------- model and Adam


def init_linear(rng, fan_in, fan_out):
    b = 1.0 / np.sqrt(fan_in)
    w = rng.uniform(-b, b, (fan_out, fan_in)).astype(np.float32)
    bias = rng.uniform(-b, b, fan_out).astype(np.float32)
    return w, bias


class Adam:
    """torch.optim.Adam's update (no weight decay, no amsgrad)."""

    def __init__(self, params):
        self.params = params
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.t = 0

    def step(self, grads):
        self.t += 1
        b1, b2 = BETAS
        c1 = 1.0 - b1**self.t
        c2 = 1.0 - b2**self.t
        step_size = np.float32(LR / c1)
        sqrt_c2 = np.float32(np.sqrt(c2))
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            m *= np.float32(b1)
            m += np.float32(1.0 - b1) * g
            v *= np.float32(b2)
            v += np.float32(1.0 - b2) * g * g
            p -= step_size * m / (np.sqrt(v) / sqrt_c2 + np.float32(EPS))


def forward(params, x):
    w1, b1, w2, b2 = params
    h = x @ w1.T + b1
    a = np.maximum(h, 0)
    return h, a, a @ w2.T + b2


def train_step(params, opt, x, y):
    """One step: loss (mean cross-entropy), backward by hand, Adam."""
    w1, b1, w2, b2 = params
    h, a, logits = forward(params, x)
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    s = e.sum(axis=1, keepdims=True)
    n = x.shape[0]
    loss = float(np.mean(np.log(s[:, 0]) - z[np.arange(n), y]))
    d = e / s
    d[np.arange(n), y] -= 1.0
    d /= np.float32(n)
    dw2 = d.T @ a
    db2 = d.sum(axis=0)
    dh = (d @ w2) * (h > 0)
    dw1 = dh.T @ x
    db1 = dh.sum(axis=0)
    opt.step([dw1, db1, dw2, db2])
    return loss


def main():
    args = sys.argv[1:]
    quick = "--quick" in args
    epochs = int(args[args.index("--epochs") + 1]) if "--epochs" in args else (1 if quick else 30)
    seed = int(args[args.index("--seed") + 1]) if "--seed" in args else 0
    x, y = load_digits()
    n_train = len(y) - TEST
    xtr, ytr, xte, yte = x[:n_train], y[:n_train], x[n_train:], y[n_train:]
    rng = np.random.default_rng(seed)
    w1, b1 = init_linear(rng, 64, 128)
    w2, b2 = init_linear(rng, 128, 10)
    params = [w1, b1, w2, b2]
    opt = Adam(params)
    steps, seconds, live, losses, accs = 0, 0.0, [], [], []
    per_epoch = 4 if quick else -(-n_train // BATCH)
    for epoch in range(epochs):
        order = np.array(permutation(n_train, seed, epoch))
        t0 = time.perf_counter()
        total = 0.0
        for k in range(per_epoch):
            rows = order[k * BATCH : (k + 1) * BATCH]
            total += train_step(params, opt, xtr[rows], ytr[rows])
        seconds += time.perf_counter() - t0
        steps += per_epoch
        losses.append(total / per_epoch)
        accs.append(float(np.mean(forward(params, xte)[2].argmax(axis=1) == yte)))
        live.append(rss_bytes())
    print(
        json.dumps(
            {
                "impl": "numpy",
                "model": "mlp",
                "epochs": epochs,
                "steps": steps,
                "us_per_step": round(seconds * 1e6 / max(steps, 1), 3),
                "test_accuracy": round(accs[-1], 4),
                "live_bytes_per_epoch": live,
                "live_bytes_kind": "rss",
                "train_seconds": round(seconds, 4),
                "loss_per_epoch": [round(v, 5) for v in losses],
                "test_accuracy_per_epoch": [round(v, 4) for v in accs],
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 2),
                "numpy": np.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
