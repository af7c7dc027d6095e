#!/usr/bin/env bash
# Nothing lost, with bad luck. Each case runs the real ./train (dp2 x tp2 on 4 ranks) and checks:
#  1. kill -9 of one rank in the middle of a save leaves the previous checkpoint as `latest`, the
#     half-written one unused; resuming the save_dir continues the losses of a run never killed,
#     and the metrics file holds each step once (the repeated steps rewritten, not appended)
#  2. SIGTERM to mpirun: every rank stops after the same step, saves, says where; resumed, the
#     losses go on as if never stopped
#  3. a second run on the same save_dir is refused, naming the first one's host and pid
#  4. learning rate 1e6: the divergence line (step, learning rate, tensor), a non-zero exit, no
#     checkpoint of the diverged step, and a metrics file that is still valid JSON Lines
#  5. resuming at total_train_steps says there is nothing to train and how to go on
#  6. an unwritable save_dir is refused before step 1
#  7. keep_last 2 keeps the two newest checkpoints; 4 threads per rank on a node of fewer cores
#     than ranks x threads is clamped, in one line
cd "$(dirname "$0")/.." || exit 1
dir=$(mktemp -d /tmp/picotron-faults.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
. tests/check_lib.sh
write_config() { # name total_steps save_frequency load_path [learning_rate] [save_dir]
    cat >"$dir/$1.json" <<JSON
{"distributed": {"dp_size": 2, "tp_size": 2},
 "model": {"name": "picotron-tiny"},
 "training": {"total_train_steps": $2, "seq_length": 32, "micro_batch_size": 2,
              "learning_rate": ${5:-1e-3}},
 "dataset": {"name": "data/pride_and_prejudice.txt"},
 "checkpoint": {"save_dir": "${6:-$dir/$1.ckpt}", "save_frequency": $3, "load_path": "$4"},
 "logging": {"metrics_file": "$dir/$1.jsonl"}}
JSON
}
losses() { sed 's/.*"step": *\([0-9]*\).*"loss": *\([-0-9.e+]*\).*/\1 \2/' "$1"; }
train() { timeout 120 mpirun -np 4 ./train --config "$dir/$1.json" >"$dir/$1.log" 2>&1; }

# 1. the reference, then a run killed while saving step 10 over a checkpoint of step 5
write_config straight 10 0 ""
train straight || { echo "FAIL: the reference run"; exit 1; }
write_config killed 5 5 ""
train killed || { echo "FAIL: the first half"; exit 1; }
write_config killed 10 5 "$dir/killed.ckpt"
PICOTRON_TEST_KILL_RANK_IN_SAVE=3 train killed
rc=$?
check "kill -9 of rank 3 while saving step 10 ends the job (exit $rc)" test $rc -ne 0 -a $rc -ne 124
check "latest still names step 5; step 10 only half-written in 10.tmp" \
    test "$(cat "$dir/killed.ckpt/latest")" = 5 -a -d "$dir/killed.ckpt/10.tmp" -a ! -e "$dir/killed.ckpt/10"
train killed
check "resumed from the save_dir at step 6 (exit $?)" grep -q '"step": 6' "$dir/killed.jsonl"
check "after the kill, steps 1..10 equal the run never killed, each step once" \
    diff <(losses "$dir/straight.jsonl") <(losses "$dir/killed.jsonl")

# 2. SIGTERM to mpirun in the middle of a long run
write_config signalled 100000 0 "$dir/signalled.ckpt"
timeout 120 mpirun -np 4 ./train --config "$dir/signalled.json" >"$dir/signalled.log" 2>&1 &
pid=$!
for _ in $(seq 600); do [ "$(cat "$dir/signalled.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break; sleep 0.1; done
kill -TERM $pid
wait $pid
rc=$?
step=$(sed -n 's/.*stopped by signal 15 after step \([0-9]*\).*/\1/p' "$dir/signalled.log")
echo "     $(grep 'stopped by signal' "$dir/signalled.log")"
check "SIGTERM: saved at step $step and exit $rc" test -n "$step" -a "$rc" = 0 -a -f "$dir/signalled.ckpt/$step/state.json"
write_config reference $((step + 3)) 0 ""
train reference
write_config signalled $((step + 3)) 0 "$dir/signalled.ckpt"
train signalled
check "resumed after SIGTERM: steps 1..$((step + 3)) equal the run never stopped" \
    diff <(losses "$dir/reference.jsonl") <(losses "$dir/signalled.jsonl")

# 3. two runs, one save_dir
write_config first 100000 1000 ""
timeout 120 mpirun -np 4 ./train --config "$dir/first.json" >"$dir/first.log" 2>&1 &
pid=$!
for _ in $(seq 600); do [ -s "$dir/first.jsonl" ] && break; sleep 0.1; done
write_config second 10 1000 "" 1e-3 "$dir/first.ckpt"
train second
rc=$?
echo "     $(cat "$dir/second.log" | grep -v parameters)"
check "a second run on the same save_dir is refused (exit $rc), naming host and pid" \
    grep -q "first.ckpt is in use by another run (host $(hostname) pid [0-9]*)" "$dir/second.log"
kill -TERM $pid; wait $pid

# 4. divergence
write_config diverged 50 1 "" 1e6
train diverged
rc=$?
line=$(grep "training diverged" "$dir/diverged.log")
echo "     $line"
at=$(echo "$line" | sed -n 's/.*diverged at step \([0-9]*\).*/\1/p')
check "lr 1e6: one divergence line naming step, learning rate and tensor, exit $rc" \
    test "$(grep -c "training diverged" "$dir/diverged.log")" = 1 -a $rc -ne 0 -a -n "$at" -a \
    -n "$(echo "$line" | grep 'learning rate 1e+06.*first tensor with a non-finite gradient: model\.')"
check "no checkpoint of step $at or later; latest is step $((at - 1))" \
    test "$(cat "$dir/diverged.ckpt/latest")" = $((at - 1)) -a ! -e "$dir/diverged.ckpt/$at"
check "the metrics stay valid JSON Lines ($(wc -l <"$dir/diverged.jsonl") lines)" \
    python3 -c 'import json, sys; [json.loads(l) for l in open(sys.argv[1])]' "$dir/diverged.jsonl"

# 5. nothing left to train
write_config straight 10 0 "$dir/killed.ckpt"
train straight
check "resuming at total_train_steps says so and exits 0 ($?)" \
    grep -q "nothing to train: the checkpoint in .* is at step 10 and training.total_train_steps = 10 (raise it" \
    "$dir/straight.log"

# 6. a save_dir that cannot be written
write_config unwritable 10 5 "" 1e-3 /proc/picotron
start=$(date +%s)
train unwritable
rc=$?
echo "     $(grep -v parameters "$dir/unwritable.log")"
check "unwritable save_dir: one line before step 1, exit $rc" \
    test $rc -ne 0 -a "$(grep -c 'cannot write in checkpoint.save_dir /proc/picotron' "$dir/unwritable.log")" = 1 -a \
    ! -s "$dir/unwritable.jsonl" -a $(($(date +%s) - start)) -le 15
# 7. keep_last, and threads beyond the cores
write_config kept 5 1 ""
sed -i 's/"save_frequency": 1,/"save_frequency": 1, "keep_last": 2,/; s/"logging"/"environment": {"OMP_NUM_THREADS": "64"}, "logging"/' \
    "$dir/kept.json"
train kept
check "keep_last 2: steps 4 and 5 kept ($(cd "$dir/kept.ckpt" && echo [0-9]*))" \
    test "$(cd "$dir/kept.ckpt" && echo [0-9]*)" = "4 5" -a "$(cat "$dir/kept.ckpt/latest")" = 5
echo "     $(grep OMP_NUM_THREADS "$dir/kept.log")"
check "64 threads x 4 ranks on $(nproc) cores: clamped, one line" \
    test "$(grep -c "OMP_NUM_THREADS = 64 with 4 ranks on this node's $(nproc) cores: using 1 thread per rank" "$dir/kept.log")" = 1
exit $((failures > 0))
