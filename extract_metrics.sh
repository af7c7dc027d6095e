#!/usr/bin/env bash
# extract_metrics.sh: throughput of every job of a sweep, as picotron's extract_metrics.py.
#
#   ./extract_metrics.sh --inp_dir tmp/sweep [--skip 3]
#
# For each folder under DIR that holds a config.json (a job of submit_slurm_jobs.sh), reads the
# job's log (log_<id>.out of the id in job_id.txt, else the newest log_*.out), skips the first
# --skip logged steps (warm-up: allocation, first communication) and averages Tokens/s/GPU and
# MFU over the rest. picotron prints 1234 as 1.23K: K, M, B (or G) and T are read back as
# 1e3, 1e6, 1e9 and 1e12. Writes metrics.csv into each job folder and DIR/global_metrics.csv
# with one row per job; a job without enough steps gets empty numbers (its status says why).
set -uo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# die and json_get
# shellcheck source=scripts/slurm_common.sh
source "$script_dir/scripts/slurm_common.sh"

inp_dir="" skip=3
while [ $# -gt 0 ]; do
    case "$1" in
    --inp_dir | --skip) [ $# -ge 2 ] || die "$1 needs a value" ;;
    -h | --help) echo "usage: ./extract_metrics.sh --inp_dir DIR [--skip N (default 3)]"; exit 0 ;;
    *) die "unknown option '$1' (usage: --inp_dir DIR [--skip N])" ;;
    esac
    case "$1" in
    --inp_dir) inp_dir=$2 ;;
    --skip) skip=$2 ;;
    esac
    shift 2
done
[ -n "$inp_dir" ] || die "--inp_dir is required: the folder that holds the job folders"
[ -d "$inp_dir" ] || die "--inp_dir $inp_dir is not a folder"
[[ $skip =~ ^[0-9]+$ ]] || die "--skip must be a number of steps, not '$skip'"
inp_dir=$(cd "$inp_dir" && pwd)

# the log of a job's last submission
job_log() {
    local d=$1 id
    id=$(head -n1 "$d/job_id.txt" 2>/dev/null | tr -dc '0-9')
    if [ -n "$id" ] && [ -f "$d/log_$id.out" ]; then
        echo "$d/log_$id.out"
    else
        find "$d" -maxdepth 1 -name 'log_*.out' | sort -V | tail -n1
    fi
}

# step_means LOG: "steps avg_tokens_s_gpu avg_mfu" over the step lines after the first $skip;
# empty numbers when no step is left
step_means() {
    awk -v skip="$skip" '
        function num(s,   m, u) {
            gsub(/[[:space:]%]/, "", s)
            u = toupper(substr(s, length(s)))
            m = 1
            if (u == "K") m = 1e3; else if (u == "M") m = 1e6
            else if (u == "B" || u == "G") m = 1e9; else if (u == "T") m = 1e12
            if (m != 1) s = substr(s, 1, length(s) - 1)
            return s * m
        }
        /Step:/ && /Tokens\/s\/GPU:/ {
            if (++seen <= skip) next
            n = split($0, f, "|")
            for (i = 1; i <= n; i++) {
                split(f[i], kv, ":")
                key = kv[1]; gsub(/^[[:space:]]+|[[:space:]]+$/, "", key)
                if (key == "Tokens/s/GPU") tps += num(kv[2])
                else if (key == "MFU") mfu += num(kv[2])
            }
            used++
        }
        END {
            if (used) printf "%d %.6g %.6g\n", used, tps / used, mfu / used
            else print "0"
        }' "$1"
}

header="run_name,status,dp,tp,pp,cp,mbs,grad_acc,seq_len,steps,avg_tokens_s_gpu,avg_mfu"
global=$inp_dir/global_metrics.csv
rows=()
while IFS= read -r d; do
    cfg=$d/config.json
    name=${d#"$inp_dir"}
    name=${name#/}
    name=${name:-.}
    status=$(head -n1 "$d/status.txt" 2>/dev/null | tr -d '[:space:]')
    log=$(job_log "$d")
    read -r steps tps mfu < <(if [ -n "$log" ]; then step_means "$log"; else echo 0; fi)
    row="$name,${status:-init}"
    for k in distributed.dp_size distributed.tp_size distributed.pp_size distributed.cp_size \
        training.micro_batch_size training.gradient_accumulation_steps training.seq_length; do
        row+=",$(json_get "$cfg" "${k%%.*}" "${k#*.}")"
    done
    row+=",$steps,${tps:-},${mfu:-}"
    printf '%s\n%s\n' "$header" "$row" >"$d/metrics.csv"
    rows+=("$d|$row")
    echo "$name: $steps steps after skipping $skip, tokens/s/GPU ${tps:--}, MFU ${mfu:--}%"
done < <(job_dirs "$inp_dir") # a job's checkpoints, with their config.json, are not jobs
[ ${#rows[@]} -gt 0 ] ||
    die "no config.json in $inp_dir or its folders: it is not a sweep of submit_slurm_jobs.sh"
{
    echo "$header"
    for r in "${rows[@]}"; do echo "${r#*|}"; done
} >"$global"
echo "wrote $global (${#rows[@]} jobs) and metrics.csv in each job folder"
