#!/usr/bin/env bash
# 8 ranks on this 2-core machine: dp=8 finishes a short run (the waits yield instead of spinning);
# and a rank that fails (here: the data file vanishes, seen by every rank) ends the whole job with
# one message and a non-zero exit within seconds instead of leaving ranks hanging.
cd "$(dirname "$0")/.." || exit 1
dir=$(mktemp -d /tmp/picotron-dp8.XXXXXX)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/ok.json" <<JSON
{"distributed": {"dp_size": 8}, "model": {"name": "picotron-tiny"},
 "training": {"total_train_steps": 3, "seq_length": 64, "micro_batch_size": 1}}
JSON
start=$(date +%s)
timeout 120 mpirun -np 8 ./train --config "$dir/ok.json" >"$dir/log" 2>&1
rc=$? secs=$(( $(date +%s) - start ))
steps=$(grep -c 'Step: ' "$dir/log")
echo "dp=8 on $(nproc) cores: exit $rc, $steps steps in ${secs}s"
[ $rc -eq 0 ] && [ "$steps" = 3 ] || exit 1
sed 's|"training"|"dataset": {"name": "'"$dir"'/missing.txt"}, "training"|' "$dir/ok.json" >"$dir/bad.json"
start=$(date +%s)
timeout 30 mpirun -np 8 ./train --config "$dir/bad.json" >"$dir/out" 2>"$dir/err"
rc=$? secs=$(( $(date +%s) - start ))
echo "missing data file on 8 ranks: exit $rc after ${secs}s: $(grep -m1 missing.txt "$dir/err")"
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $secs -le 15 ] && grep -q "missing.txt" "$dir/err"
