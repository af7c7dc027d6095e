#!/usr/bin/env bash
# Training throughput of ./train (CPU build) against PyTorch eager (transformers' LlamaForCausalLM,
# fp32, AdamW) on the same model and batch, with 1 and 2 threads: tokens/s of each and the ratio
# C / PyTorch. A benchmark, not a test: it asserts nothing.
#   bash bench/bench_vs_pytorch.sh [tiny|large|all]      (default: all; large takes minutes)
# tiny:  picotron-tiny, hidden 128, intermediate 384, 4 layers, 4 heads, 2 kv heads, vocab 256,
#        tied, seq 128, micro-batch 4
# large: hidden 512, intermediate 1536, 8 layers, 8 heads, 4 kv heads, vocab 256, tied, seq 256,
#        micro-batch 8
# Both sides time 10 steps after 3 warm-up steps; ./train's rate is the harmonic mean of the
# Tokens/s of its logged steps 4..13 (total tokens over total step time), its MFU the mean of
# their MFU (model FLOP/s over the measured FMA peak of the cores it uses). After each case, where
# ./train's step goes at each thread count (PICOTRON_KERNEL_TIME, backend/kernel_time.c): each
# kind of kernel's share, and its FLOP/s or bytes/s beside the FMA peak and a copy's bandwidth.
# PyTorch comes from the script's own virtual environment, bench/.venv (BENCH_VENV to use another),
# created and filled with pip on the first run (about 6 GB: the default wheel carries CUDA's
# libraries), so every run compares against the same pinned versions.
cd "$(dirname "$0")/.." || exit 1
TORCH_VERSION=2.15.0
TRANSFORMERS_VERSION=5.24.0
VENV=${BENCH_VENV:-bench/.venv}
WARMUP=3
STEPS=10
THREADS=${THREADS:-"1 2"}
which=${1:-all}
case $which in tiny|large|all) ;; *) echo "usage: $0 [tiny|large|all]" >&2; exit 2 ;; esac

if ! "$VENV/bin/python" -c "import torch, transformers" 2>/dev/null; then
    echo "installing torch==$TORCH_VERSION transformers==$TRANSFORMERS_VERSION into $VENV"
    { python3 -m venv "$VENV" &&
      "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION"; } ||
        { echo "could not install PyTorch into $VENV (pip needs PyPI)" >&2; exit 1; }
fi
PYTHON=$VENV/bin/python
"$PYTHON" - <<'PY'
import re, torch, transformers
blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
mkl = re.search(r"Math Kernel Library Version ([^ ]+)", torch.__config__.show())
print("PyTorch %s, transformers %s, BLAS %s %s, CPU capability %s" % (
    torch.__version__, transformers.__version__, blas.group(1) if blas else "?",
    mkl.group(1) if mkl else "", torch.backends.cpu.get_cpu_capability()))
PY
if [ -x ./train ]; then
    tmp_dis=$(mktemp)
    # gemm.c's vectors are the widest its build allowed (gemm.h): read from the binary's own
    # instructions, not from this CPU, since OPT may have asked for less than -march=native
    objdump -d --no-show-raw-insn ./train >"$tmp_dis" 2>/dev/null
    if grep -q '%zmm' "$tmp_dis"; then width="AVX-512, 14x32 tiles"
    elif grep -q '%ymm' "$tmp_dis"; then width="AVX2, 6x16 tiles"
    else width="SSE, 6x8 tiles, or unknown: objdump found no AVX registers"; fi
    rm -f "$tmp_dis"
    echo "./train: products backend/cpu/gemm.c ($width, as built)," \
         "threads: ours (backend/cpu/matmul.c)"
fi
have_c=1
if [ ! -x ./train ] || [ ! -x ./create_config ]; then
    echo "./train or ./create_config is missing (run make): PyTorch side only"
    have_c=0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# prints ./train's tokens/s for one config and thread count
c_tokens_per_s() {   # name threads args...
    local name=$1 threads=$2
    shift 2
    ./create_config --out_dir "$tmp" --exp_name "$name" --model_name picotron-tiny \
        --grad_acc_steps 1 --total_train_steps $((WARMUP + STEPS)) --use_cpu --overwrite "$@" \
        >"$tmp/create.log" 2>&1 || { cat "$tmp/create.log" >&2; return 1; }
    # train takes its thread count from the config (omp_set_num_threads)
    python3 - "$tmp/$name/config.json" "$threads" <<'PY'
import json, sys
path, threads = sys.argv[1], int(sys.argv[2])
cfg = json.load(open(path))
cfg.setdefault("environment", {})["OMP_NUM_THREADS"] = threads
json.dump(cfg, open(path, "w"), indent=4)
PY
    # PICOTRON_KERNEL_TIME: the end of the log says where the step's time went (kernel_time.c)
    PICOTRON_KERNEL_TIME=1 OMP_NUM_THREADS=$threads ./train --config "$tmp/$name/config.json" \
        >"$tmp/train.log" 2>&1 || { tail -n 5 "$tmp/train.log" >&2; return 1; }
    cp "$tmp/train.log" "$tmp/$name-$threads.log"
    python3 - "$tmp/train.log" "$WARMUP" <<'PY'
import re, sys
scale = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}
log = open(sys.argv[1]).read()
rates = [float(m.group(1)) * scale[m.group(2)]
         for m in re.finditer(r"Tokens/s:\s*([0-9.]+)([KMBT]?)\s", log)][int(sys.argv[2]):]
mfus = [float(m) for m in re.findall(r"MFU:\s*([0-9.]+)%", log)][int(sys.argv[2]):]
if not rates:
    sys.exit("no Tokens/s lines after the warm-up in ./train's log")
print("%.1f %.1f%%" % (len(rates) / sum(1 / r for r in rates), sum(mfus) / len(mfus)))
PY
}

run_case() {   # name, then the flags shared by create_config and pytorch_step.py
    local name=$1
    shift
    echo "== $name: $*"
    printf "%-8s %14s %8s %14s %10s\n" threads "C tokens/s" "C MFU" "torch tokens/s" "C/torch"
    for n in $THREADS; do
        local pt c=n/a mfu=n/a ratio=n/a
        pt=$("$PYTHON" bench/pytorch_step.py --threads "$n" --warmup $WARMUP --steps $STEPS "$@" |
             awk '/^pytorch tokens\/s:/ {print $3}')
        if [ $have_c = 1 ]; then
            read -r c mfu < <(c_tokens_per_s "$name" "$n" "$@") || c=failed
        fi
        if [[ $c =~ ^[0-9.]+$ && $pt =~ ^[0-9.]+$ ]]; then
            ratio=$(python3 -c "print('%.2f' % ($c / $pt))")
        fi
        printf "%-8s %14s %8s %14s %10s\n" "$n" "${c:-failed}" "${mfu:-n/a}" "${pt:-failed}" "$ratio"
    done
    for n in $THREADS; do
        [ -f "$tmp/$name-$n.log" ] || continue
        echo "C, $n thread(s): $(sed -n '/^where rank 0.s step goes/,/the rest/p' "$tmp/$name-$n.log" |
                                   head -n 1)"
        sed -n '/^where rank 0.s step goes/,/the rest/p' "$tmp/$name-$n.log" | tail -n +2
    done
}

ARCH_TINY="--hidden_size 128 --intermediate_size 384 --num_hidden_layers 4 --num_attention_heads 4
           --num_key_value_heads 2 --vocab_size 256 --seq_len 128 --mbs 4"
ARCH_LARGE="--hidden_size 512 --intermediate_size 1536 --num_hidden_layers 8
            --num_attention_heads 8 --num_key_value_heads 4 --vocab_size 256 --seq_len 256 --mbs 8"
# shellcheck disable=SC2086
{
    [ "$which" != large ] && run_case bench-tiny $ARCH_TINY
    [ "$which" != tiny ] && run_case bench-large $ARCH_LARGE
}
exit 0
