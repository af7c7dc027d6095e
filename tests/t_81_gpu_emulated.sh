#!/usr/bin/env bash
# The GPU build's own sources (backend/cuda/*.cu and the model built with -DPICOTRON_GPU) run on
# the CPU emulator of CUDA, cuBLAS and NCCL (`make GPU=emulate`, tests/gpu/emulator/emulator.h)
# and match the references the CPU build matches:
#   1. tests/gpu/check.sh, the script for a GPU machine, rehearsed on the emulator from source
#      (PICOTRON_CHECK_GPU=emulate): the build and the test programs warning-free; every CUDA
#      kernel against its CPU twin, each launch run a second time with threads and blocks in
#      reverse order, which must write the same bytes (PICOTRON_EMU_RACECHECK=1: a missing
#      barrier shows there); the tiny model against the PyTorch fixture in fp32 and bf16; NCCL's
#      all-reduces through a one-rank communicator; and, launches checked but not computed, a
#      step of 71680 tokens per micro-batch. Its other steps, the layouts dp2, tp2, pp2, cp2 and
#      ep2 with the mpi backend against one rank and the benchmark at SmolLM-1.7B's shape, run
#      from the bundle in its prebuilt mode (tests/t_82_gpu_bundle.sh), which also runs them here
#      from source when no bundle can be made: each step of the script runs once in the suite
#   2. the emulator itself runs correct CUDA exactly and refuses what a GPU gets wrong: a race on
#      shared memory, grid.y = 65536, 64 KiB of shared memory without the attribute, a host
#      pointer, a shuffle after lanes returned, a deadlocked barrier, a bad leading dimension,
#      a WMMA call met by half a warp or on a misaligned tile; its WMMA tiles multiply exactly;
#      and an asynchronous collective's output is NaN until the host has waited for it
#   3. the mixture-of-experts layer's own test (tests/test_moe.c) on the CUDA kernels, each launch
#      run twice the same way; so the Mamba mixer's and its model's (tests/test_mamba*.c)
#   4. layouts against one rank (fp32, 2 steps, tests/layout_harness.sh's tolerances) with the nccl
#      backend, one emulated GPU per rank, up to dp2 x tp2 x pp2 on 8 ranks, and interleaved 1F1B
#      (pp2 x V2, its exchanges' one-sided halves), and a mixture-of-experts model (4 experts,
#      top-2) on tp2 with sequence parallelism, on cp2 and with expert parallelism (ep2 x tp2);
#      then (4b) bf16 products that read each weight's cast of the step, each other input's cast
#      kept until it is written, and the bf16 copies the norms and SwiGLU write, give the bits of
#      casting at every product (one rank, dp2 under ZeRO-1, tp2 async with sequence
#      parallelism, pp2 with recomputation and experts); nccl on a shared GPU is refused in one
#      line that suggests "mpi"
# What it cannot show (speed, real concurrency, CUDA's libm) needs tests/gpu/check.sh on a GPU.
# Runs in a copy of the tree: make GPU=emulate writes ./train, which the CPU tests use. The runs of
# one process each go two at a time, one a core.
cd "$(dirname "$0")/.." || exit 1
if [ "$(uname -m)" != x86_64 ]; then
    echo "the CUDA emulator switches threads in x86-64 assembly; this is $(uname -m)"
    exit 77
fi
status=0
fail() { echo "FAIL: $*"; status=1; }
# waits for the runs started in the background (PIDs): 1 when any failed
wait_all() {
    local pid rc=0
    for pid in "$@"; do wait "$pid" || rc=1; done
    return $rc
}
tree=$(mktemp -d /tmp/picotron_emu.XXXXXX)
log=$tree/.logs
trap 'rm -rf "$tree"' EXIT
tar --exclude=./.git --exclude=./build --exclude=./build-gpu --exclude=./build-asan \
    --exclude=./build-emu --exclude=./build-bundle --exclude=./bundle --exclude=./tmp \
    --exclude=./train --exclude=./create_config -cf - . |
    tar -xf - -C "$tree"
cd "$tree" && mkdir -p "$log" || exit 1

# 1. the GPU machine's script, rehearsed from source, every launch twice (the build does not run
# kernels; the scale step checks its launches without running them)
PICOTRON_CHECK_GPU=emulate PICOTRON_CHECK_STEPS="1 2 4 scale" PICOTRON_EMU_RACECHECK=1 \
    timeout 900 bash tests/gpu/check.sh >"$log/check" 2>&1
rc=$?
grep -E '^(ok|FAIL)|passed' "$log/check"
if [ $rc -ne 0 ] || ! tail -n 1 "$log/check" | grep -q ' 0 failed$'; then
    grep -E '^ {4}' "$log/check" | tail -n 30
    grep -E '^FAIL' "$log/check" | tail -n 5 # last: the runner shows a failing test's last lines
    fail "tests/gpu/check.sh on the emulator (exit $rc)"
fi
emu=build-emu/tests/gpu/emulator/test_emulator
if ! make GPU=emulate "$emu" >"$log/build" 2>&1; then
    tail -n 20 "$log/build"
    fail "make GPU=emulate $emu"
    exit 1
fi

# 2. the emulator: the case, what must be said (empty: exit 0 and "ok"), environment
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
emulator_case wmma ""
emulator_case wmma_divergent "lanes of warp 0 meet at different warp operations"
emulator_case wmma_misaligned "breaks WMMA's alignment"
echo "emulator: 14 cases behave as a GPU would, or are refused as a GPU would fail them"

# 3. the mixture-of-experts layer through the CUDA kernels (moe.c is built with -DPICOTRON_GPU):
# finite differences, transformers' fixture and capacity, as t_44 checks the CPU build
if PICOTRON_EMU_RACECHECK=1 timeout 300 build-emu/tests/test_moe tests/fixtures/moe_mixtral.bin \
    >"$log/moe" 2>&1; then
    echo "mixture-of-experts layer (test_moe), race-checked: $(tail -n 1 "$log/moe")"
else
    grep -v '^  ok' "$log/moe" | tail -n 20
    fail "the mixture-of-experts layer on the CUDA kernels (build-emu/tests/test_moe)"
fi
# 3b. the Mamba mixer and the model composed from it through the CUDA kernels, as t_46 checks
# the CPU build
for t in test_mamba:mamba_block test_mamba_model:mamba_tiny; do
    bin=${t%%:*} fixture=${t#*:}
    if PICOTRON_EMU_RACECHECK=1 timeout 300 "build-emu/tests/$bin" "tests/fixtures/$fixture.bin" \
        >"$log/$bin" 2>&1; then
        echo "Mamba ($bin), race-checked: $(tail -n 1 "$log/$bin")"
    else
        grep -v '^  ok' "$log/$bin" | tail -n 20
        fail "the Mamba mixer on the CUDA kernels (build-emu/tests/$bin)"
    fi
done

# 4. layouts with nccl; in a subshell: the harness sets its own EXIT trap and counters
(
    export PICOTRON_BUILD=build-emu HARNESS_TRAIN=./train STEPS=2 PICOTRON_EMU_DEVICES=8
    export HARNESS_DISTRIBUTED_EXTRA='"use_cpu": false, "backend": "nccl"'
    export HARNESS_MODEL_EXTRA='"dtype": "float32"'
    # shellcheck source=tests/layout_harness.sh
    source tests/layout_harness.sh
    moe="experts=4 topk=2 aux=0.05"
    # the three one-rank references at once
    run_layout base ga=4 &
    base=$!
    run_layout base_moe ga=4 $moe &
    base_moe=$!
    run_layout base_moe_mbs1 ga=4 mbs=1 $moe &
    wait_all $base $base_moe $! || exit 1
    check_layout base dp2 dp=2 ga=2
    check_layout base tp2_async tp=2 async=true
    check_layout base tp2_sequence_parallel tp=2 sp=true
    check_layout base pp2_1f1b pp=2 engine=1f1b
    check_layout base pp2_interleaved pp=2 vstages=2
    check_layout base cp2_zigzag cp=2 zigzag=true
    check_layout base dp2_tp2_pp2_afab dp=2 tp=2 pp=2 ga=2 engine=afab
    check_layout base_moe tp2_sequence_parallel_moe tp=2 sp=true $moe
    check_layout base_moe cp2_zigzag_moe cp=2 zigzag=true $moe
    # expert parallelism: the dispatch and combine through ncclSend/ncclRecv groups
    check_layout base_moe_mbs1 ep2_tp2_moe dp=2 ep=2 tp=2 ga=2 mbs=1 $moe
    [ "$harness_failures" -eq 0 ]
) | sed 's/^/nccl backend: /' || fail "layouts with the nccl backend"
# 4b. bf16 products read each weight from its cast of the step (backend_step_begin), an input
# cast once until something writes it, and ln1, ln2, lnf, act, d(gate), d(up) from the bf16
# copies their kernels write (matmul.cu): the same bits as casting at every product, on one rank,
# under ZeRO-1 (its all-gather writes the weights between steps), under tp2 with the async
# all-reduce and sequence parallelism (the products read gathered ln1 and ln2, which the gathers
# rewrite), and on pp2 with recomputation and experts (micro-batches in flight, layers refilling
# one shared layer, the experts' rows read from their copies); the test switch
# PICOTRON_TEST_CAST_AT_EVERY_PRODUCT=1 casts at every product
(
    export PICOTRON_BUILD=build-emu HARNESS_TRAIN=./train STEPS=3 PICOTRON_EMU_DEVICES=8
    export HARNESS_DISTRIBUTED_EXTRA='"use_cpu": false, "backend": "nccl"'
    export HARNESS_MODEL_EXTRA='"dtype": "bfloat16"'
    # shellcheck source=tests/layout_harness.sh
    source tests/layout_harness.sh
    LOSS_TOL=0 WEIGHT_TOL=0
    # one rank: the two runs at once
    PICOTRON_TEST_CAST_AT_EVERY_PRODUCT=1 run_layout cast ga=2 &
    cast=$!
    run_layout copy ga=2 &
    wait_all $cast $! || exit 1
    compare_layout cast copy
    PICOTRON_TEST_CAST_AT_EVERY_PRODUCT=1 run_layout cast_zero1 dp=2 ga=1 \
        zero1=true || exit 1
    check_layout cast_zero1 copy_zero1 dp=2 ga=1 zero1=true
    PICOTRON_TEST_CAST_AT_EVERY_PRODUCT=1 run_layout cast_tp2 tp=2 async=true \
        sp=true || exit 1
    check_layout cast_tp2 copy_tp2 tp=2 async=true sp=true
    moe="experts=4 topk=2 aux=0.05"
    PICOTRON_TEST_CAST_AT_EVERY_PRODUCT=1 run_layout cast_pp2 pp=2 ga=4 \
        recompute=true $moe || exit 1
    check_layout cast_pp2 copy_pp2 pp=2 ga=4 recompute=true $moe
    [ "$harness_failures" -eq 0 ]
) | sed 's/^/bf16 casts kept: /' ||
    fail "bf16 products with the kept casts and copies against casting at every product"
cat >"$log/shared.json" <<JSON
{"distributed": {"tp_size": 2, "use_cpu": false, "backend": "nccl"},
 "model": {"name": "picotron-tiny"}, "training": {"total_train_steps": 1},
 "dataset": {"name": "data/pride_and_prejudice.txt"}}
JSON
timeout 60 mpirun -np 2 ./train --config "$log/shared.json" >"$log/shared" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q 'set distributed.backend to "mpi"' "$log/shared"; then
    echo "nccl with 2 ranks on 1 GPU: exit $rc, $(grep -m1 'needs one GPU per rank' "$log/shared")"
else
    fail "nccl with 2 ranks on one GPU was not refused in one line (exit $rc)"
    tail -n 5 "$log/shared"
fi
exit $status
