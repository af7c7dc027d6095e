#!/usr/bin/env bash
# Claim: every file a program reads is checked where it is read. A directory, a FIFO or a device
# given as the config, the dataset, the tokenizer, init_from's weights or a checkpoint's
# state.json ends the run within MAX_SECONDS (a FIFO never blocks) with a non-zero exit status and
# one line on stderr naming the file in full, however long its path; a "\u0000" in a config string
# or a JSON Lines document is refused naming the file and the key; a model of more than 4096
# tensors (8 layers of 256 experts) trains a step.
cd "$(dirname "$0")/.." || exit 1
MAX_SECONDS=10
for p in train prepare_data; do [ -x ./$p ] || { echo "./$p not built"; exit 77; }; done
command -v python3 >/dev/null || { echo "python3 is needed to write the test configs"; exit 77; }
command -v mpirun >/dev/null || { echo "mpirun not found"; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# a path of over 300 characters, every folder of it real
long="$tmp/$(printf 'a_folder_with_a_long_name_%02d/' $(seq 1 12))end"
mkdir -p "$long"

# One valid one-rank config; each variant changes the keys given as JSON on its line.
python3 - "$tmp" "$long" <<'PY'
import json, os, sys
tmp, long = sys.argv[1], sys.argv[2]
base = {
    "distributed": {"tp_size": 1, "cp_size": 1, "pp_size": 1, "dp_size": 1, "use_cpu": True},
    "model": {"name": "picotron-tiny", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
              "vocab_size": 256},
    "training": {"seed": 42, "learning_rate": 3e-4, "total_train_steps": 1, "seq_length": 16,
                 "micro_batch_size": 2, "gradient_accumulation_steps": 1},
    "dataset": {"name": "data/austen.txt"},
    "checkpoint": {"save_dir": tmp + "/ckpt", "save_frequency": 1, "load_path": ""},
    "logging": {},
    "environment": {"OMP_NUM_THREADS": "1"},
}
variants = {
    "valid": {},
    "data_dir": {"dataset": {"name": tmp + "/dir.txt"}},
    "data_fifo": {"dataset": {"name": tmp + "/fifo.txt"}},
    "data_fifo_dp2": {"dataset": {"name": tmp + "/fifo.txt"}, "distributed": {"dp_size": 2}},
    "data_dev": {"dataset": {"name": tmp + "/null.txt"}},
    "data_long": {"dataset": {"name": long + "/missing.txt"}},
    "data_long_dir": {"dataset": {"name": long + "/dir.txt"}},
    "init_dir": {"checkpoint": {"init_from": tmp + "/init_dir"}},
    "init_fifo": {"checkpoint": {"init_from": tmp + "/init_fifo"}},
    "init_dev": {"checkpoint": {"init_from": tmp + "/init_dev"}},
    "state_dir": {"checkpoint": {"load_path": tmp + "/state_dir"}},
    "state_fifo": {"checkpoint": {"load_path": tmp + "/state_fifo"}},
    "state_fifo_dp2": {"checkpoint": {"load_path": tmp + "/state_fifo"},
                       "distributed": {"dp_size": 2}},
    "state_dev": {"checkpoint": {"load_path": tmp + "/state_dev"}},
    "moe_many": {"model": {"num_hidden_layers": 8, "num_experts": 256, "num_experts_per_tok": 2,
                           "moe_intermediate_size": 4, "hidden_size": 8, "intermediate_size": 8,
                           "num_attention_heads": 1, "num_key_value_heads": 1},
                 "checkpoint": {"save_frequency": 0}},
}
for name, change in variants.items():
    cfg = json.loads(json.dumps(base))
    for section, keys in change.items():
        cfg[section].update(keys)
    with open(os.path.join(tmp, name + ".json"), "w") as f:
        json.dump(cfg, f, indent=4)
text = open(os.path.join(tmp, "valid.json")).read()
open(os.path.join(tmp, "nul.json"), "w").write(
    text.replace('"data/austen.txt"', '"data/aus\\u0000ten.txt"'))
open(os.path.join(tmp, "nul_key.json"), "w").write(
    text.replace('"environment": {', '"environment": {"OMP\\u0000": "1", '))
with open(os.path.join(tmp, "nul.jsonl"), "w") as f:
    f.write('{"text": "fine"}\n{"text": "cut\\u0000short"}\n')
PY
[ -f "$tmp/valid.json" ] || { echo "could not write the test configs"; exit 1; }
mkdir "$tmp/dir.txt" "$tmp/dir.json" "$long/dir.txt" "$tmp/tok_dir" "$tmp/tok_dir/tokenizer.json"
mkfifo "$tmp/fifo.txt" "$tmp/fifo.json" "$tmp/fifo.jsonl"
ln -s /dev/null "$tmp/null.txt"
ln -s /dev/null "$tmp/null.json"

# a real checkpoint (one step), then copies of it whose weights or state.json are no file
timeout 60 ./train --config "$tmp/valid.json" >"$tmp/out" 2>&1 || {
    echo "the valid config did not train: $(tail -n 3 "$tmp/out")"; exit 1; }
saved=$tmp/ckpt/1
for kind in dir fifo dev; do
    mkdir "$tmp/init_$kind" "$tmp/state_$kind"
    cp "$saved/config.json" "$tmp/init_$kind/"
    cp -r "$saved"/. "$tmp/state_$kind/"
    rm "$tmp/state_$kind/state.json"
done
mkdir "$tmp/init_dir/model.safetensors" "$tmp/state_dir/state.json"
mkfifo "$tmp/init_fifo/model.safetensors" "$tmp/state_fifo/state.json"
ln -s /dev/null "$tmp/init_dev/model.safetensors"
ln -s /dev/null "$tmp/state_dev/state.json"

# lines MPICH prints itself when a rank calls MPI_Abort or a process dies
MPICH_LINES='^Abort\([0-9]+\) on node [0-9]+ \(rank [0-9]+ in comm [0-9]+\): application called MPI_Abort|^=+$|^=   |^\[unset\]: |^YOU CAN IGNORE'

failures=0 cases=0
expect_error() { # expect_error NAME REGEX_THE_LINE_MUST_MATCH COMMAND...
    local name=$1 want=$2 start rc lines ms problem=""
    shift 2
    cases=$((cases + 1))
    start=$(date +%s%N)
    timeout 20 "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    grep -v -E "$MPICH_LINES" "$tmp/err" | grep -v '^[[:space:]]*$' >"$tmp/lines"
    lines=$(wc -l <"$tmp/lines")
    if [ "$rc" -ne 1 ]; then problem="exit status $rc, not 1"
    elif [ "$ms" -gt $((MAX_SECONDS * 1000)) ]; then problem="took $ms ms > $MAX_SECONDS s"
    elif [ "$lines" -ne 1 ]; then problem="$lines stderr lines instead of 1"
    elif ! grep -q -F -- "$want" "$tmp/lines"; then problem="the line does not hold '$want'"
    fi
    if [ -n "$problem" ]; then
        failures=$((failures + 1))
        echo "FAIL $name: $problem; stderr was:"
        sed 's/^/    | /' "$tmp/err" | tail -n 8
    else
        echo "ok   $name: exit $rc, $ms ms: $(cut -c 1-160 "$tmp/lines")"
    fi
}
not_file="is a directory, not a file"
fifo="is a FIFO (named pipe), not a regular file"
device="is a device, not a regular file"

expect_error "config: a directory" "$tmp/dir.json $not_file" ./train --config "$tmp/dir.json"
expect_error "config: a FIFO" "$tmp/fifo.json $fifo" ./train --config "$tmp/fifo.json"
expect_error "config: /dev/null" "$tmp/null.json $device" ./train --config "$tmp/null.json"
expect_error "config: a long path" "$long/dir.txt $not_file" ./train --config "$long/dir.txt"
expect_error "dataset: a directory" "$tmp/dir.txt $not_file" ./train --config "$tmp/data_dir.json"
expect_error "dataset: a FIFO" "$tmp/fifo.txt $fifo" ./train --config "$tmp/data_fifo.json"
expect_error "dataset: a FIFO, 2 ranks" "$tmp/fifo.txt $fifo" \
    mpirun -np 2 ./train --config "$tmp/data_fifo_dp2.json"
expect_error "dataset: /dev/null" "$tmp/null.txt $device" ./train --config "$tmp/data_dev.json"
expect_error "dataset: a long path" "$long/missing.txt: no such file" \
    ./train --config "$tmp/data_long.json"
expect_error "dataset: a long directory" "$long/dir.txt $not_file" \
    ./train --config "$tmp/data_long_dir.json"
expect_error "init_from: weights a directory" "$tmp/init_dir/model.safetensors $not_file" \
    ./train --config "$tmp/init_dir.json"
expect_error "init_from: weights a FIFO" "$tmp/init_fifo/model.safetensors $fifo" \
    ./train --config "$tmp/init_fifo.json"
expect_error "init_from: weights /dev/null" "$tmp/init_dev/model.safetensors $device" \
    ./train --config "$tmp/init_dev.json"
expect_error "state.json a directory" "$tmp/state_dir/state.json $not_file" \
    ./train --config "$tmp/state_dir.json"
expect_error "state.json a FIFO" "$tmp/state_fifo/state.json $fifo" \
    ./train --config "$tmp/state_fifo.json"
expect_error "state.json a FIFO, 2 ranks" "$tmp/state_fifo/state.json $fifo" \
    mpirun -np 2 ./train --config "$tmp/state_fifo_dp2.json"
expect_error "state.json /dev/null" "$tmp/state_dev/state.json $device" \
    ./train --config "$tmp/state_dev.json"
expect_error "tokenizer: a FIFO" "$tmp/fifo.json $fifo" \
    ./prepare_data --tokenizer "$tmp/fifo.json" --input data/austen.txt --output "$tmp/out.tok"
expect_error "tokenizer: /dev/null" "$tmp/null.json $device" \
    ./prepare_data --tokenizer "$tmp/null.json" --input data/austen.txt --output "$tmp/out.tok"
expect_error "tokenizer: tokenizer.json a directory" "$tmp/tok_dir/tokenizer.json $not_file" \
    ./prepare_data --tokenizer "$tmp/tok_dir" --input data/austen.txt --output "$tmp/out.tok"
tok=data/gpt2
if [ -d "$tok" ]; then
    expect_error "prepare_data input: a FIFO" "$tmp/fifo.jsonl $fifo" \
        ./prepare_data --tokenizer "$tok" --input "$tmp/fifo.jsonl" --output "$tmp/out.tok"
    expect_error "prepare_data input: /dev/null" "$tmp/null.txt $device" \
        ./prepare_data --tokenizer "$tok" --input "$tmp/null.txt" --output "$tmp/out.tok"
    expect_error "JSONL: \\u0000 in a document" "$tmp/nul.jsonl line 2: key text holds" \
        ./prepare_data --tokenizer "$tok" --input "$tmp/nul.jsonl" --output "$tmp/out.tok"
fi
expect_error "config: \\u0000 in a value" "$tmp/nul.json: key dataset.name holds" \
    ./train --config "$tmp/nul.json"
expect_error "config: \\u0000 in a key" "$tmp/nul_key.json: key environment.OMP" \
    ./train --config "$tmp/nul_key.json"

# more than 4096 tensors: 8 layers of (3 x 256 experts, the router and 6 more), then 2 or 3
cases=$((cases + 1))
if timeout 120 ./train --config "$tmp/moe_many.json" >"$tmp/out" 2>&1; then
    echo "ok   8 layers of 256 experts (over 6000 tensors) train a step"
else
    failures=$((failures + 1))
    echo "FAIL 8 layers of 256 experts did not train a step:"
    tail -n 5 "$tmp/out" | sed 's/^/    | /'
fi

echo "$failures of $cases cases failed"
[ "$failures" -eq 0 ]
