#!/usr/bin/env bash
# DoReMi's proxy (doremi.c), on three domains (the novel, generated sums, random bytes) against a
# reference trained on them first:
#  1. the weight update equals an independent reference (plain Python, float64) recomputing
#     every step's weights from the logged excess losses and the carried weights, to 1e-12;
#  2. the proxy under dp2, tp2, pp2 (1F1B and AFAB), cp2, dp2 x tp2 x pp2, ZeRO-1 and
#     recomputation equals one rank, and so does the proxy resumed at step 5 under dp2: losses
#     and final weights within the layout harness's tolerances, and every step's domain weights;
#  3. a one-domain proxy (weight 1, every token weighted 1) trains bit for bit as the plain run;
#  4. examples/doremi/train_doremi.sh, the whole pipeline for 100 steps: the random domain's
#     learned weight ends below its initial 1/3 and the two learnable ones above, and the final model's
#     worst non-random held-out loss is no worse than the uniform run's (the numbers are printed);
#  5. a bad doremi key or combination, or a resume without the saved run's weights, ends in one
#     line naming it.
cd "$(dirname "$0")/.." || exit 1
STEPS=10
. tests/layout_harness.sh
. tests/domains_lib.sh
work=$(mktemp -d /tmp/picotron-doremi.XXXXXX)
trap 'rm -rf "$work" "$HARNESS_DIR"' EXIT
status=0
make_domains "$work"
HARNESS_DATASET=$THREE_DOMAINS

run_layout reference ga=4
HARNESS_SECTIONS=', "doremi": {"reference_checkpoint": "'$HARNESS_DIR/reference/ckpt/$STEPS'", "step_size": 1.0, "smoothing": 0.001}'
run_layout proxy ga=4 save=5
weights_of() { echo "$HARNESS_DIR/$1/ckpt/domain_weights.jsonl"; }

# 1. the update, recomputed from the logged excess losses
report=$(python3 - "$(weights_of proxy)" <<'PY'
import json, math, struct, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
as_float = lambda x: struct.unpack("f", struct.pack("f", x))[0]  # the config holds floats
eta, c = as_float(1.0), as_float(1e-3)
names = list(lines[0]["weights"])
k = len(names)
alpha = {n: 1.0 / k for n in names}  # alpha_0: uniform
worst = 0.0
for line in lines:
    logits = {n: math.log(alpha[n]) + eta * line["excess_loss"][n] for n in names}
    top = max(logits.values())
    z = sum(math.exp(v - top) for v in logits.values())
    alpha = {n: (1 - c) * math.exp(logits[n] - top) / z + c / k for n in names}
    worst = max(worst, max(abs(alpha[n] - line["weights"][n]) for n in names))
print("%d steps of %d domains: max |weight - reference| %.1e; last weights %s" % (
    len(lines), k, worst, " ".join("%s %.4f" % (n, alpha[n]) for n in names)))
sys.exit(0 if len(lines) == 10 and worst <= 1e-12 else 1)
PY
)
[ $? = 0 ] && say ok "the update: $report" || say FAIL "the update: $report"

# 2. the proxy in other layouts: the harness's losses and weights, then the domain weights
compare_weights() {
    local report
    report=$(paste -d'\n' "$(weights_of "$1")" "$(weights_of "$2")" | python3 -c "
import json, sys
rows = [json.loads(l) for l in sys.stdin]
worst = max(abs(a['weights'][n] - b['weights'][n]) / a['weights'][n]
            for a, b in zip(rows[0::2], rows[1::2]) for n in a['weights'])
print('%d steps, domain weights max rel diff %.2e' % (len(rows) // 2, worst))
sys.exit(0 if len(rows) == 20 and worst <= 1e-5 else 1)")
    local rc=$?
    [ $rc = 0 ] && say ok "$2: $report" || say FAIL "$2: $report"
}
for layout in "dp2 dp=2 ga=2" "tp2 tp=2" "pp2 pp=2" "pp2_afab pp=2 engine=afab" "cp2 cp=2" \
              "dp2_tp2_pp2 dp=2 tp=2 pp=2 ga=2" "zero1_dp2 dp=2 ga=2 zero1=true" \
              "recompute recompute=true"; do
    set -- $layout
    check_layout proxy "$@" && compare_weights proxy "$1"
done
# resumed at step 5 in another layout: its weights come back from the saved run's log, exactly
resume_layout proxy proxy resumed_dp2 dp=2 ga=2 && compare_weights proxy resumed_dp2

# 3. one domain: its weight is 1 and every token's too, so the proxy is the plain run
HARNESS_DATASET='"domains": [{"name": "novel", "path": "data/pride_and_prejudice.txt"}]'
HARNESS_SECTIONS='' run_layout one_reference ga=4
HARNESS_SECTIONS=', "doremi": {"reference_checkpoint": "'$HARNESS_DIR/one_reference/ckpt/$STEPS'"}'
run_layout one_proxy ga=4
HARNESS_SECTIONS='' run_layout one_plain ga=4
weights=$("$BUILD_DIR/tests/tool_compare_checkpoints" "$HARNESS_DIR/one_plain/ckpt/$STEPS" \
          "$HARNESS_DIR/one_proxy/ckpt/$STEPS" 0 | tail -n 1)
cmp -s "$HARNESS_DIR/one_plain/losses" "$HARNESS_DIR/one_proxy/losses" &&
    [ "${PIPESTATUS[0]}" = 0 ] && say ok "one domain: the proxy trains as the plain run, losses to 9 digits; $weights" ||
    say FAIL "one domain: the proxy differs from the plain run: $weights"

# 4. the whole pipeline (examples/doremi/train_doremi.sh): reference, proxy, final, held-out
LONG=100
if examples/doremi/train_doremi.sh "$work/example" $LONG >"$work/example.out" 2>&1; then
    sed 's/^/     /' "$work/example.out"
    python3 - "$work/example.out" <<'PY' && say ok "$LONG steps: random bytes lost weight, the novel and the sums gained it; the worst non-random domain's held-out loss is no worse with DoReMi's weights" || say FAIL "$LONG steps: DoReMi's weights or held-out losses are not as claimed (above)"
import sys
rows = {l.split()[0]: [float(x) for x in l.split()[1:]] for l in open(sys.argv[1])
        if l.split() and l.split()[0] in ("novel", "sums", "random")}
worst = [float(x.rstrip(",")) for x in open(sys.argv[1]).read().split("uniform")[-1].replace("DoReMi", "").split()]
sys.exit(0 if rows["random"][1] < 1 / 3 < min(rows["novel"][1], rows["sums"][1]) and worst[1] <= worst[0] else 1)
PY
else
    say FAIL "examples/doremi/train_doremi.sh: $(tail -n 3 "$work/example.out")"
fi

# 5. bad keys and combinations, one line each
base=$HARNESS_DIR/proxy/config.json
R='cfg["doremi"]'
bad no_domains "del cfg['dataset']['domains']; cfg['dataset']['name'] = 'data/pride_and_prejudice.txt'" 'dataset.domains is not'
bad step_size "$R['step_size'] = 0" 'doremi.step_size = 0 must be > 0'
bad smoothing "$R['smoothing'] = 2" 'doremi.smoothing = 2 must lie in \[0, 1\]'
bad same_dir "$R['reference_checkpoint'] = cfg['checkpoint']['save_dir']" 'the reference is another run'
bad sequence_parallel "cfg['distributed']['sequence_parallel'] = True; cfg['distributed']['tp_size'] = 2" 'with distributed.sequence_parallel is not supported yet'
bad missing "$R['reference_checkpoint'] = '$work/nowhere'" "$work/nowhere"
mkdir -p "$work/no_log" && cp -r "$HARNESS_DIR/proxy/ckpt/5" "$work/no_log/5"
bad resume_no_log "cfg['checkpoint']['load_path'] = '$work/no_log/5'; cfg['checkpoint']['save_dir'] = '$work/resumed'" "resuming a proxy run needs its weights, $work/no_log/domain_weights.jsonl"
head -n 3 "$HARNESS_DIR/proxy/ckpt/domain_weights.jsonl" >"$work/no_log/domain_weights.jsonl"
bad resume_short_log "cfg['checkpoint']['load_path'] = '$work/no_log/5'; cfg['checkpoint']['save_dir'] = '$work/resumed'" 'holds the weights of 3 steps, the checkpoint is at step 5'
[ $harness_failures -eq 0 ] || status=1
exit $status
