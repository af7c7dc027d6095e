#!/usr/bin/env bash
# ./generate continues a prompt as transformers does: greedy decoding of tests/fixtures/hf_tiny
# equals LlamaForCausalLM.generate(do_sample=False) token for token, with the KV cache and without
# it, for the prompts of tests/fixtures/generate/expected.json (tests/reference/
# make_generate_fixture.py; each keeps the top-2 logit gap above 1e-3 at every step, far above
# float rounding, so the tolerance is none: every id equal).
# Also: seeded sampling repeats itself, with and without the cache; top_k 1 is greedy; through a
# tokenizer, the ids and text are the byte model's and the end-of-text id stops it; a checkpoint
# ./train wrote generates from its step folder and its save_dir, the same ids with and without the
# cache; bad input ends with one line naming it and a non-zero exit.
cd "$(dirname "$0")/.." || exit 1
[ -x ./generate ] || { echo "./generate is missing: run make"; exit 1; }
command -v python3 >/dev/null || { echo "python3 not found (it reads expected.json)"; exit 77; }
export OMP_NUM_THREADS=1
MODEL=tests/fixtures/hf_tiny
dir=$(mktemp -d /tmp/picotron-generate.XXXXXX)
trap 'rm -rf "$dir"' EXIT
failures=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; failures=$((failures + 1)); }
# same WHAT A B: pass when the id lists A and B are equal, else name the first index that differs
same() {
    if [ -n "$2" ] && [ "$2" = "$3" ]; then pass "$1"; return; fi
    local a=($2) b=($3) i=0
    while [ $i -lt ${#a[@]} ] && [ "${a[$i]}" = "${b[$i]}" ]; do i=$((i + 1)); done
    fail "$1: first difference at new token $i (${a[$i]:-none} vs ${b[$i]:-none})"
}
gen() { timeout 60 ./generate --print_ids "$@" 2>>"$dir/stderr"; }

# 1. greedy against transformers, with and without the cache
python3 -c 'import json, sys
for c in json.load(open(sys.argv[1]))["cases"]: print(c["prompt"] + "\t" + c["new_ids"])' \
    tests/fixtures/generate/expected.json >"$dir/cases.tsv" || exit 1
while IFS=$'\t' read -r prompt want; do
    n=$(wc -w <<<"$want")
    for cache in "" --no_kv_cache; do
        got=$(gen --checkpoint $MODEL --prompt "$prompt" --max_new_tokens "$n" $cache)
        same "greedy '${prompt:0:24}...' ${cache:-(kv cache)}: $n ids equal transformers'" \
            "$got" "$want"
    done
done <"$dir/cases.tsv"

# 2. sampling: a seed repeats, the cache changes nothing, another seed differs, top_k 1 is greedy
prompt="It is a truth universally acknowledged"
args=(--checkpoint $MODEL --prompt "$prompt" --max_new_tokens 40)
sampled=$(gen "${args[@]}" --temperature 0.9 --top_k 50 --top_p 0.95 --seed 7)
same "sampling with seed 7 twice" "$(gen "${args[@]}" --temperature 0.9 --top_k 50 --top_p 0.95 \
    --seed 7)" "$sampled"
same "sampling with seed 7 without the cache" "$(gen "${args[@]}" --temperature 0.9 --top_k 50 \
    --top_p 0.95 --seed 7 --no_kv_cache)" "$sampled"
other=$(gen "${args[@]}" --temperature 0.9 --top_k 50 --top_p 0.95 --seed 8)
if [ -n "$other" ] && [ "$other" != "$sampled" ]; then pass "seed 8 samples other ids than seed 7"
else fail "seed 8 samples the ids of seed 7"; fi
same "top_k 1 at temperature 2 is greedy" "$(gen "${args[@]}" --temperature 2 --top_k 1)" \
    "$(sed -n 1p "$dir/cases.tsv" | cut -f2)"

# 3. through a tokenizer: GPT-2's vocab.json + merges.txt format, no merges, each byte its own id
#    except byte 2, whose id 2 is "<|endoftext|>" (byte 2 moves to id 256, which hf_tiny lacks).
#    Ids equal bytes, so greedy gives the fixture's ids up to the first 2, and stops there.
mkdir -p "$dir/tok"
python3 - "$dir/tok" <<'PY'
import json, sys
# GPT-2's bytes_to_unicode: each byte a printable character
printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
chars, extra = {}, 0
for b in range(256):
    chars[b] = chr(b) if b in printable else chr(256 + extra)
    extra += b not in printable
vocab = {chars[b]: (b if b != 2 else 256) for b in range(256)}
vocab["<|endoftext|>"] = 2
json.dump(vocab, open(sys.argv[1] + "/vocab.json", "w"))
open(sys.argv[1] + "/merges.txt", "w").write("#version: 0.2\n")
PY
want=$(sed -n 1p "$dir/cases.tsv" | cut -f2)
want=${want%% 2 *} # the ids before the first end-of-text
n=$(wc -w <<<"$want")
prompt=$(sed -n 1p "$dir/cases.tsv" | cut -f1)
same "tokenizer: greedy stops at end-of-text after $n ids" \
    "$(gen --checkpoint $MODEL --tokenizer "$dir/tok/vocab.json" --prompt "$prompt")" "$want"
if cmp -s <(timeout 60 ./generate --checkpoint $MODEL --tokenizer "$dir/tok" --prompt "$prompt" \
            2>/dev/null) \
          <(timeout 60 ./generate --checkpoint $MODEL --prompt "$prompt" --max_new_tokens "$n" \
            2>/dev/null); then
    pass "tokenizer: its text is the byte model's text"
else fail "tokenizer: its text differs from the byte model's"; fi

# 4. a checkpoint ./train wrote (2 steps of picotron-tiny, a byte model): its step folder and its
#    save_dir (through `latest`) give the same ids, with the cache and without; the text prints
cat >"$dir/train.json" <<JSON
{"distributed": {"dp_size": 1},
 "model": {"name": "picotron-tiny"},
 "training": {"total_train_steps": 2, "seq_length": 64, "micro_batch_size": 2,
              "learning_rate": 1e-3},
 "dataset": {"name": "data/pride_and_prejudice.txt"},
 "checkpoint": {"save_dir": "$dir/ckpt", "save_frequency": 2}}
JSON
if timeout 120 mpirun -np 1 ./train --config "$dir/train.json" >"$dir/train.log" 2>&1; then
    step=$(gen --checkpoint "$dir/ckpt/2" --prompt "$prompt" --max_new_tokens 30)
    same "trained checkpoint: save_dir (latest) gives its step folder's ids" \
        "$(gen --checkpoint "$dir/ckpt" --prompt "$prompt" --max_new_tokens 30)" "$step"
    same "trained checkpoint: the same ids without the cache" \
        "$(gen --checkpoint "$dir/ckpt/2" --prompt "$prompt" --max_new_tokens 30 --no_kv_cache)" \
        "$step"
    text=$(timeout 60 ./generate --checkpoint "$dir/ckpt" --prompt "$prompt" --max_new_tokens 30 \
        --temperature 0.8 --top_k 40 2>&1)
    if [ $? -eq 0 ] && grep -q "generate: 30 tokens" <<<"$text"; then
        pass "trained checkpoint: 30 sampled tokens of text"
    else fail "trained checkpoint: sampling failed: $(tail -n 1 <<<"$text")"; fi
else
    fail "./train did not write the checkpoint: $(tail -n 1 "$dir/train.log")"
fi

# 5. bad input: one line naming it, exit not 0
mkdir -p "$dir/empty"
long=$(head -c 300 </dev/zero | tr '\0' 'a')
bad() { # WHAT WORD args...: ./generate args fails with one line that contains WORD
    local what=$1 word=$2 out rc lines
    shift 2
    out=$(timeout 30 ./generate "$@" 2>&1)
    rc=$?
    lines=$(printf '%s\n' "$out" | wc -l)
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$lines" -eq 1 ] && grep -qF -- "$word" <<<"$out"; then
        pass "$what: $out"
    else fail "$what: exit $rc, $lines lines: $(head -n 3 <<<"$out")"; fi
}
bad "empty prompt" "empty" --checkpoint $MODEL --prompt ""
bad "no prompt" "--prompt" --checkpoint $MODEL
bad "missing checkpoint" "$dir/nowhere" --checkpoint "$dir/nowhere" --prompt "a"
bad "folder without a model" "config.json" --checkpoint "$dir/empty" --prompt "a"
bad "prompt longer than the model's positions" "max_position_embeddings" --checkpoint $MODEL \
    --prompt "$long"
bad "negative temperature" "--temperature" --checkpoint $MODEL --prompt "a" --temperature -1
bad "top_p above 1" "--top_p" --checkpoint $MODEL --prompt "a" --top_p 1.5
bad "top_k not a number" "--top_k" --checkpoint $MODEL --prompt "a" --top_k many
bad "max_new_tokens 0" "--max_new_tokens" --checkpoint $MODEL --prompt "a" --max_new_tokens 0
bad "flag without its value" "needs a value" --checkpoint $MODEL --prompt "a" --seed
bad "unknown flag" "unknown argument" --checkpoint $MODEL --prompt "a" --beam 4

echo "$failures failures"
[ $failures -eq 0 ]
