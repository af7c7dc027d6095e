#!/usr/bin/env bash
# Data parallelism against gradient accumulation on the same global batch: picotron-tiny, seq 128,
# micro-batch 4, 8 micro-batches per step, trained 10+3 steps as dp=1 x grad_acc=8 (one rank, the
# reference) and as dp=8 x grad_acc=1 (mpirun -np 8). Prints the mean step time of each (the
# "seconds" of the metrics file, steps 4..13) and the ratio dp=8 / dp=1. A benchmark, not a test:
# it asserts nothing. On a 2-core machine the 8 ranks share 2 cores, so dp=8 cannot be faster
# than the cores allow; the figure shows what the all-reduces and oversubscription cost.
#   bash bench/bench_data_parallel.sh
cd "$(dirname "$0")/.." || exit 1
WARMUP=3
STEPS=10
if [ ! -x ./train ] || [ ! -x ./create_config ]; then
    echo "./train or ./create_config is missing: run make" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# prints the mean step time in seconds of one layout, after the warm-up steps
mean_step_seconds() {   # name np dp grad_acc
    local name=$1 np=$2 dp=$3 acc=$4
    ./create_config --out_dir "$tmp" --exp_name "$name" --model_name picotron-tiny \
        --dp "$dp" --grad_acc_steps "$acc" --mbs 4 --seq_len 128 \
        --total_train_steps $((WARMUP + STEPS)) --metrics_file "$tmp/$name.jsonl" \
        --use_cpu --overwrite >"$tmp/create.log" 2>&1 || { cat "$tmp/create.log" >&2; return 1; }
    mpirun -np "$np" ./train --config "$tmp/$name/config.json" >"$tmp/$name.log" 2>&1 ||
        { tail -n 5 "$tmp/$name.log" >&2; return 1; }
    python3 - "$tmp/$name.jsonl" "$WARMUP" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
secs = [r["seconds"] for r in rows if r["step"] > int(sys.argv[2])]
if not secs:
    sys.exit("no steps after the warm-up in the metrics file")
print("%.4f" % (sum(secs) / len(secs)))
PY
}

echo "picotron-tiny, seq 128, mbs 4, 8 micro-batches per step; mean of steps $((WARMUP + 1))..$((WARMUP + STEPS)); $(nproc) cores"
ref=$(mean_step_seconds acc8 1 1 8) || exit 1
echo "dp=1 x grad_acc=8 (1 rank):  $ref s/step"
dp8=$(mean_step_seconds dp8 8 8 1) || exit 1
echo "dp=8 x grad_acc=1 (8 ranks): $dp8 s/step"
python3 -c "import sys; a, b = map(float, sys.argv[1:]); print('ratio dp=8 / dp=1: %.2fx (step time; >1 = dp=8 slower)' % (b / a))" "$ref" "$dp8"
