#!/usr/bin/env bash
# `make GPU=1` compiles and links warning-free (nvcc, cuBLAS, NCCL; no GPU needed), every CUDA
# source backend/cuda/<k>.cu has its CPU twin backend/cpu/<k>.c (comm_nccl.cu: comm_mpi.c;
# flash_attention.cu, attention's bf16 path: attention.c), every
# kernel of backend/backend.h is in the GPU kernel test's twin list, and that test program links.
# Builds in a copy of the tree: make GPU=1 writes ./train, which the CPU tests use.
cd "$(dirname "$0")/.." || exit 1
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
    echo "nvcc not found in $CUDA_HOME/bin: the GPU build cannot be checked here"
    exit 77
fi
status=0

for cu in backend/cuda/*.cu; do
    name=$(basename "$cu" .cu)
    twin=backend/cpu/$name.c
    [ "$name" = comm_nccl ] && twin=backend/cpu/comm_mpi.c
    [ "$name" = flash_attention ] && twin=backend/cpu/attention.c
    if [ ! -f "$twin" ]; then
        echo "FAIL: $cu has no CPU twin $twin"
        status=1
    fi
done
echo "$(ls backend/cuda/*.cu | wc -l) CUDA sources, each with a CPU twin"

# every function of backend.h but device memory (memory.cu) is compared by the GPU kernel test
kernels=$(sed -nE 's/^(void|double|size_t) \*?([a-z_0-9]+)\(.*/\2/p' backend/backend.h |
    grep -vE '^(backend_init|device_.*|host_to_device)$')
for k in $kernels; do
    if ! grep -q "X($k)" tests/gpu/cpu_twins.h; then
        echo "FAIL: $k (backend/backend.h) is missing from tests/gpu/cpu_twins.h"
        status=1
    fi
done
echo "$(echo "$kernels" | wc -w) kernels in backend.h, each in tests/gpu/cpu_twins.h"

tree=$(mktemp -d /tmp/picotron_gpu_build.XXXXXX)
trap 'rm -rf "$tree"' EXIT
tar --exclude=./.git --exclude=./build --exclude=./build-gpu --exclude=./build-asan --exclude=./build-emu \
    --exclude=./build-bundle --exclude=./bundle \
    --exclude=./tmp --exclude=./train --exclude=./create_config -cf - . | tar -xf - -C "$tree"
start=$(date +%s)
(cd "$tree" && make GPU=1 -j2 && bash tests/gpu/build_test.sh) >"$tree/build.log" 2>&1
rc=$?
warnings=$(grep -ci warning "$tree/build.log")
echo "make GPU=1 and the kernel test: exit $rc, $warnings warning lines, $(($(date +%s) - start)) s"
if [ $rc -ne 0 ] || [ "$warnings" -ne 0 ]; then
    grep -i -A3 "warning\|error" "$tree/build.log" | head -40
    status=1
fi
for bin in train create_config build-gpu/tests/gpu/test_kernels_vs_cpu; do
    if [ ! -x "$tree/$bin" ]; then
        echo "FAIL: $bin was not linked"
        status=1
    elif ! nm -D --undefined-only "$tree/$bin" 2>/dev/null | grep -q cudaMalloc &&
         ! nm --undefined-only "$tree/$bin" 2>/dev/null | grep -q cudaMalloc; then
        echo "FAIL: $bin does not use the CUDA runtime"
        status=1
    fi
done
[ $status -eq 0 ] && echo "train, create_config and test_kernels_vs_cpu link against CUDA"
exit $status
