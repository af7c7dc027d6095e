#!/usr/bin/env bash
# Runs every tests/t_*.sh in name order. A test script exits 0 when its claim holds, 77 when it
# cannot run here (it prints why), anything else when it fails. Each test's line gives its
# seconds; the line before the last, the whole run's. Last line: "N passed, N failed, N skipped".
cd "$(dirname "$0")/.." || exit 1
export PICOTRON_BUILD=${PICOTRON_BUILD:-build}
passed=0 failed=0 skipped=0 failures=() start_all=$(date +%s)
for t in tests/t_*.sh; do
    [ -n "${TEST_FILTER:-}" ] && [[ $t != *$TEST_FILTER* ]] && continue
    start=$(date +%s)
    log=$(mktemp)
    bash "$t" >"$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    if [ $rc -eq 0 ]; then
        passed=$((passed + 1)); echo "PASS $t (${secs}s)"; sed 's/^/    /' "$log" | tail -n 8
    elif [ $rc -eq 77 ]; then
        skipped=$((skipped + 1)); echo "SKIP $t: $(tail -n 1 "$log")"
    else
        failed=$((failed + 1)); failures+=("$t"); echo "FAIL $t (exit $rc, ${secs}s)"
        sed 's/^/    /' "$log" | tail -n 40
    fi
    rm -f "$log"
done
[ ${#failures[@]} -gt 0 ] && echo "failed: ${failures[*]}"
echo "total: $(( $(date +%s) - start_all ))s"
echo "$passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
