#!/usr/bin/env bash
# Claim: on a real one-node Slurm cluster, submit_slurm_jobs.sh runs a sweep end to end: two
# small CPU configs (dp=2 on 2 ranks, and 1 rank) end `completed` with one loss line per step
# (one MPI world of 2 ranks under srun --mpi=pmi2, not 2 singletons, which ./train would reject),
# a config ./train rejects ends `fail`, the afterany chain of --nb_slurm_array starts its second
# job after the failed first one ended, `--only fail` resubmits just the failed job, a job past
# its time limit ends `timeout` and an out-of-memory log ends `oom`; extract_metrics.sh writes a
# row per job whose mean tokens/s/GPU and MFU over steps 4-6 match the log read by numfmt.
# A job given Slurm's warning signal (USR1 to the batch shell, as --signal=B:USR1@ sends it)
# saves at step S and ends `timeout`; `--only timeout` resubmits it and it trains on from S+1.
# Needs root and ../shared/tools (start-local-slurm.sh); skipped otherwise.
cd "$(dirname "$0")/.." || exit 1
root=$PWD
REL_TOL=1e-4         # the CSV holds 6 significant digits
WAIT_S=300           # bound on all the waiting for jobs
STEPS=6
tools=$root/../shared/tools
skip() { echo "$*"; exit 77; }
[ -x "$tools/start-local-slurm.sh" ] || skip "no $tools/start-local-slurm.sh (CI has ../shared)"
[ "$(id -u)" = 0 ] || skip "needs root to start a local Slurm cluster"
{ [ -x ./train ] && [ -x ./create_config ]; } || skip "./train or ./create_config is not built"

tmp=$(mktemp -d /tmp/t70.XXXXXX)
started=0
cleanup() {
    local ids
    ids=$(cat "$tmp"/*/*/job_id.txt 2>/dev/null | tr '\n' ' ')
    # shellcheck disable=SC2086  # one argument per job id
    [ -n "$ids" ] && command -v scancel >/dev/null && scancel $ids 2>/dev/null
    [ $started = 1 ] && timeout 120 "$tools/stop-local-slurm.sh" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT

# ---- the cluster (stopped on exit only when this test started it)
if ! (command -v scontrol >/dev/null && timeout 10 scontrol ping 2>/dev/null | grep -q UP); then
    started=1
fi
LOCAL_SLURM_CPUS=8 timeout 600 "$tools/start-local-slurm.sh" >"$tmp/start.log" 2>&1 ||
    { tail -n 20 "$tmp/start.log"; echo "FAIL: could not start the local Slurm cluster"; exit 1; }
conf=$(grep -oE 'SLURM_CONF=[^ ]+' "$tmp/start.log" | tail -n1)
[ -n "$conf" ] && export "${conf?}"
echo "cluster: $(grep 'is idle\|is mixed\|is allocated' "$tmp/start.log" | sed 's/^\[[^]]*\] //')"

fails=0
check() { # check DESCRIPTION COMMAND...
    local what=$1
    shift
    if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}
status() { cat "$tmp/$1/status.txt" 2>/dev/null; }
make_config() { # make_config SWEEP NAME DP
    ./create_config --out_dir "$tmp/$1" --exp_name "$2" --dp "$3" --tp 1 --pp 1 --cp 1 \
        --model_name picotron-tiny --seq_len 64 --mbs 2 --grad_acc_steps 1 \
        --total_train_steps $STEPS --use_cpu --overwrite >/dev/null ||
        { echo "FAIL: create_config $2"; exit 1; }
}
deadline=$(($(date +%s) + WAIT_S))
wait_jobs() { # wait_jobs JOB...: until none is init, pending or running (settled by --status)
    local j busy n=0
    while :; do
        busy=0
        for j; do case "$(status "$j")" in init | pending | running) busy=1 ;; esac; done
        [ $busy = 0 ] && return 0
        if [ "$(date +%s)" -ge $deadline ]; then
            echo "FAIL: jobs still busy after ${WAIT_S}s"
            return 1
        fi
        sleep 2
        n=$((n + 1))
        if [ $((n % 5)) = 0 ]; then
            for j; do ./submit_slurm_jobs.sh --inp_dir "$tmp/${j%%/*}" --status >/dev/null; done
        fi
    done
}
slurm_time() { # slurm_time ID StartTime|EndTime, from the controller's memory of the job
    scontrol show job -o "$1" 2>/dev/null | grep -oE "$2=[0-9T:-]+" | cut -d= -f2
}

# ---- a timeout and an oom, through stand-ins for train (the states do not depend on train)
make_config side slow 1
make_config side2 oom 1
printf '#!/bin/sh\nexec sleep 600\n' >"$tmp/sleeper"
printf '#!/bin/sh\necho "cudaMalloc failed: out of memory" >&2\nexit 1\n' >"$tmp/oomer"
chmod +x "$tmp/sleeper" "$tmp/oomer"
# the sleeper cannot save: no warning signal, only the time limit's SIGTERM
./submit_slurm_jobs.sh --inp_dir "$tmp/side" --cpu --time 1 --signal_lead 0 \
    --train "$tmp/sleeper" >/dev/null ||
    echo "FAIL: submitting the timeout job"
./submit_slurm_jobs.sh --inp_dir "$tmp/side2" --cpu --train "$tmp/oomer" >/dev/null ||
    echo "FAIL: submitting the oom job"

# ---- the sweep: two that train, one that ./train rejects
make_config sweep single 1
make_config sweep dp2 2
make_config sweep bad 1
sed -i 's/"training":[[:space:]]*{/"training": {"no_such_key": 1,/' "$tmp/sweep/bad/config.json"
grep -q no_such_key "$tmp/sweep/bad/config.json" || { echo "FAIL: could not spoil bad"; exit 1; }
t0=$(date +%s)
./submit_slurm_jobs.sh --inp_dir "$tmp/sweep" --cpu --time 00:05:00 --nb_slurm_array 2 \
    >"$tmp/submit.out" 2>&1
check "3 jobs submitted" grep -q "submitted 3 of 3 jobs" "$tmp/submit.out"
wait_jobs sweep/bad sweep/dp2 sweep/single
echo "    sweep done after $(($(date +%s) - t0))s"
check "single completed" test "$(status sweep/single)" = completed
check "dp2 completed" test "$(status sweep/dp2)" = completed
check "bad fail" test "$(status sweep/bad)" = fail
for j in single dp2; do
    log=$tmp/sweep/$j/log_$(cat "$tmp/sweep/$j/job_id.txt").out
    losses=$(grep -oE 'Step: +[0-9]+ +\| Loss: +[0-9.]+' "$log" | awk '{print $NF}' | tr '\n' ' ')
    check "$j: $STEPS loss lines (one world, one printing rank): $losses" \
        test "$(echo "$losses" | wc -w)" = $STEPS
done
check "dp2 ran 2 ranks in one job" \
    grep -q ": 2 ranks" "$tmp/sweep/dp2/log_$(cat "$tmp/sweep/dp2/job_id.txt").out"
bad_id=$(cat "$tmp/sweep/bad/job_id.txt")
check "bad's log names the key" grep -q no_such_key "$tmp/sweep/bad/log_$bad_id.out"
# sorted jobs bad, dp2, single in 2 chains: [bad, dp2] and [single]; afterany runs dp2 anyway
bad_end=$(slurm_time "$bad_id" EndTime)
dp2_start=$(slurm_time "$(cat "$tmp/sweep/dp2/job_id.txt")" StartTime)
after() { [ -n "$1" ] && [ -n "$2" ] && ! [[ $1 < $2 ]]; }   # ISO times compare as strings
check "chain: dp2 started ($dp2_start) after bad ended ($bad_end)" after "$dp2_start" "$bad_end"

# ---- --only fail resubmits just the failed one
ids_before="$(cat "$tmp/sweep/single/job_id.txt") $(cat "$tmp/sweep/dp2/job_id.txt")"
./submit_slurm_jobs.sh --inp_dir "$tmp/sweep" --cpu --time 00:05:00 --only fail \
    >"$tmp/resubmit.out" 2>&1
check "--only fail: 1 job submitted" grep -q "submitted 1 of 1 jobs (--only fail)" \
    "$tmp/resubmit.out"
check "--only fail: bad has a new Slurm id" test "$(cat "$tmp/sweep/bad/job_id.txt")" != "$bad_id"
check "--only fail: the others keep theirs" test "$ids_before" = \
    "$(cat "$tmp/sweep/single/job_id.txt") $(cat "$tmp/sweep/dp2/job_id.txt")"
wait_jobs sweep/bad
check "bad fail again" test "$(status sweep/bad)" = fail
./submit_slurm_jobs.sh --inp_dir "$tmp/sweep" --status >"$tmp/table"
table_ok() { grep -qx '| completed | 2 |' "$tmp/table" && grep -qx '| fail | 1 |' "$tmp/table"; }
check "table: 2 completed, 1 fail" table_ok

# ---- metrics
./extract_metrics.sh --inp_dir "$tmp/sweep" >/dev/null || echo "FAIL: extract_metrics.sh"
csv=$tmp/sweep/global_metrics.csv
check "global CSV: header + 3 rows" test "$(wc -l <"$csv")" = 4
head -n1 "$csv" | sed 's/^/    /'
for j in single dp2; do
    row=$(grep "^$j," "$csv")
    echo "    $row"
    check "$j: metrics.csv row" test "$(tail -n1 "$tmp/sweep/$j/metrics.csv")" = "$row"
    log=$tmp/sweep/$j/log_$(cat "$tmp/sweep/$j/job_id.txt").out
    # the reference: steps 4..6 read with sed and numfmt (SI suffixes), averaged by awk
    ref_tps=$(grep 'Step:' "$log" | tail -n +4 | sed -E 's/.*Tokens\/s\/GPU: *([^ |]+).*/\1/' |
        numfmt --from=si --format=%.3f | awk '{s += $1} END {print s / NR}')
    ref_mfu=$(grep 'Step:' "$log" | tail -n +4 | sed -E 's/.*MFU: *([0-9.]+)%.*/\1/' |
        awk '{s += $1} END {print s / NR}')
    IFS=, read -r _ st dp tp pp cp mbs ga sl steps tps mfu <<<"$row"
    dp_want=1
    [ $j = dp2 ] && dp_want=2
    check "$j: columns $st dp=$dp tp=$tp pp=$pp cp=$cp mbs=$mbs grad_acc=$ga seq_len=$sl" \
        test "$st $dp $tp $pp $cp $mbs $ga $sl $steps" = "completed $dp_want 1 1 1 2 1 64 3"
    check "$j: tokens/s/GPU $tps vs $ref_tps, MFU $mfu vs $ref_mfu (rel tol $REL_TOL)" \
        awk -v a="$tps" -v b="$ref_tps" -v c="$mfu" -v d="$ref_mfu" -v t=$REL_TOL 'BEGIN {
            ok = a > 0 && c > 0 && (a - b) ^ 2 <= (t * b) ^ 2 && (c - d) ^ 2 <= (t * d) ^ 2
            exit !ok }'
done
check "bad: row with no numbers" grep -qx "bad,fail,1,1,1,1,2,1,64,0,," "$csv"

# ---- the warning signal: train saves and stops, --only timeout continues from the checkpoint
# load_path = save_dir (the job folder): a fresh start the first time, a resume after that
./create_config --out_dir "$tmp/resume" --exp_name long --dp 2 --tp 1 --pp 1 --cp 1 \
    --model_name picotron-tiny --seq_len 64 --mbs 2 --grad_acc_steps 1 \
    --total_train_steps 100000 --save_frequency 0 --load_path "$tmp/resume/long" --use_cpu \
    --overwrite >/dev/null || { echo "FAIL: create_config long"; exit 1; }
./submit_slurm_jobs.sh --inp_dir "$tmp/resume" --cpu --time 00:05:00 >"$tmp/long.out" 2>&1
check "long: submitted, no restart warning" bash -c "grep -q 'submitted 1 of 1' '$tmp/long.out' &&
    ! grep -q warning '$tmp/long.out'"
long_id=$(cat "$tmp/resume/long/job_id.txt")
long_log=$tmp/resume/long/log_$long_id.out
steps_logged() { local n; n=$(grep -c 'Step:' "$1" 2>/dev/null); echo "${n:-0}"; }
until [ "$(steps_logged "$long_log")" -ge 3 ] || [ "$(date +%s)" -ge $deadline ]; do sleep 0.5; done
scancel --signal=USR1 --batch "$long_id"
wait_jobs resume/long
stopped=$(grep 'stopped by signal' "$long_log")
echo "    $stopped"
S=$(echo "$stopped" | sed -nE 's/^stopped by signal 10 after step ([0-9]+):.*/\1/p')
check "long: the batch shell passed USR1 on" grep -q 'got SIGUSR1, passing it' "$long_log"
check "long: train stopped by signal 10 (USR1) after step ${S:-?}" test -n "$S"
check "long: timeout ($(status resume/long))" test "$(status resume/long)" = timeout
check "long: latest names step $S ($(cat "$tmp/resume/long/latest" 2>/dev/null))" \
    test "$(cat "$tmp/resume/long/latest" 2>/dev/null)" = "$S"
# three more steps, so the continued job completes
sed -i -E "s/(\"total_train_steps\"[[:space:]]*:[[:space:]]*)[0-9]+/\1$((S + 3))/" \
    "$tmp/resume/long/config.json"
./submit_slurm_jobs.sh --inp_dir "$tmp/resume" --cpu --time 00:05:00 --only timeout \
    >"$tmp/long2.out" 2>&1
check "--only timeout: 1 job submitted" grep -q "submitted 1 of 1 jobs (--only timeout)" \
    "$tmp/long2.out"
wait_jobs resume/long
long_log=$tmp/resume/long/log_$(cat "$tmp/resume/long/job_id.txt").out
steps=$(grep -oE 'Step: +[0-9]+' "$long_log" | awk '{print $2}' | tr '\n' ' ')
check "long: continued at step $((S + 1)), steps $steps" test "$steps" = \
    "$((S + 1)) $((S + 2)) $((S + 3)) "
check "long: completed ($(status resume/long))" test "$(status resume/long)" = completed

# ---- the timeout and the oom
wait_jobs side/slow side2/oom
# A job killed at its time limit may end its batch shell (which writes fail) before Slurm records
# TIMEOUT; --status settles it once Slurm has, as a user's next --status would
for _ in $(seq 15); do
    [ "$(status side/slow)" = timeout ] && break
    sleep 2
    ./submit_slurm_jobs.sh --inp_dir "$tmp/side" --status >/dev/null
done
check "time limit: timeout ($(status side/slow))" test "$(status side/slow)" = timeout
check "out of memory: oom ($(status side2/oom))" test "$(status side2/oom)" = oom
echo "    all jobs done after $(($(date +%s) - t0))s"

[ $fails = 0 ] || { echo "$fails checks failed"; exit 1; }
echo "all checks passed"
