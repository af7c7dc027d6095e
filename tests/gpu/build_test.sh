#!/usr/bin/env bash
# Builds build-gpu/tests/gpu/test_kernels_vs_cpu: the test program, the CUDA backend objects of
# `make GPU=1`, and the CPU kernels backend/cpu/<kernel>.c renamed to cpu_<name> (the names listed
# in tests/gpu/cpu_twins.h), so each CUDA kernel can be run against its CPU twin in one process.
# Needs build-gpu/backend/cuda/*.o and build-gpu/utils.o (make GPU=1). Run from the repo root.
set -euo pipefail
BUILD=${PICOTRON_GPU_BUILD:-build-gpu}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
OUT=$BUILD/tests/gpu
mkdir -p "$OUT"
CFLAGS="-O2 -march=native -g -std=gnu11 -Wall -Wextra -fopenmp -I."
renames=$(grep -o 'X([a-z_0-9]*)' tests/gpu/cpu_twins.h | sed 's/X(\(.*\))/-D\1=cpu_\1/')
cpu_objs=()
# the kernel files: every CUDA source but device memory and communication has a CPU twin
for cu in backend/cuda/*.cu; do
    name=$(basename "$cu" .cu)
    [ "$name" = memory ] || [ "$name" = comm_nccl ] && continue
    # shellcheck disable=SC2086
    mpicc $CFLAGS $renames -c -o "$OUT/cpu_$name.o" "backend/cpu/$name.c"
    cpu_objs+=("$OUT/cpu_$name.o")
done
# shellcheck disable=SC2086
mpicc $CFLAGS -c -o "$OUT/test_kernels_vs_cpu.o" tests/gpu/test_kernels_vs_cpu.c
mpicc -o "$OUT/test_kernels_vs_cpu" "$OUT/test_kernels_vs_cpu.o" "${cpu_objs[@]}" \
    "$BUILD"/backend/cuda/*.o "$BUILD/utils.o" -lblis -lm -fopenmp \
    -L"$CUDA_HOME/lib64" -lcudart -lcublas -lcublasLt -lnccl -lstdc++ -Wl,-rpath,"$CUDA_HOME/lib64"
echo "built $OUT/test_kernels_vs_cpu"
