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
