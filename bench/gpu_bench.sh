#!/usr/bin/env bash
# The GPU benchmark: a SmolLM-1.7B-shaped stack (hidden 2048, intermediate 8192, 32 heads, 32 kv
# heads, vocab 49152, tied embeddings) cut to LAYERS layers, bf16 products (model.dtype), seq 1024,
# micro-batch MBS, STEPS steps on one GPU (nccl backend: a group of one communicates nothing), on
# the byte-level corpus data/austen.txt. Prints, on lines starting "bench:", tokens/s and MFU
# (train's own numbers, against device_peak_flops) averaged over the steps after the first (the
# first pays for cuBLAS's heuristics and first allocations), and, on lines starting "profile:",
# the time split of the whole run (GEMM, attention, other kernels, communication) from the CUDA
# backend's profiler (PICOTRON_PROFILE=1), with its per-step share.
# Before the run, bench/roofline.c's estimate of the same step (its table, from the source here:
# built with cc, or build*/bench/roofline); after it, on lines starting "roofline:", the estimate's
# time per profiler category beside the profiler's measured time per step, and their ratio.
# ROOFLINE_FLAGS passes the device to the estimate (default one H200, e.g. "--peak 312e12
# --bandwidth 2.04e12" for an A100 SXM). --estimate-only prints the estimate alone: no GPU needed.
# A benchmark, not a test: it asserts nothing beyond train running and printing its numbers.
#   bash bench/gpu_bench.sh [--estimate-only] [layers] [mbs] [steps]
#   (defaults 8 4 10; the run needs `make GPU=1`)
# 8 layers hold ~0.64 B parameters: fp32 weights, gradients and AdamW moments take ~10 GB, the
# fp32 activations of 4 x 1024 tokens a few GB more (autocast stores activations in fp32).
cd "$(dirname "$0")/.." || exit 1
ESTIMATE_ONLY=0
if [ "${1:-}" = --estimate-only ]; then
    ESTIMATE_ONLY=1
    shift
fi
LAYERS=${1:-8}
MBS=${2:-4}
STEPS=${3:-10}
SEQ=${SEQ:-1024}
TRAIN=${PICOTRON_TRAIN:-./train} # the GPU emulator's: build-emu/bin/train
if [ $ESTIMATE_ONLY = 0 ] && { [ ! -x "$TRAIN" ] || ! grep -qa cudaMalloc "$TRAIN"; }; then
    echo "./train is missing or is the CPU build: run make GPU=1" >&2
    exit 1
fi
tmp=$(mktemp -d /tmp/picotron_gpu_bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# the estimate: the same shape as the run below (SmolLM-1.7B's, the roofline tool's default)
roofline=$tmp/roofline
if ! cc -O2 -o "$roofline" bench/roofline.c -lm 2>/dev/null; then
    roofline=
    for built in build*/bench/roofline; do
        [ -x "$built" ] && roofline=$built && break
    done
fi
read -r -a roofline_flags <<<"--layers $LAYERS --seq $SEQ --mbs $MBS ${ROOFLINE_FLAGS:-}"
if [ -z "$roofline" ] || ! "$roofline" "${roofline_flags[@]}" ||
    ! "$roofline" "${roofline_flags[@]}" --csv >"$tmp/roofline.csv"; then
    echo "roofline: no estimate (bench/roofline.c: no cc here to build it, nor make's build)"
    rm -f "$tmp/roofline.csv"
fi
# compare [LOG STEPS METRICS]: the estimate's time per profiler category and step, beside the
# profiler's in LOG (all STEPS steps) and the step time in METRICS (steps 2-STEPS) when given
compare() {
    [ -s "$tmp/roofline.csv" ] || return 0
    python3 - "$tmp/roofline.csv" "$@" <<'PY'
import csv, json, re, sys
estimate = dict.fromkeys(["GEMM", "attention", "other kernels", "communication"], 0.0)
for row in csv.DictReader(open(sys.argv[1])):
    if row["config"] == "today":
        estimate[row["profiler"]] += float(row["ms"])
estimate["kernels in all"] = estimate["step"] = sum(estimate.values())
measured = {}
if len(sys.argv) > 2:
    log, steps, metrics = sys.argv[2], int(sys.argv[3]), sys.argv[4]
    for name, ms in re.findall(r"^profile: (GEMM|attention|other kernels|communication) +"
                               r"([0-9.]+) ms", open(log).read(), re.M):
        measured[name] = float(ms) / steps
    measured["kernels in all"] = sum(measured.values())
    secs = [json.loads(l)["seconds"] for l in open(metrics) if l.strip()][1:]
    measured["step"] = 1e3 * sum(secs) / len(secs) # with the host's gaps between kernels
    print("roofline: per step, ms: estimate (roofline) | measured (profiler, mean of all %d "
          "steps; step: train's, steps 2-%d) | measured / estimate" % (steps, steps))
else:
    print("roofline: per step, ms: estimate (roofline); measured: not run (--estimate-only)")
for name, ms in estimate.items():
    line = "roofline: %-15s estimate %8.1f" % (name, ms)
    if name in measured:
        ratio = "%.2f" % (measured[name] / ms) if ms > 0 else "-"
        line += " | measured %8.1f | %s" % (measured[name], ratio)
    print(line)
PY
}
if [ $ESTIMATE_ONLY = 1 ]; then
    compare
    exit
fi
cat >"$tmp/config.json" <<JSON
{"distributed": {"tp_size": 1, "cp_size": 1, "pp_size": 1, "dp_size": 1, "use_cpu": false,
                 "backend": "nccl"},
 "model": {"name": "HuggingFaceTB/SmolLM-1.7B", "num_hidden_layers": $LAYERS,
           "dtype": "bfloat16"},
 "training": {"seed": 42, "learning_rate": 3e-4, "total_train_steps": $STEPS,
              "seq_length": $SEQ, "micro_batch_size": $MBS, "gradient_accumulation_steps": 1},
 "dataset": {"name": "data/austen.txt"},
 "logging": {"metrics_file": "$tmp/metrics.jsonl"}}
JSON
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | sed 's/^/bench: GPU /'
echo "bench: SmolLM-1.7B shape, $LAYERS layers, bf16 products, seq $SEQ, mbs $MBS, $STEPS steps"
PICOTRON_PROFILE=1 "$TRAIN" --config "$tmp/config.json" >"$tmp/train.log" 2>&1
rc=$?
cat "$tmp/train.log"
if [ $rc -ne 0 ]; then
    echo "bench: train exited $rc"
    exit $rc
fi
# tokens/s from the metrics file's seconds (the log line rounds them); MFU from the log line
python3 - "$tmp/metrics.jsonl" "$tmp/train.log" "$((MBS * SEQ))" "$STEPS" <<'PY' || exit 1
import json, re, sys
metrics, log, tokens, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = [json.loads(l) for l in open(metrics) if l.strip()]
mfu = [float(m) for m in re.findall(r"MFU: *([0-9.]+)%", open(log).read())]
if len(rows) < 2 or len(mfu) != len(rows):
    sys.exit("bench: expected one metrics row and one MFU per step, got %d and %d"
             % (len(rows), len(mfu)))
secs = [r["seconds"] for r in rows[1:]]
mean = sum(secs) / len(secs)
print("bench: step %.1f ms (mean of steps 2-%d), %.0f tokens/s, MFU %.2f%%"
      % (1e3 * mean, len(rows), tokens / mean, sum(mfu[1:]) / len(mfu[1:])))
prof = re.findall(r"^profile: (GEMM|attention|other kernels|communication|outside calls) +"
                  r"([0-9.]+) ms", open(log).read(), re.M)
if len(prof) != 5:
    sys.exit("bench: the profiler's report (PICOTRON_PROFILE=1) is missing from the log")
print("bench: per step, all %d steps: %s" % (steps, ", ".join(
    "%s %.1f ms" % (name, float(ms) / steps) for name, ms in prof)))
PY
compare "$tmp/train.log" "$STEPS" "$tmp/metrics.jsonl"
