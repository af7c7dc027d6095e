#!/usr/bin/env bash
# Expert parallelism (distributed.ep_size) changes where the experts run, never the numbers: a
# mixture-of-experts model (4 experts, top-2, every layer) trains to the one-rank losses, aux
# losses and final weights (every expert's tensors among them), within the harness's tolerances:
#  1. ep2 and ep4 (all dp ranks share out the experts), ep2 on dp4 (two ep groups: each expert has
#     two replicas, averaged over expert_dp), ep2 x tp2, ep2 x pp2 (1F1B and interleaved), ep2 x
#     cp2, ep2 x tp2 with sequence parallelism and recomputation;
#  2. with a capacity factor that drops pairs: ep2, ep4, ep2 x tp2 and ep2 x pp2 equal one rank with
#     the same capacity and drop the same pairs per step (each rank's capacity is per source);
#  3. gradient clipping at 0.05 on ep2 x dp4: the global norm counts each expert once;
#  4. checkpoints: saved under ep2 x tp2, resumed with every expert on one rank under pp2, and
#     saved under dp2 (no ep), resumed under ep4; both equal the run that never stopped;
#  5. the ep group's all-to-alls show in the end-of-run report and the trace's byte table.
# As in t_67, one sequence per micro-batch: dp x grad_acc then reads what one rank reads.
cd "$(dirname "$0")/.." && source tests/layout_harness.sh
MOE="experts=4 topk=2 aux=0.05 mbs=1"

run_layout base $MOE
for layout in "ep2 dp=2 ep=2 ga=2" "ep4 dp=4 ep=4 ga=1" "ep2_dp4 dp=4 ep=2 ga=1" \
    "ep2_tp2 dp=2 ep=2 tp=2 ga=2" "ep2_pp2 dp=2 ep=2 pp=2 ga=2" \
    "ep2_pp2_interleaved dp=2 ep=2 pp=2 vstages=2 ga=2" "ep2_cp2 dp=2 ep=2 cp=2 zigzag=true ga=2" \
    "ep2_tp2_sp_recompute dp=2 ep=2 tp=2 sp=true recompute=true ga=2"; do
    set -- $layout
    check_moe base "$@"
done

run_layout base_cap $MOE cap=1.0
for layout in "ep2_cap dp=2 ep=2 ga=2" "ep4_cap dp=4 ep=4 ga=1" "ep2_tp2_cap dp=2 ep=2 tp=2 ga=2" \
    "ep2_pp2_cap dp=2 ep=2 pp=2 ga=2"; do
    set -- $layout
    check_moe base_cap "$@" cap=1.0 && check_dropped base_cap "$1"
done

run_layout base_clip $MOE clip=0.05
check_moe base_clip ep2_dp4_clip dp=4 ep=2 ga=1 clip=0.05
# the norm (metrics' grad_norm, before clipping) is the same: each expert counted once
report=$(paste <(grep -o '"grad_norm": [0-9.e+-]*' "$HARNESS_DIR/base_clip/metrics.jsonl") \
        <(grep -o '"grad_norm": [0-9.e+-]*' "$HARNESS_DIR/ep2_dp4_clip/metrics.jsonl") |
    awk '{ d = $2 - $4; if (d < 0) d = -d; r = d / $2; if (r > m) m = r; if ($2 > 0.05) c++ }
         END { printf "gradient norms max rel diff %.2e, %d of %d steps clipped", m, c, NR
               exit (m > 1e-4 || c == 0 || NR != '"$STEPS"') }')
if [ $? -eq 0 ]; then echo "ok   ep2_dp4_clip: $report"; else
    echo "FAIL ep2_dp4_clip: $report (want equal norms, some above 0.05)"
    harness_failures=$((harness_failures + 1))
fi

check_moe base ep2_tp2_save dp=2 ep=2 tp=2 ga=2 save=5
resume_layout base ep2_tp2_save pp2_resumed $MOE pp=2
check_moe base dp2_save dp=2 ga=2 save=5
resume_layout base dp2_save ep4_resumed $MOE dp=4 ep=4 ga=1

# the report: the all-to-alls of every layer, forward and backward; the trace's table: ep bytes
line=$(grep '^expert parallelism: ep=4, 1 of 4 experts on each rank' "$HARNESS_DIR/ep4/log")
if [ -n "$line" ] && echo "$line" | awk '{ match($0, /, [0-9.]+ MB sent/)
        exit !(substr($0, RSTART + 2, RLENGTH - 10) + 0 > 0) }'; then
    echo "ok   ep4 report: $line"
else
    echo "FAIL ep4 report: '$line' (want ep=4 and bytes sent > 0)"
    harness_failures=$((harness_failures + 1))
fi
if grep -A 1 '^bytes sent per step and group' "$HARNESS_DIR/ep4/log" | grep -qw ep; then
    echo "ok   ep4 trace table has an ep column"
else
    echo "FAIL ep4: no ep column in the bytes table"; harness_failures=$((harness_failures + 1))
fi
[ $harness_failures -eq 0 ]
