#!/usr/bin/env bash
# The watchdog: a rank stopped mid-training (SIGSTOP, as a wedged device or a lost node looks to
# its peers) ends the whole job within distributed.timeout_s plus a few seconds, non-zero, with
# one line naming the rank that waited, the group and the operation; for a stopped dp peer, tp
# peer and pipeline stage. And a timeout_s that is not positive is refused in one line. And an
# MPI_Finalize that never returns (PICOTRON_TEST_HANG_IN_FINALIZE=1: MPICH over UCX sometimes
# hangs there, utils.c) ends the finished job within timeout_s plus a few seconds, exit 1, with
# one line from the rank that gives up first (mpirun ends the others then), or at once when a
# rank is sent SIGTERM there; the same run without the switch ends 0 and says nothing of it.
cd "$(dirname "$0")/.." || exit 1
command -v mpirun >/dev/null || { echo "mpirun not found: install mpich (make deps)"; exit 77; }
TIMEOUT_S=5 # distributed.timeout_s of every case
SLACK_S=15  # the job must end within TIMEOUT_S + SLACK_S of the stop
dir=$(mktemp -d /tmp/picotron-watchdog.XXXXXX)
pids=()
cleanup() { # the stopped rank, should MPI_Abort have missed it
    for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
    rm -rf "$dir"
}
trap cleanup EXIT
export OMP_NUM_THREADS=1
status=0

# the pid of world rank $2 among mpirun $1's descendants (hydra's proxy starts the ranks)
rank_pid() {
    local p
    for p in $(pgrep -P "$(pgrep -P "$1" | head -1)"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "PMI_RANK=$2" && echo "$p"
    done
}

# waits until file $1 holds a line matching $2, for at most 30 s
wait_for_line() {
    local waited=0
    until grep -q "$2" "$1" || [ $waited -ge 60 ]; do sleep 0.5; waited=$((waited + 1)); done
}

# case_stop NAME LAYOUT VICTIM EXPECT: 2 ranks in LAYOUT, rank VICTIM stopped once a step is
# logged; the line must match EXPECT (grep -E)
case_stop() {
    local name=$1 layout=$2 victim_rank=$3 expect=$4
    cat >"$dir/$name.json" <<JSON
{"distributed": {$layout, "timeout_s": $TIMEOUT_S}, "model": {"name": "picotron-tiny"},
 "training": {"total_train_steps": 100000, "seq_length": 64, "micro_batch_size": 1}}
JSON
    timeout 120 mpirun -np 2 ./train --config "$dir/$name.json" >"$dir/$name.log" 2>&1 &
    local job=$!
    wait_for_line "$dir/$name.log" 'Step: '
    local victim
    victim=$(rank_pid "$(pgrep -P $job)" "$victim_rank")
    [ -n "$victim" ] || { echo "$name: rank $victim_rank's pid not found"; kill $job; status=1; return; }
    pids+=("$victim")
    kill -STOP "$victim"
    local start
    start=$(date +%s.%N)
    wait $job
    local rc=$? secs
    secs=$(echo "$(date +%s.%N) - $start" | bc)
    local line
    line=$(grep 'timeout: waited' "$dir/$name.log")
    echo "$name: rank $victim_rank stopped; job ended after ${secs} s (exit $rc): $line"
    if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ "$(echo "$secs > $TIMEOUT_S + $SLACK_S" | bc)" = 1 ] ||
        [ "$(echo "$line" | grep -c .)" != 1 ] || ! echo "$line" | grep -Eq "$expect"; then
        echo "$name: FAILED (want one line matching: $expect)"
        tail -5 "$dir/$name.log"
        status=1
    fi
}

# A peer stopped inside a step leaves the other waiting in that step's collective (dp's gradient
# all-reduce, tp's row-linear all-reduce, pp's activations); stopped between two steps, in the
# step's closing all-reduce of the stop flag (train.c) on world. Either is the right line.
case_stop dp_peer '"dp_size": 2' 1 '^\[rank 0\] timeout: waited [0-9]+ s for all_reduce on (dp|world) '
case_stop tp_peer '"tp_size": 2' 1 '^\[rank 0\] timeout: waited [0-9]+ s for all_reduce on (tp|world) '
case_stop pp_stage '"pp_size": 2' 0 \
    '^\[rank 1\] timeout: waited [0-9]+ s for ((send|recv|send_recv) on pp|all_reduce on world) '

for bad in 0 -1; do
    sed "s/\"timeout_s\": $TIMEOUT_S/\"timeout_s\": $bad/" "$dir/dp_peer.json" >"$dir/bad.json"
    timeout 30 mpirun -np 2 ./train --config "$dir/bad.json" >"$dir/bad.out" 2>&1
    rc=$?
    msg=$(grep 'timeout_s' "$dir/bad.out")
    echo "timeout_s = $bad: exit $rc: $msg"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(echo "$msg" | grep -c .)" = 1 ] || status=1
done

# the finished run's MPI_Finalize: watched only where it hangs
fin() { # SWITCH: runs 2 steps on dp 2; prints "exit seconds lines", lines naming the hung finalize
    local start rc
    start=$(date +%s.%N)
    env ${1:+PICOTRON_TEST_HANG_IN_FINALIZE=$1} timeout 60 mpirun -np 2 ./train --config "$dir/fin.json" \
        >"$dir/fin$1.log" 2>&1
    rc=$?
    echo "$rc $(echo "$(date +%s.%N) - $start" | bc) $(grep -c 'MPI_Finalize has not returned' \
        "$dir/fin$1.log")"
}
sed 's/"total_train_steps": 100000/"total_train_steps": 2/' "$dir/dp_peer.json" >"$dir/fin.json"
read -r rc secs lines < <(fin "")
echo "finalize that returns: exit $rc after $secs s, $lines lines of a hung finalize"
[ "$rc" = 0 ] && [ "$lines" = 0 ] && grep -q 'Step: 2 ' "$dir/fin.log" || { status=1; tail -3 "$dir/fin.log"; }
read -r rc secs lines < <(fin 1)
echo "finalize that hangs: exit $rc after $secs s, $lines lines of a hung finalize"
[ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$lines" -ge 1 ] && grep -q 'Step: 2 ' "$dir/fin1.log" &&
    [ "$(echo "$secs < $TIMEOUT_S + $SLACK_S" | bc)" = 1 ] || { status=1; tail -3 "$dir/fin1.log"; }
# a hung finalize that is sent SIGTERM (a user's kill, Slurm's stop) ends at once, not after
# timeout_s: the run is over, nothing is left to save
sed 's/"timeout_s": [0-9]*/"timeout_s": 300/' "$dir/fin.json" >"$dir/fin_term.json"
PICOTRON_TEST_HANG_IN_FINALIZE=1 timeout 60 mpirun -np 2 ./train --config "$dir/fin_term.json" \
    >"$dir/fin_term.log" 2>&1 &
job=$!
# the last line rank 0 prints before its finalize, then a second for rank 1 to reach its own
wait_for_line "$dir/fin_term.log" 'overlapped the backward'
sleep 1
victim=$(rank_pid "$(pgrep -P $job)" 1)
start=$(date +%s.%N)
[ -n "$victim" ] && kill -TERM "$victim"
wait $job
rc=$?
secs=$(echo "$(date +%s.%N) - $start" | bc)
echo "finalize that hangs, rank 1 sent SIGTERM: exit $rc after $secs s"
[ -n "$victim" ] && [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$(echo "$secs < $SLACK_S" | bc)" = 1 ] ||
    { status=1; tail -3 "$dir/fin_term.log"; }
exit $status
