# shellcheck shell=bash
# Helpers of the sweep scripts submit_slurm_jobs.sh and extract_metrics.sh, which source this file
# from beside them (so either runs from any folder).

die() { # one line on stderr, named after the script that sourced this file, then exit 1
    echo "${0##*/}: error: $*" >&2
    exit 1
}

# json_get FILE SECTION KEY: the value of SECTION.KEY in a config.json (quotes stripped), empty
# when absent. The config's sections are flat objects, so "[^}]*" spans exactly one section.
json_get() {
    tr '\n\r\t' '   ' <"$1" |
        grep -oE "\"$2\"[[:space:]]*:[[:space:]]*\{[^}]*\}" | head -n1 |
        grep -oE "\"$3\"[[:space:]]*:[[:space:]]*(\"[^\"]*\"|[^,}[:space:]]+)" | head -n1 |
        sed -E 's/^[^:]*:[[:space:]]*//; s/^"//; s/"$//'
}

# job_dirs DIR: the job folders under DIR, one a line: every folder that holds a config.json, but
# none inside another job (a job's checkpoints hold a config.json too). Sorting the folders, not
# the files, puts a job before its checkpoints: "job" < "job/40", while "job/40/config.json"
# < "job/config.json".
job_dirs() {
    local d j found=()
    while IFS= read -r d; do
        for j in "${found[@]+"${found[@]}"}"; do [[ $d == "$j"/* ]] && continue 2; done
        found+=("$d")
        echo "$d"
    done < <(find "$1" -name config.json -type f -printf '%h\n' | LC_ALL=C sort)
}
