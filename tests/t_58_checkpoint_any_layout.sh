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

# another layout of the same model from SAVED's step 5, compared with SAVED itself: steps 1..5 are
# SAVED's own, so the comparison covers 6..10 and the final weights
resume_layout saved saved one_rank ga=4
resume_layout saved saved tp4 tp=4 ga=4
resume_layout saved saved pp4 pp=4 ga=4
resume_layout saved saved cp2_zigzag cp=2 zigzag=true ga=4
# tied: the last stage's copy of the embedding is read, never written
resume_layout saved_tied saved_tied one_rank_tied tied=true ga=4
resume_layout saved_tied saved_tied pp4_tied tied=true pp=4 ga=4
exit $((harness_failures > 0))
