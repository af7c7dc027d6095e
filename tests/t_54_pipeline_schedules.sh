#!/usr/bin/env bash
# The pipeline schedules never deadlock and keep the activations they promise: for pp = 2..4 and
# grad_acc = 1..8, AFAB and 1F1B each finish 2 steps within 60 s, and each stage's peak number of
# activation slots in use is grad_acc under AFAB and min(pp - stage, grad_acc) under 1F1B.
cd "$(dirname "$0")/.." || exit 1
dir=$(mktemp -d /tmp/picotron-schedules.XXXXXX)
trap 'rm -rf "$dir"' EXIT
failures=0 runs=0
for pp in 2 3 4; do
    for ga in 1 2 3 4 5 6 7 8; do
        for engine in afab 1f1b; do
            cat >"$dir/config.json" <<JSON
{"distributed": {"pp_size": $pp, "pp_engine": "$engine"},
 "model": {"name": "picotron-tiny", "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1},
 "training": {"total_train_steps": 2, "seq_length": 16, "micro_batch_size": 1,
              "gradient_accumulation_steps": $ga},
 "dataset": {"name": "data/pride_and_prejudice.txt"}}
JSON
            runs=$((runs + 1))
            if ! timeout 60 mpirun -np $pp ./train --config "$dir/config.json" >"$dir/log" 2>&1; then
                echo "FAIL pp=$pp grad_acc=$ga $engine: did not finish (exit $?)"
                failures=$((failures + 1)); continue
            fi
            for ((stage = 0; stage < pp; stage++)); do
                if [ $engine = afab ]; then want=$ga; else want=$((pp - stage < ga ? pp - stage : ga)); fi
                got=$(grep -o "pipeline stage $stage: peak [0-9]*" "$dir/log" | awk '{print $5}')
                if [ "$got" != "$want" ]; then
                    echo "FAIL pp=$pp grad_acc=$ga $engine stage $stage: peak slots ${got:-?}, want $want"
                    failures=$((failures + 1))
                fi
            done
        done
    done
done
echo "$runs schedule runs (pp 2..4, grad_acc 1..8, afab and 1f1b): $failures failures"
[ $failures -eq 0 ]
