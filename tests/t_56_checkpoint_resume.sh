#!/usr/bin/env bash
# A run stopped at step 5 and resumed from its checkpoint trains exactly like one that never
# stopped: the data position follows from the step and the checkpoint holds the parameters and
# both AdamW moments, so steps 6-10 give bit-identical losses and final weights (tolerance 0),
# here with dp=2 x tp=2 so every rank restores its own blocks. A flipped byte in a tensor is refused
# in one line naming it, and the job ends non-zero within seconds.
cd "$(dirname "$0")/.." || exit 1
dir=$(mktemp -d /tmp/picotron-resume.XXXXXX)
trap 'rm -rf "$dir"' EXIT
write_config() {  # name total_steps save_dir load_path
    cat >"$dir/$1.json" <<JSON
{"distributed": {"dp_size": 2, "tp_size": 2},
 "model": {"name": "picotron-tiny"},
 "training": {"total_train_steps": $2, "seq_length": 32, "micro_batch_size": 2,
              "learning_rate": 1e-3},
 "dataset": {"name": "data/pride_and_prejudice.txt"},
 "checkpoint": {"save_dir": "$3", "save_frequency": 5, "load_path": "$4"},
 "logging": {"metrics_file": "$dir/$1.jsonl"}}
JSON
}
write_config straight 10 "$dir/straight" ""
write_config resumed 10 "$dir/resumed" "$dir/straight/5"
timeout 120 mpirun -np 4 ./train --config "$dir/straight.json" >"$dir/straight.log" 2>&1 || exit 1
timeout 120 mpirun -np 4 ./train --config "$dir/resumed.json" >"$dir/resumed.log" 2>&1 || exit 1
first=$(head -n 1 "$dir/resumed.jsonl" | grep -o '"step": [0-9]*')
echo "resumed run starts at $first"
[ "$first" = '"step": 6' ] || exit 1
if ! diff <(tail -n 5 "$dir/straight.jsonl" | sed 's/, "seconds.*//') \
          <(sed 's/, "seconds.*//' "$dir/resumed.jsonl"); then
    echo "losses of steps 6-10 differ"; exit 1
fi
echo "losses of steps 6-10 identical"
"${PICOTRON_BUILD:-build}/tests/tool_compare_checkpoints" "$dir/straight/10" "$dir/resumed/10" 0 ||
    exit 1
python3 - "$dir/straight/5/model.safetensors" <<'PY'
import json, struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
n, = struct.unpack_from("<Q", data, 0)
begin = json.loads(data[8:8 + n])["model.layers.1.self_attn.o_proj.weight"]["data_offsets"][0]
data[8 + n + begin + 4001] ^= 0x01  # one bit of one weight
open(path, "wb").write(data)
PY
rm -rf "$dir/resumed"
start=$(date +%s)
timeout 30 mpirun -np 4 ./train --config "$dir/resumed.json" >/dev/null 2>"$dir/err"
rc=$? secs=$(( $(date +%s) - start ))
line=$(grep -c "o_proj" "$dir/err")
echo "one flipped bit: exit $rc after ${secs}s, $line line naming the tensor: $(grep -m1 o_proj "$dir/err")"
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$line" = 1 ] && [ $secs -le 15 ] &&
    grep -q "model.layers.1.self_attn.o_proj.weight does not match its checksum" "$dir/err"
