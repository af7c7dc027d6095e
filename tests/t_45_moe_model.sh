#!/usr/bin/env bash
# A mixture-of-experts Llama (picotron-tiny with 4 experts of 128 features per layer, top-2)
# trains on the bundled corpus on one rank:
#  1. its loss falls: the mean of the last 10 of 150 steps is below FINAL_MAX (from ln 256 = 5.5);
#  2. the load-balancing loss balances the router: with router_aux_loss_coef 0.05 the pairs each
#     expert takes per step are more even (max/mean, averaged over layers and steps, the end-of-run
#     report's "router balance") than with 0, same seed and steps, by at least BALANCE_GAIN;
#  3. the metrics carry each step's aux_loss, and the end-of-run memory table accounts for 95-100%
#     of the allocator's peak;
#  4. ./generate continues a prompt from its checkpoint (the training forward: no KV cache).
# (The model against transformers' MixtralForCausalLM is t_30; its layouts, t_67.)
cd "$(dirname "$0")/.." && source tests/layout_harness.sh # allocator_share_ok
FINAL_MAX=2.8
BALANCE_GAIN=0.1
dir=$HARNESS_DIR
failures=0
fail() { failures=$((failures + 1)); echo "FAIL $*"; }

for coef in 0.05 0; do
    name=aux_$coef
    ./create_config --out_dir "$dir" --exp_name $name --model_name picotron-tiny --num_experts 4 \
        --num_experts_per_tok 2 --moe_intermediate_size 128 --router_aux_loss_coef $coef \
        --total_train_steps 150 --learning_rate 1e-3 --seq_len 64 --mbs 4 --save_frequency 150 \
        --dataset data/austen.txt --metrics_file "$dir/$name/metrics.jsonl" --use_cpu \
        >/dev/null || exit 1
    OMP_NUM_THREADS=1 ./train --config "$dir/$name/config.json" >"$dir/$name.log" 2>&1 ||
        { tail -n 5 "$dir/$name.log"; exit 1; }
done

log=$dir/aux_0.05.log
grep -o 'Loss: *[0-9.]*' "$log" | awk -v max=$FINAL_MAX '
    { loss[NR] = $2 }
    END {
        for (i = NR - 9; i <= NR; i++) last += loss[i] / 10
        printf "loss: step 1 %.4f, mean of steps %d-%d %.4f (must be < %.1f)\n", loss[1], NR - 9,
               NR, last, max
        exit !(NR == 150 && loss[1] > 5.0 && last < max)
    }' && echo "ok   the loss falls" || fail "the loss does not fall below $FINAL_MAX"

balance() {
    sed -n 's/^router balance: max\/mean pairs per expert \([0-9.]*\).*/\1/p' "$dir/$1.log"
}
on=$(balance aux_0.05) off=$(balance aux_0)
if awk -v on="$on" -v off="$off" -v gain=$BALANCE_GAIN \
    'BEGIN { exit !(on != "" && off != "" && on + gain <= off) }'; then
    echo "ok   router balance, max/mean pairs per expert: $on with the aux loss (coef 0.05)," \
        "$off without (the same seed and 150 steps)"
else
    fail "router balance: '$on' with the aux loss, '$off' without" \
        "(want at least $BALANCE_GAIN less)"
fi
grep -A 4 "^mixture of experts" "$log" | sed 's/^/     /'

aux_lines=$(grep -c '"aux_loss": [0-9]' "$dir/aux_0.05/metrics.jsonl")
awk '{ match($0, /"aux_loss": [0-9.e+-]*/); a[NR] = substr($0, RSTART + 12, RLENGTH - 12) }
     END { printf "     aux loss (mean over layers): step 1 %.4f, step %d %.4f\n", a[1], NR,
                   a[NR] }' \
    "$dir/aux_0.05/metrics.jsonl"
[ "$aux_lines" = 150 ] && echo "ok   metrics: an aux_loss in each of the 150 lines" ||
    fail "metrics: $aux_lines aux_loss fields, want 150"

if report=$(allocator_share_ok "$log"); then
    echo "ok   memory: $report"
else
    fail "memory: '$report' (want 95-100%)"
fi

./generate --checkpoint "$dir/aux_0.05" --prompt "It is a truth" --max_new_tokens 40 --seed 1 \
    >"$dir/generated" 2>"$dir/generate.err"
rc=$? chars=$(wc -c <"$dir/generated")
if [ $rc -eq 0 ] && [ "$chars" -gt 20 ] && grep -q "no kv cache" "$dir/generate.err"; then
    echo "ok   generate: $(tail -n 1 "$dir/generate.err")"
else
    fail "generate: exit $rc, $chars characters: $(cat "$dir/generate.err")"
fi
[ $failures -eq 0 ]
