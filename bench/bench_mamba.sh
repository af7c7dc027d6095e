#!/usr/bin/env bash
# A Mamba beside a Llama of about as many parameters (examples/mamba/train_mamba.sh's two models:
# 583,040 and 590,848 parameters in their layers, the same embedding and head), on one rank with
# THREADS threads (default 2), the same batches: tokens/s of each over steps 4..STEPS (total
# tokens over total seconds, from the metrics file) and their ratio; then where a mixer's time
# goes (build/bench/bench_mamba): the selective scan's share of one layer's forward and backward,
# at the example's shape and at state-spaces/mamba-130m-hf's (seq 512).
# usage: bench/bench_mamba.sh [STEPS]   (default 15)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-15}
threads=${THREADS:-2}
work=$(mktemp -d /tmp/picotron-bench-mamba.XXXXXX)
trap 'rm -rf "$work"' EXIT
[ -x ./train ] && [ -x build/bench/bench_mamba ] || make -s all
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $threads threads"
create() { # create NAME FLAGS...
    local name=$1; shift
    ./create_config --out_dir "$work" --exp_name "$name" --overwrite --model_name picotron-tiny \
        --dataset data/pride_and_prejudice.txt --seq_len 64 --mbs 8 --learning_rate 3e-3 \
        --total_train_steps "$steps" --metrics_file "$work/$name.jsonl" "$@" >/dev/null
}
create mamba --model_type mamba --num_hidden_layers 5 --state_size 16
create llama --num_hidden_layers 4 --intermediate_size 256 --num_attention_heads 4 \
    --num_key_value_heads 2
rate() { # tokens per second over steps 4..STEPS
    python3 -c "
import json
rows = [json.loads(l) for l in open('$work/$1.jsonl')][3:]
per_step = rows[1]['tokens'] - rows[0]['tokens']
print('%.0f' % (per_step * len(rows) / sum(r['seconds'] for r in rows)))"
}
for run in mamba llama; do
    OMP_NUM_THREADS=$threads ./train --config "$work/$run/config.json" >"$work/$run.log" 2>&1
done
m=$(rate mamba) l=$(rate llama)
echo "tokens/s, steps 4..$steps: Mamba $m, Llama $l (the reference, same run): Mamba/Llama $(python3 -c "print('%.2f' % ($m / $l))")"
OMP_NUM_THREADS=$threads build/bench/bench_mamba 8 64 128 256 16 8 4 10
OMP_NUM_THREADS=$threads build/bench/bench_mamba 1 512 768 1536 16 48 4 3
