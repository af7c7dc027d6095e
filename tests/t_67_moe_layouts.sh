#!/usr/bin/env bash
# A mixture-of-experts model (4 experts, top-2, in every layer) trains to the one-rank numbers
# under every layout, within the harness's tolerances:
#  1. tp2, pp2 (1F1B, AFAB, interleaved V=2), cp2 (zig-zag), tp2 with sequence parallelism,
#     recomputation (tp2 x pp2 with sequence parallelism), dp2, dp2 x tp2 x pp2 and ZeRO-1 (dp2):
#     each step's loss (the cross-entropy) and load-balancing loss (metrics' aux_loss), and the
#     final weights (every expert's tensors among them);
#  2. with a capacity factor that drops pairs, tp2 x pp2 and dp2 equal one rank with the same
#     capacity, and drop the same pairs per step as one rank (the end-of-run report);
#  3. a checkpoint saved under dp2 x tp2 resumes under pp2 and equals the run that never stopped;
#  4. a multi-rank run's end-of-run memory table accounts for 95-100% of the allocator's peak.
# The aux loss and the capacity belong to a micro-batch (its tokens' loads), so a dp layout
# equals the one rank that sees the same micro-batches: with one sequence per micro-batch, dp x
# grad_acc reads the sequences one rank's dp*grad_acc micro-batches read (data.c's order).
cd "$(dirname "$0")/.." && source tests/layout_harness.sh
MOE="experts=4 topk=2 aux=0.05"

run_layout base $MOE
for layout in "tp2 tp=2" "pp2 pp=2" "pp2_afab pp=2 engine=afab" "pp2_interleaved pp=2 vstages=2" \
    "cp2 cp=2 zigzag=true" "tp2_sp tp=2 sp=true" \
    "tp2_pp2_sp_recompute tp=2 pp=2 sp=true recompute=true"; do
    set -- $layout
    check_moe base "$@"
done
run_layout base_mbs1 $MOE mbs=1
for layout in "dp2 dp=2 ga=2" "dp2_tp2_pp2 dp=2 tp=2 pp=2 ga=2" "dp2_zero1 dp=2 ga=2 zero1=true"; do
    set -- $layout
    check_moe base_mbs1 "$@" mbs=1
done

# capacity 1.0: an expert takes at most ceil(1.0 * tokens * 2 / 4) pairs of a micro-batch
run_layout base_cap $MOE cap=1.0
check_moe base_cap tp2_pp2_cap tp=2 pp=2 cap=1.0 && check_dropped base_cap tp2_pp2_cap
run_layout base_mbs1_cap $MOE cap=1.0 mbs=1
check_moe base_mbs1_cap dp2_cap dp=2 ga=2 cap=1.0 mbs=1 && check_dropped base_mbs1_cap dp2_cap

# a checkpoint of experts is layout-independent
check_moe base_mbs1 dp2_tp2_save dp=2 ga=2 tp=2 save=5 mbs=1
resume_layout base_mbs1 dp2_tp2_save pp2_resumed $MOE pp=2 mbs=1

if report=$(allocator_share_ok "$HARNESS_DIR/tp2_sp/log"); then
    echo "ok   tp2_sp memory: $report"
else
    echo "FAIL tp2_sp memory: '$report' (want 95-100%)"
    harness_failures=$((harness_failures + 1))
fi
grep -A 1 "^router balance" "$HARNESS_DIR/base/log" | head -n 1 | sed 's/^/     one rank: /'
[ $harness_failures -eq 0 ]
