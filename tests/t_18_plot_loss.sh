#!/usr/bin/env bash
# ./plot_loss draws what the metrics files hold, and nothing else:
#  1. three runs (30, 30 and 12 steps; the first two identical, as a 1-rank and an 8-rank run
#     should be): well-formed SVG with one <path class="run"> per file, named as the legend names
#     it, one vertex per line, every vertex where its (step, loss) falls on one shared pair of
#     linear axes (within TOLERANCE_PX), so a falling loss draws a path going down the picture; the
#     later of two identical curves is drawn thinner, so both stay visible
#  2. --x tokens puts each vertex at its token count, --log_y at the log of its loss
#  3. bad input ends with one line that names the file (and the line), exit 1
#  4. the metrics file of a real 5-step ./train run draws one path of 5 points
cd "$(dirname "$0")/.." || exit 1
TOLERANCE_PX=0.02 # coordinates are written with 2 decimals
for bin in ./plot_loss ./create_config ./train; do
    [ -x "$bin" ] || { echo "$bin is missing: build it with make"; exit 1; }
done
dir=$(mktemp -d /tmp/picotron-plot.XXXXXX)
trap 'rm -rf "$dir"' EXIT
. tests/check_lib.sh

# metrics FILE STEPS TOKENS_PER_STEP: a falling loss with a bump every third step (0: no "tokens")
metrics() {
    mkdir -p "$(dirname "$1")"
    awk -v n="$2" -v t="$3" 'BEGIN {
        for (s = 1; s <= n; s++) {
            loss = 2 + 3.5 * exp(-s / 8) + (s % 3 == 0 ? 0.2 : 0)
            if (t) printf "{\"step\": %d, \"loss\": %.9g, \"tokens\": %d, \"seconds\": 0.01}\n", s, loss, s * t
            else printf "{\"step\": %d, \"loss\": %.9g}\n", s, loss
        }
    }' >"$1"
}
metrics "$dir/one/metrics.jsonl" 30 256
mkdir "$dir/eight" && cp "$dir/one/metrics.jsonl" "$dir/eight/metrics.jsonl"
metrics "$dir/short.jsonl" 12 0

# svg_check SVG X_KEY LOG_Y FILE:NAME...: prints what it compared, exits 1 with the reason if wrong
svg_check() {
    python3 - "$TOLERANCE_PX" "$@" <<'PY'
import json, math, re, sys, xml.etree.ElementTree as ET
tol, svg, x_key, log_y, runs = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5:]
def fail(why): print(why); sys.exit(1)
try:
    paths = [p for p in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}path") if p.get("class") == "run"]
except ET.ParseError as e:
    fail("%s is not well-formed XML: %s" % (svg, e))
if len(paths) != len(runs): fail("%d run paths for %d files" % (len(paths), len(runs)))
points, widths = [], []  # (value x, value y, picture x, picture y) of every vertex of every run
for path, run in zip(paths, runs):
    file, name = run.rsplit(":", 1)
    lines = [json.loads(l) for l in open(file)]
    vertices = [tuple(map(float, v)) for v in re.findall(r"[ML]\s*(-?[\d.]+)\s+(-?[\d.]+)", path.get("d"))]
    if path.get("data-name") != name: fail("data-name %r, want %r" % (path.get("data-name"), name))
    if path.get("data-points") != str(len(lines)): fail("%s: data-points %s, %d lines" % (name, path.get("data-points"), len(lines)))
    if len(vertices) != len(lines): fail("%s: %d vertices, %d lines" % (name, len(vertices), len(lines)))
    for l, (px, py) in zip(lines, vertices):
        points.append((l[x_key], math.log10(l["loss"]) if log_y else l["loss"], px, py))
    widths.append(float(path.get("stroke-width")))
# one linear map per axis for all runs: picture = a + b * value, fitted by least squares
def fit(pairs):
    n = len(pairs); mv = sum(v for v, _ in pairs) / n; mp = sum(p for _, p in pairs) / n
    b = sum((v - mv) * (p - mp) for v, p in pairs) / sum((v - mv) ** 2 for v, _ in pairs)
    return b, max(abs(mp + b * (v - mv) - p) for v, p in pairs)
bx, ex = fit([(x, px) for x, _, px, _ in points])
by, ey = fit([(y, py) for _, y, _, py in points])
if bx <= 0: fail("x grows leftward (%.3g px per %s)" % (bx, x_key))
if by >= 0: fail("a higher loss is drawn lower (%.3g px per loss unit; SVG's y grows downward)" % by)
if max(ex, ey) > tol: fail("a vertex is %.3f px off the axes' linear map (x %.3f, y %.3f)" % (max(ex, ey), ex, ey))
if any(b >= a for a, b in zip(widths, widths[1:])): fail("stroke widths %s: each later run should be thinner" % widths)
print("%d paths, %d vertices, each within %.3f px of %s and within %.3f px of %sloss; widths %s"
      % (len(paths), len(points), ex, x_key, ey, "log " if log_y else "", widths))
PY
}

# 1. three runs against step
out=$(./plot_loss --out "$dir/step.svg" --title "1 & 8 ranks <agree>" "$dir/one/metrics.jsonl" \
    "$dir/eight/metrics.jsonl" "$dir/short.jsonl=short")
summary=$(svg_check "$dir/step.svg" step 0 "$dir/one/metrics.jsonl:one" "$dir/eight/metrics.jsonl:eight" "$dir/short.jsonl:short")
check "3 runs by step: $summary" test $? = 0 -a "$out" = "wrote $dir/step.svg: 3 runs, 72 points"

# 2. against tokens (the 8-rank run saw twice the tokens a step), and on a log loss axis
metrics "$dir/eight/metrics.jsonl" 30 512
./plot_loss --out "$dir/tokens.svg" --x tokens --log_y "$dir/one/metrics.jsonl" "$dir/eight/metrics.jsonl" >/dev/null
summary=$(svg_check "$dir/tokens.svg" tokens 1 "$dir/one/metrics.jsonl:one" "$dir/eight/metrics.jsonl:eight")
check "2 runs by tokens, log loss: $summary" test $? = 0

# 3. bad input: exactly one line, naming what is wrong, exit 1
one_line() { # what expected-text command...
    local what=$1 want=$2 out rc
    shift 2
    out=$("$@" 2>&1)
    rc=$?
    check "$what: $(echo "$out" | head -n 1)" \
        test $rc = 1 -a "$(echo "$out" | grep -c .)" = 1 -a -n "$(echo "$out" | grep -F -- "$want")"
}
: >"$dir/empty.jsonl"
printf '{"step": 1, "loss": 5.5}\n{"step": 2, "loss": 5.4\n' >"$dir/broken.jsonl"
printf '{"step": 1, "loss": 5.5}\n{"step": 2, "loss": nan}\n' >"$dir/nan.jsonl"
one_line "missing file" "$dir/none.jsonl cannot be opened" ./plot_loss --out "$dir/x.svg" "$dir/none.jsonl"
one_line "empty file" "$dir/empty.jsonl holds no metrics lines" ./plot_loss --out "$dir/x.svg" "$dir/empty.jsonl"
one_line "a line that is not JSON" "$dir/broken.jsonl line 2 is not a JSON object" ./plot_loss --out "$dir/x.svg" "$dir/broken.jsonl"
one_line "a NaN loss" "$dir/nan.jsonl line 2 holds a number that is not finite" ./plot_loss --out "$dir/x.svg" "$dir/nan.jsonl"
one_line "--x tokens on a file without tokens" "$dir/short.jsonl line 1 is not a JSON object with numbers \"tokens\"" \
    ./plot_loss --out "$dir/x.svg" --x tokens "$dir/short.jsonl"
one_line "unknown flag" "unknown flag '--out_file'" ./plot_loss --out_file "$dir/x.svg" "$dir/short.jsonl"
one_line "no --out" "--out FILE.svg is needed" ./plot_loss "$dir/short.jsonl"
one_line "no file" "no metrics file given" ./plot_loss --out "$dir/x.svg"
one_line "an unwritable --out" "cannot write $dir/no/such/x.svg" ./plot_loss --out "$dir/no/such/x.svg" "$dir/short.jsonl"

# 4. a real run's metrics
if ! command -v mpirun >/dev/null; then
    echo "mpirun not found: install mpich (make deps) to plot a real run"
    [ "$failures" -gt 0 ] && exit 1
    exit 77
fi
./create_config --out_dir "$dir" --exp_name a --model_name picotron-tiny --seq_len 32 --mbs 2 \
    --total_train_steps 5 --use_cpu --metrics_file "$dir/a.jsonl" >/dev/null || exit 1
timeout 120 mpirun -np 1 ./train --config "$dir/a/config.json" >"$dir/a.log" 2>&1 || { tail -n 5 "$dir/a.log"; exit 1; }
./plot_loss --out "$dir/a.svg" "$dir/a.jsonl=a" >/dev/null
summary=$(svg_check "$dir/a.svg" step 0 "$dir/a.jsonl:a")
check "a 5-step ./train run: $summary" test $? = 0 -a "$(grep -c . "$dir/a.jsonl")" = 5
exit $((failures > 0))
