#!/usr/bin/env bash
# What 8 ranks on this machine's cores lose against one process using the same cores: the same
# model and global batch trained by one process with 2 threads (dp1, micro-batch 4, grad_acc 4)
# and by mpirun -np 8 (dp2 x tp2 x pp2 1F1B, 1 thread each, micro-batch 4, grad_acc 2). Prints
# tokens/s of each (global-batch tokens over the mean step time of steps WARMUP+1..) and the ratio
# 8 ranks / 1 process, for the tiny and the 512-hidden model, REPEATS times by turns (default 3),
# their median, and the best 8-rank run over the best one-process run. A benchmark, not a test.
#   bash bench/bench_ranks.sh [tiny|large|all]      (STEPS, WARMUP, REPEATS to change them)
cd "$(dirname "$0")/.." || exit 1
WARMUP=${WARMUP:-2}
STEPS=${STEPS:-5}
REPEATS=${REPEATS:-3}
which=${1:-all}
case $which in tiny|large|all) ;; *) echo "usage: $0 [tiny|large|all]" >&2; exit 2 ;; esac
if [ ! -x ./train ] || [ ! -x ./create_config ]; then
    echo "./train or ./create_config is missing: run make" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# prints tokens/s of one run: name np threads, then create_config flags
tokens_per_s() {
    local name=$1 np=$2 threads=$3
    shift 3
    ./create_config --out_dir "$tmp" --exp_name "$name" --model_name picotron-tiny \
        --total_train_steps $((WARMUP + STEPS)) --metrics_file "$tmp/$name.jsonl" \
        --use_cpu --overwrite "$@" >"$tmp/create.log" 2>&1 || { cat "$tmp/create.log" >&2; return 1; }
    sed -i "s/\"OMP_NUM_THREADS\": \"[0-9]*\"/\"OMP_NUM_THREADS\": \"$threads\"/" \
        "$tmp/$name/config.json"
    OMP_NUM_THREADS=$threads mpirun -np "$np" ./train --config "$tmp/$name/config.json" \
        >"$tmp/$name.log" 2>&1 || { tail -n 5 "$tmp/$name.log" >&2; return 1; }
    python3 - "$tmp/$name.jsonl" "$WARMUP" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
rows = rows[int(sys.argv[2]):]
tokens = rows[1]["tokens"] - rows[0]["tokens"] if len(rows) > 1 else rows[0]["tokens"]
print("%.1f" % (tokens * len(rows) / sum(r["seconds"] for r in rows)))
PY
}

best_of() {   # the largest of its tokens/s arguments, leaving out runs that failed
    printf '%s\n' "$@" | awk '$1 ~ /^[0-9.]+$/ && $1 > m { m = $1 } END { print m }'
}

run_case() {   # name, then the architecture flags
    local name=$1 ones=() eights=() ratios=()
    shift
    # the two runs by turns, REPEATS times: the shared machine moves one run by 10-20%, so
    # each ratio compares runs a few seconds apart, and the median is printed
    for ((r = 0; r < REPEATS; r++)); do
        local one eight
        one=$(tokens_per_s "$name-1" 1 2 --mbs 4 --grad_acc_steps 4 "$@") || one=failed
        eight=$(tokens_per_s "$name-8" 8 1 --dp 2 --tp 2 --pp 2 --pp_engine 1f1b --mbs 4 \
            --grad_acc_steps 2 "$@") || eight=failed
        ones+=("$one") eights+=("$eight")
        [[ $one =~ ^[0-9.]+$ && $eight =~ ^[0-9.]+$ ]] &&
            ratios+=("$(python3 -c "print('%.2f' % ($eight / $one))")")
    done
    local median=n/a
    [ ${#ratios[@]} -gt 0 ] && median=$(printf '%s\n' "${ratios[@]}" | sort -n |
        awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
    # the best of each: a run is slowed, never sped up, when the VM's host shares its cores (a
    # 2-thread run then goes no faster than 1 thread for a whole run), so the best is each's speed
    local best=n/a
    [ ${#ratios[@]} -gt 0 ] &&
        best=$(python3 -c "print('%.2f' % ($(best_of "${eights[@]}") / $(best_of "${ones[@]}")))")
    printf "%-8s %22s %30s %8s\n" "$name" "${ones[*]}" "${eights[*]}" "${ratios[*]:-n/a}"
    printf "%-8s %62s %8s\n" "" "median 8 / 1" "$median"
    printf "%-8s %62s %8s\n" "" "best 8 / best 1" "$best"
}

printf "%-8s %22s %30s %8s\n" model "1 process x 2 threads" "8 ranks (dp2 tp2 pp2) x 1 thread" "8 / 1"
ARCH_TINY="--hidden_size 128 --intermediate_size 384 --num_hidden_layers 4 --num_attention_heads 4
           --num_key_value_heads 2 --vocab_size 256 --seq_len 128"
ARCH_LARGE="--hidden_size 512 --intermediate_size 1536 --num_hidden_layers 8
            --num_attention_heads 8 --num_key_value_heads 4 --vocab_size 256 --seq_len 256"
# shellcheck disable=SC2086
{
    [ "$which" != large ] && run_case tiny $ARCH_TINY
    [ "$which" != tiny ] && run_case large $ARCH_LARGE
}
exit 0
