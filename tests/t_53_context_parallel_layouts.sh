#!/usr/bin/env bash
# Context parallelism trains exactly like one rank: cp=2 and cp=4 with and without zig-zag,
# cp=2 x dp=2, cp=2 x tp=2, cp=2 x pp=2, and the full 4D dp=2 x tp=2 x pp=2 x cp=2 on 16 ranks
# (tolerances in tests/layout_harness.sh).
cd "$(dirname "$0")/.." && source tests/layout_harness.sh
run_layout base ga=2
check_layout base cp2 cp=2 ga=2
check_layout base cp4 cp=4 ga=2
check_layout base cp2_zigzag cp=2 ga=2 zigzag=true
check_layout base cp4_zigzag cp=4 ga=2 zigzag=true
check_layout base cp2_dp2 cp=2 dp=2 ga=1
check_layout base cp2_tp2 cp=2 tp=2 ga=2
check_layout base cp2_pp2 cp=2 pp=2 ga=2
check_layout base dp2_tp2_pp2_cp2 dp=2 tp=2 pp=2 cp=2 ga=1 tied=false
[ $harness_failures -eq 0 ]
