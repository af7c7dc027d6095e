#!/usr/bin/env bash
# Claim: submit_slurm_jobs.sh turns dp*tp*pp*cp into nodes x tasks: a 16-GPU config (dp=4 tp=2 pp=2)
# gets a job.slurm asking for 2 nodes x 8 tasks with 8 GPUs each, CUDA_DEVICE_MAX_CONNECTIONS=1
# and srun --mpi=pmi2 on the absolute ./train; a 4-rank --cpu config gets 1 node x 4 tasks and no
# GPU; every job.slurm asks for USR1 --signal_lead seconds (default 120) before its time limit
# and its batch shell passes USR1 and TERM on to the launcher, then waits for it; a config whose
# checkpoint.load_path is not its save_dir gets a one-line warning that a resubmission restarts;
# --nb_slurm_array chains jobs with afterany and --only picks jobs by status (seen through a
# recording stand-in for sbatch); a folder without config.json, a missing sbatch, a world size
# that does not fit the nodes and a warning lead past the time limit each end with one line on
# stderr. No cluster is needed.
cd "$(dirname "$0")/.." || exit 1
root=$PWD
[ -x ./create_config ] || { echo "./create_config is not built (run make)"; exit 77; }

tmp=$(mktemp -d /tmp/t71.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() { # check DESCRIPTION COMMAND...: passes when the command succeeds
    local what=$1
    shift
    if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}
has() { grep -qxF -- "$2" "$1"; }   # the file has this exact line

make_config() { # make_config DIR NAME DP TP PP CP [--use_cpu]
    ./create_config --out_dir "$1" --exp_name "$2" --dp "$3" --tp "$4" --pp "$5" --cp "$6" \
        --model_name picotron-tiny --seq_len 64 --mbs 2 --grad_acc_steps 1 \
        --total_train_steps 5 --overwrite "${@:7}" >/dev/null ||
        { echo "create_config failed for $2"; exit 1; }
}

# ---- 16 GPUs: 2 nodes x 8 tasks
make_config "$tmp/gpu" dp4_tp2_pp2 4 2 2 1
./submit_slurm_jobs.sh --inp_dir "$tmp/gpu" --dry_run >"$tmp/out" 2>&1 ||
    { cat "$tmp/out"; echo "FAIL: dry run exited non-zero"; exit 1; }
js=$tmp/gpu/dp4_tp2_pp2/job.slurm
check "job.slurm written" test -f "$js"
check "2 nodes" has "$js" "#SBATCH --nodes=2"
check "8 tasks per node" has "$js" "#SBATCH --ntasks-per-node=8"
check "8 GPUs per node" has "$js" "#SBATCH --gres=gpu:8"
check "CUDA_DEVICE_MAX_CONNECTIONS=1" has "$js" "export CUDA_DEVICE_MAX_CONNECTIONS=1"
check "log in the job folder" has "$js" "#SBATCH --output=$tmp/gpu/dp4_tp2_pp2/log_%j.out"
check "srun --mpi=pmi2 on the absolute train" \
    has "$js" "srun --mpi=pmi2 '$root/train' --config \"\$JOB_DIR/config.json\" &"
check "job.slurm is valid bash" bash -n "$js"
check "USR1 120 s before the time limit, to the batch shell" has "$js" "#SBATCH --signal=B:USR1@120"
# shellcheck disable=SC2016  # job.slurm's lines, unexpanded
passes_on() { # both traps, and the kill that hands the signal to the launcher
    has "$1" "trap 'forward USR1' USR1" && has "$1" "trap 'forward TERM' TERM" &&
        grep -qF 'kill -"$1" "$launcher"' "$1"
}
check "USR1 and TERM passed on to the launcher" passes_on "$js"
# shellcheck disable=SC2016  # the line as job.slurm holds it, unexpanded
check "waits again while the launcher lives" \
    has "$js" 'while kill -0 "$launcher" 2>/dev/null; do wait "$launcher"; done'
check "a stop by signal ends timeout" grep -qF "grep -q 'stopped by signal'" "$js"
warned='warning: dp4_tp2_pp2: checkpoint.load_path is empty, so a resubmission restarts from'
warned+=' step 1.*--load_path'
check "empty load_path: one warning line" test "$(grep -c "$warned" "$tmp/out")" = 1
check "status init" test "$(cat "$tmp/gpu/dp4_tp2_pp2/status.txt")" = init
check "dry run submits nothing" test ! -e "$tmp/gpu/dp4_tp2_pp2/job_id.txt"
echo "    $(grep -E -- '--nodes|--ntasks-per-node|--gres' "$js" | tr '\n' ' ')"

# ---- 4 CPU ranks: 1 node x 4 tasks, no GPU
make_config "$tmp/cpu" dp2_tp2 2 2 1 1 --use_cpu
./submit_slurm_jobs.sh --inp_dir "$tmp/cpu" --cpu --dry_run --partition p1 --qos q1 \
    --time 00:10:00 --signal_lead 300 >/dev/null 2>&1 || echo "FAIL: cpu dry run exited non-zero"
js=$tmp/cpu/dp2_tp2/job.slurm
check "cpu: --signal_lead 300" has "$js" "#SBATCH --signal=B:USR1@300"
check "cpu: 1 node" has "$js" "#SBATCH --nodes=1"
check "cpu: 4 tasks" has "$js" "#SBATCH --ntasks-per-node=4"
check "cpu: no GPU request" bash -c "! grep -qE 'gres|CUDA_DEVICE' '$js'"
check "partition, qos, time" bash -c "grep -qx '#SBATCH --partition=p1' '$js' &&
    grep -qx '#SBATCH --qos=q1' '$js' && grep -qx '#SBATCH --time=00:10:00' '$js'"
./submit_slurm_jobs.sh --inp_dir "$tmp/cpu" --cpu --dry_run --time 1 --signal_lead 0 >/dev/null \
    2>&1 || echo "FAIL: --signal_lead 0 dry run exited non-zero"
check "--signal_lead 0: no warning signal" bash -c "! grep -q -- '--signal' '$js'"

# ---- load_path = save_dir continues on resubmission: no warning; another load_path: a warning
make_config "$tmp/res" same 1 1 1 1 --use_cpu --load_path "$tmp/res/same"
make_config "$tmp/res" other 1 1 1 1 --use_cpu --load_path "$tmp/elsewhere"
# a checkpoint in the job folder holds a config.json too, and is no job of its own
mkdir -p "$tmp/res/same/40" && echo '{}' >"$tmp/res/same/40/config.json"
./submit_slurm_jobs.sh --inp_dir "$tmp/res" --cpu --dry_run >"$tmp/out" 2>&1 ||
    echo "FAIL: resume dry run exited non-zero"
check "load_path = save_dir: no warning" bash -c "! grep -q 'warning: same' '$tmp/out'"
check "load_path elsewhere: one warning" \
    grep -q "warning: other: checkpoint.load_path $tmp/elsewhere is not its save_dir" "$tmp/out"
check "a checkpoint folder is not a job: 2 job scripts" \
    grep -q "dry run: wrote 2 job scripts" "$tmp/out"

# ---- chains and --only, through a stand-in sbatch that records its arguments...
mkdir -p "$tmp/bin"
cat >"$tmp/bin/sbatch" <<EOF
#!/bin/bash
n=\$(( \$(cat "$tmp/sbatch.n" 2>/dev/null || echo 100) + 1 ))
echo \$n >"$tmp/sbatch.n"
echo "\$n \$*" >>"$tmp/sbatch.log"
echo "\$n;cluster"
EOF
# and squeue, which sees every submitted job as pending (the real one would not know them)
printf '#!/bin/bash\ncase " $* " in *" -j "*) echo PENDING ;; esac\n' >"$tmp/bin/squeue"
chmod +x "$tmp/bin/sbatch" "$tmp/bin/squeue"
for i in 1 2 3 4 5; do make_config "$tmp/chain" "job$i" 1 1 1 1 --use_cpu; done
PATH=$tmp/bin:$PATH ./submit_slurm_jobs.sh --inp_dir "$tmp/chain" --cpu --nb_slurm_array 2 \
    >/dev/null 2>&1 || echo "FAIL: chained submission exited non-zero"
deps=$(awk '{d = "-"; for (i = 2; i <= NF; i++) if ($i ~ /^--dependency=/) d = $i; print $1, d}' \
    "$tmp/sbatch.log" | tr '\n' ',')
expect="101 -,102 --dependency=afterany:101,103 --dependency=afterany:102,104 -,"
expect+="105 --dependency=afterany:104,"
check "5 jobs in 2 chains (3 + 2): $deps" test "$deps" = "$expect"
check "job id recorded" test "$(cat "$tmp/chain/job3/job_id.txt")" = 103
echo fail >"$tmp/chain/job2/status.txt"
echo fail >"$tmp/chain/job4/status.txt"
rm -f "$tmp/sbatch.log"
PATH=$tmp/bin:$PATH ./submit_slurm_jobs.sh --inp_dir "$tmp/chain" --cpu --only fail \
    >"$tmp/out" 2>&1 || echo "FAIL: --only fail exited non-zero"
check "--only fail submits the 2 failed jobs" test "$(wc -l <"$tmp/sbatch.log")" = 2
check "... and says so" grep -q "submitted 2 of 2 jobs (--only fail)" "$tmp/out"
check "... now pending" test "$(cat "$tmp/chain/job2/status.txt")" = pending

# ---- errors: one line on stderr, exit non-zero, nothing submitted
one_line_error() { # one_line_error DESCRIPTION PATTERN COMMAND...
    local what=$1 pattern=$2 rc
    shift 2
    "$@" >"$tmp/o" 2>"$tmp/e"
    rc=$?
    if [ $rc != 0 ] && [ "$(wc -l <"$tmp/e")" = 1 ] && grep -qE -- "$pattern" "$tmp/e"; then
        echo "ok: $what: $(cat "$tmp/e")"
    else
        echo "FAIL: $what (exit $rc, stderr:)"
        cat "$tmp/e"
        fails=$((fails + 1))
    fi
}
mkdir -p "$tmp/empty/sub"
one_line_error "folder without config.json" "no config.json in" \
    ./submit_slurm_jobs.sh --inp_dir "$tmp/empty" --dry_run
# a PATH with every tool of /usr/bin and /bin except Slurm's
mkdir -p "$tmp/nosl"
for d in /usr/local/bin /usr/bin /bin; do   # the first of a name wins, as in PATH
    ln -s -t "$tmp/nosl" "$d"/* 2>/dev/null
done
rm -f "$tmp/nosl"/{sbatch,srun,squeue,scontrol,sacct}
one_line_error "missing sbatch" "sbatch not found in PATH" \
    env PATH="$tmp/nosl" ./submit_slurm_jobs.sh --inp_dir "$tmp/cpu" --cpu
make_config "$tmp/bad12" dp6_tp2 6 2 1 1
one_line_error "12 ranks on 8-GPU nodes" "world size 12 .*not a multiple of 8" \
    ./submit_slurm_jobs.sh --inp_dir "$tmp/bad12" --gpus_per_node 8 --dry_run
one_line_error "16 ranks, --max_nodes 1" "needs 2 nodes of 8 ranks, more than --max_nodes 1" \
    ./submit_slurm_jobs.sh --inp_dir "$tmp/gpu" --max_nodes 1 --dry_run
one_line_error "bad --only" "--only finished: expected one of" \
    ./submit_slurm_jobs.sh --inp_dir "$tmp/gpu" --only finished --dry_run
one_line_error "warning lead past the time limit" \
    "--signal_lead 120 is not shorter than --time 2 \(120 s\)" \
    ./submit_slurm_jobs.sh --inp_dir "$tmp/gpu" --time 2 --dry_run
one_line_error "extract_metrics: folder without config.json" "no config.json in" \
    ./extract_metrics.sh --inp_dir "$tmp/empty"

[ $fails = 0 ] || { echo "$fails checks failed"; exit 1; }
echo "all checks passed: 16 GPUs -> 2 nodes x 8 tasks, 4 CPU ranks -> 1 node x 4 tasks"
