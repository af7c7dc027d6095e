#!/usr/bin/env bash
# The whole job's peak resident memory on picotron's README CPU example (SmolLM-1.7B cut to 5
# layers, dp2 x tp2 x pp2, 1F1B, seq 128, mbs 4, grad_acc 2, 8 ranks), as it runs by default and
# with ZeRO-3, recomputation and sequence parallelism on (EXTRA, default "--zero_stage 3
# --recompute --sequence_parallel"): the sum over the 8 ranks of each one's maximum resident set
# (GNU time's %M), for STEPS steps (default 2: the peak is reached in the first step, whose update
# touches AdamW's moments; the second one's time is printed beside the default's). Needs about
# 20 GB and 3 minutes on 2 cores.
# A benchmark, not a test.
#   bash bench/bench_memory_readme.sh
cd "$(dirname "$0")/.." || exit 1
STEPS=${STEPS:-2}
EXTRA=${EXTRA:---zero_stage 3 --recompute --sequence_parallel}
for exe in train create_config; do
    [ -x ./$exe ] || { echo "./$exe is missing: run make" >&2; exit 1; }
done
[ -x /usr/bin/time ] || { echo "GNU time is missing: apt-get install time" >&2; exit 1; }
tmp=$(mktemp -d "${BENCH_DIR:-/tmp}/picotron-bench-mem.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# run NAME FLAGS...: prints the job's peak resident memory in GB (the sum of the ranks' peaks)
run() {
    local name=$1
    shift
    ./create_config --out_dir "$tmp" --exp_name "$name" --dp 2 --tp 2 --pp 2 --pp_engine 1f1b \
        --model_name HuggingFaceTB/SmolLM-1.7B --num_hidden_layers 5 --grad_acc_steps 2 --mbs 4 \
        --seq_len 128 --total_train_steps "$STEPS" --use_cpu --overwrite "$@" >/dev/null || return 1
    # each rank appends one short line (O_APPEND: lines never interleave)
    mpirun -np 8 /usr/bin/time -a -o "$tmp/$name.rss" -f "%M" ./train \
        --config "$tmp/$name/config.json" >"$tmp/$name.log" 2>&1 ||
        { tail -n 5 "$tmp/$name.log" >&2; return 1; }
    awk '{ kb += $1; n++ } END { printf "%.2f %d\n", kb / 1048576, n }' "$tmp/$name.rss"
}

echo "picotron's README CPU example, 8 ranks, $STEPS step(s): the sum of the ranks' peak RSS"
read -r today ranks < <(run today) || exit 1
read -r smaller ranks2 < <(run options $EXTRA) || exit 1
# the last step's seconds: its tokens (dp 2 x mbs 4 x seq 128 x grad_acc 2) over its Tokens/s
step_seconds() {
    grep -o 'Tokens/s: *[0-9.]*[KM]*' "$tmp/$1.log" | tail -n 1 | awk '{
        x = $2; m = x ~ /K$/ ? 1e3 : x ~ /M$/ ? 1e6 : 1; sub(/[KM]$/, "", x)
        printf "%.1f", 2 * 4 * 128 * 2 / (x * m) }'
}
awk -v a="$today" -v b="$smaller" -v n="$ranks" -v extra="$EXTRA" \
    -v ta="$(step_seconds today)" -v tb="$(step_seconds options)" 'BEGIN {
    printf "default: %6.2f GB (%d ranks), step %s s\n", a, n, ta
    printf "with %s: %6.2f GB, %.2f of the default (the goal: at most 0.50), step %s s (%.2fx)\n",
           extra, b, b / a, tb, tb / ta }'
echo "memory tables (MB per rank): the default, then with $EXTRA"
for name in today options; do
    sed -n '/^memory per rank/,/^pipeline bubble/p' "$tmp/$name.log" | grep -E "^ +[0-9]+ +[0-9.]+"
done
grep -h 'ZeRO-[23]:' "$tmp/options.log"
