#!/usr/bin/env bash
# A checkpoint carries the tokenizer its run trained with, as a Hugging Face model folder does:
#  1. two ranks train 2 steps on a .tok file made with GPT-2's tokenizer, once naming its folder
#     (data/gpt2: tokenizer.json is read) and once its vocab.json (vocab.json + merges.txt): the
#     checkpoint holds byte-identical copies of the files read, config.json and
#     generation_config.json say bos_token_id = eos_token_id = 50256 (GPT-2's <|endoftext|>), and
#     state.json records the same 16-hex-digit tokenizer fingerprint for both forms (checked here
#     with python3's json, not with the C that wrote them);
#  2. where tokenizers and transformers import (TOKENIZERS_PYTHON, python3, or t_16's venv),
#     AutoTokenizer.from_pretrained(checkpoint) gives ./prepare_data's ids for a sample text and
#     bos/eos 50256, for both forms; else a skip line;
#  3. ./generate uses the checkpoint's copy when no --tokenizer is given (the ids of --tokenizer
#     data/gpt2), accepts the same tokenizer in the other form, and refuses, exit 1 and one line
#     naming both fingerprints, a vocab.json of the same size with two ids swapped, and a copy in
#     the folder that was changed; a checkpoint whose state.json records no fingerprint (older
#     ones, Hugging Face folders) takes any tokenizer, as before;
#  4. a byte model (no dataset.tokenizer) writes bos/eos null (no end-of-text token exists; null
#     keeps transformers from guessing Llama's 1 and 2), no tokenizer files and no fingerprint;
#  5. resuming from the checkpoint trains on, and the next checkpoint records the same.
cd "$(dirname "$0")/.." || exit 1
[ -x ./train ] && [ -x ./generate ] && [ -x ./prepare_data ] || { echo "run make first"; exit 1; }
command -v python3 >/dev/null || { echo "python3 not found: the checks read JSON with it"; exit 77; }
export OMP_NUM_THREADS=1
EOT=50256
dir=$(mktemp -d /tmp/picotron-tokckpt.XXXXXX)
trap 'rm -rf "$dir"' EXIT
failures=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; failures=$((failures + 1)); }

head -c 30000 data/pride_and_prejudice.txt >"$dir/text.txt"
./prepare_data --tokenizer data/gpt2 --input "$dir/text.txt" --output "$dir/text.tok" >/dev/null ||
    { echo "FAIL prepare_data"; exit 1; }
# train NAME TOKENIZER STEPS [LOAD]: a 1-layer model of GPT-2's vocabulary, dp 2
train() {
    local dataset="\"name\": \"$dir/text.tok\", \"tokenizer\": \"$2\"" vocab=50257
    [ -z "$2" ] && dataset='"name": "data/pride_and_prejudice.txt"' vocab=256
    cat >"$dir/$1.json" <<JSON
{"distributed": {"dp_size": 2},
 "model": {"name": "picotron-tiny", "vocab_size": $vocab, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2},
 "training": {"total_train_steps": $3, "seq_length": 32, "micro_batch_size": 1, "learning_rate": 1e-3},
 "dataset": {$dataset},
 "checkpoint": {"save_dir": "$dir/$1", "save_frequency": 2${4:+, \"load_path\": \"$4\"}}}
JSON
    timeout 120 mpirun -np 2 ./train --config "$dir/$1.json" >"$dir/$1.log" 2>&1 ||
        { fail "$1: train exited non-zero: $(tail -n 1 "$dir/$1.log")"; return 1; }
}
train folder data/gpt2 2 && train vocab data/gpt2/vocab.json 2 && train bytes "" 2 || exit 1

# 1. the files, read by another program than the one that wrote them
python3 - "$dir" "$EOT" <<'PY' || failures=$((failures + 1))
import filecmp, json, os, re, sys
d, eot = sys.argv[1], int(sys.argv[2])
fails = 0
def check(ok, what):
    global fails
    print(("ok   " if ok else "FAIL ") + what)
    fails += not ok
copies = {"folder": ["tokenizer.json"], "vocab": ["vocab.json", "merges.txt"]}
prints = {}
for name, files in copies.items():
    ck = f"{d}/{name}/2"
    for f in files:
        check(filecmp.cmp(f"data/gpt2/{f}", f"{ck}/{f}", shallow=False),
              f"{name}: {f} is byte-identical to data/gpt2/{f}")
    others = {"tokenizer.json", "vocab.json", "merges.txt"} - set(files)
    check(not others & set(os.listdir(ck)), f"{name}: no other tokenizer file")
    for f in ["config.json", "generation_config.json"]:
        j = json.load(open(f"{ck}/{f}"))
        check(j.get("bos_token_id") == eot and j.get("eos_token_id") == eot,
              f"{name}: {f} bos/eos = {j.get('bos_token_id')}/{j.get('eos_token_id')}")
    tc = json.load(open(f"{ck}/tokenizer_config.json"))
    check(tc.get("eos_token") == "<|endoftext|>" and tc.get("add_bos_token") is False,
          f"{name}: tokenizer_config.json: {tc.get('tokenizer_class')}, eos {tc.get('eos_token')}")
    prints[name] = json.load(open(f"{ck}/state.json")).get("tokenizer_fingerprint", "")
check(re.fullmatch("[0-9a-f]{16}", prints["folder"] or "") and prints["folder"] == prints["vocab"],
      f"state.json's tokenizer_fingerprint {prints['folder']} is that of both forms")
# 4. the byte model
ck = f"{d}/bytes/2"
for f in ["config.json", "generation_config.json"]:
    j = json.load(open(f"{ck}/{f}"))
    check("bos_token_id" in j and j["bos_token_id"] is None and j["eos_token_id"] is None,
          f"bytes: {f} bos/eos are null")
left = {"tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"} & set(os.listdir(ck))
check(not left and "tokenizer_fingerprint" not in json.load(open(f"{ck}/state.json")),
      "bytes: no tokenizer files, no fingerprint")
sys.exit(1 if fails else 0)
PY

# 2. transformers opens the tokenizer
source tests/tokenizers_python.sh
tokenizers_python "$dir/pip.log"
if $python -c "import tokenizers, transformers" 2>/dev/null; then
    sample="It is a truth universally acknowledged, that a single man in possession of a good
fortune, must be in want of a wife. 1813 -- \"Mr. Bennet\"<|endoftext|>Chapter 2"
    printf '%s' "$sample" >"$dir/sample.txt"
    ./prepare_data --tokenizer data/gpt2 --input "$dir/sample.txt" --output "$dir/sample.tok" \
        >/dev/null || fail "prepare_data on the sample"
    $python - "$dir" "$EOT" <<'PY' 2>"$dir/hf.err" || { failures=$((failures + 1)); tail -n 3 "$dir/hf.err"; }
import struct, sys
from transformers import AutoTokenizer
d, eot = sys.argv[1], int(sys.argv[2])
raw = open(f"{d}/sample.tok", "rb").read()
width, count = struct.unpack_from("<IQ", raw, 12)
want = list(struct.unpack_from(f"<{count}{'H' if width == 2 else 'I'}", raw, 64))
fails = 0
for name in ["folder", "vocab"]:
    t = AutoTokenizer.from_pretrained(f"{d}/{name}/2")
    got = t(open(f"{d}/sample.txt").read())["input_ids"]
    ok = got == want and t.bos_token_id == eot and t.eos_token_id == eot
    print(("ok   " if ok else "FAIL ") + f"{name}: AutoTokenizer ({type(t).__name__}) gives "
          f"prepare_data's {len(want)} ids: {got == want}; bos/eos {t.bos_token_id}/{t.eos_token_id}")
    fails += not ok
sys.exit(1 if fails else 0)
PY
else
    echo "skip AutoTokenizer on the checkpoint: no tokenizers/transformers in $python, and pip could not install them ($(tail -n 1 "$dir/pip.log" 2>/dev/null))"
fi

# 3. ./generate and the fingerprint
prompt="It is a truth universally"
gen() { timeout 60 ./generate --print_ids --prompt "$prompt" --max_new_tokens 8 "$@" 2>"$dir/gen.err"; }
own=$(gen --checkpoint "$dir/folder")
given=$(gen --checkpoint "$dir/folder" --tokenizer data/gpt2)
other=$(gen --checkpoint "$dir/folder" --tokenizer data/gpt2/vocab.json)
if [ -n "$own" ] && [ "$own" = "$given" ] && [ "$own" = "$other" ]; then
    pass "generate: the checkpoint's own copy gives the ids of --tokenizer data/gpt2 and of its vocab.json ($own)"
else fail "generate: own copy '$own', data/gpt2 '$given', vocab.json '$other'"; fi
mkdir -p "$dir/swapped"
cp data/gpt2/merges.txt "$dir/swapped/"
python3 -c 'import json, sys
v = json.load(open("data/gpt2/vocab.json"))
v["hello"], v["world"] = v["world"], v["hello"]
json.dump(v, open(sys.argv[1], "w"))' "$dir/swapped/vocab.json"
refused() { # WHAT args...: ./generate args exits 1 with one line naming the fingerprints
    local what=$1 out rc
    shift
    out=$(timeout 60 ./generate --prompt "$prompt" --max_new_tokens 2 "$@" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -eq 1 ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] &&
        [ "$(grep -oE '[0-9a-f]{16}' <<<"$out" | sort -u | wc -l)" -eq 2 ]; then
        pass "$what: exit 1: ${out//$dir/DIR}"
    else fail "$what: exit $rc: $out"; fi
}
refused "generate refuses a vocabulary of the same size with two ids swapped" \
    --checkpoint "$dir/folder" --tokenizer "$dir/swapped"
cp -r "$dir/folder/2" "$dir/changed"
cp "$dir/swapped/vocab.json" "$dir/swapped/merges.txt" "$dir/changed/"
rm "$dir/changed/tokenizer.json"
refused "generate refuses a checkpoint whose tokenizer copy was changed" --checkpoint "$dir/changed"
cp -r "$dir/folder/2" "$dir/older"
python3 -c 'import json, sys
s = json.load(open(sys.argv[1])); del s["tokenizer_fingerprint"]
json.dump(s, open(sys.argv[1], "w"), indent=1)' "$dir/older/state.json"
if gen --checkpoint "$dir/older" --tokenizer "$dir/swapped" >/dev/null; then
    pass "generate: a checkpoint without a fingerprint takes any tokenizer, as before (exit 0)"
else fail "generate refused a checkpoint without a fingerprint: $(cat "$dir/gen.err")"; fi
bytes_ids=$(gen --checkpoint "$dir/bytes")
if [ -n "$bytes_ids" ]; then
    pass "generate: the byte model generates bytes, as before ($bytes_ids)"
else fail "generate on the byte model: $(cat "$dir/gen.err")"; fi

# 5. resume
if train folder data/gpt2 4 "$dir/folder" && grep -q "tokenizer_fingerprint" "$dir/folder/4/state.json" &&
    cmp -s data/gpt2/tokenizer.json "$dir/folder/4/tokenizer.json"; then
    pass "resumed from step 2 to step 4: its checkpoint records the tokenizer too"
else fail "resume: $(tail -n 1 "$dir/folder.log")"; fi

echo "$failures failures"
[ $failures -eq 0 ]
