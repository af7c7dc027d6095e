#!/usr/bin/env bash
# The tutorial's commands run as written: every ```sh block of tutorial/0*.md whose first line is
# "# run" runs, in chapter order, from the repo root (bash -e -o pipefail, each under timeout
# BLOCK_TIMEOUT_S), with OUT set to a temporary folder so the experiments land there and not in
# tmp/; a block that exits non-zero fails the test. Prints how many blocks ran.
# TUTORIAL_VERBOSE=1 prints every block's output (to refresh the output pasted in the chapters).
cd "$(dirname "$0")/.." || exit 1
BLOCK_TIMEOUT_S=120
command -v mpirun >/dev/null || { echo "mpirun not found: install mpich (make deps)"; exit 77; }
command -v gdb >/dev/null || { echo "gdb not found: the chapters' gdb blocks need it (apt-get install gdb)"; exit 77; }
for bin in ./train ./create_config; do
    [ -x "$bin" ] || { echo "$bin is missing: build it with make"; exit 1; }
done
OUT=$(mktemp -d /tmp/picotron-tutorial.XXXXXX)
export OUT
trap 'rm -rf "$OUT"' EXIT
blocks=$OUT/.blocks
mkdir -p "$blocks"

# one file per runnable block: NNN.sh, and its origin (file:line) in NNN.where
awk -v dir="$blocks" '
    FNR == 1 { inside = 0 }
    /^```sh[[:space:]]*$/ && !inside { inside = 1; first = 1; start = FNR; next }
    /^```[[:space:]]*$/ && inside { inside = 0; if (keep) close(file); keep = 0; next }
    inside && first {
        first = 0
        keep = ($0 ~ /^# run[[:space:]]*$/)
        if (keep) {
            n++
            file = sprintf("%s/%03d.sh", dir, n)
            printf "%s:%d\n", FILENAME, start > sprintf("%s/%03d.where", dir, n)
            close(sprintf("%s/%03d.where", dir, n))
        }
    }
    inside && keep { print > file }
' tutorial/0*.md

ran=0 failed=0 start_all=$(date +%s)
for block in "$blocks"/*.sh; do
    [ -e "$block" ] || break
    where=$(cat "${block%.sh}.where")
    start=$(date +%s)
    timeout "$BLOCK_TIMEOUT_S" bash -e -o pipefail "$block" >"${block%.sh}.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    ran=$((ran + 1))
    if [ $rc -ne 0 ]; then
        failed=$((failed + 1))
        echo "FAIL $where: exit $rc after ${secs}s$([ $rc -eq 124 ] && echo " (timeout)")"
        tail -n 15 "${block%.sh}.log" | sed 's/^/    /'
    else
        echo "ok   $where (${secs}s)"
    fi
    if [ -n "${TUTORIAL_VERBOSE:-}" ]; then
        sed 's/^/    | /' "${block%.sh}.log"
    fi
done
echo "$ran tutorial blocks ran in $(( $(date +%s) - start_all ))s, $failed failed"
[ $ran -gt 0 ] && [ $failed -eq 0 ]
