# shellcheck shell=bash
# Sourced by the tests that list their claims one line each (t_17, t_32, t_59).

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
