#!/usr/bin/env bash
# Claim: across nodes that have separate network stacks (network namespaces joined by veth links
# to a bridge, tests/nodes_lib.sh), MPICH's Hydra starts the ranks on each node and they train as
# one rank: dp2 x tp2 x pp2 on 2 nodes of 4 ranks and on 4 nodes of 2 gives the single-rank
# losses and final weights (tests/layout_harness.sh's tolerances); the report shows each rank's
# node and local rank and which groups cross nodes; the bytes the links' own counters saw are
# within NODE_BYTES_TOL of what the report says crossed; and every namespace, link and process
# the test made is gone at its end. Needs root (CAP_NET_ADMIN); skipped otherwise.
cd "$(dirname "$0")/.." || exit 1
NODE_BYTES_TOL=0.10 # the links also carry TCP/IP headers, UCX's own messages and Hydra's PMI
KILLED_TIMEOUT_S=10 # distributed.timeout_s of the job whose rank is killed: room for a slow start
KILL_END_S=30       # that timeout, Slurm's KillWait = 5, and the time to notice
skip() { echo "$*"; exit 77; }
source tests/nodes_lib.sh
source tests/nodes_slurm.sh
why=$(nodes_can) || skip "skipped: $why"
[ -x ./train ] || skip "./train is not built"
source tests/layout_harness.sh
trap 'nodes_down; rm -rf "$HARNESS_DIR"' EXIT
nodes_up 4 || { echo "FAIL: could not make 4 nodes"; exit 1; }
trap 'nodes_down; rm -rf "$HARNESS_DIR"' EXIT # nodes_up set its own; keep the harness's too
chmod 755 "$HARNESS_DIR" # the Slurm cluster's munged (user munge) has its files below
mpicc -shared -fPIC -o "$HARNESS_DIR/finalize_shim.so" tests/finalize_shim.c ||
    { echo "FAIL: building tests/finalize_shim.c"; exit 1; }
# hydra RANKS_PER_NODE NODES: mpirun's options for the nodes; UCX over TCP on each node's link
# only (by default it would find the other nodes' ranks in this machine's shared memory)
hydra() {
    local hosts="" i
    for ((i = 0; i < $2; i++)); do hosts+="${hosts:+,}$(nodes_addr $i):$1"; done
    echo "mpirun -launcher rsh -launcher-exec $PWD/tests/node_launcher.sh -iface $NODES_BRIDGE" \
        "-genv UCX_TLS tcp -genv UCX_NET_DEVICES pn0" \
        "-genv LD_PRELOAD $HARNESS_DIR/finalize_shim.so -hosts $hosts"
}
fails=0
run_layout base ga=4 || exit 1
for layout in "4 2" "2 4"; do
    read -r per nodes <<<"$layout"
    name=n${nodes}x$per
    before=$(nodes_rx_bytes)
    HARNESS_MPIRUN=$(hydra "$per" "$nodes") check_layout base "$name" dp=2 tp=2 pp=2 ga=2 ||
        fails=$((fails + 1))
    link=$(($(nodes_rx_bytes) - before))
    log=$HARNESS_DIR/$name/log
    [ -n "${T72_KEEP:-}" ] && cp "$log" "/tmp/t72-$name.log"
    # each rank's node and local rank: the report's node:local column, rank r on node r / per
    want=$(seq 0 7 | awk -v p="$per" '{printf "%d %d:%d\n", $1, int($1 / p), $1 % p}')
    got=$(awk '/^bytes sent per step/ {t = 1; getline; next}
               t && /^ +[0-9]+ / {print $1, $3; next} t {exit}' "$log")
    if [ "$got" = "$want" ]; then
        echo "ok   $name: ranks on their nodes: $(echo "$got" | tr '\n' ' ')"
    else
        echo "FAIL $name: node:local per rank '$(echo "$got" | tr '\n' ' ')', want '$(echo "$want" | tr '\n' ' ')'"
        fails=$((fails + 1))
    fi
    grep -A1 '^across' "$log" | tail -n 1 | sed 's/^ */    /'
    report=$(sed -nE 's/^ *over the whole run ([0-9]+) bytes crossed nodes$/\1/p' "$log")
    if awk -v a="$link" -v b="${report:-0}" -v t=$NODE_BYTES_TOL 'BEGIN {
            d = a - b; if (d < 0) d = -d; printf "    links %d bytes, report %d, rel diff %.3f\n", a, b, b ? d / b : 1
            exit !(b > 0 && d <= t * b) }'; then
        echo "ok   $name: the links' counters match the report within $NODE_BYTES_TOL"
    else
        echo "FAIL $name: the links' counters vs the report's bytes across nodes"
        fails=$((fails + 1))
    fi
done
# tp inside a node on 4 x 2; dp and pp cross
grep -q "tp stays inside a node" "$HARNESS_DIR/n4x2/log" && grep -q "dp crosses nodes" "$HARNESS_DIR/n4x2/log" ||
    { echo "FAIL n4x2: want tp inside a node, dp across"; fails=$((fails + 1)); }
# the same layout placed round robin on 2 nodes (Hydra wraps -hosts a:1,b:1): rank 1 on node 1,
# so tp crosses, and dp (ranks r and r+4) stays inside a node
HARNESS_MPIRUN=$(hydra 1 2) check_layout base rr2 dp=2 tp=2 pp=2 ga=2 || fails=$((fails + 1))
across=$(grep -A1 '^across' "$HARNESS_DIR/rr2/log" | tail -n 1 | sed 's/^ *//')
echo "    $across"
[[ $across == "dp stays inside a node; tp crosses nodes: "* ]] ||
    { echo "FAIL rr2: want dp inside a node, tp across"; fails=$((fails + 1)); }

# ---- Slurm on the first 2 nodes: a job that completes, then one whose second node loses a rank
slurm=$HARNESS_DIR/slurm
if ! slurm_nodes_up "$slurm" 2 >"$HARNESS_DIR/slurm.out" 2>&1; then
    cat "$HARNESS_DIR/slurm.out"
    echo "FAIL: the 2-node Slurm cluster did not start"
    fails=$((fails + 1))
else
    echo "ok   Slurm: $(sinfo -h -N -o '%N %T' | tr '\n' ' ')"
    export NODE_RANK_SHIM=$HARNESS_DIR/finalize_shim.so
    status() { cat "$slurm/$1/status.txt" 2>/dev/null; }
    wait_job() { # wait_job SWEEP/JOB SECONDS: until its status is final
        local t
        for ((t = 0; t < $2 * 2; t++)); do
            case "$(status "$1")" in completed | fail | oom | timeout) return 0 ;; esac
            sleep 0.5
            [ $((t % 10)) = 9 ] && ./submit_slurm_jobs.sh --inp_dir "$slurm/${1%%/*}" --status >/dev/null
        done
        return 1
    }
    submit() { # submit SWEEP STEPS TIMEOUT_S
        ./create_config --out_dir "$slurm/$1" --exp_name job --dp 2 --tp 2 --pp 2 \
            --model_name picotron-tiny --seq_len 32 --mbs 2 --grad_acc_steps 2 \
            --total_train_steps "$2" --timeout_s "$3" --save_frequency 0 --use_cpu >/dev/null &&
            ./submit_slurm_jobs.sh --inp_dir "$slurm/$1" --cpu --nodes 2 --time 00:05:00 \
                --signal_lead 0 --train "$PWD/tests/node_rank.sh" >/dev/null
    }
    submit finished 6 60 || { echo "FAIL: submitting the 2-node job"; fails=$((fails + 1)); }
    wait_job finished/job 120
    log=$(ls "$slurm"/finished/job/log_*.out 2>/dev/null | head -n 1)
    steps=$(grep -c 'Step:' "$log" 2>/dev/null)
    echo "    $(grep -m1 '^job .* ranks' "$log" 2>/dev/null)"
    if [ "$(status finished/job)" = completed ] && [ "$steps" = 6 ] &&
        grep -q 'over the whole run' "$log"; then
        echo "ok   Slurm: 2-node job completed, $steps loss lines, the report across nodes"
    else
        echo "FAIL Slurm: 2-node job '$(status finished/job)', ${steps:-0} loss lines"
        grep -m 5 -iE 'error|abort|killed|timeout|signal|exit' "$log" 2>/dev/null
        tail -n 5 "$log" 2>/dev/null
        fails=$((fails + 1))
    fi
    # the metrics as on one node: a row of global_metrics.csv with the layout and the throughput
    ./extract_metrics.sh --inp_dir "$slurm/finished" >/dev/null 2>&1
    row=$(grep '^job,' "$slurm/finished/global_metrics.csv" 2>/dev/null)
    echo "    global_metrics.csv: $row"
    IFS=, read -r _ st dp tp pp cp _ _ _ _ tps mfu <<<"$row"
    if [ "$st $dp $tp $pp $cp" = "completed 2 2 2 1" ] && [ -n "$tps" ] && [ -n "$mfu" ]; then
        echo "ok   Slurm: the 2-node job's metrics row (tokens/s/GPU $tps, MFU $mfu)"
    else
        echo "FAIL Slurm: the 2-node job's metrics row '$row'"
        fails=$((fails + 1))
    fi
    # the first job's nodes are free before the second is submitted: a slow machine's Slurm may
    # still be ending it, and the second would wait in the queue
    for ((t = 0; t < 120; t++)); do [ -z "$(squeue -h -o %A)" ] && break; sleep 0.5; done
    submit killed 100000 $KILLED_TIMEOUT_S || { echo "FAIL: submitting the job to kill"; fails=$((fails + 1)); }
    log="" victim=""
    for ((t = 0; t < 240; t++)); do # until 2 steps are logged and a rank on node 1 is found
        log=$(ls "$slurm"/killed/job/log_*.out 2>/dev/null | head -n 1)
        case "$(status killed/job)" in completed | fail | oom | timeout) break ;; esac
        if [ -n "$log" ] && [ "$(grep -c 'Step:' "$log")" -ge 2 ]; then
            for pid in $(ip netns pids "$(nodes_ns 1)"); do
                [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = train ] && victim=$pid && break
            done
        fi
        [ -n "$victim" ] && break
        sleep 0.5
    done
    if [ -z "$victim" ]; then
        steps=$(grep -c 'Step:' "$log" 2>/dev/null)
        echo "FAIL Slurm: no rank of the job found on node 1 after $((t / 2)) s:" \
            "status '$(status killed/job)', queue '$(squeue -h -o '%A %T %R' | tr '\n' ' ')'," \
            "${steps:-0} steps logged"
        tail -n 5 "$log" 2>/dev/null
        fails=$((fails + 1))
    else
        t0=$(date +%s.%N)
        kill -KILL "$victim"
        wait_job killed/job $KILL_END_S
        t1=$(date +%s.%N)
        until [ -z "$(squeue -h -o %A)" ] || [ "$(echo "$(date +%s.%N) - $t0 > $KILL_END_S" | bc)" = 1 ]; do
            sleep 0.5
        done
        t1=$(date +%s.%N)
        took=$(printf %.1f "$(echo "$t1 - $t0" | bc)")
        line=$(grep -m1 -E 'timeout: waited|error|Abort|BAD TERMINATION|Killed' "$log")
        echo "    killed rank pid $victim on node 1; job $(status killed/job) after ${took}s: $line"
        if [ "$(status killed/job)" = fail ] && [ -z "$(squeue -h -o %A)" ] && [ -n "$line" ] &&
            [ "$(echo "$took <= $KILL_END_S" | bc)" = 1 ]; then
            echo "ok   Slurm: a killed rank on the second node ends the job in ${took}s (<= $KILL_END_S) with a line"
        else
            echo "FAIL Slurm: the job with a killed rank"
            tail -n 5 "$log"
            fails=$((fails + 1))
        fi
    fi
fi

nodes_down
gone() { # gone WHEN: nothing of the fixture is left
    local left
    left=$(nodes_leftovers)
    if [ -z "$left" ]; then
        echo "ok   every namespace, link, process and daemon of the nodes is gone $1"
    else
        echo "FAIL left behind $1: $left"
        fails=$((fails + 1))
    fi
}
gone "after the test"
# and after a failure: a script that makes 2 nodes and their cluster, then fails
mkdir -p "$HARNESS_DIR/failed"
bash -c 'source tests/nodes_lib.sh && source tests/nodes_slurm.sh && nodes_up 2 &&
    slurm_nodes_up "$1" 2 >/dev/null && sinfo -h -N -o %N | grep -q pn1 && exit 3' _ "$HARNESS_DIR/failed"
rc=$?
[ $rc = 3 ] || { echo "FAIL the failing script ended $rc before its failure"; fails=$((fails + 1)); }
gone "after a script that failed with its nodes and cluster up (exit $rc)"
[ $fails -eq 0 ] && [ $harness_failures -eq 0 ]
