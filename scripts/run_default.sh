#!/usr/bin/env bash
# What `make run` runs after building: writes a config for the default tiny Llama on the bundled
# Jane Austen corpus and trains it with dp=2 x tp=2 x pp=2 (1F1B) on 8 MPI ranks, one loss line
# per step, then prints what the model writes after a prompt from the book and draws the loss curve
# (tmp/picotron-tiny-3d/loss.svg). Environment overrides: STEPS, NP, DP, TP, PP, PP_ENGINE, MODEL,
# SEQ_LEN, MBS, GRAD_ACC, DATASET, e.g. `STEPS=20 make run` or `NP=4 DP=1 make run`.
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${STEPS:-150}
TP=${TP:-2}
PP=${PP:-2}
NP=${NP:-$(( ${DP:-2} * TP * PP ))}
if [ -z "${DP:-}" ]; then
    if [ $(( NP % (TP * PP) )) -ne 0 ]; then
        echo "run_default: NP=$NP is not a multiple of TP*PP=$((TP * PP));" \
             "set DP, TP and PP so that DP*TP*PP = NP" >&2
        exit 1
    fi
    DP=$(( NP / (TP * PP) ))
fi
if [ $(( DP * TP * PP )) -ne "$NP" ]; then
    echo "run_default: DP*TP*PP = $DP*$TP*$PP = $((DP * TP * PP)) but NP=$NP; make them equal" >&2
    exit 1
fi
PP_ENGINE=${PP_ENGINE:-1f1b}
MODEL=${MODEL:-picotron-tiny}
SEQ_LEN=${SEQ_LEN:-128}
MBS=${MBS:-4}
GRAD_ACC=${GRAD_ACC:-2}
DATASET=${DATASET:-data/austen.txt}
EXP=picotron-tiny-3d

PROMPT=${PROMPT:-It is a truth universally acknowledged}
for exe in create_config train generate plot_loss; do
    [ -x "./$exe" ] || { echo "run_default: ./$exe is not built; run make first" >&2; exit 1; }
done

run() {
    echo "+ $*"
    "$@"
}
run ./create_config --out_dir tmp --exp_name "$EXP" --dp "$DP" --tp "$TP" --pp "$PP" \
    --pp_engine "$PP_ENGINE" --model_name "$MODEL" --seq_len "$SEQ_LEN" --mbs "$MBS" \
    --grad_acc_steps "$GRAD_ACC" --total_train_steps "$STEPS" --dataset "$DATASET" \
    --learning_rate 1e-3 --save_frequency "$STEPS" --metrics_file "tmp/$EXP/metrics.jsonl" \
    --use_cpu --overwrite
run mpirun -np "$NP" ./train --config "tmp/$EXP/config.json"
# the checkpoint of the last step (tmp/$EXP/latest names it), continued from the prompt
echo
run ./generate --checkpoint "tmp/$EXP" --prompt "$PROMPT" --max_new_tokens 200 --temperature 0.8 \
    --top_k 40 --seed 1
echo
run ./plot_loss --out "tmp/$EXP/loss.svg" --title "$MODEL, dp=$DP x tp=$TP x pp=$PP ($PP_ENGINE)" \
    "tmp/$EXP/metrics.jsonl"
echo "the loss curve: tmp/$EXP/loss.svg (open it in a browser)"
