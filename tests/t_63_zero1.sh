#!/usr/bin/env bash
# ZeRO-1 (distributed.zero1) trains exactly like one rank: each cp*dp replica reduce-scatters the
# gradient buckets, updates its own shard with AdamW moments of shard size, and all-gathers the
# parameters. dp2, dp4, dp2 x cp2 and dp2 x tp2 x pp2 (8 ranks; also with the embedding tied to the
# head across the pipeline) give the single-rank losses and final weights (tolerances in
# tests/layout_harness.sh), with gradient clipping at 0.5 too (the global norm: every shard counted
# once); dp3, whose last bucket is padded, too. Checkpoints keep full tensors: saved at step 5 with zero1 under dp2, resumed without it
# (and the reverse, and under dp4's other shards), steps 6..10 match the run that never stopped.
# The end-of-run report shows the optimizer state halved under dp2 (1% allowed for padding) and the
# dp bytes per step 4*(num_params + shard) + 4: the reduce-scatters send whole buckets, the
# all-gathers this rank's shard, the loss's mean 4 bytes.
cd "$(dirname "$0")/.." && source tests/layout_harness.sh
STEPS=10
run_layout base ga=4
check_layout base dp2 dp=2 ga=2
check_layout base zero1_dp2 dp=2 ga=2 zero1=true
check_layout base zero1_dp4 dp=4 ga=1 zero1=true
check_layout base zero1_dp2_cp2 dp=2 cp=2 ga=2 zero1=true
check_layout base zero1_dp2_tp2_pp2 dp=2 tp=2 pp=2 ga=2 zero1=true
run_layout base_tied tied=true ga=4
check_layout base_tied zero1_dp2_tp2_pp2_tied dp=2 tp=2 pp=2 ga=2 tied=true zero1=true

# clipping at 0.5 bites (the losses change), and the sharded norm is the global one
run_layout base_clip clip=0.5 ga=4
differ=$(paste "$HARNESS_DIR/base/losses" "$HARNESS_DIR/base_clip/losses" |
         awk '{ d = $2 - $4; if (d < 0) d = -d; if (d > m) m = d } END { print (m > 1e-3) }')
echo "clipping at 0.5 changes the losses: $([ "$differ" = 1 ] && echo yes || echo NO)"
[ "$differ" = 1 ] || harness_failures=$((harness_failures + 1))
check_layout base_clip zero1_dp2_clip dp=2 ga=2 clip=0.5 zero1=true
check_layout base_clip zero1_dp2_cp2_clip dp=2 cp=2 ga=2 clip=0.5 zero1=true

run_layout saved_zero1 dp=2 ga=2 zero1=true save=5
run_layout saved_plain dp=2 ga=2 save=5
resume_layout base saved_zero1 resumed_without_zero1 dp=2 ga=2
resume_layout base saved_plain resumed_with_zero1 dp=2 ga=2 zero1=true
resume_layout base saved_zero1 resumed_zero1_dp4 dp=4 ga=1 zero1=true
resume_layout base saved_zero1 resumed_one_rank ga=4

# dp3: 656512 parameters do not divide by 3, so the last bucket is padded (its last piece short)
run_layout base_12 ga=6
check_layout base_12 zero1_dp3 dp=3 ga=2 zero1=true save=5
resume_layout base_12 zero1_dp3 resumed_dp3_one_rank ga=6

# report_value RUN SECTION COLUMN: rank 0's number in that column of the end-of-run report's table
report_value() {
    awk -v section="$2" -v column="$3" '
        index($0, section) == 1 { found = 1; next }
        found && $1 == "rank" { for (i = 1; i <= NF; i++) if ($i == column) c = i; next }
        found && c { print $c; exit }' "$HARNESS_DIR/$1/log"
}
plain=$(report_value dp2 "memory per rank, MB" optimizer)
sharded=$(report_value zero1_dp2 "memory per rank, MB" optimizer)
echo "optimizer state per rank, dp2: $plain MB without zero1, $sharded MB with zero1"
awk -v a="$plain" -v b="$sharded" 'BEGIN { r = b / (a / 2); exit !(a > 0 && r > 0.99 && r < 1.01) }' ||
    { echo "FAIL the optimizer state with zero1 is not half of it without"; harness_failures=$((harness_failures + 1)); }

bytes=$(report_value dp2 "bytes sent per step" dp)
num_params=$(( (bytes - 4) / 4 ))
for r in 2 4; do
    got=$(report_value zero1_dp$r "bytes sent per step" dp)
    # the tiny model's 1 MB buckets divide by 2 and 4: no padding, the shard is num_params / r
    want=$(( 4 * (num_params + num_params / r) + 4 ))
    echo "dp bytes per step, zero1 dp$r: $got (num_params $num_params, shard $((num_params / r)): want $want; without zero1 $bytes)"
    [ "$got" = "$want" ] || { echo "FAIL zero1 dp$r sends $got dp bytes per step, not $want"; harness_failures=$((harness_failures + 1)); }
done
[ $harness_failures -eq 0 ]
