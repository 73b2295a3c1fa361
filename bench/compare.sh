#!/usr/bin/env bash
# Run the same micro-benchmarks in ndscope and numpy, one after the other in one run,
# and print both JSON lines and the ratios (numpy time / ndscope time: > 1 means
# ndscope is faster). Needs `pip install numpy` (threadpoolctl optional).
# Usage: bench/compare.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --example bench >/dev/null 2>&1
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE may be set on this machine for old OpenBLAS
# builds; they slow a current numpy, so unset them for the numpy run only.
nd=$(./target/release/examples/bench --json "$@")
np=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python3 bench/numpy_bench.py "$@")
echo "$nd"
echo "$np"
python3 - "$nd" "$np" <<'PY'
import json, sys
nd, np = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"{'workload':22} {'ndscope':>10} {'numpy':>10} {'numpy/ndscope':>14}")
for key, lower_better in [("add10_ns", True), ("matmul_1000x2x1_us", True), ("add16M_ms", True),
                          ("matmul2048_GFLOPs", False), ("sum16M_ms", True),
                          ("linreg_step_us", True)]:
    a, b = nd[key], np[key]
    ratio = b / a if lower_better else a / b
    print(f"{key:22} {a:>10} {b:>10} {ratio:>13.2f}x")
PY
