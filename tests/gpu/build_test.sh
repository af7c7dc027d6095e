#!/usr/bin/env bash
# Builds the GPU test programs of tests/gpu (needs `make GPU=1` first; run from the repo root):
#   build-gpu/tests/gpu/test_kernels_vs_cpu: the test program, the CUDA backend objects, and the
#     CPU kernels backend/cpu/<kernel>.c renamed to cpu_<name> (the names listed in
#     tests/gpu/cpu_twins.h), so each CUDA kernel can be run against its CPU twin in one process;
#   build-gpu/tests/gpu/test_model_bf16: the tiny model with bf16 products against the fixture;
#   build-gpu/tests/gpu/test_nccl_one_gpu: NCCL's all-reduces through a communicator of one rank.
# PICOTRON_GPU_BUILD=build-emu builds them against the CUDA emulator (`make GPU=emulate` first).
# `build_test.sh --emulate` instead builds build/tests/gpu/test_model_bf16_emulated from the CPU
# build's objects (make first): the same test with every product's operands rounded to bf16 on
# the CPU, which is how its tolerances were measured without a GPU.
# OPT replaces the optimisation flags, as it does for the Makefile (tests/gpu/bundle.sh builds for
# a portable target: OPT="-O2 -g -march=x86-64-v3").
set -euo pipefail
CFLAGS="${OPT:--O2 -march=native -g} -std=gnu11 -Wall -Wextra -fopenmp -I."
# the core objects of a build: every top-level object but the programs' (each has a main), and
# the backend's own C files (backend/*.o: the collectives' counters and host collectives)
core_objs() {
    for obj in "$1"/*.o "$1"/backend/*.o; do
        case $obj in */train.o | */create_config.o | */prepare_data.o | */generate.o | */plot_loss.o) ;; *) echo "$obj" ;; esac
    done
}
if [ "${1:-}" = --emulate ]; then
    mkdir -p build/tests/gpu
    # shellcheck disable=SC2086,SC2046
    mpicc $CFLAGS -DEMULATE_BF16 -o build/tests/gpu/test_model_bf16_emulated \
        tests/gpu/test_model_bf16.c $(core_objs build) build/backend/cpu/*.o \
        -Wl,--wrap=matmul_forward,--wrap=matmul_backward,--wrap=matmul_backward_write \
        $(pkg-config --libs libcjson) -lm -fopenmp -lblis
    echo "built build/tests/gpu/test_model_bf16_emulated"
    exit 0
fi
BUILD=${PICOTRON_GPU_BUILD:-build-gpu}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
OUT=$BUILD/tests/gpu
mkdir -p "$OUT"
# shellcheck disable=SC2054
CUDA_LIBS=(-L"$CUDA_HOME/lib64" -lcudart -lcublas -lcublasLt -lnccl -lstdc++
           -Wl,-rpath,"$CUDA_HOME/lib64")
# PICOTRON_GPU_BUILD=build-emu: `make GPU=emulate` built the CUDA sources for the CPU emulator
[ -f "$BUILD/tests/gpu/emulator/emulator.o" ] &&
    CUDA_LIBS=("$BUILD/tests/gpu/emulator/emulator.o" -lblis -lstdc++)
# what the backend's kernels and communication call outside their own files: errors, the
# counters, the CPU kernels' timing
comm_deps=("$BUILD/utils.o" "$BUILD/backend/comm_log.o" "$BUILD/backend/comm_host.o"
           "$BUILD/backend/kernel_time.o")
renames=$(grep -o 'X([a-z_0-9]*)' tests/gpu/cpu_twins.h | sed 's/X(\(.*\))/-D\1=cpu_\1/')
cpu_objs=()
# the kernel files: every CUDA source but device memory and communication has a CPU twin;
# flash_attention.cu is attention's bf16 path, whose twin is attention.c's
for cu in backend/cuda/*.cu; do
    name=$(basename "$cu" .cu)
    [ "$name" = memory ] || [ "$name" = comm_nccl ] || [ "$name" = flash_attention ] && continue
    # shellcheck disable=SC2086
    mpicc $CFLAGS $renames -c -o "$OUT/cpu_$name.o" "backend/cpu/$name.c"
    cpu_objs+=("$OUT/cpu_$name.o")
done
# the CPU twins' matrix product (matmul.c's and attention.c's), which has no CUDA file of its own
mpicc $CFLAGS -c -o "$OUT/cpu_gemm.o" backend/cpu/gemm.c
cpu_objs+=("$OUT/cpu_gemm.o")
# shellcheck disable=SC2086
mpicc $CFLAGS -c -o "$OUT/test_kernels_vs_cpu.o" tests/gpu/test_kernels_vs_cpu.c
mpicc -o "$OUT/test_kernels_vs_cpu" "$OUT/test_kernels_vs_cpu.o" "${cpu_objs[@]}" \
    "$BUILD"/backend/cuda/*.o "${comm_deps[@]}" -lblis -lm -fopenmp \
    "${CUDA_LIBS[@]}"
echo "built $OUT/test_kernels_vs_cpu"
# shellcheck disable=SC2086
mpicc $CFLAGS -DPICOTRON_GPU -o "$OUT/test_nccl_one_gpu" tests/gpu/test_nccl_one_gpu.c \
    "$BUILD"/backend/cuda/*.o "${comm_deps[@]}" -lm -fopenmp \
    "${CUDA_LIBS[@]}"
echo "built $OUT/test_nccl_one_gpu"
# shellcheck disable=SC2086,SC2046
mpicc $CFLAGS -DPICOTRON_GPU -o "$OUT/test_model_bf16" tests/gpu/test_model_bf16.c \
    $(core_objs "$BUILD") "$BUILD"/backend/cuda/*.o \
    $(pkg-config --libs libcjson) -lm \
    -fopenmp "${CUDA_LIBS[@]}"
echo "built $OUT/test_model_bf16"
