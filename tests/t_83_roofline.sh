#!/usr/bin/env bash
# bench/roofline.c's estimate holds against references computed here from the shapes alone:
#  1. its products' FLOPs add up to the model's: 6 x (weights a GEMM reads) x tokens, plus
#     attention's 2 x B x H x T^2 x D per product, 7 products a layer today (2 forward, the scores
#     again and 4 backward); with --flash 2 + 5 products on the causal tiles only (128 x 128 tiles,
#     counted here). Tiny (GQA, untied) and SmolLM-1.7B shapes, bf16 and fp32 products
#  2. rows checkable by hand: adamw_kernel moves 28 bytes a parameter (+2 a GEMM weight for its
#     bf16 copy under --bf16-activations), the gradients' zeroing 4 a parameter (under
#     --write-not-zero only the norms' and an untied embedding's), cross_entropy_backward_kernel
#     12 a logit, softmax_rows_kernel 8 a score, the dlogits casts 2 x 6 a logit
#  3. every row's time is max(FLOPs / its peak, bytes / bandwidth), its peak the one of its kind
#     (linear products --peak, today's attention products --tf32-peak, kernels --fp32-peak), the
#     step is the sum of its rows, and the summary's MFU is picotron's (utils.c's formula, redone
#     here)
#  4. each planned change alone takes time off the step, --all more than any one
#  5. a bad flag ends with one line naming it, exit 1; bench/gpu_bench.sh --estimate-only runs
#     without a GPU and prints no measured number
cd "$(dirname "$0")/.." || exit 1
TOLERANCE=1e-9 # relative: the CSV prints 17 digits
ROOFLINE=${PICOTRON_BUILD:-build}/bench/roofline
[ -x "$ROOFLINE" ] || { echo "$ROOFLINE is missing: build it with make"; exit 1; }
dir=$(mktemp -d /tmp/picotron-roofline.XXXXXX)
trap 'rm -rf "$dir"' EXIT
failures=0

# distinct peaks, so that a row at the wrong one shows
DEVICE=(--peak 1.5e15 --tf32-peak 0.6e15 --fp32-peak 5e13 --bandwidth 3e12)
SHAPES=("tiny|--layers 2 --hidden 64 --intermediate 160 --heads 4 --kv-heads 2 --vocab 300 --seq 320 --mbs 2 --tied 0"
    "SmolLM-1.7B|--layers 24 --hidden 2048 --intermediate 8192 --heads 32 --kv-heads 32 --vocab 49152 --seq 2048 --mbs 4 --tied 1")
for entry in "${SHAPES[@]}"; do
    read -r -a shape <<<"${entry#*|}"
    for dtype in bf16 fp32; do
        for plan in today --flash --bf16-activations --fused-loss --write-not-zero --all; do
            [ $dtype = fp32 ] && [[ $plan = --bf16-activations || $plan = --all ]] && continue
            name="${entry%%|*} $dtype $plan"
            args=("${shape[@]}" --dtype "$dtype" "${DEVICE[@]}")
            [ $plan = today ] || args+=("$plan")
            if ! "$ROOFLINE" "${args[@]}" --csv >"$dir/rows.csv" ||
                ! "$ROOFLINE" "${args[@]}" >"$dir/table.txt"; then
                echo "FAIL $name: the tool failed"
                failures=$((failures + 1))
                continue
            fi
            python3 - "$name" "$dir/rows.csv" "$dir/table.txt" "$TOLERANCE" "${args[@]}" <<'PY' ||
import csv, math, re, sys
name, rows_csv, table, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
flags, args = {}, sys.argv[5:]
i = 0
while i < len(args):
    if args[i] in ("--flash", "--bf16-activations", "--fused-loss", "--write-not-zero", "--all"):
        flags[args[i]] = True
        i += 1
    else:
        flags[args[i]] = args[i + 1]
        i += 2
plan = {p: "--all" in flags or p in flags
        for p in ("--flash", "--bf16-activations", "--fused-loss", "--write-not-zero")}
L, C, I, H, KV = (int(flags[k]) for k in ("--layers", "--hidden", "--intermediate", "--heads", "--kv-heads"))
V, T, B, tied = int(flags["--vocab"]), int(flags["--seq"]), int(flags["--mbs"]), flags["--tied"] == "1"
bf16 = flags["--dtype"] == "bf16"
peak, tf32, fp32, bw = (float(flags[k]) for k in ("--peak", "--tf32-peak", "--fp32-peak", "--bandwidth"))
D, N = C // H, B * T
weights = L * (2 * C * H * D + 2 * C * KV * D + 3 * C * I) + V * C  # what the linears multiply by
params = weights + (2 * L + 1) * C + (0 if tied else V * C)  # + norms and an untied embedding

def fail(why):
    print("FAIL %s: %s" % (name, why))
    sys.exit(1)

def close(a, b):
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-30)

config = None
rows = []
for r in csv.DictReader(open(rows_csv)):
    if None in r or None in r.values():
        fail("a malformed CSV line: %r" % r)
    config = r["config"]  # the last: the planned one when there is a plan
    rows.append(r)
rows = [r for r in rows if r["config"] == config]

# 1. the products' FLOPs against the model's
if plan["--flash"]:
    tiles = math.ceil(T / 128)
    causal = sum(1 for q in range(tiles) for k in range(tiles) if k <= q) / tiles**2
    attention = 7 * 2 * B * H * T * T * D * causal
else:
    attention = 7 * 2 * B * H * T * T * D
expected = 6 * N * weights + L * attention
gemm = sum(float(r["flops"]) for r in rows if r["kind"] == "gemm")
if not close(gemm, expected):
    fail("GEMM FLOPs %.6g, the model's %.6g" % (gemm, expected))

# 2. rows by hand
def row(label):
    found = [r for r in rows if r["name"] == label]
    if len(found) != 1:
        fail("%d rows named %r" % (len(found), label))
    return found[0]
adamw = 28 * params + (2 * weights if plan["--bf16-activations"] else 0)
# --write-not-zero: the dweight products write the gradients; the norms' (and an untied
# embedding's, which embedding_backward adds into) are still zeroed
zeroed = (2 * L + 1) * C + (0 if tied else V * C) if plan["--write-not-zero"] else params
checks = [("adamw_kernel", adamw), ("device_zero: model.grads (train.c)", 4 * zeroed)]
if not plan["--fused-loss"]:
    checks.append(("cross_entropy_backward_kernel", 12 * N * V))
    if bf16:
        checks.append(("to_bf16_kernel: dlogits", (1 if plan["--bf16-activations"] else 2) * 6 * N * V))
if not plan["--flash"]:
    checks.append(("softmax_rows_kernel: causal mask and softmax", L * 8 * B * H * T * T))
for label, want in checks:
    if not close(float(row(label)["bytes"]), want):
        fail("%s moves %s bytes, by hand %.17g" % (label, row(label)["bytes"], want))
if not bf16 and any(r["name"].startswith("to_bf16") for r in rows):
    fail("fp32 products with bf16 casts")

# 3. each row on its roofline at the peak of its kind; the step and its MFU
for r in rows:
    if r["kind"] != "gemm":
        want = fp32
    elif not bf16:
        want = fp32
    elif r["group"] == "attention" and not plan["--flash"]:
        want = tf32
    else:
        want = peak
    if float(r["peak"]) != want:
        fail("%s runs at %s FLOP/s, its kind at %g" % (r["name"], r["peak"], want))
    ms = 1e3 * max(float(r["flops"]) / want, float(r["bytes"]) / bw)
    if not close(float(r["ms"]), ms):
        fail("%s: %s ms, max(F/P, B/W) = %.17g ms" % (r["name"], r["ms"], ms))
step = sum(float(r["ms"]) for r in rows)
line = [l for l in open(table) if l.startswith("roofline: %s:" % config)]
if len(line) != 1:
    fail("no summary line for %s" % config)
m = re.match(r"roofline: .*: step ([0-9.]+) ms, ([0-9]+) tokens/s, MFU ([0-9.]+)%", line[0])
per_token = 6 * params + 12 * L * C * T  # utils.c's flops_per_token, with the untied head
mfu = 100 * N / (step / 1e3) * per_token / peak
if not m or abs(float(m.group(1)) - step) > 0.0051 or abs(float(m.group(3)) - mfu) > 0.051:
    fail("summary %r, the rows' step %.2f ms and picotron's MFU %.2f%%" % (line[0].strip(), step, mfu))
print("ok   %s: %d rows, GEMM %.6g FLOP = the model's, step %.2f ms = the rows' sum, MFU %.2f%%"
      % (name, len(rows), gemm, step, mfu))
PY
                failures=$((failures + 1))
        done
    done
done

# 4. each change takes time off; all of them more than any one
"$ROOFLINE" --all >"$dir/all.txt" || failures=$((failures + 1))
python3 - "$dir/all.txt" <<'PY' || failures=$((failures + 1))
import re, sys
step = dict(re.findall(r"^roofline: (.+?): step ([0-9.]+) ms", open(sys.argv[1]).read(), re.M))
step = {k: float(v) for k, v in step.items()}
singles = ["--flash", "--bf16-activations", "--fused-loss", "--write-not-zero"]
if set(step) != {"today", "--all"} | set(singles):
    sys.exit("FAIL --all: summary lines for %s" % sorted(step))
worse = [s for s in singles if not step[s] < step["today"] or not step["--all"] < step[s]]
if worse:
    sys.exit("FAIL --all: %s do not take time off (%s)" % (worse, step))
print("ok   every change takes time off: today %.1f ms, %s, --all %.1f ms"
      % (step["today"], ", ".join("%s %.1f" % (s, step[s]) for s in singles), step["--all"]))
PY

# 5. bad flags, each with the flag its line must name: one line, exit 1
while IFS='|' read -r bad flag; do
    # shellcheck disable=SC2086 # the flags split into words
    "$ROOFLINE" $bad >"$dir/out" 2>"$dir/err"
    rc=$?
    if [ $rc -eq 1 ] && [ ! -s "$dir/out" ] && [ "$(wc -l <"$dir/err")" -eq 1 ] &&
        grep -q -- "$flag" "$dir/err"; then
        echo "ok   $bad: $(cat "$dir/err")"
    else
        echo "FAIL $bad: exit $rc, stderr: $(cat "$dir/err")"
        failures=$((failures + 1))
    fi
done <<'CASES'
--layers 0|--layers
--seq x|--seq
--tied 2|--tied
--peak|--peak
--bandwidth -1|--bandwidth
--dtype fp16|--dtype
--heads 5|--heads
--kv-heads 3|--kv-heads
--bogus|--bogus
--dtype fp32 --bf16-activations|--bf16-activations
CASES

# gpu_bench.sh's estimate needs no GPU, and calls nothing measured
if bash bench/gpu_bench.sh --estimate-only 2 >"$dir/bench.txt" 2>&1 &&
    grep -q "^roofline: GEMM  *estimate  *[0-9.]*$" "$dir/bench.txt" &&
    grep -q "^roofline: today: step" "$dir/bench.txt" &&
    ! grep -qiE "measured +[0-9]" "$dir/bench.txt"; then
    echo "ok   bench/gpu_bench.sh --estimate-only: $(grep -c '^roofline:' "$dir/bench.txt") roofline lines, no measured number"
else
    echo "FAIL bench/gpu_bench.sh --estimate-only:"
    tail -n 5 "$dir/bench.txt"
    failures=$((failures + 1))
fi
echo "$failures failed"
[ $failures -eq 0 ]
