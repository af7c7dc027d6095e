#!/usr/bin/env bash
# picotron's CPU example, translated: SmolLM-1.7B cut to 5 layers, dp=2 x tp=2 x pp=2 (1F1B),
# seq 128, micro-batch 4, grad_acc 2, 3 steps, on 8 ranks (mpirun -np 8) on the byte-level corpus
# data/austen.txt (tokens < 256 < vocab 49152). Prints each step's time (the metrics file) and the
# peak resident memory of every rank (/usr/bin/time's maximum RSS, from wait4) and their total,
# beside the log's "Memory usage" (the logging rank's own getrusage peak) as the cross-check.
# A benchmark, not a test: it asserts nothing. Needs about 20 GB of free memory.
#   bash bench/bench_smollm_cpu.sh [steps]      (default 3)
cd "$(dirname "$0")/.." || exit 1
STEPS=${1:-3}
NP=8
if [ ! -x ./train ] || [ ! -x ./create_config ]; then
    echo "./train or ./create_config is missing: run make" >&2
    exit 1
fi
if [ ! -x /usr/bin/time ]; then
    echo "/usr/bin/time is missing (apt-get install time): it measures each rank's peak memory" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

./create_config --out_dir "$tmp" --exp_name smollm-cpu --model_name HuggingFaceTB/SmolLM-1.7B \
    --num_hidden_layers 5 --dp 2 --tp 2 --pp 2 --pp_engine 1f1b --seq_len 128 --mbs 4 \
    --grad_acc_steps 2 --total_train_steps "$STEPS" --use_cpu --overwrite \
    --metrics_file "$tmp/metrics.jsonl" >"$tmp/create.log" 2>&1 ||
    { cat "$tmp/create.log" >&2; exit 1; }
# each rank runs under /usr/bin/time, which writes its maximum RSS (KB) to a file named by the
# rank MPICH's launcher gives it (PMI_RANK)
start=$(date +%s.%N)
mpirun -np $NP bash -c 'exec /usr/bin/time -f "%M" -o "$0/rss.$PMI_RANK" ./train --config "$1"' \
    "$tmp" "$tmp/smollm-cpu/config.json" >"$tmp/train.log" 2>&1 ||
    { tail -n 5 "$tmp/train.log" >&2; exit 1; }
wall=$(python3 -c "import sys, time; print('%.1f' % (time.time() - float(sys.argv[1])))" "$start")
grep -E "parameters on this rank" "$tmp/train.log"
python3 - "$tmp" "$NP" "$wall" <<'PY'
import json, os, re, sys
tmp, np, wall = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = [json.loads(l) for l in open(os.path.join(tmp, "metrics.jsonl")) if l.strip()]
for r in rows:
    print("step %d: %.2f s, loss %.4f, %.0f tokens/s" %
          (r["step"], r["seconds"], r["loss"], 2 * 4 * 128 * 2 / r["seconds"]))
log = open(os.path.join(tmp, "train.log")).read()
logged = re.findall(r"\[rank (\d+)\] Step: +(\d+).*Memory usage: +([0-9.]+)GB", log)
if logged:
    rank, step, gb = logged[-1]
    print("log's Memory usage (rank %s, step %s): %s GB" % (rank, step, gb))
total = 0
for r in range(np):
    kb = int(open(os.path.join(tmp, "rss.%d" % r)).read().split()[-1])
    total += kb
    print("rank %d peak RSS: %.2f GB" % (r, kb * 1024 / 1e9))
print("total peak RSS over %d ranks: %.2f GB (sum of per-rank peaks); wall %s s" %
      (np, total * 1024 / 1e9, wall))
PY
