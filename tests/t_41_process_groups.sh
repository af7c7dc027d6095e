#!/usr/bin/env bash
# Claim: for every 4D layout below, each rank's (dp, pp, cp, tp) coordinates, its tp/cp/pp,
# cp_dp and embed groups and its pipeline and context neighbours are exactly those of
# global_rank = ((dp_rank*pp + pp_rank)*cp + cp_rank)*tp + tp_rank (tests/test_pgm.c: exact
# comparisons, no tolerance); with expert parallelism (ep dividing dp), its ep_rank = dp_rank % ep,
# ep and expert_dp groups are those too; and a world size that does not match tp*cp*pp*dp gets one line
# naming the sizes and the job exits non-zero within LIMIT_S seconds.
set -u
BUILD=${PICOTRON_BUILD:-build}
BIN=$BUILD/tests/test_pgm
LIMIT_S=10
command -v mpirun >/dev/null || { echo "mpirun not found: install mpich (make deps)"; exit 77; }
[ -x "$BIN" ] || { echo "$BIN is missing: build it with make $BIN"; exit 1; }
status=0

# dp pp cp tp [ep]: mixes of every axis, a cp ring of 4, middle pipeline stages, each axis alone;
# expert parallelism over all dp ranks, over part of them, and beside every other axis
for layout in "2 2 2 1" "1 2 2 2" "2 1 2 2" "2 2 1 2" "1 2 4 1" "1 4 1 2" \
              "8 1 1 1" "1 8 1 1" "1 1 8 1" "1 1 1 8" "1 1 1 1" \
              "8 1 1 1 8" "8 1 1 1 2" "4 1 1 2 2" "2 2 2 1 2" "4 2 1 1 2" "4 1 2 1 4"; do
    set -- $layout
    np=$(( $1 * $2 * $3 * $4 ))
    out=$(timeout 60 mpirun -np $np "$BIN" --dp $1 --pp $2 --cp $3 --tp $4 --ep ${5:-1} 2>&1)
    rc=$?
    echo "$out" | tail -n 1
    if [ $rc -ne 0 ]; then
        echo "dp=$1 pp=$2 cp=$3 tp=$4 ep=${5:-1}: exit $rc"; echo "$out" | head -n 20; status=1
    fi
done

# 3 ranks for a 2*2*1*1 grid
start=$(date +%s%N)
out=$(timeout $LIMIT_S mpirun -np 3 "$BIN" --dp 2 --pp 2 --cp 1 --tp 1 2>&1)
rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
lines=$(echo "$out" | grep -c 'config error: tp\*cp\*pp\*dp = 1\*1\*2\*2 = 4 but mpirun started 3')
echo "mismatch (3 ranks, grid of 4): exit $rc after $ms ms (limit ${LIMIT_S} s)," \
     "$lines line(s) said:"
echo "$out" | grep -m1 'config error'
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "the job hung"; status=1
elif [ $rc -eq 0 ]; then
    echo "the job exited 0"; status=1
elif [ "$lines" -ne 1 ]; then
    echo "want one line, got $lines:"; echo "$out" | head -n 10; status=1
fi
exit $status
