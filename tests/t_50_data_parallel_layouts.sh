#!/usr/bin/env bash
# Data parallelism trains exactly like one rank: (dp=1, grad_acc=4), (dp=2, grad_acc=2) and
# (dp=4, grad_acc=1) give the same loss at every one of 10 steps and the same final weights
# (tolerances in tests/layout_harness.sh), and with 1 MB buckets some all-reduces start while
# backward is still running.
cd "$(dirname "$0")/.." && source tests/layout_harness.sh
run_layout base ga=4
check_layout base dp2 dp=2 ga=2
check_layout base dp4 dp=4 ga=1
check_layout base dp2_cp2 dp=2 cp=2 ga=2
early=$(grep -o 'data parallel: [0-9]* bucket all-reduces of [0-9]*' "$HARNESS_DIR/dp4/log")
echo "overlap (dp=4): ${early:-none}"
n=$(echo "$early" | awk '{print $3}')
[ "${n:-0}" -ge 1 ] || { echo "FAIL no bucket all-reduce started during backward"; exit 1; }
[ $harness_failures -eq 0 ]
