#!/usr/bin/env bash
# The default small model (picotron-tiny, byte tokenizer, vocab 256) trained 200 steps on the
# bundled Jane Austen corpus starts near ln(256) = 5.55 and ends clearly lower: the mean loss of
# the last 10 steps must be below FINAL_MAX (a unigram model of English bytes is about 3.3 nats).
cd "$(dirname "$0")/.." || exit 1
FINAL_MAX=3.0
dir=$(mktemp -d /tmp/picotron-default.XXXXXX)
trap 'rm -rf "$dir"' EXIT
./create_config --out_dir "$dir" --exp_name tiny --model_name picotron-tiny --total_train_steps 200 \
    --learning_rate 1e-3 --use_cpu >/dev/null || exit 1
./train --config "$dir/tiny/config.json" >"$dir/log" 2>&1 || { tail -n 5 "$dir/log"; exit 1; }
grep -o 'Loss: *[0-9.]*' "$dir/log" | awk -v max=$FINAL_MAX '
    { loss[NR] = $2 }
    END {
        for (i = NR - 9; i <= NR; i++) last += loss[i] / 10
        printf "loss: step 1 %.4f, mean of steps %d-%d %.4f (must be < %.1f; ln 256 = 5.545)\n",
               loss[1], NR - 9, NR, last, max
        exit !(NR == 200 && loss[1] > 5.0 && loss[1] < 6.5 && last < max)
    }'
