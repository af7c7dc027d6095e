#!/usr/bin/env bash
# Tensor parallelism trains exactly like one rank: tp=2 and tp=4 (8 heads, 4 kv heads: kv < heads
# at tp=2, kv = tp at tp=4), tied and untied embeddings, the async column-parallel linear, and
# dp=2 x tp=2, all against tp=1 (tolerances in tests/layout_harness.sh).
cd "$(dirname "$0")/.." && source tests/layout_harness.sh
run_layout base ga=4
check_layout base tp2 tp=2
check_layout base tp4 tp=4
check_layout base tp2_async tp=2 async=true
check_layout base dp2_tp2 dp=2 tp=2 ga=2
run_layout base_tied ga=4 tied=true
check_layout base_tied tp2_tied tp=2 tied=true
check_layout base_tied tp4_tied tp=4 tied=true
[ $harness_failures -eq 0 ]
