#!/usr/bin/env bash
# Runs bench_zigzag (causal ring attention at cp=4, contiguous vs zig-zag chunks) on 4 ranks:
# per-rank forward+backward wall and CPU time, forward blocks computed, the imbalance of each
# and the slowest rank's ratio. A benchmark, not a test: it asserts nothing.
#   bash bench/bench_zigzag.sh [reps]      (default 5)
cd "$(dirname "$0")/.." || exit 1
bin=${PICOTRON_BUILD:-build}/bench/bench_zigzag
if [ ! -x "$bin" ]; then
    echo "$bin is missing: run make $bin" >&2
    exit 1
fi
echo "$(nproc) cores for 4 ranks"
mpirun -np 4 "$bin" "${1:-5}"
