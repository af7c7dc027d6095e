# shellcheck shell=bash
# Sourced by the tests that list their claims one line each (t_17, t_32, t_33, t_59).

# check WHAT COMMAND...: "ok   WHAT" when COMMAND succeeds, else "FAIL WHAT" and the last lines
# COMMAND printed (it is silent when it passes); failures counts the FAILs for the exit status
failures=0
check() {
    local what=$1 out
    shift
    if out=$("$@" 2>&1); then
        echo "ok   $what"
    else
        echo "FAIL $what"
        echo "$out" | tail -n 3
        failures=$((failures + 1))
    fi
}

# loss_in FILE STEP: the loss of that step in a metrics file (JSONL, 9 digits)
loss_in() { sed -n "s/.*\"step\": $2, \"loss\": \([-0-9.e+]*\).*/\1/p" "$1"; }
# rel A B: the relative difference of A from B; close A B: both there, and rel within the caller's TOL
rel() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; printf "%.2e", (d < 0 ? -d : d) / b }'; }
close() { [ -n "$1" ] && [ -n "$2" ] && awk -v r="$(rel "$1" "$2")" -v tol="$TOL" 'BEGIN { exit !(r <= tol) }'; }
