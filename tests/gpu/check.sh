#!/usr/bin/env bash
# The GPU checks, in one script for a machine with an NVIDIA GPU (within 8 minutes, the build
# included). One summary line per check, "N passed, N failed" last; exit 0 when none failed.
#   build  make GPU=1: train, create_config and the tests, against CUDA, cuBLAS and NCCL
#   1.     every CUDA kernel against its CPU twin on random inputs, and the bf16 products
#          (tests/gpu/test_kernels_vs_cpu.c)
#   2.     the tiny model's loss and gradients on one GPU against the PyTorch fixture the CPU build
#          matches: fp32 to the CPU's tolerances (tests/t_30_model_vs_torch.sh on build-gpu), bf16
#          products to looser stated bounds (tests/gpu/test_model_bf16.c)
#   3.     layout equivalence on one GPU with the mpi backend (ranks share the GPU): dp=2, tp=2,
#          pp=2 (1f1b), cp=2 against one rank, fp32, tolerances of tests/layout_harness.sh
#   scale  2 steps of the tiny model with 71680 tokens per micro-batch (grid limits at scale)
#   4.     benchmark (bench/gpu_bench.sh): a SmolLM-1.7B-shaped stack, bf16, seq 1024: tokens/s,
#          MFU and the step's time split (GEMM, attention, other kernels, communication)
# PICOTRON_CHECK_GPU=emulate rehearses this script on the CPU emulator (make GPU=emulate,
# build-emu/), the benchmark's launches checked but not computed: the script's own plumbing is
# proven before the GPU machine's minutes are spent on it. No number it prints means anything.
cd "$(dirname "$0")/../.." || exit 1
GPU_MODE=${PICOTRON_CHECK_GPU:-1}
BUILD=build-gpu
HEAVY=(env)              # how the two big runs (scale, benchmark) start
BENCH_ARGS=()
if [ "$GPU_MODE" = emulate ]; then
    BUILD=build-emu
    HEAVY=(env PICOTRON_EMU_SKIP_COMPUTE=1)
    BENCH_ARGS=(1 1 2)   # 1 layer, micro-batch 1, 2 steps
fi
export PICOTRON_GPU_BUILD=$BUILD
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
for tool in mpicc mpirun "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" pkg-config python3; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
echo "#include <cblas.h>" | gcc -E -x c - >/dev/null 2>&1 || missing+=("cblas.h (libblis-dev)")
pkg-config --exists libcjson 2>/dev/null || missing+=("libcjson-dev")
if [ ${#missing[@]} -gt 0 ]; then
    echo "FAIL build: missing ${missing[*]} (scripts/install_deps.sh installs them)"
    failed=$((failed + 1))
    finish
fi

start=$(date +%s)
timeout 360 make GPU="$GPU_MODE" -j"$(nproc)" >"$log_dir/build.log" 2>&1
built=$?
rc=$built
if [ $rc -eq 0 ] && grep -qi warning "$log_dir/build.log"; then
    rc=1   # a warning fails this check, but the binaries are there for the next ones
    grep -i -A3 warning "$log_dir/build.log" >"$log_dir/warnings.log"
    mv "$log_dir/warnings.log" "$log_dir/build.log"
fi
report "build: make GPU=$GPU_MODE, warning-free" $(($(date +%s) - start)) $rc "$log_dir/build.log"
[ $built -eq 0 ] || finish

start=$(date +%s)
{ bash tests/gpu/build_test.sh && timeout 120 $BUILD/tests/gpu/test_kernels_vs_cpu; } \
    >"$log_dir/kernels.log" 2>&1
rc=$?
sed 's/^/    /' "$log_dir/kernels.log"
report "1. CUDA kernels vs their CPU twins" $(($(date +%s) - start)) $rc "$log_dir/kernels.log"

start=$(date +%s)
{ PICOTRON_BUILD=$BUILD timeout 120 bash tests/t_30_model_vs_torch.sh &&
    timeout 120 $BUILD/tests/gpu/test_model_bf16 tests/fixtures/llama_tiny_tied.bin \
        tests/fixtures/llama_tiny_untied.bin; } >"$log_dir/model.log" 2>&1
rc=$?
grep -E '^tests/fixtures|\(tol ' "$log_dir/model.log" | sed 's/^/    /'
report "2. tiny model on one GPU vs the PyTorch fixture, fp32 and bf16" \
    $(($(date +%s) - start)) $rc "$log_dir/model.log"

# in a subshell: the harness sets its own EXIT trap and counters
start=$(date +%s)
(
    export PICOTRON_BUILD=$BUILD
    export HARNESS_DISTRIBUTED_EXTRA='"use_cpu": false, "backend": "mpi"'
    export HARNESS_MODEL_EXTRA='"dtype": "float32"' # the GPU default, bfloat16, is not exact
    # shellcheck source=tests/layout_harness.sh
    source tests/layout_harness.sh
    run_layout base ga=4 || exit 1
    check_layout base dp2 dp=2 ga=2
    check_layout base tp2 tp=2
    check_layout base pp2_1f1b pp=2 engine=1f1b
    check_layout base cp2 cp=2
    [ "$harness_failures" -eq 0 ]
) >"$log_dir/layouts.log" 2>&1
rc=$?
sed 's/^/    /' "$log_dir/layouts.log"
report "3. layouts on one GPU, mpi backend: dp2, tp2, pp2 1f1b, cp2 = one rank" \
    $(($(date +%s) - start)) $rc "$log_dir/layouts.log"

# a micro-batch of 71680 tokens: more rows than a grid's y or z dimension holds (65535)
start=$(date +%s)
cat >"$log_dir/scale.json" <<JSON
{"distributed": {"use_cpu": false}, "model": {"name": "picotron-tiny", "num_hidden_layers": 2},
 "training": {"total_train_steps": 2, "seq_length": 1024, "micro_batch_size": 70},
 "dataset": {"name": "data/pride_and_prejudice.txt"}}
JSON
timeout 120 "${HEAVY[@]}" mpirun -np 1 ./train --config "$log_dir/scale.json" \
    >"$log_dir/scale.log" 2>&1
rc=$?
grep -E 'Step: *2 ' "$log_dir/scale.log" | sed 's/^/    /'
report "scale: 2 steps with 71680 tokens per micro-batch, bf16" $(($(date +%s) - start)) $rc \
    "$log_dir/scale.log"

start=$(date +%s)
timeout 240 "${HEAVY[@]}" bash bench/gpu_bench.sh "${BENCH_ARGS[@]}" >"$log_dir/bench.log" 2>&1
rc=$?
grep -E '^(bench|profile):' "$log_dir/bench.log" | sed 's/^/    /'
report "4. benchmark, SmolLM-1.7B-shaped, bf16, seq 1024" $(($(date +%s) - start)) $rc \
    "$log_dir/bench.log"
finish
