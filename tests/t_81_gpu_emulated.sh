#!/usr/bin/env bash
# The GPU build's own sources (backend/cuda/*.cu and the model built with -DPICOTRON_GPU) run on
# the CPU emulator of CUDA, cuBLAS and NCCL (`make GPU=emulate`, tests/gpu/emulator/emulator.h)
# and match the references the CPU build matches:
#   1. the emulator itself runs correct CUDA exactly and refuses what a GPU gets wrong: a race on
#      shared memory, grid.y = 65536, 64 KiB of shared memory without the attribute, a host
#      pointer, a shuffle after lanes returned, a deadlocked barrier, a bad leading dimension;
#      and an asynchronous collective's output is NaN until the host has waited for it
#   2. every CUDA kernel against its CPU twin (tests/gpu/test_kernels_vs_cpu.c), each launch run
#      a second time with threads and blocks in reverse order, which must write the same bytes
#   3. the tiny model against the PyTorch fixture: fp32 to t_30's tolerances, bf16 products to
#      test_model_bf16's
#   4. layouts against one rank (fp32, tests/layout_harness.sh's tolerances) with backend "mpi"
#      (ranks share one GPU) and "nccl" (one emulated GPU per rank); nccl on a shared GPU is
#      refused in one line that suggests "mpi"
#   5. one training step with 71680 tokens per micro-batch (more than a grid's y or z holds):
#      every launch and GEMM checked against an H100's limits, none computed; and the GPU
#      benchmark, bench/gpu_bench.sh, end to end at SmolLM-1.7B's shape (1 layer) the same way,
#      so the GPU machine's minutes are not spent finding a broken script
# What it cannot show (speed, real concurrency, CUDA's libm) needs tests/gpu/check.sh on a GPU.
cd "$(dirname "$0")/.." || exit 1
if [ "$(uname -m)" != x86_64 ]; then
    echo "the CUDA emulator switches threads in x86-64 assembly; this is $(uname -m)"
    exit 77
fi
status=0
fail() { echo "FAIL: $*"; status=1; }
log=$(mktemp -d /tmp/picotron_emu.XXXXXX)
trap 'rm -rf "$log"' EXIT
emu=build-emu/tests/gpu/emulator/test_emulator

start=$(date +%s)
if ! { make GPU=emulate -j2 build-emu/bin/train build-emu/tests/test_model_vs_torch "$emu" &&
    PICOTRON_GPU_BUILD=build-emu bash tests/gpu/build_test.sh; } >"$log/build.log" 2>&1; then
    tail -n 30 "$log/build.log"
    echo "FAIL: make GPU=emulate"
    exit 1
fi
grep -i -A3 warning "$log/build.log" && fail "make GPU=emulate printed warnings"
echo "built with the emulator in $(($(date +%s) - start)) s"

# 1. the emulator: the case, what must be said (empty: exit 0 and "ok"), environment
emulator_case() {
    local name=$1 want=$2
    shift 2
    env "$@" "$emu" "$name" >"$log/case" 2>&1
    local rc=$?
    if [ -z "$want" ]; then
        [ $rc -eq 0 ] && grep -q '^ok' "$log/case" || fail "emulator case $name: $(cat "$log/case")"
    else
        [ $rc -ne 0 ] && grep -q "$want" "$log/case" ||
            fail "emulator case $name (exit $rc) did not say '$want': $(head -n 2 "$log/case")"
    fi
}
emulator_case reduce ""
emulator_case race "" # without the race check the racy kernel runs: the check is what finds it
emulator_case race "racy_kernel is not deterministic" PICOTRON_EMU_RACECHECK=1
emulator_case grid_y ""
emulator_case smem ""
emulator_case host_pointer "argument 0 .* is not device memory"
emulator_case shfl_after_exit "a lane of warp 0 returned while the others waited"
emulator_case shfl_after_exit "lanes of warp 0 already returned" PICOTRON_EMU_ORDER=reverse
emulator_case deadlock "every thread waits at a barrier"
emulator_case gemm_ld ""
emulator_case deferred ""
echo "emulator: 11 cases behave as a GPU would, or are refused as a GPU would fail them"

# 2. the kernels, with the race check on every launch
if PICOTRON_EMU_RACECHECK=1 timeout 300 build-emu/tests/gpu/test_kernels_vs_cpu >"$log/k" 2>&1; then
    echo "kernels vs CPU twins, race-checked: $(tail -n 1 "$log/k")"
else
    grep -v '^  ok' "$log/k" | tail -n 20
    fail "CUDA kernels vs their CPU twins"
fi

# 3. the model against PyTorch
if PICOTRON_BUILD=build-emu timeout 300 bash tests/t_30_model_vs_torch.sh >"$log/m" 2>&1 &&
    timeout 300 build-emu/tests/gpu/test_model_bf16 tests/fixtures/llama_tiny_tied.bin \
        tests/fixtures/llama_tiny_untied.bin >>"$log/m" 2>&1; then
    grep -E '^tests/fixtures/.*: PASS|^  (loss|gradients|final weights) \(' "$log/m" |
        sed 's/^ */model: /'
else
    tail -n 20 "$log/m"
    fail "the model on the emulated GPU vs the PyTorch fixture"
fi

# 4. layouts; in a subshell: the harness sets its own EXIT trap and counters
layouts() {
    (
        export PICOTRON_BUILD=build HARNESS_TRAIN=build-emu/bin/train STEPS=5
        export HARNESS_DISTRIBUTED_EXTRA="\"use_cpu\": false, \"backend\": \"$1\""
        export HARNESS_MODEL_EXTRA='"dtype": "float32"'
        # shellcheck source=tests/layout_harness.sh
        source tests/layout_harness.sh
        run_layout base ga=4 || exit 1
        check_layout base dp2 dp=2 ga=2
        check_layout base tp2_async tp=2 async=true
        check_layout base pp2_1f1b pp=2 engine=1f1b
        check_layout base cp2_zigzag cp=2 zigzag=true
        [ "$1" = nccl ] && check_layout base dp2_tp2_pp2_afab dp=2 tp=2 pp=2 ga=2 engine=afab
        [ "$harness_failures" -eq 0 ]
    )
}
layouts mpi | sed 's/^/mpi backend:  /' || fail "layouts with the mpi backend"
PICOTRON_EMU_DEVICES=8 layouts nccl | sed 's/^/nccl backend: /' || fail "layouts with nccl"
cat >"$log/shared.json" <<JSON
{"distributed": {"tp_size": 2, "use_cpu": false, "backend": "nccl"},
 "model": {"name": "picotron-tiny"}, "training": {"total_train_steps": 1},
 "dataset": {"name": "data/pride_and_prejudice.txt"}}
JSON
timeout 60 mpirun -np 2 build-emu/bin/train --config "$log/shared.json" >"$log/shared" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q 'set distributed.backend to "mpi"' "$log/shared"; then
    echo "nccl with 2 ranks on 1 GPU: exit $rc, $(grep -m1 'needs one GPU per rank' "$log/shared")"
else
    fail "nccl with 2 ranks on one GPU was not refused in one line (exit $rc)"
    tail -n 5 "$log/shared"
fi

# 5. a step at scale: launch limits only
cat >"$log/scale.json" <<JSON
{"distributed": {"tp_size": 2, "use_cpu": false, "backend": "nccl"},
 "model": {"name": "picotron-tiny", "num_hidden_layers": 2, "dtype": "bfloat16"},
 "training": {"total_train_steps": 1, "seq_length": 1024, "micro_batch_size": 70},
 "dataset": {"name": "data/pride_and_prejudice.txt"}}
JSON
start=$(date +%s)
if PICOTRON_EMU_DEVICES=2 PICOTRON_EMU_SKIP_COMPUTE=1 timeout 300 \
    mpirun -np 2 build-emu/bin/train --config "$log/scale.json" >"$log/scale" 2>&1; then
    echo "scale: 1 step, tp=2, 70 x 1024 = 71680 tokens per micro-batch, every launch within" \
        "an H100's limits ($(($(date +%s) - start)) s)"
else
    tail -n 5 "$log/scale"
    fail "a step with 71680 tokens per micro-batch broke a launch limit"
fi
start=$(date +%s)
if PICOTRON_TRAIN=build-emu/bin/train PICOTRON_EMU_SKIP_COMPUTE=1 timeout 300 \
    bash bench/gpu_bench.sh 1 1 2 >"$log/bench" 2>&1 && grep -q '^bench: per step' "$log/bench"; then
    echo "bench/gpu_bench.sh at SmolLM-1.7B's shape (1 layer, seq 1024): runs and reports" \
        "($(($(date +%s) - start)) s)"
else
    tail -n 8 "$log/bench"
    fail "bench/gpu_bench.sh did not run through on the emulator"
fi
exit $status
