#!/usr/bin/env bash
# The CPU build trains to the same bits whatever vector width it was built for: ./train built for
# x86-64-v3 (AVX2 and FMA, no AVX-512) and the build here (-march=native: AVX-512 on such a CPU)
# train the tiny model 3 steps to the same losses, digit for digit, and the same checkpoint,
# bit for bit (tool_compare_checkpoints, tolerance 0). What makes it so: gemm.c sums every element
# in one order whatever its tile width, attention's tiles are the same on every build, row sums go
# through lanes.h's fixed lanes, AdamW rounds each operation on its own. On a CPU without AVX-512
# both builds use the same vectors, and the comparison says so.
cd "$(dirname "$0")/.." || exit 1
compare=${PICOTRON_BUILD:-build}/tests/tool_compare_checkpoints
[ -x ./train ] && [ -x ./create_config ] && [ -x "$compare" ] ||
    { echo "./train, ./create_config or $compare is missing: run make"; exit 1; }
grep -q avx2 /proc/cpuinfo || { echo "this CPU has no AVX2: nothing to compare"; exit 77; }
tree=$(mktemp -d /tmp/picotron_same_bits.XXXXXX)
trap 'rm -rf "$tree"' EXIT
tar --exclude=./.git --exclude='./build*' --exclude=./bundle --exclude=./tmp --exclude=./bench/.venv \
    --exclude=./train --exclude=./create_config -cf - . | tar -xf - -C "$tree"
start=$(date +%s)
# the flags of the build under test (make test-asan sets them), x86-64-v3 for -march=native
opt=${PICOTRON_OPT:--O2 -march=native -g}
if ! (cd "$tree" && make -j2 OPT="${opt/-march=native/-march=x86-64-v3}" \
    SANITIZE="${PICOTRON_SANITIZE:-}" train) >"$tree/build.log" 2>&1; then
    tail -n 20 "$tree/build.log"
    echo "FAIL: the x86-64-v3 build"
    exit 1
fi
echo "built ./train for x86-64-v3 in $(($(date +%s) - start)) s; this build: $(grep -q avx512f /proc/cpuinfo &&
    echo '-march=native with AVX-512' || echo '-march=native without AVX-512 (the same vectors)')"
status=0
for build in native v3; do
    train=./train
    [ $build = v3 ] && train=$tree/train
    ./create_config --out_dir "$tree/runs" --exp_name $build --model_name picotron-tiny --seq_len 64 \
        --mbs 2 --grad_acc_steps 2 --total_train_steps 3 --save_frequency 3 --dataset data/austen.txt \
        --metrics_file "$tree/runs/$build.jsonl" --use_cpu --overwrite >/dev/null || exit 1
    OMP_NUM_THREADS=1 "$train" --config "$tree/runs/$build/config.json" >"$tree/$build.log" 2>&1 ||
        { tail -n 5 "$tree/$build.log"; echo "FAIL: the $build run"; exit 1; }
done
losses() { python3 -c "import json, sys; print(*(json.loads(l)['loss'] for l in open(sys.argv[1])))" "$1"; }
a=$(losses "$tree/runs/native.jsonl") b=$(losses "$tree/runs/v3.jsonl")
if [ "$a" = "$b" ]; then echo "ok   losses of 3 steps: $a (both builds)"
else echo "FAIL losses: native $a, x86-64-v3 $b"; status=1; fi
if "$compare" "$tree/runs/native/3" "$tree/runs/v3/3" 0; then
    echo "ok   the step-3 checkpoints are equal, bit for bit"
else echo "FAIL the step-3 checkpoints differ"; status=1; fi
exit $status
