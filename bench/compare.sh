#!/usr/bin/env bash
# Run the same micro-benchmarks in ndscope (examples/bench.rs), candle-core
# (bench/candle) and numpy (bench/numpy_bench.py), one after the other in one run, print
# the three JSON lines and a table of every key with the ratios ndscope/candle and
# ndscope/numpy (for times, < 1 means ndscope is faster; for GFLOP/s, GB/s and speedups,
# > 1 means ndscope is better). A figure a program does not measure shows as '-'.
# Needs `pip install numpy` (threadpoolctl optional) and network access for candle's
# first build. Extra arguments (e.g. --quick) go to all three programs.
# Then the nn workloads (conv2d_fwd_bwd_us, cross_entropy_fwd_bwd_us) against
# bench/torch_nn_bench.py: PyTorch with one thread where it is installed, else numpy.
# Also the floor of the small-op path (bench/floor) beside candle-core's add10, and the
# digits models (examples/digits) beside bench/digits_torch.py where PyTorch is installed.
# Python: $PYTHON (default python3), e.g. PYTHON=../torch-env/bin/python for a venv
# with numpy and PyTorch. Progress goes to stderr; the figures to stdout.
# Usage: [PYTHON=...] bench/compare.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
T=${CARGO_TARGET_DIR:-target}
say() { echo ">> $*" >&2; }
say "building ndscope's bench and digits examples (release; a first build takes minutes)"
cargo build --release --example bench --example digits >/dev/null 2>&1
say "building the candle-core peer (bench/candle; a first build fetches and compiles candle)"
# Each peer builds into its own target folder, so the paths below hold whatever
# CARGO_TARGET_DIR says.
cargo build --release --manifest-path bench/candle/Cargo.toml --target-dir bench/candle/target >/dev/null 2>&1
say "building the floor (bench/floor)"
cargo build --release --manifest-path bench/floor/Cargo.toml --target-dir bench/floor/target >/dev/null 2>&1
say "running ndscope"
nd=$("$T"/release/examples/bench --json "$@")
# candle hands even tiny matmuls to rayon when it has several threads, which makes
# every workload here several times slower (see bench/candle/src/main.rs); 1 thread is
# its best setting for them. CANDLE_RAYON_THREADS=N overrides it.
say "running candle-core"
ca=$(RAYON_NUM_THREADS="${CANDLE_RAYON_THREADS:-1}" bench/candle/target/release/candle-bench --json "$@")
# The floor of the small-op path (bench/floor), in the same minute as candle's add10.
say "running the floor"
fl=$(bench/floor/target/release/floor-bench --json "$@")
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE may be set on this machine for old OpenBLAS
# builds; they slow a current numpy, so unset them for the numpy run only.
say "running numpy ($PY)"
np=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$PY" bench/numpy_bench.py "$@")
echo "$nd"
echo "$ca"
echo "$np"
"$PY" - "$nd" "$ca" "$np" <<'PY'
import json, sys
nd, ca, np = (json.loads(a) for a in sys.argv[1:4])
def num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
def show(v, fmt="{:.4g}"):
    return "-" if v is None else fmt.format(v)
def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b
print(f"{'key':42} {'ndscope':>10} {'candle':>10} {'numpy':>10} {'nd/candle':>10} {'nd/numpy':>10}")
for key in nd:
    if key == "impl":
        continue
    a, b, c = num(nd.get(key)), num(ca.get(key)), num(np.get(key))
    if key == "threads":  # worker threads each uses; no ratio
        print(f"{key:42} {show(a):>10} {show(b):>10} {show(c):>10}")
        continue
    print(f"{key:42} {show(a):>10} {show(b):>10} {show(c):>10} "
          f"{show(ratio(a, b), '{:.2f}x'):>10} {show(ratio(a, c), '{:.2f}x'):>10}")
PY
echo "$fl"
"$PY" - "$fl" "$ca" <<'PY'
import json, sys
fl, ca = (json.loads(a) for a in sys.argv[1:3])
f, c = fl.get("floor_add10_ns"), ca.get("add10_ns")
r = "-" if f is None or not c else f"{f / c:.2f}x"
print(f"{'add10 floor (bench/floor; ndscope alongside)':42} {f:>10} {c if c is not None else '-':>10} {'floor/candle':>12} {r}"
      f"   (ndscope in the same process: {fl.get('ndscope_add10_ns')} ns)")
PY
say "running the nn peer ($PY: PyTorch where installed, else numpy)"
tn=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$PY" bench/torch_nn_bench.py "$@")
echo "$tn"
"$PY" - "$nd" "$tn" <<'PY'
import json, sys
nd, tn = (json.loads(a) for a in sys.argv[1:3])
print(f"{'key':42} {'ndscope':>10} {'peer':>10} {'nd/peer':>10}   (peer: {tn['impl']})")
for key in [k for k in tn if k in nd and k != "impl" and k != "threads"]:
    a, b = nd.get(key), tn.get(key)
    r = "-" if a is None or not b else f"{a / b:.2f}x"
    print(f"{key:42} {a if a is not None else '-':>10} {b if b is not None else '-':>10} {r:>10}")
PY
# The digits models (examples/digits) beside PyTorch's same models, where installed.
if "$PY" -c 'import torch' 2>/dev/null; then
  for m in mlp cnn; do
    say "running the digits $m (ndscope, then PyTorch)"
    dn=$("$T"/release/examples/digits --model "$m" --json)
    dt=$("$PY" bench/digits_torch.py --model "$m" | tail -1)
    "$PY" - "$m" "$dn" "$dt" <<'PY'
import json, sys
m, dn, dt = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
a, b = dn["us_per_step"], dt["us_per_step"]
print(f"{'digits ' + m + ' us_per_step':42} {a:>10.1f} {'pytorch':>10} {b:>10.1f} {a / b:>9.2f}x"
      f"   (accuracy {dn['test_accuracy']} against {dt['test_accuracy']})")
PY
  done
else
  echo "PyTorch is not importable by $PY: the digits models were not measured beside it"
fi
# The 2048³ matmul again with the optional `openblas` feature (large f32/f64 products
# through the system OpenBLAS), where that library links.
if echo 'int main(void){return 0;}' | gcc -x c - -lopenblas -o /dev/null 2>/dev/null; then
  say "building the bench with the openblas feature"
  cargo build --release --example bench --features openblas --target-dir "$T"/openblas >/dev/null 2>&1
  ob=$("$T"/openblas/release/examples/bench --only matmul2048 --json "$@")
  echo "$ob"
  "$PY" - "$ob" "$np" <<'PY'
import json, sys
ob, np = (json.loads(a) for a in sys.argv[1:3])
a, b = ob.get("matmul2048_GFLOPs"), np.get("matmul2048_GFLOPs")
r = "-" if a is None or not b else f"{a / b:.2f}x"
print(f"{'matmul2048_GFLOPs (feature openblas)':42} {a if a is not None else '-':>10} {'numpy':>10} {b if b is not None else '-':>10} {r:>10}")
PY
else
  echo "libopenblas does not link here: the openblas feature was not measured"
fi
