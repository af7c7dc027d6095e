#!/usr/bin/env bash
# bench/roofline.c's estimate holds against references computed here from the shapes alone, and
# its rows are the launches the GPU build makes:
#  1. its linear products' FLOPs add up to the model's, 6 x (weights a GEMM reads) x tokens; its
#     attention products' to 2 + 4 + 3 products (flash_attention.cu's forward, dk/dv and dq
#     kernels) on the 64 x 64 tiles a causal mask leaves, counted here, with the head dim padded
#     as the kernels pad it; or, on attention.cu's GEMM path (fp32), 7 products of
#     2 x B x H x T^2 x D. Tiny (GQA, untied) and SmolLM-1.7B shapes, bf16 and fp32 products
#  2. rows checkable by hand: adamw_kernel moves 28 bytes a parameter (+2 under
#     --bf16-activations, for the weights' bf16 copy), the gradients' zeroing 4 a parameter
#     (under --write-not-zero only the norms' and an untied embedding's),
#     cross_entropy_backward_kernel 8 a logit in fp32, 10 in bf16 (its bf16 copy of dlogits for
#     the head's products) and 6 under --bf16-dlogits, no dlogits cast in any (the copy is read),
#     softmax_rows_kernel 8 a score; in bf16 the weights' casts one launch per tensor the products
#     read (7 a layer and the head) and 6 bytes per weight (read 4, write 2), once a step
#  3. every row's time is max(FLOPs / its peak, bytes / bandwidth), its peak the one of its call
#     (cublasGemmEx --peak, or --fp32-peak in fp32; flash kernels --flash-peak; the GEMM path's
#     batched products --fp32-peak in fp32; kernels --fp32-peak), the step is the sum of its
#     rows, and the summary's MFU is picotron's (utils.c's formula, redone here)
#  4. each planned change alone takes time off the step, --all more than any one
#  5. a bad flag ends with one line naming it, exit 1; bench/gpu_bench.sh --estimate-only runs
#     without a GPU and prints no measured number
#  6. the census: one training step of the GPU build on the CUDA emulator (make GPU=emulate; every
#     launch checked, none computed) launches each kernel, and calls cuBLAS, cudaMemset and
#     device-to-device copies, exactly as often as the roofline's rows of that call add up to:
#     bf16 (flash attention) with GQA untied and with MHA tied, 8192 tokens (the bitonic sort's
#     global steps), and fp32 (the GEMM path, its scores in several head sets). Two steps' counts
#     less one step's, so that the set-up's launches cancel. A kernel the code adds, drops or
#     launches once more per layer without the roofline following fails here.
cd "$(dirname "$0")/.." || exit 1
TOLERANCE=1e-9 # relative: the CSV prints 17 digits
ROOFLINE=${PICOTRON_BUILD:-build}/bench/roofline
[ -x "$ROOFLINE" ] || { echo "$ROOFLINE is missing: build it with make"; exit 1; }
dir=$(mktemp -d /tmp/picotron-roofline.XXXXXX)
trap 'rm -rf "$dir"' EXIT
failures=0

# distinct peaks, so that a row at the wrong one shows
DEVICE=(--peak 1.5e15 --flash-peak 0.9e15 --tf32-peak 0.6e15 --fp32-peak 5e13 --bandwidth 3e12)
SHAPES=("tiny|--layers 2 --hidden 64 --intermediate 160 --heads 4 --kv-heads 2 --vocab 300 --seq 320 --mbs 2 --tied 0"
    "SmolLM-1.7B|--layers 24 --hidden 2048 --intermediate 8192 --heads 32 --kv-heads 32 --vocab 49152 --seq 2048 --mbs 4 --tied 1")
for entry in "${SHAPES[@]}"; do
    read -r -a shape <<<"${entry#*|}"
    for dtype in bf16 fp32; do
        for plan in today --bf16-activations --bf16-dlogits --write-not-zero --all; do
            [ $dtype = fp32 ] && [ $plan != today ] && [ $plan != --write-not-zero ] && continue
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
    if args[i] in ("--bf16-activations", "--bf16-dlogits", "--write-not-zero", "--all"):
        flags[args[i]] = True
        i += 1
    else:
        flags[args[i]] = args[i + 1]
        i += 2
plan = {p: "--all" in flags or p in flags
        for p in ("--bf16-activations", "--bf16-dlogits", "--write-not-zero")}
L, C, I, H, KV = (int(flags[k]) for k in ("--layers", "--hidden", "--intermediate", "--heads", "--kv-heads"))
V, T, B, tied = int(flags["--vocab"]), int(flags["--seq"]), int(flags["--mbs"]), flags["--tied"] == "1"
bf16 = flags["--dtype"] == "bf16"
peak, flash_peak, tf32, fp32, bw = (float(flags[k]) for k in
                                    ("--peak", "--flash-peak", "--tf32-peak", "--fp32-peak", "--bandwidth"))
D, N = C // H, B * T
flash = bf16 and D <= 128
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
linear = sum(float(r["flops"]) for r in rows if r["call"] == "cublasGemmEx")
if not close(linear, 6 * N * weights):
    fail("linear GEMM FLOPs %.6g, the model's %.6g" % (linear, 6 * N * weights))
if flash:
    tiles = math.ceil(T / 64)
    pairs = sum(1 for q in range(tiles) for k in range(tiles) if k <= q)  # the causal tiles
    DP = next(p for p in (16, 32, 64, 128) if D <= p)
    expected = L * 9 * B * H * pairs * 2 * 64 * 64 * DP
    calls = ("flash_forward_kernel", "flash_dk_dv_kernel", "flash_dq_kernel")
else:
    expected = L * 7 * 2 * B * H * T * T * D
    calls = ("cublasGemmStridedBatchedEx",)
attention = sum(float(r["flops"]) for r in rows if r["call"] in calls)
if not close(attention, expected):
    fail("attention products' FLOPs %.6g, by hand %.6g" % (attention, expected))

# 2. rows by hand
def row(label):
    found = [r for r in rows if r["name"] == label]
    if len(found) != 1:
        fail("%d rows named %r" % (len(found), label))
    return found[0]
adamw = 28 * params + (2 * params if plan["--bf16-activations"] else 0)
# --write-not-zero: the dweight products write the gradients; the norms' (and an untied
# embedding's, which embedding_backward adds into) are still zeroed
zeroed = (2 * L + 1) * C + (0 if tied else V * C) if plan["--write-not-zero"] else params
dlogits = 6 if plan["--bf16-dlogits"] else 10 if bf16 else 8
checks = [("adamw_kernel", adamw), ("device_zero: model.grads (train.c)", 4 * zeroed),
          ("cross_entropy_backward_kernel: dlogits written whole", dlogits * N * V)]
if any("dlogits" in r["name"] and r["call"] == "to_bf16_kernel" for r in rows):
    fail("dlogits cast: its kernel writes the products' copy")
if not flash:
    checks.append(("softmax_rows_kernel: causal mask and softmax", L * 8 * B * H * T * T))
for label, want in checks:
    if not close(float(row(label)["bytes"]), want):
        fail("%s moves %s bytes, by hand %.17g" % (label, row(label)["bytes"], want))
if not bf16 and any(r["call"] == "to_bf16_kernel" for r in rows):
    fail("fp32 products with bf16 casts")
if bf16 and not plan["--bf16-activations"]:  # there AdamW writes the copy: no weight is cast
    w = row("to_bf16_kernel: each weight, at its first product of the step")
    if float(w["calls"]) != 7 * L + 1 or not close(float(w["bytes"]), 6 * weights):
        fail("the weights' casts: %s launches of %s bytes, by hand %d of %.17g"
             % (w["calls"], w["bytes"], 7 * L + 1, 6 * weights))

# 3. each row on its roofline at the peak of its call; the step and its MFU
for r in rows:
    if r["call"] == "cublasGemmEx":
        want = peak if bf16 else fp32
    elif r["call"].startswith("flash_"):
        want = flash_peak
    elif r["call"] == "cublasGemmStridedBatchedEx":
        want = tf32 if bf16 else fp32
    else:
        want = fp32
    if float(r["peak"]) != want:
        fail("%s runs at %s FLOP/s, its call at %g" % (r["name"], r["peak"], want))
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
print("ok   %s: %d rows, FLOPs = the model's (linear %.6g, attention %.6g), step %.2f ms = the "
      "rows' sum, MFU %.2f%%" % (name, len(rows), linear, attention, step, mfu))
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
singles = ["--bf16-activations", "--bf16-dlogits", "--write-not-zero"]
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
--dtype fp32 --bf16-dlogits|--bf16-dlogits
--flash-peak 0|--flash-peak
--scores-cap x|--scores-cap
--scores-cap 0|--scores-cap
--flash|--flash
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
# 6. the census: one step's launches on the CUDA emulator against the rows' calls
# census_check NAME [ROOFLINE-FLAG VALUE]...: the step on the emulator (launches checked, none
# computed), its config written from the same shape the roofline is given
census_check() {
    local name=$1 i k
    shift
    local -A f=([--layers]=2 [--hidden]=64 [--intermediate]=160 [--heads]=4 [--kv-heads]=2
        [--vocab]=300 [--seq]=64 [--mbs]=2 [--tied]=0 [--dtype]=bf16)
    local args=("$@") dtype=bfloat16 tied=false
    for ((i = 0; i < ${#args[@]}; i += 2)); do f[${args[i]}]=${args[i + 1]}; done
    [ "${f[--dtype]}" = fp32 ] && dtype=float32
    [ "${f[--tied]}" = 1 ] && tied=true
    for steps in 1 2; do
        cat >"$dir/census$steps.json" <<JSON
{"distributed": {"use_cpu": false, "backend": "nccl"},
 "model": {"name": "picotron-tiny", "num_hidden_layers": ${f[--layers]},
           "hidden_size": ${f[--hidden]}, "intermediate_size": ${f[--intermediate]},
           "num_attention_heads": ${f[--heads]}, "num_key_value_heads": ${f[--kv-heads]},
           "vocab_size": ${f[--vocab]}, "max_position_embeddings": ${f[--seq]},
           "tie_word_embeddings": $tied, "dtype": "$dtype"},
 "training": {"total_train_steps": $steps, "seq_length": ${f[--seq]},
              "micro_batch_size": ${f[--mbs]}},
 "dataset": {"name": "data/austen.txt"}, "checkpoint": {"save_dir": "$dir/census"}}
JSON
        if ! PICOTRON_EMU_SKIP_COMPUTE=1 PICOTRON_EMU_CENSUS=$dir/census$steps timeout 300 \
            mpirun -np 1 build-emu/bin/train --config "$dir/census$steps.json" \
            >"$dir/census$steps.log" 2>&1; then
            echo "FAIL census $name: the emulated run of $steps steps failed:"
            tail -n 3 "$dir/census$steps.log"
            return 1
        fi
    done
    local flags=()
    for k in "${!f[@]}"; do flags+=("$k" "${f[$k]}"); done
    # the emulator's build sets attention.cu's SCORES_CAP to 2048 floats (Makefile)
    "$ROOFLINE" "${flags[@]}" --scores-cap 2048 --csv >"$dir/census.csv" ||
        { echo "FAIL census $name: roofline ${flags[*]} failed"; return 1; }
    python3 - "$name" "$dir/census1.0" "$dir/census2.0" "$dir/census.csv" <<'PY'
import collections, csv, sys
name = sys.argv[1]
def counts(path):
    out = {}
    for line in open(path):
        n, call = line.split(None, 1)
        out[call.strip()] = int(n)
    return out
one, two = counts(sys.argv[2]), counts(sys.argv[3])
step = {c: two.get(c, 0) - one.get(c, 0) for c in set(one) | set(two)}
step = {c: n for c, n in step.items() if n}
rows = collections.Counter()
for r in csv.DictReader(open(sys.argv[4])):
    if r["config"] == "today":
        rows[r["call"]] += int(float(r["calls"]))
bad = ["%s launched %d times, the rows say %d" % (c, step.get(c, 0), rows.get(c, 0))
       for c in sorted(set(step) | set(rows)) if step.get(c, 0) != rows.get(c, 0)]
if bad:
    print("FAIL census %s: %s" % (name, "; ".join(bad)))
    sys.exit(1)
print("ok   census %s: %d calls of %d kinds in one step, each as many as its rows say"
      % (name, sum(step.values()), len(step)))
PY
}
if [ "$(uname -m)" != x86_64 ]; then
    echo "skip census: the CUDA emulator switches threads in x86-64 assembly; this is $(uname -m)"
elif ! make GPU=emulate build-emu/bin/train >"$dir/build.log" 2>&1; then
    echo "FAIL census: make GPU=emulate build-emu/bin/train"
    tail -n 20 "$dir/build.log"
    failures=$((failures + 1))
else
    census_check "bf16 GQA untied" || failures=$((failures + 1))
    census_check "bf16 MHA tied 3 layers" --layers 3 --heads 4 --kv-heads 4 --tied 1 --seq 128 ||
        failures=$((failures + 1))
    census_check "bf16 8192 tokens" --seq 1024 --mbs 8 || failures=$((failures + 1))
    census_check "fp32 GEMM path" --dtype fp32 --seq 64 || failures=$((failures + 1))
fi
echo "$failures failed"
[ $failures -eq 0 ]
