#!/usr/bin/env bash
# submit_slurm_jobs.sh: submit every config folder of a sweep to Slurm, as picotron's
# submit_slurm_jobs.py does, in shell.
#
#   ./create_config --out_dir tmp/sweep --exp_name dp8 --dp 8 ...      (one folder per config)
#   ./submit_slurm_jobs.sh --inp_dir tmp/sweep --qos high --nb_slurm_array 4
#   ./submit_slurm_jobs.sh --inp_dir tmp/sweep --status                 (table of states)
#   ./submit_slurm_jobs.sh --inp_dir tmp/sweep --only fail              (resubmit the failed ones)
#   ./extract_metrics.sh   --inp_dir tmp/sweep                          (throughput table)
#
# Each job folder gets job.slurm (the batch script), log_<slurm id>.out, job_id.txt (the last
# Slurm id) and status.txt, which moves through the states of picotron's Status enum:
#   init -> pending -> running -> completed | fail | oom | timeout
# The batch script writes running, then completed (train exited 0), timeout (train stopped by a
# signal and saved, or Slurm's "DUE TO TIME LIMIT" in the log), oom (the log shows an
# out-of-memory error) or fail. A job killed before it could write its end state is settled on
# the next call of this script: it asks squeue, then `scontrol show job` (which remembers a job
# for MinJobAge, 300 s by default), then sacct when accounting exists, and falls back to the log.
#
# Stopping in time: the job asks Slurm for SIGUSR1 --signal_lead seconds before its time limit
# (#SBATCH --signal=B:USR1@SECONDS; Slurm may send it up to a minute earlier). B: sends it to the
# batch shell alone, which passes it on to the launcher: srun forwards USR1 to every task, MPICH's
# mpirun to every rank. scancel and the time limit itself send SIGTERM to every process of the job
# instead, and the shell passes that on too (srun then prints "forcing job termination", yet its
# tasks still get KillWait seconds). On either signal ./train finishes its step, saves a checkpoint
# in checkpoint.save_dir and exits 0; the log's "stopped by signal" line makes the state timeout.
# `--only timeout` then resubmits the job, and a config whose checkpoint.load_path is its save_dir
# continues from the latest checkpoint (this script warns about configs that would restart).
#
# Nodes and tasks: world size W = dp*tp*pp*cp, one rank per task. A GPU job puts one rank on
# each GPU: W <= gpus_per_node gives one node with W tasks, otherwise W / gpus_per_node nodes of
# gpus_per_node tasks (W must be a multiple). A CPU job (--cpu) puts all W ranks on one node, or
# --cpus_per_node ranks per node when given; --nodes N puts W/N ranks on each of N nodes. The job
# kind follows --cpu, not the config's use_cpu (a CPU-built create_config sets it by default):
# ./train itself checks that it matches.
set -uo pipefail

STATES="init pending running completed fail oom timeout"

usage() {
    cat <<'EOF'
usage: ./submit_slurm_jobs.sh --inp_dir DIR [options]
  --inp_dir DIR          every folder under DIR that holds a config.json is a job
  --qos QOS              Slurm quality of service (#SBATCH --qos)
  --partition NAME       Slurm partition (#SBATCH --partition)
  --time LIMIT           job time limit, as sbatch reads it (default 01:00:00)
  --signal_lead SECONDS  SIGUSR1 this long before the time limit, so train saves a checkpoint
                         and stops (default 120; 0: no warning signal, only the limit's SIGTERM)
  --gpus_per_node N      GPUs (= ranks) per node for GPU jobs (default 8)
  --cpu                  CPU-only jobs (no GPUs requested)
  --cpus_per_node N      CPU jobs: ranks per node (default: all ranks on one node)
  --max_nodes N          refuse jobs that need more than N nodes
  --nodes N              spread each job's ranks over N nodes (N divides its world size)
  --nb_slurm_array N     N dependency chains (afterany): at most N jobs run at once
  --only STATE           (re)submit only jobs in STATE: fail, pending, timeout, running, ...
  --dry_run              write job.slurm files, submit nothing
  --status               settle and print the states, submit nothing
  --launcher srun|mpirun launch ranks with srun --mpi=pmi2 (default) or MPICH's mpirun
  --train PATH           the train binary (default: ./train beside this script)
EOF
}

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# die, json_get and job_dirs
# shellcheck source=scripts/slurm_common.sh
source "$script_dir/scripts/slurm_common.sh"

is_posint() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }

# time_seconds LIMIT: sbatch's --time in seconds (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S); nothing
# for a form it does not know (UNLIMITED)
time_seconds() {
    local d=0 h=0 m=0 s=0 r
    if [[ $1 =~ ^([0-9]+)-([0-9]+)(:([0-9]+))?(:([0-9]+))?$ ]]; then
        r=("${BASH_REMATCH[@]}")
        d=${r[1]} h=${r[2]} m=${r[4]:-0} s=${r[6]:-0}
    elif [[ $1 =~ ^([0-9]+):([0-9]+):([0-9]+)$ ]]; then
        h=${BASH_REMATCH[1]} m=${BASH_REMATCH[2]} s=${BASH_REMATCH[3]}
    elif [[ $1 =~ ^([0-9]+)(:([0-9]+))?$ ]]; then
        m=${BASH_REMATCH[1]} s=${BASH_REMATCH[3]:-0}
    else
        return 0
    fi
    echo $((((10#$d * 24 + 10#$h) * 60 + 10#$m) * 60 + 10#$s)) # 10#: 08 is not octal
}

# ---------------------------------------------------------------- options
inp_dir="" qos="" partition="" time_limit="01:00:00" gpus_per_node=8 cpu=0 cpus_per_node=""
max_nodes="" nodes_wanted="" nb_slurm_array=0 only="" dry_run=0 status_only=0 launcher=srun train=""
signal_lead=120
while [ $# -gt 0 ]; do
    opt=$1
    case "$opt" in
    --cpu) cpu=1; shift; continue ;;
    --dry_run) dry_run=1; shift; continue ;;
    --status) status_only=1; shift; continue ;;
    -h | --help) usage; exit 0 ;;
    --inp_dir | --qos | --partition | --time | --gpus_per_node | --cpus_per_node | --max_nodes | \
        --nodes | --nb_slurm_array | --only | --launcher | --train | --signal_lead)
        [ $# -ge 2 ] || die "$opt needs a value (see --help)" ;;
    *) die "unknown option '$opt' (see --help)" ;;
    esac
    val=$2
    shift 2
    case "$opt" in
    --inp_dir) inp_dir=$val ;;
    --qos) qos=$val ;;
    --partition) partition=$val ;;
    --time) time_limit=$val ;;
    --gpus_per_node) gpus_per_node=$val ;;
    --cpus_per_node) cpus_per_node=$val ;;
    --max_nodes) max_nodes=$val ;;
    --nodes) nodes_wanted=$val ;;
    --nb_slurm_array) nb_slurm_array=$val ;;
    --only) only=$val ;;
    --launcher) launcher=$val ;;
    --train) train=$val ;;
    --signal_lead) signal_lead=$val ;;
    esac
done
[ -n "$inp_dir" ] || die "--inp_dir is required: the folder that holds the config folders"
[ -d "$inp_dir" ] || die "--inp_dir $inp_dir is not a folder"
is_posint "$gpus_per_node" || die "--gpus_per_node must be a positive integer, not '$gpus_per_node'"
[ -z "$cpus_per_node" ] || is_posint "$cpus_per_node" ||
    die "--cpus_per_node must be a positive integer, not '$cpus_per_node'"
[ -z "$nodes_wanted" ] || is_posint "$nodes_wanted" ||
    die "--nodes must be a positive integer, not '$nodes_wanted'"
[ -z "$nodes_wanted" ] || [ -z "$cpus_per_node" ] || die "--nodes and --cpus_per_node: pass one"
[ -z "$max_nodes" ] || is_posint "$max_nodes" ||
    die "--max_nodes must be a positive integer, not '$max_nodes'"
[[ $nb_slurm_array =~ ^[0-9]+$ ]] ||
    die "--nb_slurm_array must be a number of chains (0: no chains), not '$nb_slurm_array'"
[ -z "$only" ] || [[ " $STATES " == *" $only "* ]] ||
    die "--only $only: expected one of: $STATES"
[ "$launcher" = srun ] || [ "$launcher" = mpirun ] ||
    die "--launcher $launcher: expected srun or mpirun"
[ -z "$time_limit" ] && die "--time needs a limit such as 01:00:00"
if ! [[ $signal_lead =~ ^[0-9]+$ ]] || [ "$signal_lead" -gt 65535 ]; then
    die "--signal_lead must be a number of seconds from 0 to 65535 (Slurm's limit)," \
        "not '$signal_lead'"
fi
limit_s=$(time_seconds "$time_limit")
[ "$signal_lead" = 0 ] || [ -z "$limit_s" ] || [ "$signal_lead" -lt "$limit_s" ] ||
    die "--signal_lead $signal_lead is not shorter than --time $time_limit ($limit_s s):" \
        "the warning would come at once; give a shorter lead, or 0 for none"
inp_dir=$(cd "$inp_dir" && pwd)
[ -n "$train" ] || train=$script_dir/train
[[ $train == /* ]] || train=$PWD/$train

# ---------------------------------------------------------------- the jobs
# A folder with a config.json is a job; folders below a job (checkpoints) are not.
mapfile -t jobs < <(job_dirs "$inp_dir")
[ ${#jobs[@]} -gt 0 ] ||
    die "no config.json in $inp_dir or its folders:" \
        "write configs with ./create_config --out_dir $inp_dir ..."

job_name() { # path relative to inp_dir ("." for inp_dir itself)
    local n=${1#"$inp_dir"}
    n=${n#/}
    echo "${n:-.}"
}
get_status() {
    local s
    s=$(head -n1 "$1/status.txt" 2>/dev/null | tr -d '[:space:]')
    echo "${s:-init}"
}
set_status() { echo "$2" >"$1/status.txt"; }

# slurm_state ID: Slurm's state of a job (PENDING, RUNNING, COMPLETED, TIMEOUT, ...), empty when
# Slurm no longer knows it; fails when squeue cannot reach the controller.
slurm_state() {
    local s
    s=$(squeue -h -j "$1" -o %T 2>/dev/null | head -n1)
    if [ -z "$s" ]; then
        squeue -h -o %A >/dev/null 2>&1 || return 1
        # squeue forgets a job when it ends; scontrol keeps it for MinJobAge (300 s by default)
        s=$(scontrol show job -o "$1" 2>/dev/null | grep -oE 'JobState=[A-Z_]+' | head -n1)
        s=${s#JobState=}
    fi
    if [ -z "$s" ] && command -v sacct >/dev/null 2>&1; then
        s=$(sacct -n -X -j "$1" -o State 2>/dev/null | head -n1 | awk '{print $1}')
    fi
    echo "$s"
}

# settle DIR: bring status.txt up to date for a job that Slurm has ended. While the job lives,
# its batch script writes status.txt itself; settle only catches the ends it could not write
# (killed at the time limit, cancelled while pending, node lost) and refines fail.
settle() {
    local d=$1 st id state log
    st=$(get_status "$d")
    case "$st" in pending | running | fail) ;; *) return ;; esac
    id=$(head -n1 "$d/job_id.txt" 2>/dev/null | tr -dc '0-9')
    [ -n "$id" ] && command -v squeue >/dev/null 2>&1 || return
    state=$(slurm_state "$id") || return
    log=$d/log_$id.out
    case "$state" in
    PENDING | RUNNING | CONFIGURING | COMPLETING | SUSPENDED | REQUEUED | RESIZING) ;;
    TIMEOUT) set_status "$d" timeout ;;
    OUT_OF_MEMORY) set_status "$d" oom ;;
    *)
        if [ -f "$log" ] && grep -qE 'stopped by signal|DUE TO TIME LIMIT' "$log"; then
            set_status "$d" timeout
        elif [ -f "$log" ] && grep -qiE 'out of memory|OutOfMemory' "$log"; then
            set_status "$d" oom
        elif [ "$st" != fail ]; then
            set_status "$d" fail
        fi ;;
    esac
}

print_table() {
    local s d n
    echo "| job | status | slurm id |"
    for d in "${jobs[@]}"; do
        echo "| $(job_name "$d") | $(get_status "$d") | $(head -n1 "$d/job_id.txt" 2>/dev/null) |"
    done
    echo
    echo "| status | count |"
    for s in $STATES; do
        n=0
        for d in "${jobs[@]}"; do [ "$(get_status "$d")" = "$s" ] && n=$((n + 1)); done
        echo "| $s | $n |"
    done
    echo "| total | ${#jobs[@]} |"
}

if [ $status_only = 1 ]; then
    for d in "${jobs[@]}"; do settle "$d"; done
    print_table
    exit 0
fi

# ---------------------------------------------------------------- job.slurm
# write_job_script DIR: checks the layout against the nodes, then writes DIR/job.slurm
write_job_script() {
    local d=$1 cfg=$1/config.json k v dp tp pp cp world kind per_node nodes omp
    for k in dp tp pp cp; do
        v=$(json_get "$cfg" distributed "${k}_size")
        is_posint "$v" || die "$cfg: distributed.${k}_size is '${v:-missing}'," \
            "expected a positive integer (rewrite it with ./create_config)"
        printf -v "$k" '%s' "$v"
    done
    world=$((dp * tp * pp * cp))
    kind=gpu
    [ $cpu = 1 ] && kind=cpu
    if [ $kind = gpu ]; then per_node=$gpus_per_node; else per_node=${cpus_per_node:-$world}; fi
    if [ -n "$nodes_wanted" ]; then
        [ $((world % nodes_wanted)) = 0 ] || die "$cfg: world size $world" \
            "(dp*tp*pp*cp = $dp*$tp*$pp*$cp) does not split over --nodes $nodes_wanted"
        per_node=$((world / nodes_wanted))
    fi
    if [ $world -le "$per_node" ]; then
        per_node=$world
        nodes=1
    else
        [ $((world % per_node)) = 0 ] || die "$cfg: world size $world" \
            "(dp*tp*pp*cp = $dp*$tp*$pp*$cp) is not a multiple of $per_node ranks per node;" \
            "change the layout or --${kind}s_per_node"
        nodes=$((world / per_node))
    fi
    [ -z "$max_nodes" ] || [ $nodes -le "$max_nodes" ] || die "$cfg: world size $world" \
        "(dp*tp*pp*cp = $dp*$tp*$pp*$cp) needs $nodes nodes of $per_node ranks," \
        "more than --max_nodes $max_nodes"
    omp=$(json_get "$cfg" environment OMP_NUM_THREADS)
    [ -n "$omp" ] || omp=$(json_get "$cfg" environment omp_num_threads)
    is_posint "$omp" || omp=1

    local launch="srun --mpi=pmi2"
    [ "$launcher" = mpirun ] && launch="mpirun -np \$SLURM_NTASKS"
    {
        echo "#!/bin/bash"
        echo "# picotron.c job, written by submit_slurm_jobs.sh: $world ranks" \
            "(dp=$dp tp=$tp pp=$pp cp=$cp), $kind"
        echo "#SBATCH --job-name=picotron-$(job_name "$d" | tr '/ ' '__')"
        echo "#SBATCH --nodes=$nodes"
        echo "#SBATCH --ntasks-per-node=$per_node"
        if [ $kind = gpu ]; then
            echo "#SBATCH --gres=gpu:$per_node"
            echo "#SBATCH --exclusive"
        fi
        echo "#SBATCH --output=$d/log_%j.out"
        echo "#SBATCH --time=$time_limit"
        [ "$signal_lead" = 0 ] || echo "#SBATCH --signal=B:USR1@$signal_lead"
        echo "#SBATCH --chdir=$PWD"
        [ -n "$partition" ] && echo "#SBATCH --partition=$partition"
        [ -n "$qos" ] && echo "#SBATCH --qos=$qos"
        cat <<EOF

JOB_DIR='$d'
LOG="\$JOB_DIR/log_\$SLURM_JOB_ID.out"
export OMP_NUM_THREADS=$omp
EOF
        [ $kind = gpu ] && echo "export CUDA_DEVICE_MAX_CONNECTIONS=1"
        cat <<EOF

# status.txt: running now; at the end completed, oom, timeout or fail (picotron's states).
# timeout also when train stopped by a signal and saved: --only timeout resubmits it to continue.
finish() {
    local state=fail
    if grep -q 'stopped by signal' "\$LOG" 2>/dev/null; then
        state=timeout
    elif [ "\$1" = 0 ]; then
        state=completed
    elif grep -qiE 'out of memory|OutOfMemory' "\$LOG" 2>/dev/null; then
        state=oom
    elif grep -q 'DUE TO TIME LIMIT' "\$LOG" 2>/dev/null; then
        state=timeout
    fi
    echo "\$state" >"\$JOB_DIR/status.txt"
    exit "\$1"
}
# Slurm's warning before the time limit (USR1) comes to this shell alone; scancel and the limit
# send TERM to every process. Both go on to the launcher, which hands them to the ranks: train
# finishes its step, saves a checkpoint and exits 0.
launcher=""
forward() {
    echo "batch script: got SIG\$1, passing it to the launcher (pid \$launcher)"
    [ -n "\$launcher" ] && kill -"\$1" "\$launcher" 2>/dev/null
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
echo running >"\$JOB_DIR/status.txt"
echo "job \$SLURM_JOB_ID on \$SLURM_JOB_NODELIST: \$SLURM_NTASKS ranks"
$launch '$train' --config "\$JOB_DIR/config.json" &
launcher=\$!
# bash's wait returns as soon as a trapped signal arrives: wait again while the launcher lives
while kill -0 "\$launcher" 2>/dev/null; do wait "\$launcher"; done
wait "\$launcher" # bash keeps the exit status of a child it has reaped
finish \$?
EOF
    } >"$d/job.slurm"
    [ -f "$d/status.txt" ] || set_status "$d" init
}

# resume_note DIR: one line when resubmitting this job would not continue from its checkpoints;
# train resumes from save_dir/latest only when checkpoint.load_path is the save_dir itself
resume_note() {
    local d=$1 save load
    save=$(json_get "$d/config.json" checkpoint save_dir)
    load=$(json_get "$d/config.json" checkpoint load_path)
    [ "$load" = null ] && load=""
    if [ -z "$save" ]; then
        echo "warning: $(job_name "$d"): checkpoint.save_dir is empty: stopped by its time" \
            "limit, this job saves nothing, and a resubmission restarts from step 1"
    elif [ -z "$load" ]; then
        echo "warning: $(job_name "$d"): checkpoint.load_path is empty, so a resubmission" \
            "restarts from step 1; to continue from the latest checkpoint instead, write the" \
            "config with ./create_config ... --load_path $save (or set it in $d/config.json)"
    elif [ "$load" != "$save" ]; then
        echo "warning: $(job_name "$d"): checkpoint.load_path $load is not its save_dir $save," \
            "so a resubmission starts again from $load, not from the latest checkpoint"
    fi
}

# ---------------------------------------------------------------- select and submit
for d in "${jobs[@]}"; do settle "$d"; done
selected=()
for d in "${jobs[@]}"; do
    st=$(get_status "$d")
    if [ -n "$only" ]; then
        [ "$st" = "$only" ] && selected+=("$d")
    elif [ "$st" = pending ] || [ "$st" = running ]; then
        echo "skipping $(job_name "$d"): already $st (Slurm job $(cat "$d/job_id.txt"))"
    else
        selected+=("$d")
    fi
done
# every job script is written (and every layout checked) before anything is submitted
for d in "${selected[@]+"${selected[@]}"}"; do write_job_script "$d"; done
for d in "${selected[@]+"${selected[@]}"}"; do resume_note "$d"; done

if [ $dry_run = 1 ]; then
    for d in "${selected[@]+"${selected[@]}"}"; do echo "wrote $d/job.slurm"; done
    echo "dry run: wrote ${#selected[@]} job scripts, submitted nothing"
    exit 0
fi
command -v sbatch >/dev/null 2>&1 ||
    die "sbatch not found in PATH: run this on a Slurm login node," \
        "or use --dry_run to only write job.slurm files"
[ -x "$train" ] ||
    die "$train not found: build it with make (make GPU=1 for GPUs) or pass --train PATH"

# --nb_slurm_array N: N chains of consecutive jobs; a job starts after the one before it in its
# chain has ended, whatever its outcome (afterany), so at most N run at once.
chains=$nb_slurm_array
[ "$chains" -gt ${#selected[@]} ] && chains=${#selected[@]}
submitted=0 failed=0 prev="" chain_left=0 chain=0
for d in "${selected[@]+"${selected[@]}"}"; do
    if [ "$chains" -gt 0 ] && [ $chain_left = 0 ]; then
        # the first (count % chains) chains take one job more, as picotron distributes them
        chain_left=$(( ${#selected[@]} / chains + (chain < ${#selected[@]} % chains ? 1 : 0) ))
        chain=$((chain + 1))
        prev=""
    fi
    dep=()
    [ -n "$prev" ] && dep=(--dependency="afterany:$prev")
    old=$(get_status "$d")
    set_status "$d" pending   # before sbatch: a quick job may write running at once
    if out=$(sbatch --parsable "${dep[@]+"${dep[@]}"}" "$d/job.slurm" 2>&1); then
        id=${out%%;*}
        echo "$id" >"$d/job_id.txt"
        echo "submitted $(job_name "$d") as Slurm job $id${prev:+ (after $prev)}"
        submitted=$((submitted + 1))
        [ "$chains" -gt 0 ] && prev=$id
    else
        set_status "$d" "$old"
        echo "sbatch failed for $(job_name "$d"): $(echo "$out" | head -n1)" >&2
        failed=$((failed + 1))
    fi
    [ "$chains" -gt 0 ] && chain_left=$((chain_left - 1))
done
echo "submitted $submitted of ${#selected[@]} jobs${only:+ (--only $only)}"
print_table
[ $failed = 0 ]
