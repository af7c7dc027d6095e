#!/usr/bin/env bash
# A checkpoint holds full tensors, so any layout resumes any other: saved under dp2 x tp2 x pp2 at
# step 5, resumed under 1 rank, tp4, pp4 and cp2 (zig-zag) with the same global batch (8 samples
# per step), steps 6..10 give the losses of the run that never stopped (LOSS_TOL, relative) and the
# same final weights (WEIGHT_TOL, relative L2 per tensor), as the layout harness measures them;
# with the embedding tied to the head too, whose second copy lives on the last pipeline stage.
cd "$(dirname "$0")/.." || exit 1
. tests/layout_harness.sh
STEPS=10
run_layout saved tp=2 pp=2 dp=2 ga=2 save=5 || exit 1
run_layout saved_tied tied=true tp=2 pp=2 dp=2 ga=2 save=5 || exit 1

# resume SAVED NAME key=value...: another layout of the same model, from SAVED's step 5
resume() {
    local saved=$1 name=$2; shift 2
    local dir=$HARNESS_DIR/$name
    run_layout "$name" "$@" load="$HARNESS_DIR/$saved/ckpt/5" || return 1
    [ "$(head -n 1 "$dir/losses" | cut -d' ' -f1)" = 6 ] ||
        { echo "FAIL $name: did not resume at step 6"; harness_failures=$((harness_failures + 1)); return 1; }
    # steps 1..5 are the saved run's own: the comparison covers 6..10
    { head -n 5 "$HARNESS_DIR/$saved/losses"; cat "$dir/losses"; } >"$dir/losses.all"
    mv "$dir/losses.all" "$dir/losses"
    compare_layout "$saved" "$name"
}
resume saved one_rank ga=4
resume saved tp4 tp=4 ga=4
resume saved pp4 pp=4 ga=4
resume saved cp2_zigzag cp=2 zigzag=true ga=4
# tied: the last stage's copy of the embedding is read, never written
resume saved_tied one_rank_tied tied=true ga=4
resume saved_tied pp4_tied tied=true pp=4 ga=4
exit $((harness_failures > 0))
