#!/usr/bin/env bash
# The GPU checks, in one script for a machine with an NVIDIA GPU (within 8 minutes, the build
# included). One summary line per check, "N passed, N failed" last; exit 0 when none failed.
#   build  make GPU=1: train, create_config and the tests, against CUDA, cuBLAS and NCCL
#   1.     every CUDA kernel against its CPU twin on random inputs (tests/gpu/test_kernels_vs_cpu.c)
#   2.     the tiny model's loss and gradients on one GPU against the CPU build (to be filled in)
#   3.     layout equivalence on one GPU, mpi backend, dp/tp/pp/cp = 2 vs one rank (to be filled in)
#   4.     benchmark: a SmolLM-1.7B-shaped stack, bf16, seq 1024, tokens/s and MFU (to be filled in)
cd "$(dirname "$0")/../.." || exit 1
passed=0 failed=0
log_dir=$(mktemp -d /tmp/picotron_gpu_check.XXXXXX)
trap 'rm -rf "$log_dir"' EXIT

# name, seconds, exit status, log: one summary line; the log's tail when it failed
report() {
    if [ "$3" -eq 0 ]; then
        passed=$((passed + 1)); echo "PASS $1 ($2 s)"
    else
        failed=$((failed + 1)); echo "FAIL $1 (exit $3, $2 s)"; tail -n 40 "$4" | sed 's/^/    /'
    fi
}

finish() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
    | sed 's/^/GPU: /'
missing=()
for tool in mpicc mpirun "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" pkg-config; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
[ -f /usr/include/cblas.h ] || missing+=("cblas.h (libblis-dev)")
pkg-config --exists libcjson 2>/dev/null || missing+=("libcjson-dev")
if [ ${#missing[@]} -gt 0 ]; then
    echo "FAIL build: missing ${missing[*]} (scripts/install_deps.sh installs them)"
    failed=$((failed + 1))
    finish
fi

start=$(date +%s)
timeout 360 make GPU=1 -j"$(nproc)" >"$log_dir/build.log" 2>&1
built=$?
rc=$built
if [ $rc -eq 0 ] && grep -qi warning "$log_dir/build.log"; then
    rc=1   # a warning fails this check, but the binaries are there for the next ones
    grep -i -A3 warning "$log_dir/build.log" >"$log_dir/warnings.log"
    mv "$log_dir/warnings.log" "$log_dir/build.log"
fi
report "build: make GPU=1, warning-free" $(($(date +%s) - start)) $rc "$log_dir/build.log"
[ $built -eq 0 ] || finish

start=$(date +%s)
{ bash tests/gpu/build_test.sh && timeout 120 build-gpu/tests/gpu/test_kernels_vs_cpu; } \
    >"$log_dir/kernels.log" 2>&1
rc=$?
sed 's/^/    /' "$log_dir/kernels.log"
report "1. CUDA kernels vs their CPU twins" $(($(date +%s) - start)) $rc "$log_dir/kernels.log"

echo "SKIP 2. tiny model on one GPU vs the CPU build, fp32 and bf16 (not written yet)"
echo "SKIP 3. layout equivalence on one GPU with the mpi backend (not written yet)"
echo "SKIP 4. benchmark, SmolLM-1.7B-shaped, bf16, seq 1024 (not written yet)"
finish
