#!/usr/bin/env bash
# Claim: every collective of backend/comm.h (sum, mean, max, send/recv, send_recv, two handles in
# flight with a message between them, all_to_all with its counts exchange, a group of one) equals a
# locally computed reference on 4 and on 8 ranks, in groups of 8, 4, 2 and 1, and in tensor-parallel
# pairs, whose all-reduce goes through shared memory, each size both ways (tolerances in
# tests/test_comm.c), and an all-reduce leaves the same bits on every rank; a rank that fails
# while the others wait in all_reduce ends the whole job, non-zero, within LIMIT_S seconds; a tp
# pair's third all-reduce in flight and a count above INT_MAX are refused with a message.
set -u
BUILD=${PICOTRON_BUILD:-build}
BIN=$BUILD/tests/test_comm
LIMIT_S=10   # the failing rank fails after 1 s; the job must be gone well before this
command -v mpirun >/dev/null || { echo "mpirun not found: install mpich (make deps)"; exit 77; }
[ -x "$BIN" ] || { echo "$BIN is missing: build it with make $BIN"; exit 1; }
status=0

for np in 4 8; do
    out=$(timeout 120 mpirun -np $np "$BIN" 2>&1)
    rc=$?
    echo "$out" | grep -v '^ok' | sed "s/^/np=$np: /"
    echo "$out" | grep 'n=100003' | grep -E 'all_reduce sum|send_recv to next|all_to_all_start' | head -n 3 |
        sed "s/^/np=$np: /"
    [ $rc -eq 0 ] || { echo "np=$np: test_comm exited $rc"; status=1; }
done

start=$(date +%s%N)
out=$(timeout $LIMIT_S mpirun -np 4 "$BIN" --fail-rank 1 2>&1)
rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "fail-rank 1 of 4: exit $rc after $ms ms (limit ${LIMIT_S} s)"
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "the job hung: the ranks waiting in all_reduce were not ended"; status=1
elif [ $rc -eq 0 ]; then
    echo "the job exited 0 although rank 1 failed"; status=1
elif ! echo "$out" | grep -q '^\[rank 1\] .*rank 1 fails while 3 ranks wait'; then
    echo "rank 1's message is missing:"; echo "$out" | head -n 5; status=1
elif echo "$out" | grep -q 'returned although'; then
    echo "all_reduce returned on a rank although its peer failed"; status=1
fi

out=$(timeout $LIMIT_S mpirun -np 2 "$BIN" --three-in-flight 2>&1)
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! echo "$out" | grep -q 'starts with 2 in flight'; then
    echo "a tp pair's third all-reduce in flight was not refused (exit $rc):"
    echo "$out" | head -n 5; status=1
else
    echo "third tp all-reduce in flight refused: $(echo "$out" | grep -m1 'in flight')"
fi

out=$(timeout $LIMIT_S mpirun -np 2 "$BIN" --huge 2>&1)
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! echo "$out" | grep -q 'exceeds INT_MAX'; then
    echo "2^31 floats were not refused (exit $rc):"; echo "$out" | head -n 5; status=1
else
    echo "2^31-float all_reduce refused: $(echo "$out" | grep -m1 'exceeds INT_MAX')"
fi
exit $status
