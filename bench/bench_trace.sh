#!/usr/bin/env bash
# What recording a timeline costs: the same run with and without logging.trace, every step traced
# (trace_steps = all of them), on the layouts whose events are densest: dp2 x pp2 with 1F1B (a
# span per micro-batch and layer, every send and receive, the bucket all-reduces) and tp2 x cp2
# (an all-reduce per linear, the ring's blocks), 256 hidden, 8 layers, seq 128, grad_acc 4.
# Runs alternate (off, on, off, on, ...) so that drift of the machine falls on both; each run's
# figure is its mean step time over steps 2..STEPS (from the metrics file), and the cost is the
# median "on" over the median "off". On a busy machine that comparison drowns in noise, so the
# script also states the cost as what it is made of: the events one rank records per step (from
# the trace) times the cost of one recorded span (build/bench/bench_trace_event), over the step
# time. The goal is under 5%. A benchmark, not a test.
#   bash bench/bench_trace.sh            (REPEATS=3 STEPS=8 by default)
cd "$(dirname "$0")/.." || exit 1
REPEATS=${REPEATS:-3}
STEPS=${STEPS:-8}
for exe in train create_config build/bench/bench_trace_event; do
    [ -x ./$exe ] || { echo "./$exe is missing: run make" >&2; exit 1; }
done
span=$(./build/bench/bench_trace_event | tee /dev/stderr | sed -n 's/.*, \([0-9.]*\) ns with it/\1/p')
tmp=$(mktemp -d "${BENCH_DIR:-/tmp}/picotron-bench-trace.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# run NAME NP TRACE(0/1) FLAGS...: prints the mean step seconds over steps 2..STEPS
run() {
    local name=$1 np=$2 trace=$3
    shift 3
    ./create_config --out_dir "$tmp" --exp_name "$name" --model_name picotron-tiny \
        --hidden_size 256 --intermediate_size 768 --num_hidden_layers 8 --seq_len 128 --mbs 2 \
        --grad_acc_steps 4 --total_train_steps "$STEPS" --metrics_file "$tmp/$name.jsonl" \
        --trace_steps "$STEPS" --use_cpu --overwrite $([ "$trace" = 1 ] && echo --trace) "$@" \
        >/dev/null || return 1
    rm -f "$tmp/$name.jsonl"
    mpirun -np "$np" ./train --config "$tmp/$name/config.json" >"$tmp/$name.log" 2>&1 ||
        { tail -n 3 "$tmp/$name.log" >&2; return 1; }
    awk -F'"seconds": ' 'NR > 1 { split($2, a, "}"); s += a[1]; n++ } END { printf "%.5f", s / n }' \
        "$tmp/$name.jsonl"
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

echo "trace recording cost: $REPEATS alternating runs each, mean step time of steps 2-$STEPS"
for layout in "dp2_pp2 4 --dp 2 --pp 2 --pp_engine 1f1b --bucket_size_mb 1" "tp2_cp2 4 --tp 2 --cp 2"; do
    set -- $layout
    name=$1 np=$2
    shift 2
    off="" on="" events=""
    for ((i = 0; i < REPEATS; i++)); do
        off+=" $(run "$name" "$np" 0 "$@")" || exit 1
        on+=" $(run "$name" "$np" 1 "$@")" || exit 1
    done
    events=$(sed -n 's/.*, \([0-9]*\) events of.*/\1/p' "$tmp/$name.log")
    awk -v n="$name" -v off="$(echo "$off" | median)" -v on="$(echo "$on" | median)" \
        -v ev="$events" -v offs="$off" -v ons="$on" -v np="$np" -v steps="$STEPS" -v span="$span" 'BEGIN {
        per_step = ev / np / steps
        printf "%-8s off %.4f s/step, on %.4f s/step: measured cost %+.1f%% (runs off:%s, on:%s)\n",
               n, off, on, 100 * (on / off - 1), offs, ons
        printf "         %d events per rank and step x %.0f ns = %.3f ms of a %.1f ms step: %.3f%%\n",
               per_step, span, per_step * span * 1e-6, off * 1e3, 100 * per_step * span * 1e-9 / off }'
done
