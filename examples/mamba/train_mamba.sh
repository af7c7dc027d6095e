#!/usr/bin/env bash
# A Mamba on a laptop (nanotron's examples/mamba, here without CUDA-only packages): transformers'
# MambaForCausalLM (model.model_type "mamba", model_mamba.c) trained on the bundled novel, bytes as
# tokens, in a layout of create_config's flags, beside a Llama of about as many parameters on the
# same batches; then the Mamba's checkpoint continues a prompt (./generate).
#   Mamba: hidden 128, 5 layers of 256 channels, 16 states each: 583,040 parameters in its layers
#   Llama: hidden 128, 4 layers, intermediate 256:                590,848 parameters in its layers
# and both the same embedding, head and final norm (65,664).
#
# usage: examples/mamba/train_mamba.sh [WORK_DIR] [STEPS]   (defaults tmp/mamba, 200)
# The layout: NP=N ranks for mpirun and LAYOUT="--dp 2 --tp 2 --pp 2" (the default, 8 ranks; a
# Mamba runs dp, ZeRO-1, pp, tp and cp). The last line gives both models' losses at the last step.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=${1:-tmp/mamba}
steps=${2:-200}
np=${NP:-8}
layout=${LAYOUT:---dp 2 --tp 2 --pp 2}
[ -x ./train ] || make -s all

create() { # create NAME FLAGS...
    local name=$1; shift
    ./create_config --out_dir "$work" --exp_name "$name" --overwrite --model_name picotron-tiny \
        --dataset data/pride_and_prejudice.txt --seq_len 64 --mbs 4 --grad_acc_steps 2 \
        --learning_rate 3e-3 --total_train_steps "$steps" --save_frequency "$steps" \
        --metrics_file "$work/$name.jsonl" $layout "$@" >/dev/null
}
train() { mpirun -np "$np" ./train --config "$work/$1/config.json" >"$work/$1.log" 2>&1 ||
    { echo "train $1 failed: $(tail -n 3 "$work/$1.log")" >&2; exit 1; }; }
loss() { sed -n "s/.*\"step\": $steps, \"loss\": \([-0-9.e+]*\).*/\1/p" "$work/$1.jsonl"; }

create mamba --model_type mamba --num_hidden_layers 5 --state_size 16
create llama --num_hidden_layers 4 --intermediate_size 256 --num_attention_heads 4 \
    --num_key_value_heads 2
for run in mamba llama; do
    echo "training the $run ($np ranks: $layout), $steps steps"
    train $run
    grep -E "Step: +(1|$steps) " "$work/$run.log" | sed 's/^/  /'
done
echo "the Mamba continues a prompt:"
./generate --checkpoint "$work/mamba" --prompt "It is a truth universally acknowledged" \
    --max_new_tokens 80 2>/dev/null | grep -v '^note' | sed 's/^/  /'
echo "after $steps steps of the same batches: Mamba loss $(loss mamba), Llama loss $(loss llama)"
