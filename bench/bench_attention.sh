#!/usr/bin/env bash
# The CPU's causal attention at the large model of bench_vs_pytorch.sh (8 heads, 4 kv heads of
# 64, micro-batch 8) at seq 128, 256 and 1024, with 1 and 2 threads, against the FMA peak of the
# cores it uses (build/bench/bench_attention). A benchmark, not a test: it asserts nothing.
#   bash bench/bench_attention.sh [reps]   (default 5: each kernel's best of 5)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-5}
[ -x build/bench/bench_attention ] || make -s build/bench/bench_attention
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')," \
     "$(grep -q avx512f /proc/cpuinfo && echo AVX-512 || echo 'no AVX-512')"
for threads in ${THREADS:-1 2}; do
    for seq in ${SEQS:-128 256 1024}; do
        OMP_NUM_THREADS=$threads build/bench/bench_attention 8 "$seq" 8 4 64 "$reps"
    done
done
