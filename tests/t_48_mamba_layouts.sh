#!/usr/bin/env bash
# A Mamba (model_type "mamba": 4 layers of Mamba blocks, d_inner 256, 8 states per channel)
# trains to the one-rank numbers under every layout it supports, within the harness's tolerances
# (each step's loss, and the final weights): dp2, ZeRO-1 over dp2, pp2 under 1F1B, AFAB and
# interleaved (pipeline stages by layers), tp2 and tp4 over the channels (in_proj column-parallel, x_proj and
# out_proj row-parallel) and with sequence parallelism, cp2, cp4 and tp2 x cp2 (the sequence split, the scan's state and the
# conv's halo passed between the ranks: mamba_context_parallel.c), full recomputation (alone,
# with fewer activations, and under tp2 x sp x cp2 x pp2), and dp2 x tp2 x pp2 tied; a checkpoint saved
# under dp2 resumes under pp2 (checkpoints hold full tensors) and equals the run that never
# stopped.
cd "$(dirname "$0")/.." && source tests/layout_harness.sh

run_layout base mamba=true
for layout in "dp2 dp=2 ga=2" "dp2_zero1 dp=2 ga=2 zero1=true" "pp2 pp=2" \
    "pp2_afab pp=2 engine=afab" "pp2_interleaved pp=2 vstages=2" "tp2 tp=2" "tp4 tp=4" "cp2 cp=2" "cp4 cp=4" \
    "tp2_cp2 tp=2 cp=2" "tp2_sp tp=2 sp=true" "recompute recompute=true" \
    "tp2_sp_cp2_pp2_recompute tp=2 sp=true cp=2 pp=2 recompute=true" \
    "dp2_tp2_pp2 dp=2 tp=2 pp=2 ga=2 tied=true"; do
    set -- $layout
    [ "$1" = dp2_tp2_pp2 ] && run_layout base_tied mamba=true tied=true && base=base_tied || base=base
    check_layout $base "$@" mamba=true
done
check_layout base dp2_save dp=2 ga=2 save=5 mamba=true
resume_layout base dp2_save pp2_resumed pp=2 mamba=true
base_mb=$(activations_mb base) recompute_mb=$(activations_mb recompute)
if awk -v a="$recompute_mb" -v b="$base_mb" 'BEGIN { exit !(a > 0 && a < b) }'; then
    echo "ok   recompute keeps fewer activations: $recompute_mb MB, $base_mb MB without"
else
    echo "FAIL recompute activations $recompute_mb MB, $base_mb MB without (want fewer)"
    harness_failures=$((harness_failures + 1))
fi
[ $harness_failures -eq 0 ]
