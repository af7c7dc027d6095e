#!/usr/bin/env bash
# Proves that a change did not change the numbers: the trainer built from BEFORE and the trainer
# built from AFTER give string-identical losses (the metrics JSONL prints them with %.9g, which
# round-trips a float32 exactly, so identical strings mean bit-identical losses) at every step of
# every layout the layout tests run (tests/t_50 to t_53 and t_57: dp, tp, pp, cp, their mixes up
# to dp2 x tp2 x pp2 x cp2 on 16 ranks, clipping and the warmup + cosine schedule), including the
# single-rank base runs those tests compare against. Use it after a refactor that should be
# numerically neutral. Checkpoints are not compared (their format may change between commits).
#
#   bash scripts/compare_commits.sh BEFORE_COMMIT [AFTER_COMMIT]
#   STEPS=20 bash scripts/compare_commits.sh HEAD~3 HEAD
#
# Without AFTER_COMMIT, AFTER is the working tree of the repository this script lives in (its
# tracked and untracked, not ignored files, copied once at the start). Each side is unpacked into a
# temporary directory under /tmp (git archive, or that copy) and built there with
# `make -j2 train create_config`, so the repository's own ./train, build/, index and working tree
# are never touched. Every layout runs through tests/layout_harness.sh's run_layout (the copy in
# this script's repository, the same config template for both sides), BEFORE then AFTER, one run
# at a time, STEPS steps (default 10). Prints one line per layout:
#   identical  NAME (10 steps)
#   DIFFERENT NAME: step S before X after Y
#   FAIL      NAME: ...            (a side's run failed or wrote a wrong number of losses)
# and last `N layouts bit-identical, M different` (plus `, F failed` when some run failed). Exits 0
# only when every layout is identical; 1 when some differ or fail; 2 on bad usage or a failed
# build. Temporary directories go on exit. About 90 s on a 2-core machine.
set -u -o pipefail

usage() { echo "usage:" >&2; sed -n '10,11p' "$0" | sed 's/^#//' >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
case $1 in -h | --help) usage ;; esac

repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel) || exit 2
resolve() {  # resolve REV: its full commit id, or a message and exit 2
    git -C "$repo" rev-parse --verify --quiet "$1^{commit}" ||
        { echo "compare_commits: '$1' is not a commit of $repo" >&2; exit 2; }
}
before_rev=$(resolve "$1") || exit 2
after_rev=
if [ $# -eq 2 ]; then after_rev=$(resolve "$2") || exit 2; fi
export STEPS=${STEPS:-10}

work=$(mktemp -d /tmp/picotron-compare.XXXXXX)
harness_tmp=
cleanup() { rm -rf "$work" ${harness_tmp:+"$harness_tmp"}; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# unpack_tree DIR [REV]: REV's files, or (no REV) the working tree's tracked and untracked files
# that git does not ignore, without build outputs; only reads the repository
unpack_tree() {
    mkdir -p "$1"
    if [ -n "${2:-}" ]; then
        git -C "$repo" archive --format=tar "$2" | tar -x -C "$1"
    else
        (cd "$repo" &&
         git --no-optional-locks ls-files -z --cached --others --exclude-standard |
         while IFS= read -r -d '' f; do
             if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi  # skip deleted files
         done | tar -c --null -T - -f -) | tar -x -C "$1"
    fi
}

# build_tree NAME: make the trainer in $work/NAME, or exit 2 with the build's last lines
build_tree() {
    local start=$SECONDS
    if ! make -C "$work/$1" -j2 train create_config >"$work/$1.build.log" 2>&1; then
        echo "compare_commits: building $1 failed:" >&2
        tail -n 20 "$work/$1.build.log" >&2
        exit 2
    fi
    echo "built $1 in $((SECONDS - start))s"
}

describe() { git -C "$repo" log -1 --format='%h %s' "$1" | cut -c1-72; }
echo "before: $(describe "$before_rev")"
if [ -n "$after_rev" ]; then
    echo "after:  $(describe "$after_rev")"
else
    echo "after:  working tree of $repo (HEAD $(describe HEAD), plus uncommitted changes)"
fi

# the harness now, from the repository's working tree (one config template for both sides)
cp "$repo/tests/layout_harness.sh" "$work/layout_harness.sh" || exit 2
unpack_tree "$work/before" "$before_rev" || { echo "compare_commits: unpacking BEFORE failed" >&2; exit 2; }
unpack_tree "$work/after" "$after_rev" || { echo "compare_commits: unpacking AFTER failed" >&2; exit 2; }
build_tree before
build_tree after

# the harness makes its own HARNESS_DIR and EXIT trap: run_side points HARNESS_DIR at our
# directories, and our trap goes back
# shellcheck source=tests/layout_harness.sh
source "$work/layout_harness.sh"
harness_tmp=$HARNESS_DIR
trap cleanup EXIT
mkdir -p "$work/runs/before" "$work/runs/after"

# Every layout the layout tests run, with their arguments (tests/t_50 .. t_53, t_57), the
# single-rank bases included; names are unique here (the tests reuse "base"), duplicates dropped.
layouts=$(cat <<'LAYOUTS'
base_ga4 ga=4
base_ga1 ga=1
base_ga2 ga=2
base_ga8 ga=8
base_tied ga=4 tied=true
base5 ga=2 layers=5
base_clip clip=0.5 warmup=3 decay=cosine tied=true ga=4
unclipped warmup=3 decay=cosine tied=true ga=4
dp2 dp=2 ga=2
dp4 dp=4 ga=1
dp2_cp2 dp=2 cp=2 ga=2
tp2 tp=2
tp4 tp=4
tp2_async tp=2 async=true
dp2_tp2 dp=2 tp=2 ga=2
tp2_tied tp=2 tied=true
tp4_tied tp=4 tied=true
pp2_afab_ga1 pp=2 ga=1 engine=afab
pp2_1f1b_ga1 pp=2 ga=1 engine=1f1b
pp2_afab_ga2 pp=2 ga=2 engine=afab
pp2_1f1b_ga2 pp=2 ga=2 engine=1f1b
pp2_afab_ga8 pp=2 ga=8 engine=afab
pp2_1f1b_ga8 pp=2 ga=8 engine=1f1b
pp4_1f1b_ga2 pp=4 ga=2
pp4_afab_ga8 pp=4 ga=8 engine=afab
pp2_uneven layers=5 pp=2 ga=2
pp2_tied pp=2 ga=4 tied=true
dp2_tp2_pp2_tied dp=2 tp=2 pp=2 ga=2 tied=true
dp2_pp2 dp=2 pp=2 ga=1
tp2_pp2 tp=2 pp=2 ga=2
dp2_tp2_pp2 dp=2 tp=2 pp=2 ga=1
cp2 cp=2 ga=2
cp4 cp=4 ga=2
cp2_zigzag cp=2 ga=2 zigzag=true
cp4_zigzag cp=4 ga=2 zigzag=true
cp2_dp2 cp=2 dp=2 ga=1
cp2_tp2 cp=2 tp=2 ga=2
cp2_pp2 cp=2 pp=2 ga=2
dp2_tp2_pp2_cp2 dp=2 tp=2 pp=2 cp=2 ga=1 tied=false
tp2_clip tp=2 clip=0.5 warmup=3 decay=cosine tied=true ga=4
pp2_clip pp=2 clip=0.5 warmup=3 decay=cosine tied=true ga=4
dp2_cp2_clip dp=2 cp=2 clip=0.5 warmup=3 decay=cosine tied=true ga=2
dp2_tp2_pp2_clip dp=2 tp=2 pp=2 clip=0.5 warmup=3 decay=cosine tied=true ga=2
LAYOUTS
)

# run_side SIDE NAME ARGS...: that side's trainer on one layout, from its own tree (the harness's
# dataset path is relative); the losses land in $work/runs/SIDE/NAME/losses
run_side() {
    local side=$1 name=$2; shift 2
    # shellcheck disable=SC2034  # read by the harness's run_layout
    HARNESS_DIR=$work/runs/$side HARNESS_TRAIN=$work/$side/train
    # stdin from /dev/null: mpirun would read it
    (cd "$work/$side" && run_layout "$name" "$@") </dev/null >"$work/runs/$side/$name.out" 2>&1 ||
        return 1
    # exactly STEPS lines "STEP LOSS", steps 1..STEPS in order
    awk -v n="$STEPS" 'NF != 2 || $1 != NR || $2 !~ /^[-+0-9.eEinfa]+$/ { bad = 1 }
                       END { exit bad || NR != n }' "$work/runs/$side/$name/losses" 2>/dev/null
}

identical=0 different=0 failed=0 start=$SECONDS
while read -r -u 3 name args; do
    [ -n "$name" ] || continue
    # shellcheck disable=SC2086  # args are key=value words
    for side in before after; do
        if ! run_side $side "$name" $args; then
            echo "FAIL      $name: the $side run failed or did not write $STEPS losses:"
            sed 's/^/    /' "$work/runs/$side/$name.out" | tail -n 6
            failed=$((failed + 1)); continue 2
        fi
    done
    first=$(paste -d ' ' "$work/runs/before/$name/losses" "$work/runs/after/$name/losses" |
            awk '($2 "") != ($4 "") { print $1, $2, $4; exit }')  # as strings
    if [ -z "$first" ]; then
        echo "identical  $name ($STEPS steps)"; identical=$((identical + 1))
    else
        read -r s x y <<<"$first"
        echo "DIFFERENT $name: step $s before $x after $y"; different=$((different + 1))
    fi
done 3<<<"$layouts"

echo "($((SECONDS - start))s for $((identical + different + failed)) layouts, $STEPS steps each)"
summary="$identical layouts bit-identical, $different different"
[ $failed -eq 0 ] || summary+=", $failed failed"
echo "$summary"
[ $different -eq 0 ] && [ $failed -eq 0 ]
