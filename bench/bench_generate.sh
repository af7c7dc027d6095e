#!/usr/bin/env bash
# Decoding speed of ./generate with the KV cache (one position per new token) against without it
# (the training forward over the whole window per new token): tokens/s of each, side by side, and
# the ratio. A benchmark, not a test: it asserts nothing, but says whether both gave the same ids.
#   bash bench/bench_generate.sh [tiny|large|all]      (default: all)
# tiny:  picotron-tiny (hidden 128, intermediate 384, 4 layers, 4 heads, 2 kv heads, vocab 256)
# large: hidden 512, intermediate 1536, 8 layers, 8 heads, 4 kv heads, vocab 256, tied
# Each model is trained for one step by ./train and saved; ./generate then continues the same
# prompt greedily for NEW tokens (default 128), its rate being new tokens over the time from the
# prompt's forward to the last token (the model's load not counted). THREADS (default 1) sets
# OMP_NUM_THREADS.
cd "$(dirname "$0")/.." || exit 1
NEW=${NEW:-128}
export OMP_NUM_THREADS=${THREADS:-1}
which=${1:-all}
case $which in tiny|large|all) ;; *) echo "usage: $0 [tiny|large|all]" >&2; exit 2 ;; esac
for program in ./train ./generate; do
    [ -x $program ] || { echo "$program is missing: run make" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PROMPT="It is a truth universally acknowledged, that a single man in possession of a good fortune"

# trains NAME for one step with the model section MODEL_JSON and saves it in $tmp/NAME
save_model() {
    cat >"$tmp/$1.json" <<JSON
{"distributed": {"dp_size": 1},
 "model": $2,
 "training": {"total_train_steps": 1, "seq_length": 128, "micro_batch_size": 1,
              "learning_rate": 1e-3},
 "dataset": {"name": "data/pride_and_prejudice.txt"},
 "checkpoint": {"save_dir": "$tmp/$1", "save_frequency": 1}}
JSON
    mpirun -np 1 ./train --config "$tmp/$1.json" >"$tmp/$1.log" 2>&1 ||
        { echo "./train failed: $(tail -n 1 "$tmp/$1.log")" >&2; exit 1; }
}

# prints the tokens/s of one ./generate run on NAME, with the cache or without; its ids go to
# $tmp/NAME.MODE.ids
rate() { # name cache|no_cache
    local flag=
    [ "$2" = no_cache ] && flag=--no_kv_cache
    ./generate --checkpoint "$tmp/$1" --prompt "$PROMPT" --max_new_tokens "$NEW" --print_ids $flag \
        >"$tmp/$1.$2.ids" 2>"$tmp/$1.$2.err" ||
        { echo "./generate failed: $(tail -n 1 "$tmp/$1.$2.err")" >&2; exit 1; }
    sed -n 's/^generate: .* in .* s, \([0-9.]*\) tokens\/s.*/\1/p' "$tmp/$1.$2.err"
}

printf "%-42s %6s %8s %16s %16s %7s %9s\n" model prompt new "no cache tok/s" "kv cache tok/s" \
    ratio "same ids"
bench() { # name description model_json
    save_model "$1" "$3"
    local without with same=no
    without=$(rate "$1" no_cache) || exit 1
    with=$(rate "$1" cache) || exit 1
    cmp -s "$tmp/$1.no_cache.ids" "$tmp/$1.cache.ids" && same=yes
    printf "%-42s %6s %8s %16s %16s %7s %9s\n" "$2" "${#PROMPT}" "$NEW" "$without" "$with" \
        "$(awk -v a="$with" -v b="$without" 'BEGIN { printf "%.1fx", a / b }')" "$same"
}
if [ "$which" != large ]; then
    bench tiny "picotron-tiny (128 hidden, 4 layers)" '{"name": "picotron-tiny"}'
fi
if [ "$which" != tiny ]; then
    bench large "512 hidden, 8 layers, 8 heads / 4 kv" \
        '{"name": "bench-512x8", "hidden_size": 512, "intermediate_size": 1536,
          "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
          "vocab_size": 256, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5,
          "rope_theta": 10000, "tie_word_embeddings": true}'
fi
echo "threads: $OMP_NUM_THREADS; window: prompt + $NEW - 1 positions; rates include the prompt's forward"
