"""examples/digits.rs in PyTorch (eager, CPU, one thread): the same two models, optimizer,
schedule, batches and split, printing one JSON line per run with the example's --json
keys (impl "pytorch").

- Data: data/digits.csv.gz (scikit-learn's digits), pixels / 16 as float32; the first
  1437 samples train, the last 360 test.
- `mlp`: Linear(64, 128), ReLU, Linear(128, 10).
- `cnn`: Conv2d(1, 16, 3, padding=1), ReLU, MaxPool2d(2), Conv2d(16, 32, 3, padding=1),
  ReLU, MaxPool2d(2), Flatten, Linear(128, 10).
- PyTorch's default initialisation (torch.manual_seed(seed)), Adam(lr=1e-3), batches
  of 32 (the last of each epoch has 29), mean cross-entropy, 30 epochs, no schedule.
- Batch order: ndscope's seeded permutation (SplitMix64 Fisher-Yates, reimplemented
  below from src/data.rs), so both programs see the same batches in the same order.
- live_bytes_per_epoch: PyTorch has no counter of live CPU tensor bytes, so this is the
  process's resident set size after each epoch (live_bytes_kind "rss"), which shows
  whether memory stays flat.

Not run on the project machine (PyPI's torch pulls gigabytes of CUDA packages there);
run it where `pip install torch` works:

    python3 bench/digits_torch.py [--model mlp|cnn|both] [--epochs N] [--seed S] [--quick]
"""
import gzip
import json
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
DIGITS = os.path.join(HERE, "..", "data", "digits.csv.gz")
TEST, BATCH, LR = 360, 32, 1e-3
M64 = (1 << 64) - 1


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


def build(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 2 * 2, 10),
    )


def run(kind, epochs, seed, quick):
    torch.manual_seed(seed)
    x, y = load_digits()
    n_train = len(y) - TEST
    shape = (-1, 64) if kind == "mlp" else (-1, 1, 8, 8)
    xtr = torch.from_numpy(x[:n_train]).reshape(shape)
    ytr = torch.from_numpy(y[:n_train])
    xte = torch.from_numpy(x[n_train:]).reshape(shape)
    yte = torch.from_numpy(y[n_train:])
    model = build(kind)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    per_epoch = 4 if quick else -(-n_train // BATCH)
    steps, seconds, live, losses, accs = 0, 0.0, [], [], []
    for epoch in range(epochs):
        order = torch.tensor(permutation(n_train, seed, epoch))
        model.train()
        total = 0.0
        t0 = time.perf_counter()
        for k in range(per_epoch):
            rows = order[k * BATCH : (k + 1) * BATCH]
            xb, yb = xtr[rows], ytr[rows]
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            total += loss.item()
        seconds += time.perf_counter() - t0
        steps += per_epoch
        losses.append(total / per_epoch)
        model.eval()
        with torch.no_grad():
            accs.append((model(xte).argmax(dim=1) == yte).float().mean().item())
        live.append(rss_bytes())
    return {
        "impl": "pytorch",
        "model": kind,
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
        "torch": torch.__version__,
    }


def main():
    args = sys.argv[1:]
    quick = "--quick" in args
    epochs = int(args[args.index("--epochs") + 1]) if "--epochs" in args else (1 if quick else 30)
    seed = int(args[args.index("--seed") + 1]) if "--seed" in args else 0
    which = args[args.index("--model") + 1] if "--model" in args else "both"
    kinds = ["mlp", "cnn"] if which == "both" else [which]
    torch.set_num_threads(1)
    for kind in kinds:
        print(json.dumps(run(kind, epochs, seed, quick)), flush=True)


if __name__ == "__main__":
    main()
