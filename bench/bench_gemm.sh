#!/usr/bin/env bash
# The CPU's matrix products at the large model of bench_vs_pytorch.sh (hidden 512, intermediate
# 1536, 4 kv heads of 64, vocab 256, 2048 tokens: seq 256 x micro-batch 8), with 1 and 2 threads:
# backend/cpu/gemm.c beside BLIS's SGEMM on the same rows, each against the FMA peak of the
# cores it uses (build/bench/bench_gemm). A benchmark, not a test: it asserts nothing.
#   bash bench/bench_gemm.sh [reps]   (default 5: each product's best of 5)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-5}
[ -x build/bench/bench_gemm ] || make -s build/bench/bench_gemm
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')," \
     "$(grep -q avx512f /proc/cpuinfo && echo AVX-512 || echo 'no AVX-512'), BLIS" \
     "$(dpkg-query -W -f='${Version}' libblis4 2>/dev/null || echo '?')"
for threads in ${THREADS:-1 2}; do
    OMP_NUM_THREADS=$threads build/bench/bench_gemm 2048 512 1536 256 256 "$reps"
done
