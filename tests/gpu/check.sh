#!/usr/bin/env bash
# The GPU checks, in one script for a machine with an NVIDIA GPU, within 9 minutes in all (a
# global timeout; each step has its own smaller limit, set for a GPU). One "ok" or "FAIL" line per
# step with its figure, "N passed, N failed" last; exit 0 when none failed.
#   build    make GPU=1 here (train, create_config, the test programs), warning-free; or, with
#   / probe  PICOTRON_CHECK_PREBUILT=<bundle>, none: tests/gpu/bundle.sh built everything on
#            another machine and this machine needs only a GPU, its driver, CUDA 13's runtime,
#            cuBLAS and NCCL (the toolkit under $CUDA_HOME or the PyTorch wheels' nvidia/*/lib),
#            glibc and libstdc++. The probe prints nvidia-smi's GPU, driver and memory, where each
#            CUDA library was found, and ldd of the trainer, and stops the check at once, in one
#            line, when anything is missing.
#   1.       every CUDA kernel against its CPU twin on random inputs, and the bf16 products and
#            flash attention (tests/gpu/test_kernels_vs_cpu.c)
#   2.       the tiny model's loss and gradients on one GPU against the PyTorch fixture the CPU
#            build matches: fp32 to the CPU's tolerances (tests/t_30_model_vs_torch.sh), bf16
#            products to looser stated bounds (tests/gpu/test_model_bf16.c)
#   3.       layout equivalence on one GPU with the mpi backend (two ranks share the GPU): dp=2,
#            tp=2 (and sequence-parallel), pp=2 (1f1b), cp=2 against one rank, fp32, tests/layout_harness.sh's tolerances
#   4.       NCCL on one GPU: all-reduces through a communicator of one rank, blocking and on the
#            group's stream with events (PICOTRON_TEST_NCCL_GROUP_OF_ONE, tests/gpu/test_nccl_one_gpu.c)
#   scale    2 steps of the tiny model with 71680 tokens per micro-batch (grid limits at scale)
#   5.       benchmark (bench/gpu_bench.sh): SmolLM-1.7B-shaped layers, bf16, seq 2048 (SEQ, as
#            far as gpu_bench.sh takes it: the line says which it ran): tokens/s, MFU against the
#            GPU's bf16 dense peak (H200: 989.5 TFLOP/s), peak GPU memory, and the step's time
#            split (GEMM, attention, other kernels, communication), beside bench/roofline.c's
#            estimate of each (an H200's peaks unless ROOFLINE_FLAGS says otherwise)
# Every log goes under $OUT when it is set (check.log: this output; check-steps.log: every step's
# whole output, written as it runs), so a run that is stopped still leaves them.
# Modes (environment):
#   PICOTRON_CHECK_PREBUILT=DIR   DIR is bundle/ (holding picotron-gpu.tar.gz), the archive itself,
#                                 or an unpacked bundle; its bin/ and lib/ go first in PATH and
#                                 LD_LIBRARY_PATH
#   PICOTRON_CHECK_GPU=emulate    rehearses this script on the CPU emulator (make GPU=emulate,
#                                 build-emu/; with PREBUILT, a bundle made by bundle.sh --emulate),
#                                 the scale step's and benchmark's launches checked but not
#                                 computed, step limits x6 and 14 minutes in all: the plumbing is
#                                 proven before a GPU's minutes are spent on it. No number it
#                                 prints means anything.
#   PICOTRON_CHECK_LIMIT=SECONDS  the global limit (540; 840 on the emulator)
#   PICOTRON_CHECK_BENCH="L M S"  the benchmark's layers, micro-batch and steps (16 4 8)
#   STEPS=N                       the layout harness's steps (10); a dry run may take fewer
#   PICOTRON_CHECK_STEPS="1 3"    only these of the steps 1 2 3 4 scale 5 (the build or the probe
#                                 runs first all the same): a step rerun alone, or a rehearsal
#                                 split between two tests (t_81 from source, t_82 from the bundle)
#   PICOTRON_CHECK_PROBE_ONLY=1   with PREBUILT: the probe alone
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
# OUT and the bundle may be named relative to where this was started
if [ -n "${OUT:-}" ]; then
    if ! { mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd); }; then
        echo "check.sh: cannot create OUT=$OUT (set OUT to a writable folder)"
        exit 2
    fi
fi
PREBUILT=${PICOTRON_CHECK_PREBUILT:-}
[ -n "$PREBUILT" ] && [ -e "$PREBUILT" ] && PREBUILT=$(cd "$(dirname "$PREBUILT")" && pwd)/$(basename "$PREBUILT")
cd "$(dirname "$self")/../.." || exit 1
GPU_MODE=${PICOTRON_CHECK_GPU:-1}
case $GPU_MODE in
    1) LIMIT=${PICOTRON_CHECK_LIMIT:-540} SCALE=1 ;;
    emulate) LIMIT=${PICOTRON_CHECK_LIMIT:-840} SCALE=6 ;;
    *)
        echo "check.sh: PICOTRON_CHECK_GPU='$GPU_MODE' is neither 1 (a GPU) nor emulate"
        exit 2
        ;;
esac
if ! [[ $LIMIT =~ ^[1-9][0-9]*$ ]]; then
    echo "check.sh: PICOTRON_CHECK_LIMIT='$LIMIT' is not a number of seconds"
    exit 2
fi
ALL_STEPS="1 2 3 4 scale 5"
WANTED=${PICOTRON_CHECK_STEPS:-$ALL_STEPS}
for s in $WANTED; do
    if [[ " $ALL_STEPS " != *" $s "* ]]; then
        echo "check.sh: PICOTRON_CHECK_STEPS names '$s': the steps are $ALL_STEPS"
        exit 2
    fi
done
wanted() { [[ " $WANTED " == *" $1 "* ]]; }

# The whole check runs under one timeout, in a second copy of this script; this one only waits
# for it (and copies its output into $OUT/check.log), then says so if the limit stopped it.
if [ -z "${PICOTRON_CHECK_DEADLINE:-}" ]; then
    PICOTRON_CHECK_DEADLINE=$(($(date +%s) + LIMIT))
    export PICOTRON_CHECK_DEADLINE
    if [ -n "${OUT:-}" ]; then
        timeout -k 10 "$LIMIT" bash "$self" "$@" 2>&1 | tee "$OUT/check.log"
        rc=${PIPESTATUS[0]}
    else
        timeout -k 10 "$LIMIT" bash "$self" "$@"
        rc=$?
    fi
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        line="FAIL the whole check ran past its $LIMIT s (PICOTRON_CHECK_LIMIT) and was stopped"
        if [ -n "${OUT:-}" ]; then
            echo "$line; every step's output so far is in $OUT/check-steps.log" | tee -a "$OUT/check.log"
        else
            echo "$line (set OUT=DIR to keep every step's output)"
        fi
    fi
    exit "$rc"
fi

passed=0 failed=0
scratch=$(mktemp -d /tmp/picotron_gpu_check.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
trap 'exit 143' TERM INT
log_dir=${OUT:-$scratch}
steps_log=$log_dir/check-steps.log
: >"$steps_log"

# limit SECONDS: a step's limit, set for a GPU (x SCALE on the emulator), cut to the time left
limit() {
    local want=$(($1 * SCALE)) left=$((PICOTRON_CHECK_DEADLINE - $(date +%s) - 15))
    [ $left -lt 1 ] && left=1
    echo $((want < left ? want : left))
}
# step NAME: begins a step; its output is appended to check-steps.log, from where step_log reads it
step() {
    step_name=$1
    step_start=$(date +%s)
    printf '\n===== %s (%s)\n' "$1" "$(date +%T)" >>"$steps_log"
    step_offset=$(stat -c %s "$steps_log")
}
step_log() { tail -c +$((step_offset + 1)) "$steps_log"; }
# report EXIT_STATUS [FIGURE]: the step's one line; its log's tail when it failed
report() {
    local rc=$1 figure=${2:+: $2} secs=$(($(date +%s) - step_start)) why=
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && why=", ran past its limit"
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
        echo "ok   $step_name$figure ($secs s)"
    else
        failed=$((failed + 1))
        echo "FAIL $step_name$figure (exit $rc$why, $secs s)"
        step_log | tail -n 40 | sed 's/^/    /'
    fi
}
finish() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
}
# stop WHAT HINT: a step that leaves nothing to check ends the check here, in one line
stop() {
    failed=$((failed + 1))
    echo "FAIL $step_name: $1 ($2)"
    finish
}

HEAVY=(env)              # how the two big runs (scale, benchmark) start
read -r -a BENCH_ARGS <<<"${PICOTRON_CHECK_BENCH:-16 4 8}"
if [ "$GPU_MODE" = emulate ]; then
    HEAVY=(env PICOTRON_EMU_SKIP_COMPUTE=1)
    BENCH_ARGS=(1 1 2)   # 1 layer, micro-batch 1, 2 steps
fi

if [ -z "$PREBUILT" ]; then
    # ------------------------------------------------------------------------------------------
    # build here
    BUILD=build-gpu
    [ "$GPU_MODE" = emulate ] && BUILD=build-emu
    TRAIN=./train
    export PICOTRON_GPU_BUILD=$BUILD
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null |
        sed 's/^/GPU: /'
    step "build: make GPU=$GPU_MODE, warning-free"
    missing=()
    for tool in mpicc mpirun "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" pkg-config python3; do
        [ "$GPU_MODE" = emulate ] && [[ $tool == */nvcc ]] && continue
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    echo "#include <cblas.h>" | gcc -E -x c - >/dev/null 2>&1 || missing+=("cblas.h (libblis-dev)")
    pkg-config --exists libcjson 2>/dev/null || missing+=("libcjson-dev")
    if [ ${#missing[@]} -gt 0 ]; then
        stop "missing ${missing[*]}" "scripts/install_deps.sh installs them; without a registry, make bundle/ elsewhere with tests/gpu/bundle.sh and set PICOTRON_CHECK_PREBUILT=bundle"
    fi
    # the test programs too, whichever steps run
    timeout "$(limit 360)" bash -c "make GPU=$GPU_MODE -j$(nproc) && bash tests/gpu/build_test.sh" \
        >"$scratch/build.log" 2>&1
    built=$?
    rc=$built
    if [ $rc -eq 0 ] && grep -qi warning "$scratch/build.log"; then
        rc=1 # a warning fails this check, but the binaries are there for the next ones
        grep -i -A3 warning "$scratch/build.log" >>"$steps_log"
    else
        cat "$scratch/build.log" >>"$steps_log"
    fi
    report $rc
    [ $built -eq 0 ] || finish
else
    # ------------------------------------------------------------------------------------------
    # prebuilt: unpack the bundle, put it first, find the GPU machine's libraries, probe
    flavour=gpu
    [ "$GPU_MODE" = emulate ] && flavour=emu
    step "probe: the bundle, the GPU, its libraries"
    archive=
    if [ -f "$PREBUILT" ]; then
        archive=$PREBUILT
    elif [ -f "$PREBUILT/picotron-$flavour.tar.gz" ]; then
        archive=$PREBUILT/picotron-$flavour.tar.gz
    elif [ -x "$PREBUILT/bin/train" ]; then
        root=$(cd "$PREBUILT" && pwd)
    else
        stop "PICOTRON_CHECK_PREBUILT=$PREBUILT holds neither picotron-$flavour.tar.gz nor bin/train" \
            "make it with bash tests/gpu/bundle.sh$([ "$flavour" = emu ] && echo " --emulate") and carry bundle/"
    fi
    if [ -n "$archive" ]; then
        tar -xzf "$archive" -C "$scratch" >>"$steps_log" 2>&1 ||
            stop "cannot unpack $archive" "rebuild it with tests/gpu/bundle.sh"
        root=$scratch/picotron-$flavour
    fi
    manifest() { sed -n "s/^$1=//p" "$root/MANIFEST" 2>/dev/null; }
    if [ "$(manifest flavour)" != "$flavour" ]; then
        stop "the bundle in $PREBUILT is '$(manifest flavour)', this check needs '$flavour'" \
            "PICOTRON_CHECK_GPU=emulate takes bundle.sh --emulate's bundle, a GPU the plain one"
    fi
    echo "bundle: $(manifest commit), $(manifest make); built $(manifest built)"
    BUILD=$root/build
    TRAIN=$root/bin/train
    export PATH=$root/bin:$PATH
    lib_dirs=$root/lib
    if [ "$flavour" = gpu ]; then
        command -v nvidia-smi >/dev/null || stop "nvidia-smi is not on PATH: no NVIDIA driver here" \
            "run this on the GPU machine, or PICOTRON_CHECK_GPU=emulate with an emulator bundle"
        if ! gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1) ||
            [ -z "$gpu" ]; then
            stop "nvidia-smi found no GPU: $(echo "$gpu" | head -n 1)" \
                "run this on the GPU machine, or PICOTRON_CHECK_GPU=emulate with an emulator bundle"
        fi
        echo "GPU: $(echo "$gpu" | head -n 1) (name, driver, memory)"
        # where CUDA's libraries are: the toolkit first, then the PyTorch wheels' nvidia/*/lib
        cuda_home=${CUDA_HOME:-/usr/local/cuda}
        toolkit_dirs=("$cuda_home/lib64" "$cuda_home/targets/x86_64-linux/lib" "$cuda_home/lib")
        wheel_dirs=()
        for site in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
            for dir in "$site"/nvidia/*/lib; do [ -d "$dir" ] && wheel_dirs+=("$dir"); done
        done
        for soname in $(manifest gpu_machine_libraries); do
            where='' kind=''
            for dir in "${toolkit_dirs[@]}" "${wheel_dirs[@]}"; do
                [ -e "$dir/$soname" ] && { where=$dir; break; }
            done
            if [ -n "$where" ]; then
                kind="PyTorch's nvidia wheel"
                [[ " ${toolkit_dirs[*]} " == *" $where "* ]] && kind="CUDA toolkit"
            else # a system package's (libnccl2, say), in the loader's cache
                where=$(ldconfig -p 2>/dev/null | awk -v so="$soname" '$1 == so { print $NF; exit }')
                [ -n "$where" ] && where=$(dirname "$where") kind="system, ldconfig"
            fi
            [ -n "$where" ] || stop "$soname is in neither the CUDA toolkit ($cuda_home), the PyTorch wheels' nvidia/*/lib (${#wheel_dirs[@]} folders) nor ldconfig's cache" \
                "set CUDA_HOME to a CUDA 13 toolkit, or use the python3 whose site-packages hold nvidia-*-cu13"
            echo "$soname: $where ($kind)"
            [[ ":$lib_dirs:" == *":$where:"* ]] || lib_dirs=$lib_dirs:$where
        done
        # the driver's library, which the CUDA runtime opens at its start
        driver=$(ldconfig -p 2>/dev/null | awk '$1 == "libcuda.so.1" { print $NF; exit }')
        if [ -z "$driver" ]; then
            for dir in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu \
                       /usr/lib64 ${LD_LIBRARY_PATH//:/ }; do
                [ -e "$dir/libcuda.so.1" ] && { driver=$dir/libcuda.so.1; break; }
            done
            [ -n "$driver" ] || stop "the driver's libcuda.so.1 is nowhere (ldconfig, /usr/local/nvidia)" \
                "the GPU machine's driver is not mounted"
            lib_dirs=$lib_dirs:$(dirname "$driver")
        fi
        echo "libcuda.so.1: $driver (the driver)"
    else
        echo "emulator bundle: no GPU, no CUDA library needed"
    fi
    export LD_LIBRARY_PATH=$lib_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "glibc here $(ldd --version 2>&1 | head -n 1 | awk '{print $NF}'), the bundle needs >= $(manifest glibc_min)"
    echo "ldd $TRAIN:"
    ldd "$TRAIN" 2>&1 | sed 's/^\s*/    /'
    missing=()
    for prog in "$root"/bin/* "$BUILD"/tests/* "$BUILD"/tests/gpu/*; do
        [ -f "$prog" ] || continue
        while read -r line; do missing+=("$(basename "$prog"): $line"); done \
            < <(ldd "$prog" 2>&1 | grep 'not found' | sed 's/^\s*//')
    done
    if [ ${#missing[@]} -gt 0 ]; then
        printf '    %s\n' "${missing[@]}" >>"$steps_log"
        stop "${#missing[@]} missing: ${missing[0]}" "check-steps.log lists them all"
    fi
    # the launcher of the two-rank checks, from the bundle
    if ! timeout 30 mpirun -np 2 true >>"$steps_log" 2>&1; then
        stop "the bundle's mpirun -np 2 true failed" "check-steps.log has MPICH's words"
    fi
    echo "mpirun: $(command -v mpirun) starts 2 ranks"
    report 0 "$(echo "${gpu:-the CUDA emulator}" | head -n 1 | cut -d, -f1), every library found"
    [ -n "${PICOTRON_CHECK_PROBE_ONLY:-}" ] && finish
fi

# ------------------------------------------------------------------------------------------------
if wanted 1; then
    step "1. CUDA kernels vs their CPU twins"
    timeout "$(limit 90)" "$BUILD/tests/gpu/test_kernels_vs_cpu" >>"$steps_log" 2>&1
    rc=$?
    # here the bf16 products, flash attention's outputs and dq, and what failed; check-steps.log has
    # every kernel's line
    step_log | grep -E '^ +FAIL|^ +ok +bf16|^ +ok +flash (fwd .* out|bwd .* dq)|device_memory_used' |
        sed 's/^ */    /'
    report $rc "$(step_log | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)"
fi

if wanted 2; then
    step "2. tiny model on one GPU vs the PyTorch fixture, fp32 and bf16"
    { PICOTRON_BUILD=$BUILD timeout "$(limit 60)" bash tests/t_30_model_vs_torch.sh &&
        timeout "$(limit 60)" "$BUILD/tests/gpu/test_model_bf16" tests/fixtures/llama_tiny_tied.bin \
            tests/fixtures/llama_tiny_untied.bin; } >>"$steps_log" 2>&1
    rc=$?
    step_log | grep -E '^tests/fixtures|\(tol ' | sed 's/^/    /'
    report $rc "$(step_log | grep -c '^tests/fixtures/.*: PASS') of 5 fixture runs pass (fp32: tied, untied, Mixtral; bf16: tied, untied)"
fi

if wanted 3; then
    step "3. layouts on one GPU, mpi backend: dp2, tp2, tp2 sequence-parallel, pp2 1f1b, cp2, experts on ep2 = one rank"
    # in its own bash: the harness sets its own EXIT trap and counters
    # shellcheck disable=SC2016
    PICOTRON_BUILD=$BUILD HARNESS_TRAIN=$TRAIN timeout "$(limit 180)" bash -c '
        export HARNESS_DISTRIBUTED_EXTRA="\"use_cpu\": false, \"backend\": \"mpi\""
        export HARNESS_MODEL_EXTRA="\"dtype\": \"float32\"" # the GPU default, bfloat16, is not exact
        source tests/layout_harness.sh
        run_layout base ga=4 || exit 1
        check_layout base dp2 dp=2 ga=2
        check_layout base tp2 tp=2
        check_layout base tp2_sp tp=2 sp=true
        check_layout base pp2_1f1b pp=2 engine=1f1b
        check_layout base cp2 cp=2
        moe="experts=4 topk=2 aux=0.05 mbs=1"
        run_layout base_moe ga=4 $moe || exit 1
        check_layout base_moe ep2_moe dp=2 ep=2 ga=2 $moe
        [ "$harness_failures" -eq 0 ]' >>"$steps_log" 2>&1
    rc=$?
    step_log | grep -E '^(ok|FAIL) ' | sed 's/^/    /'
    report $rc "$(step_log | awk '
        /^ok / { n++; for (i = 1; i <= NF; i++) {
            if ($i == "diff" && $(i - 3) == "losses" && $(i + 1) + 0 > l) l = $(i + 1) + 0
            if ($i == "diff" && $(i - 1) == "L2" && $(i + 1) + 0 > w) w = $(i + 1) + 0 } }
        END { printf "%d of 6 layouts equal one rank, worst loss rel diff %.2e, worst weight rel L2 %.2e", n, l, w }')"
fi

if wanted 4; then
    step "4. NCCL on one GPU: a one-rank communicator, its stream and events"
    timeout "$(limit 60)" "$BUILD/tests/gpu/test_nccl_one_gpu" >>"$steps_log" 2>&1
    rc=$?
    step_log | grep -E '^ +(ok|FAIL)' | sed 's/^ */    /'
    report $rc "$(step_log | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)"
fi

# a micro-batch of 71680 tokens: more rows than a grid's y or z dimension holds (65535)
if wanted scale; then
    step "scale: 2 steps with 71680 tokens per micro-batch, bf16"
    cat >"$scratch/scale.json" <<JSON
    {"distributed": {"use_cpu": false}, "model": {"name": "picotron-tiny", "num_hidden_layers": 2},
     "training": {"total_train_steps": 2, "seq_length": 1024, "micro_batch_size": 70},
     "dataset": {"name": "data/pride_and_prejudice.txt"}}
JSON
    timeout "$(limit 90)" "${HEAVY[@]}" mpirun -np 1 "$TRAIN" --config "$scratch/scale.json" \
        >>"$steps_log" 2>&1
    rc=$?
    step_log | grep -E 'Step: *2 ' | sed 's/^/    /'
    report $rc "$(step_log | grep -E 'Step: *2 ' | grep -oE 'Tokens/s: *[0-9.]+[KMG]?' | tail -n 1)"
fi

if wanted 5; then
    step "5. benchmark, SmolLM-1.7B-shaped layers, bf16"
    sampler=
    if [ "$GPU_MODE" = 1 ] && command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 \
            >"$scratch/memory.csv" 2>/dev/null &
        sampler=$!
    fi
    SEQ=2048 PICOTRON_TRAIN=$TRAIN timeout "$(limit 240)" "${HEAVY[@]}" \
        bash bench/gpu_bench.sh "${BENCH_ARGS[@]}" >>"$steps_log" 2>&1
    rc=$?
    [ -n "$sampler" ] && kill "$sampler" 2>/dev/null && wait "$sampler" 2>/dev/null
    step_log | grep -E '^(bench|profile|roofline):' | sed 's/^/    /'
    peak_smi=n/a
    if [ -s "$scratch/memory.csv" ]; then
        peak_smi=$(sort -n "$scratch/memory.csv" | tail -n 1 | awk '{ printf "%.1f GiB", $1 / 1024 }')
    fi
    peak_train=$(step_log | grep -oE 'Memory usage: *[0-9.]+GB' | awk '{ sub("GB", "", $3); if ($3 > m) m = $3 }
        END { printf "%.1f GB", m }')
    report $rc "$(step_log | awk -v smi="$peak_smi" -v mem="$peak_train" '
        /^bench: SmolLM/ { match($0, /[0-9]+ layers/); layers = substr($0, RSTART, RLENGTH)
                           match($0, /seq [0-9]+/); seq = substr($0, RSTART, RLENGTH)
                           match($0, /mbs [0-9]+/); mbs = substr($0, RSTART, RLENGTH) }
        /^bench: step/ { sub(/^bench: /, ""); speed = $0 }
        /^bench: per step/ { sub(/^bench: per step, all [0-9]+ steps: /, ""); split_ = $0 }
        END { printf "%s, %s, %s: %s; peak GPU memory %s (nvidia-smi), %s (train); per step: %s",
              layers, seq, mbs, speed, smi, mem, split_ }')"
fi
finish
