#!/usr/bin/env bash
# Pipeline parallelism trains exactly like one rank: pp=2 and pp=4 with AFAB and 1F1B, grad_acc
# 1, 2 and 8, an uneven split (5 layers over 2 stages), then dp=2 x pp=2, tp=2 x pp=2 and
# dp=2 x tp=2 x pp=2 on 8 ranks, tied and untied (tolerances in tests/layout_harness.sh).
cd "$(dirname "$0")/.." && source tests/layout_harness.sh
for ga in 1 2 8; do
    run_layout base_ga$ga ga=$ga
    for engine in afab 1f1b; do
        check_layout base_ga$ga pp2_${engine}_ga$ga pp=2 ga=$ga engine=$engine
    done
done
check_layout base_ga2 pp4_1f1b_ga2 pp=4 ga=2
check_layout base_ga8 pp4_afab_ga8 pp=4 ga=8 engine=afab
run_layout base5 ga=2 layers=5
check_layout base5 pp2_uneven layers=5 pp=2 ga=2
run_layout base_tied ga=4 tied=true
check_layout base_tied pp2_tied pp=2 ga=4 tied=true
check_layout base_tied dp2_tp2_pp2_tied dp=2 tp=2 pp=2 ga=2 tied=true
check_layout base_ga2 dp2_pp2 dp=2 pp=2 ga=1
check_layout base_ga2 tp2_pp2 tp=2 pp=2 ga=2
check_layout base_ga2 dp2_tp2_pp2 dp=2 tp=2 pp=2 ga=1
[ $harness_failures -eq 0 ]
