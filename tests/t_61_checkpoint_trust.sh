#!/usr/bin/env bash
# Nothing silently wrong: a checkpoint is trusted only once checked, and nothing non-finite or
# half-written is ever saved. Every case runs the real ./train (dp 2, so two ranks must both end)
# or ./generate on a crafted file and asserts the exact exit status, the one line naming the file
# and the key (or tensor), and that the job ended within LIMIT seconds.
#  1. state.json edited: step negative, huge, not whole, missing; optimizer_step beyond step;
#     samples_per_step 0; layout.tp_size 0; format missing; latest not a number
#  2. config.json edited (0 heads, 0 layers, negative hidden_size, vocab_size 2^40): refused by
#     ./train (resume) and ./generate alike, in config_validate's words naming the file
#  3. ./generate refuses a damaged model.safetensors and optimizer.safetensors (checksums), as
#     ./train does; a NaN in imported weights (init_from, and ./generate of that folder), or in a
#     checkpoint whose checksum was made to match: the line says the input weights are not finite
#  4. a run made to diverge in AdamW's update (learning rate 1e38: finite gradients, infinite
#     steps): the line says "in the update", nothing is saved, latest still names the last one
#  5. keep_last 1 while resuming from an older step: the new save and latest stay, the later
#     steps' folders stay, one line says so
#  6. an unwritable save_dir (signal-only saves) or logging.metrics_file: refused before step 1;
#     as root, a full disk: the metrics file's failed write ends the job naming the file and
#     errno, and a SIGTERM whose save cannot be written exits non-zero
cd "$(dirname "$0")/.." || exit 1
command -v python3 >/dev/null || { echo "python3 not found (it edits the JSON files)"; exit 77; }
LIMIT=20 # seconds a refused run may take, start-up included, on a busy machine
dir=$(mktemp -d /tmp/picotron-trust.XXXXXX)
mnt=""
# the tmpfs of case 6, once the ranks that wrote there are gone (under ASan they linger a little)
unmount() {
    for _ in $(seq 10); do
        umount "$mnt" 2>/dev/null && mnt="" && return
        sleep 1
    done
}
trap 'kill $(jobs -p) 2>/dev/null; [ -n "$mnt" ] && unmount; rm -rf "$dir"' EXIT
. tests/check_lib.sh
export OMP_NUM_THREADS=1
write_config() { # name total_steps save_frequency load_path [learning_rate] [extra checkpoint keys]
    cat >"$dir/$1.json" <<JSON
{"distributed": {"dp_size": 2},
 "model": {"name": "picotron-tiny"},
 "training": {"total_train_steps": $2, "seq_length": 32, "micro_batch_size": 2,
              "learning_rate": ${5:-1e-3}},
 "dataset": {"name": "data/pride_and_prejudice.txt"},
 "checkpoint": {"save_dir": "$dir/$1.ckpt", "save_frequency": $3, "load_path": "$4"${6:+, $6}},
 "logging": {"metrics_file": "$dir/$1.jsonl"}}
JSON
}
train() { timeout 60 mpirun -np 2 ./train --config "$dir/$1.json" >"$dir/$1.log" 2>&1; }
gen() { timeout 60 ./generate --print_ids --max_new_tokens 5 --prompt "It is" --checkpoint "$@"; }
# refused WHAT RC PATTERN LOG: the run just timed (start) exited RC, its log holds exactly one
# line with PATTERN (grep -E), and it took at most LIMIT seconds
refused() {
    local what=$1 want=$2 pattern=$3 log=$4 took=$(($(date +%s) - start))
    echo "     $(grep -E "$pattern" "$log" | head -n 1)"
    check "$what (exit $rc, ${took}s)" test "$rc" = "$want" -a "$took" -le $LIMIT -a \
        "$(grep -cE "$pattern" "$log")" = 1
}
# edit FILE PYTHON: runs PYTHON with d the file's JSON, then writes d back
edit() { python3 -c "import json, sys; p = sys.argv[1]; d = json.load(open(p)); $2; json.dump(d, open(p, 'w'))" "$1"; }

write_config base 2 2 ""
train base || { echo "FAIL: the base run"; cat "$dir/base.log"; exit 1; }
ckpt=$dir/base.ckpt/2

# 1. state.json's numbers
state_case() { # what python-edit pattern
    rm -rf "$dir/s.ckpt" && cp -r "$dir/base.ckpt" "$dir/s.ckpt"
    edit "$dir/s.ckpt/2/state.json" "$2"
    write_config s 4 2 "$dir/s.ckpt"
    start=$(date +%s)
    train s
    rc=$?
    refused "state.json, $1: refused" 1 "$3" "$dir/s.log"
}
S="s\.ckpt/2/state\.json"
state_case "step -1" 'd["step"] = -1' "$S: step = -1 is not a whole number from 1 to 1073741824"
state_case "step 1e12" 'd["step"] = 1e12' "$S: step = 1000000000000 is not a whole number from 1"
state_case "step 2.5" 'd["step"] = 2.5' "$S: step = 2.5 is not a whole number"
state_case "step missing" 'del d["step"]' "$S has no number step"
state_case "optimizer_step 99 > step" 'd["optimizer_step"] = 99' \
    "$S: optimizer_step = 99 is not a whole number from 0 to 2"
state_case "samples_per_step 0" 'd["samples_per_step"] = 0' "$S: samples_per_step = 0 is not"
state_case "layout.tp_size 0" 'd["layout"]["tp_size"] = 0' "$S: layout\.tp_size = 0 is not"
state_case "samples_seen 7, not step x samples_per_step" 'd["samples_seen"] = 7' \
    "$S: samples_seen = 7 is not a whole number from 8 to 8"
state_case "tokens_seen missing" 'del d["tokens_seen"]' "$S has no number tokens_seen"
state_case "format missing" 'del d["format"]' "$S: format is not \"picotron\.c checkpoint 1\""
rm -rf "$dir/s.ckpt" && cp -r "$dir/base.ckpt" "$dir/s.ckpt" && echo "-3" >"$dir/s.ckpt/latest"
start=$(date +%s)
train s
rc=$?
refused "latest holds -3: refused" 1 "s\.ckpt/latest holds \"-3.?\", not a step from 1 to 2\^30" "$dir/s.log"
echo "7" >"$dir/s.ckpt/latest"
start=$(date +%s)
train s
rc=$?
refused "latest names step 7, no such folder: refused" 1 "s\.ckpt/latest names .*s\.ckpt/7, which is not there" "$dir/s.log"

# 2. config.json's sizes, for ./train and ./generate
config_case() { # what python-edit pattern
    rm -rf "$dir/c.ckpt" && cp -r "$dir/base.ckpt" "$dir/c.ckpt"
    edit "$dir/c.ckpt/2/config.json" "$2"
    write_config c 4 2 "$dir/c.ckpt"
    start=$(date +%s)
    train c
    rc=$?
    refused "config.json, $1: ./train refuses" 1 "config error: .*c\.ckpt/2/config\.json: $3" "$dir/c.log"
    start=$(date +%s)
    gen "$dir/c.ckpt" >"$dir/c.gen" 2>&1
    rc=$?
    refused "config.json, $1: ./generate refuses, no text" 1 \
        "config error: .*c\.ckpt/2/config\.json: $3" "$dir/c.gen"
}
config_case "0 heads" 'd["num_attention_heads"] = 0' "model\.num_attention_heads = 0 must be at least 1"
config_case "0 layers" 'd["num_hidden_layers"] = 0' "model\.num_hidden_layers = 0 must be at least 1"
config_case "hidden_size -128" 'd["hidden_size"] = -128' "model\.hidden_size = -128 must be at least 1"
config_case "vocab_size 2^25" 'd["vocab_size"] = 2**25' "model\.vocab_size = 33554432 must be at most 16777216"
# beyond an int: config_read_hf's line, before config_validate's
rm -rf "$dir/c.ckpt" && cp -r "$dir/base.ckpt" "$dir/c.ckpt"
edit "$dir/c.ckpt/2/config.json" 'd["intermediate_size"] = 2**40'
start=$(date +%s)
gen "$dir/c.ckpt" >"$dir/c.gen" 2>&1
rc=$?
refused "config.json, intermediate_size 2^40: ./generate refuses, no text" 1 \
    "c\.ckpt/2: intermediate_size = 1099511627776 is not a whole number from -2\^31" "$dir/c.gen"

# 3. damaged weights for ./generate; NaN in imported weights
flip() { python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(-7, 2); b = f.read(1); f.seek(-7, 2); f.write(bytes([b[0] ^ 1]))' "$1"; }
for file in model optimizer; do
    rm -rf "$dir/g.ckpt" && cp -r "$dir/base.ckpt" "$dir/g.ckpt" && flip "$dir/g.ckpt/2/$file.safetensors"
    start=$(date +%s)
    gen "$dir/g.ckpt" >"$dir/g.gen" 2>&1
    rc=$?
    refused "one flipped bit in $file.safetensors: ./generate refuses (checksum), no text" 1 \
        "g\.ckpt/2/$file\.safetensors: tensor .* does not match its checksum" "$dir/g.gen"
done
gen "$ckpt" >"$dir/ok.gen" 2>&1
check "the undamaged checkpoint generates (exit $?)" grep -qE '^[0-9]+( [0-9]+){4}$' "$dir/ok.gen"
# a Hugging Face folder (config.json, model.safetensors) whose model.norm.weight holds a NaN
mkdir -p "$dir/hf" && cp "$ckpt/config.json" "$ckpt/model.safetensors" "$dir/hf/"
python3 - "$dir/hf/model.safetensors" <<'PY'
import json, struct, sys
f = open(sys.argv[1], "r+b")
n = struct.unpack("<Q", f.read(8))[0]
at = json.loads(f.read(n))["model.norm.weight"]["data_offsets"][0]
f.seek(8 + n + at + 4 * 5)
f.write(struct.pack("<f", float("nan")))
PY
write_config nan 2 0 "" 1e-3 "\"init_from\": \"$dir/hf\""
start=$(date +%s)
train nan
rc=$?
refused "NaN in init_from's weights: ./train refuses before step 1" 1 \
    "init_from .*/hf: tensor model\.norm\.weight holds an inf or a NaN: the input weights are not finite" \
    "$dir/nan.log"
check "  ... and no step ran" test ! -s "$dir/nan.jsonl"
start=$(date +%s)
gen "$dir/hf" >"$dir/nan.gen" 2>&1
rc=$?
refused "NaN in a Hugging Face folder: ./generate refuses" 1 \
    "tensor model\.norm\.weight holds an inf or a NaN: the input weights are not finite" "$dir/nan.gen"

# a NaN in a ./train checkpoint whose checksum was made to match: refused all the same
rm -rf "$dir/n.ckpt" && cp -r "$dir/base.ckpt" "$dir/n.ckpt"
python3 - "$dir/n.ckpt/2" <<'PY'
import json, struct, sys
M = 2**64 - 1
def splitmix64(x):  # checkpoint.c's, on the element's index and bits
    x = (x + 0x9E3779B97F4A7C15) & M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M
    return x ^ (x >> 31)
folder, name, k = sys.argv[1], "model.norm.weight", 5
f = open(folder + "/model.safetensors", "r+b")
n = struct.unpack("<Q", f.read(8))[0]
at = 8 + n + json.loads(f.read(n))[name]["data_offsets"][0] + 4 * k
f.seek(at)
old = struct.unpack("<I", f.read(4))[0]
new = 0x7FC00000  # a quiet NaN
f.seek(at)
f.write(struct.pack("<I", new))
state = json.load(open(folder + "/state.json"))
sums = state["checksums"]["model.safetensors"]
sums[name] = "%016x" % ((int(sums[name], 16) - splitmix64(k << 32 | old) + splitmix64(k << 32 | new)) & M)
json.dump(state, open(folder + "/state.json", "w"))
PY
write_config n 4 2 "$dir/n.ckpt"
start=$(date +%s)
train n
rc=$?
refused "NaN in a checkpoint, checksum matching: ./train refuses" 1 \
    "n\.ckpt/2/model\.safetensors: tensor model\.norm\.weight holds an inf or a NaN: the input weights are not finite" \
    "$dir/n.log"
start=$(date +%s)
gen "$dir/n.ckpt" >"$dir/n.gen" 2>&1
rc=$?
refused "  ... and ./generate too" 1 "tensor model\.norm\.weight holds an inf or a NaN: the input weights" "$dir/n.gen"

# 4. diverged in the update: steps 1-2 at 1e-3 saved, then 1e38 from step 3
write_config up 2 1 ""
train up || { echo "FAIL: the first half of the update case"; exit 1; }
write_config up 4 1 "$dir/up.ckpt" 1e38
start=$(date +%s)
train up
rc=$?
refused "lr 1e38: diverged at step 3 in the update" 1 \
    "training diverged at step 3 \(learning rate 1e\+38\) in the update: the loss and the gradients were finite .* made tensor model\." \
    "$dir/up.log"
check "  ... nothing of step 3 saved, latest still 2" \
    test "$(cat "$dir/up.ckpt/latest")" = 2 -a ! -e "$dir/up.ckpt/3" -a ! -e "$dir/up.ckpt/3.tmp"
write_config up 4 1 "$dir/up.ckpt"
train up
check "  ... and step 2 still resumes (exit $?)" grep -q '"step": 4' "$dir/up.jsonl"

# 5. keep_last 1, resumed from step 2 of a save_dir holding 2, 4, 6
write_config keep 6 2 ""
train keep || { echo "FAIL: the first run of the keep_last case"; exit 1; }
write_config keep 3 1 "$dir/keep.ckpt/2" 1e-3 '"keep_last": 1'
train keep
rc=$?
echo "     $(grep 'later steps' "$dir/keep.log")"
check "resumed from 2 of 2,4,6: one line says later steps are kept (exit $rc)" \
    test $rc = 0 -a "$(grep -c "keep\.ckpt holds 2 checkpoints of later steps than 2 (the newest 6): kept" "$dir/keep.log")" = 1
check "keep_last 1: the new save 3 is latest and kept, 4 and 6 kept, 2 removed ($(cd "$dir/keep.ckpt" && echo [0-9]*))" \
    test "$(cd "$dir/keep.ckpt" && echo [0-9]*)" = "3 4 6" -a "$(cat "$dir/keep.ckpt/latest")" = 3

# 6. unwritable save_dir and metrics file: refused before step 1
write_config w 5 0 ""
sed -i "s|\"save_dir\": \"[^\"]*\"|\"save_dir\": \"/proc/picotron/ckpt\"|" "$dir/w.json"
start=$(date +%s)
train w
rc=$?
refused "save_dir unwritable, saved only on a signal: refused at start-up" 1 \
    "cannot write in checkpoint\.save_dir /proc/picotron/ckpt" "$dir/w.log"
check "  ... before step 1" test ! -s "$dir/w.jsonl"
write_config m 5 0 ""
sed -i "s|\"metrics_file\": \"[^\"]*\"|\"metrics_file\": \"/proc/picotron/m.jsonl\"|" "$dir/m.json"
start=$(date +%s)
train m
rc=$?
refused "metrics_file unwritable: refused at start-up" 1 \
    "cannot write logging\.metrics_file /proc/picotron/m\.jsonl\.tmp: No such file" "$dir/m.log"
check "  ... before step 1" test "$(grep -c 'Step:' "$dir/m.log")" = 0

if [ "$(id -u)" = 0 ] && mkdir -p "$dir/full" && mount -t tmpfs -o size=1M tmpfs "$dir/full"; then
    mnt=$dir/full
    head -c 2M /dev/zero >"$mnt/filler" 2>/dev/null # the disk is now full
    write_config full 100 0 ""
    sed -i "s|\"metrics_file\": \"[^\"]*\"|\"metrics_file\": \"$mnt/m.jsonl\"|" "$dir/full.json"
    start=$(date +%s)
    train full
    rc=$?
    refused "metrics_file on a full disk: the first write ends the job" 1 \
        "cannot write logging\.metrics_file $mnt/m\.jsonl: No space left on device" "$dir/full.log"
    # a signal's save that cannot be written: the start-up probe passes (a folder takes no room),
    # then the lock file cannot be written (a full disk), or the checkpoint (1 MB for 10 MB)
    sigterm() { # what
        write_config sig 100000 0 ""
        sed -i "s|\"save_dir\": \"[^\"]*\"|\"save_dir\": \"$mnt/ckpt\"|" "$dir/sig.json"
        rm -rf "$dir/sig.jsonl" "$mnt/ckpt"
        timeout 60 mpirun -np 2 ./train --config "$dir/sig.json" >"$dir/sig.log" 2>&1 &
        pid=$!
        for _ in $(seq 600); do
            [ -f "$dir/sig.jsonl" ] && [ "$(wc -l <"$dir/sig.jsonl")" -ge 3 ] && break
            sleep 0.1
        done
        start=$(date +%s)
        kill -TERM $pid
        wait $pid
        rc=$?
        echo "     $(grep -E 'No space left' "$dir/sig.log" | head -n 1)"
        check "SIGTERM, $1: exit $rc (not 0), no 'saved' line, no latest" \
            test "$rc" = 1 -a "$(grep -c 'stopped by signal' "$dir/sig.log")" = 0 -a \
            "$(grep -c 'No space left on device' "$dir/sig.log")" = 1 -a \
            ! -e "$mnt/ckpt/latest" -a $(($(date +%s) - start)) -le $LIMIT
    }
    sigterm "its lock file on a full disk"
    rm "$mnt/filler"
    sigterm "its checkpoint beyond the disk's 1 MB"
    unmount
else
    echo "skip a full disk (needs root to mount a tmpfs)"
fi
exit $((failures > 0))
