#!/usr/bin/env bash
# Gradient clipping by the global norm and the warmup + cosine schedule are layout-independent:
# the norm counts each parameter once (tp-replicated norms once, the tied embedding's copy on the
# last pipeline stage once), so tp=2, pp=2 (tied), dp=2 x cp=2 and the 8-rank 3D mix train like
# one rank with clipping at 0.5 and 3 warmup steps then cosine decay. Clipping at 0.5 is active:
# the same run without it gives other losses.
cd "$(dirname "$0")/.." && source tests/layout_harness.sh
schedule=(clip=0.5 warmup=3 decay=cosine tied=true ga=4)
run_layout base "${schedule[@]}"
run_layout unclipped warmup=3 decay=cosine tied=true ga=4
differ=$(paste "$HARNESS_DIR/base/losses" "$HARNESS_DIR/unclipped/losses" |
         awk '{ d = $2 - $4; if (d < 0) d = -d; if (d > m) m = d } END { print (m > 1e-3) }')
echo "clipping at 0.5 changes the losses: $([ "$differ" = 1 ] && echo yes || echo NO)"
[ "$differ" = 1 ] || harness_failures=$((harness_failures + 1))
check_layout base tp2_clip tp=2 "${schedule[@]}"
check_layout base pp2_clip pp=2 "${schedule[@]}"
check_layout base dp2_cp2_clip dp=2 cp=2 clip=0.5 warmup=3 decay=cosine tied=true ga=2
check_layout base dp2_tp2_pp2_clip dp=2 tp=2 pp=2 clip=0.5 warmup=3 decay=cosine tied=true ga=2
[ $harness_failures -eq 0 ]
