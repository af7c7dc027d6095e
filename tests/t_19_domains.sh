#!/usr/bin/env bash
# A mixture of domains (dataset.domains, doremi.c):
#  1. the sampler (tests/test_domains.c): domain counts match the weights (chi-square), each
#     domain read in order, every layout and a resumed run read the same rows;
#  2. a one-domain mixture trains bit for bit as dataset.name does, and its domain loss is the loss;
#  3. three domains (the novel, generated arithmetic, random bytes) under dp2, cp2 x dp2 and
#     dp2 x tp2 x pp2, and resumed at step 5 under dp4, train as one rank (the layout harness's
#     tolerances), each domain's loss too, step by step;
#  4. every malformed list, and create_config's --domains, ends in one line naming the entry.
cd "$(dirname "$0")/.." || exit 1
bin=${PICOTRON_BUILD:-build}/tests/test_domains
[ -x "$bin" ] || { echo "$bin is not built (run make)"; exit 1; }
work=$(mktemp -d /tmp/picotron-domains.XXXXXX)
status=0
. tests/domains_lib.sh

# 1
"$bin" "$work" | sed 's/^/     /'
[ "${PIPESTATUS[0]}" = 0 ] && say ok "the sampler" || say FAIL "the sampler"

make_domains "$work"

# 2: one domain is the corpus itself
STEPS=5 HARNESS_DATASET='"domains": [{"name": "novel", "path": "data/pride_and_prejudice.txt"}]'
. tests/layout_harness.sh
trap 'rm -rf "$work" "$HARNESS_DIR"' EXIT
run_layout one_domain dp=2 ga=2
HARNESS_DATASET='"name": "data/pride_and_prejudice.txt"' run_layout corpus dp=2 ga=2
same=$(cmp -s "$HARNESS_DIR/one_domain/losses" "$HARNESS_DIR/corpus/losses" && echo yes)
weights=$("$BUILD_DIR/tests/tool_compare_checkpoints" "$HARNESS_DIR/corpus/ckpt/$STEPS" \
          "$HARNESS_DIR/one_domain/ckpt/$STEPS" 0 | tail -n 1)
[ "$same" = yes ] && [ "${PIPESTATUS[0]}" = 0 ] &&
    say ok "one domain trains as dataset.name: the same losses to 9 digits; $weights" ||
    say FAIL "one domain differs from dataset.name: $weights"
# the loss is the mean of float token losses in float, the domain's a mean in double
LOSS_TOL_SUM=1e-6
report=$(sed 's/.*"loss": \([-0-9.e+]*\),.*"domain_loss": {"novel": \([-0-9.e+]*\)}.*/\1 \2/' \
    "$HARNESS_DIR/one_domain/metrics.jsonl" | awk -v tol=$LOSS_TOL_SUM '
    { d = $1 - $2; if (d < 0) d = -d; if (d / $1 > m) m = d / $1; n++ }
    END { printf "%d steps, max rel diff %.2e", n, m; exit (n != 5 || m > tol) }')
[ $? = 0 ] && say ok "its domain_loss is the loss: $report" || say FAIL "domain_loss is not the loss: $report"

# 3: three domains in four layouts
STEPS=10
HARNESS_DATASET=$THREE_DOMAINS
# domain_losses NAME: one line per step, the three domains' losses
domain_losses() {
    sed 's/.*"domain_loss": {"novel": \([^,]*\), "sums": \([^,]*\), "random": \([^}]*\)}.*/\1 \2 \3/' \
        "$HARNESS_DIR/$1/metrics.jsonl"
}
compare_domains() {
    local report
    report=$(paste <(domain_losses "$1") <(domain_losses "$2") | awk -v tol="$LOSS_TOL" '
        { for (i = 1; i <= 3; i++) { if ($i == "null" || $(i + 3) == "null") { if ($i != $(i + 3)) bad = 1; continue }
          d = $i - $(i + 3); if (d < 0) d = -d; if (d / $i > m) m = d / $i; n++ } }
        END { printf "%d domain losses, max rel diff %.2e", n, m; exit (bad || n < 20 || m > tol) }')
    local rc=$?
    [ $rc = 0 ] && say ok "$2: $report" || say FAIL "$2: $report"
}
run_layout mix ga=4 save=5
for layout in "dp2 dp=2 ga=2" "cp2_dp2 cp=2 dp=2 ga=2" "dp2_tp2_pp2 dp=2 tp=2 pp=2 ga=2"; do
    set -- $layout
    check_layout mix "$@" && compare_domains mix "$1"
done
resume_layout mix mix resumed_dp4 dp=4 ga=1
sed -n 's/^  \(novel\|sums\|random\) /     &/p' "$HARNESS_DIR/mix/log"
[ $harness_failures -eq 0 ] || status=1

# 4: malformed lists, each one line naming what is wrong (after MPICH's own abort lines)
base=$HARNESS_DIR/mix/config.json
D='cfg["dataset"]["domains"]'
bad not_a_list "$D = 'novel'" 'dataset.domains must be a list'
bad empty "$D = []" 'dataset.domains is empty'
bad no_path "del $D[1]['path']" 'dataset.domains\[1\] has no "path" string'
bad unknown_key "$D[0]['wieght'] = 1" 'dataset.domains\[0\] has the unknown key "wieght"'
bad same_name "$D[2]['name'] = 'sums'" 'dataset.domains\[1\] and \[2\] are both named "sums"'
bad zero_weight "$D[1]['weight'] = 0" 'dataset.domains\[1\] ("sums"): weight must be a number > 0'
bad missing_file "$D[2]['path'] = '$work/nowhere.txt'" "$work/nowhere.txt: no such file"
bad num_samples "cfg['training']['num_samples'] = 100" 'training.num_samples = 100 caps one corpus'
out=$(./create_config --out_dir "$work" --exp_name cc --domains "novel=data/austen.txt,sums" 2>&1)
rc=$?
[ $rc = 1 ] && [ "$(echo "$out" | grep -c .)" = 1 ] && echo "$out" | grep -q '"sums" is not name=path' &&
    say ok "create_config --domains novel=...,sums: exit 1: $out" || say FAIL "create_config: exit $rc: $out"
./create_config --out_dir "$work" --exp_name cc2 --domains "novel=data/austen.txt:3,sums=$work/sums.txt" >/dev/null &&
    python3 -c "import json; d = json.load(open('$work/cc2/config.json'))['dataset']
assert d['name'] == '' and d['domains'] == [{'name': 'novel', 'path': 'data/austen.txt', 'weight': 3},
    {'name': 'sums', 'path': '$work/sums.txt', 'weight': 1}], d" &&
    say ok "create_config --domains novel=data/austen.txt:3,sums=...: the list in config.json, dataset.name empty" ||
    say FAIL "create_config --domains wrote another list"
exit $status
