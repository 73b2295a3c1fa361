#!/usr/bin/env bash
# Instructions per operation of the small-op path (callgrind; deterministic whatever
# the load): add10 + close, and the linear-regression step with and without autograd.
# Each figure is `bench --only W --quick --iters N` minus `--only none` at the same N,
# divided by the iterations that N gives (see BENCHMARKS.md).
# Usage: scripts/callgrind.sh [BENCH_BINARY]   (default target/release/examples/bench)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/examples/bench}
[ "${1:-}" ] || cargo build --quiet --release --example bench
total() { # total instructions of one run
  local out; out=$(mktemp)
  valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" --only "$1" --quick --iters "$2" >/dev/null 2>&1
  grep -m1 '^summary:\|^totals:' "$out" | awk '{print $2}'
  rm -f "$out"
}
per() { # workload N iterations
  local w=$1 n=$2 it=$3
  local a b; a=$(total "$w" "$n"); b=$(total none "$n")
  echo "$w: $(( (a - b) / it )) instructions per iteration (N=$n, $it iterations)"
}
per add10 100000 101000
per linreg 2000 3000
per linreg_autograd 2000 9000
