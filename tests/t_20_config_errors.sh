#!/usr/bin/env bash
# Claim: every bad config (unknown key or section, wrong type, missing section, invalid JSON,
# impossible sizes, vocabulary padding and mixture-of-experts settings, the wrong build, the wrong
# number of ranks, a missing file) and every bad ./train command line ends the job within
# MAX_SECONDS with a non-zero exit status and exactly one line on stderr that names the offending
# key, after MPICH's own abort lines are removed.
cd "$(dirname "$0")/.." || exit 1
MAX_SECONDS=10
[ -x ./train ] || { echo "./train not built"; exit 77; }
command -v python3 >/dev/null || { echo "python3 is needed to write the test configs"; exit 77; }
command -v mpirun >/dev/null || { echo "mpirun not found"; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A valid config for one rank on the CPU build; each variant breaks one thing in it.
# One python3 run writes them all (python3 starts slowly on a busy machine).
python3 - "$tmp" <<'PY'
import copy, json, os, sys
base = {
    "distributed": {"tp_size": 1, "cp_size": 1, "pp_size": 1, "dp_size": 1,
                    "pp_engine": "1f1b", "backend": "mpi", "use_cpu": True},
    "model": {"name": "picotron-tiny", "num_hidden_layers": None, "num_attention_heads": None,
              "num_key_value_heads": None, "dtype": "float32", "use_flash_attention": False,
              "use_fused_adam": False},
    "training": {"seed": 42, "learning_rate": 3e-4, "total_train_steps": 2, "seq_length": 128,
                 "micro_batch_size": 4, "gradient_accumulation_steps": 1, "num_samples": None,
                 "max_tokens": None},
    "dataset": {"name": "data/austen.txt", "subset_name": None, "num_workers": 0, "num_proc": 1},
    "checkpoint": {"save_dir": "ckpt", "save_frequency": 0, "load_path": ""},
    "logging": {"use_wandb": False, "project_name": "picotron", "run_name": None},
    "environment": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                    "FLASH_ATTEN": "1", "HF_TOKEN": None},
}
variants = {   # name: a statement that edits `cfg`
    "valid": 'pass',
    "unknown_key": 'cfg["model"]["hidden_sise"] = 128',
    "unknown_section": 'cfg["optimizer"] = {"lr": 1}',
    "wrong_type": 'cfg["training"]["seq_length"] = "abc"',
    "wrong_env_type": 'cfg["environment"]["OMP_NUM_THREADS"] = "two"',
    "no_model": 'del cfg["model"]',
    "no_name": 'del cfg["model"]["name"]',
    "unknown_model": 'cfg["model"]["name"] = "my-org/my-model"',
    "hidden_heads": 'cfg["model"].update(hidden_size=100, num_attention_heads=3, '
                    'num_key_value_heads=1)',
    "heads_kv": 'cfg["model"].update(num_attention_heads=4, num_key_value_heads=3)',
    "seq_cp": 'cfg["distributed"]["cp_size"] = 3',
    "layers_pp": 'cfg["model"]["num_hidden_layers"] = 2; cfg["distributed"]["pp_size"] = 4',
    "tp_heads": 'cfg["distributed"]["tp_size"] = 3',
    "vocab_tp": 'cfg["model"]["vocab_size"] = 255; cfg["distributed"]["tp_size"] = 2',
    "pad_zero": 'cfg["model"]["make_vocab_size_divisible_by"] = 0',
    "pad_huge": 'cfg["model"]["make_vocab_size_divisible_by"] = 1 << 20',
    "pad_tp": 'cfg["model"].update(vocab_size=50257, make_vocab_size_divisible_by=3); '
              'cfg["distributed"]["tp_size"] = 2',
    "bad_engine": 'cfg["distributed"]["pp_engine"] = "gpipe"',
    "sp_tokens": 'cfg["distributed"].update(tp_size=2, cp_size=2, sequence_parallel=True); '
                 'cfg["training"].update(micro_batch_size=1, seq_length=34)',
    "gpu_config": 'cfg["distributed"]["use_cpu"] = False',
    "bf16": 'cfg["model"]["dtype"] = "bfloat16"',
    "moe_topk": 'cfg["model"].update(num_experts=4, num_experts_per_tok=5, '
                'moe_intermediate_size=128)',
    "moe_size": 'cfg["model"].update(num_experts=4, num_experts_per_tok=2)',
    "moe_tp": 'cfg["model"].update(num_experts=4, moe_intermediate_size=129); '
              'cfg["distributed"]["tp_size"] = 2',
    "moe_coef": 'cfg["model"].update(num_experts=4, moe_intermediate_size=128, '
                'router_aux_loss_coef=-1)',
    "moe_capacity": 'cfg["model"].update(num_experts=4, moe_intermediate_size=128, '
                    'moe_capacity_factor=-0.5)',
    "moe_capacity_cp": 'cfg["model"].update(num_experts=4, moe_intermediate_size=128, '
                       'moe_capacity_factor=1.25); cfg["distributed"]["cp_size"] = 2',
    "moe_negative": 'cfg["model"]["num_experts"] = -2',
    "ep_dense": 'cfg["distributed"].update(dp_size=2, ep_size=2)',
    "ep_dp": 'cfg["model"].update(num_experts=4, moe_intermediate_size=128); '
             'cfg["distributed"].update(dp_size=3, ep_size=2)',
    "ep_experts": 'cfg["model"].update(num_experts=6, moe_intermediate_size=128); '
                  'cfg["distributed"].update(dp_size=4, ep_size=4)',
    "ep_zero1": 'cfg["model"].update(num_experts=4, moe_intermediate_size=128); '
                'cfg["distributed"].update(dp_size=2, ep_size=2, zero1=True)',
    "zero_stage_4": 'cfg["distributed"]["zero_stage"] = 4',
    "zero3_naive": 'cfg["distributed"].update(dp_size=2, zero_stage=3, dp_naive=True)',
    "ep_naive": 'cfg["model"].update(num_experts=4, moe_intermediate_size=128); '
                'cfg["distributed"].update(dp_size=2, ep_size=2, dp_naive=True)',
    "ep_zero": 'cfg["distributed"]["ep_size"] = 0',
}
for name, edit in variants.items():
    cfg = copy.deepcopy(base)
    exec(edit)
    with open(os.path.join(sys.argv[1], name + ".json"), "w") as f:
        json.dump(cfg, f, indent=4)
PY
[ -f "$tmp/valid.json" ] || { echo "could not write the test configs"; exit 1; }
printf '{\n  "distributed": {"tp_size": 1,,}\n}\n' >"$tmp/invalid.json"
sed 's/"seed": 42,/"seed": 42, "seed": 43,/' "$tmp/valid.json" >"$tmp/duplicate.json"

# lines MPICH prints itself when a rank calls MPI_Abort or a process dies
MPICH_LINES='^Abort\([0-9]+\) on node [0-9]+ \(rank [0-9]+ in comm [0-9]+\): application called MPI_Abort|^=+$|^=   |^\[unset\]: |^YOU CAN IGNORE'

failures=0 cases=0
expect_error() {   # expect_error NAME REGEX_THE_LINE_MUST_MATCH NP ARGS...
    local name=$1 want=$2 np=$3
    shift 3
    local start rc lines ms problem=""
    cases=$((cases + 1))
    start=$(date +%s%N)
    if [ "$np" = 1 ]; then
        timeout 20 ./train "$@" >"$tmp/out" 2>"$tmp/err"
    else
        timeout 20 mpirun -np "$np" ./train "$@" >"$tmp/out" 2>"$tmp/err"
    fi
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    grep -v -E "$MPICH_LINES" "$tmp/err" | grep -v '^[[:space:]]*$' >"$tmp/lines"
    lines=$(wc -l <"$tmp/lines")
    if [ "$rc" -eq 0 ]; then problem="exit status 0"
    elif [ "$rc" -eq 124 ]; then problem="did not end within 20 s"
    elif [ "$ms" -gt $((MAX_SECONDS * 1000)) ]; then problem="took $ms ms > $MAX_SECONDS s"
    elif [ "$lines" -ne 1 ]; then problem="$lines stderr lines instead of 1"
    elif ! grep -q -E -- "$want" "$tmp/lines"; then problem="the line does not match /$want/"
    fi
    if [ -n "$problem" ]; then
        failures=$((failures + 1))
        echo "FAIL $name: $problem (exit $rc); stderr was:"
        sed 's/^/    | /' "$tmp/err"
    else
        echo "ok   $name: exit $rc, $ms ms: $(cat "$tmp/lines")"
    fi
}

c() { echo "--config=$tmp/$1.json"; }
expect_error "unknown key" 'model\.hidden_sise.*model\.hidden_size' 1 "$(c unknown_key)"
expect_error "unknown section" '"optimizer"' 1 "$(c unknown_section)"
expect_error "wrong type" 'training\.seq_length must be an integer, got "abc"' 1 "$(c wrong_type)"
expect_error "environment value" 'environment\.OMP_NUM_THREADS' 1 "$(c wrong_env_type)"
expect_error "missing model section" '"model"' 1 "$(c no_model)"
expect_error "missing model.name" 'model\.name' 1 "$(c no_name)"
expect_error "architecture of a non-preset model" 'model\.hidden_size is missing' 1 \
    "$(c unknown_model)"
expect_error "invalid JSON" 'invalid\.json.*line 2' 1 "$(c invalid)"
expect_error "duplicate key" 'training\.seed' 1 "$(c duplicate)"
expect_error "hidden % heads" 'model\.hidden_size = 100.*model\.num_attention_heads = 3' 1 \
    "$(c hidden_heads)"
expect_error "heads % kv heads" 'model\.num_attention_heads = 4.*model\.num_key_value_heads = 3' \
    1 "$(c heads_kv)"
expect_error "seq_length % cp" 'training\.seq_length = 128.*distributed\.cp_size = 3' 1 \
    "$(c seq_cp)"
expect_error "layers < pp" 'model\.num_hidden_layers = 2.*distributed\.pp_size = 4' 1 \
    "$(c layers_pp)"
expect_error "tp does not divide heads" 'distributed\.tp_size = 3.*model\.num_attention_heads' \
    1 "$(c tp_heads)"
expect_error "vocab % tp" \
    'model\.vocab_size = 255.*distributed\.tp_size = 2.*model\.make_vocab_size_divisible_by' 1 \
    "$(c vocab_tp)"
expect_error "vocabulary padding 0" 'model\.make_vocab_size_divisible_by = 0 must be at least 1' \
    1 "$(c pad_zero)"
expect_error "vocabulary padding too large" \
    'model\.make_vocab_size_divisible_by = 1048576 must be at most 65536' 1 "$(c pad_huge)"
expect_error "padded vocab % tp" \
    'vocab_size = 50257, padded to 50259 rows \(model\.make_vocab_size_divisible_by = 3\).*tp_size = 2' \
    1 "$(c pad_tp)"
expect_error "unknown pp_engine" 'distributed\.pp_engine' 1 "$(c bad_engine)"
expect_error "sequence parallel tokens % tp" \
    'distributed\.sequence_parallel.*17 tokens.*distributed\.tp_size = 2' 1 "$(c sp_tokens)"
expect_error "use_cpu false on the CPU build" 'distributed\.use_cpu.*make GPU=1' 1 \
    "$(c gpu_config)"
expect_error "bfloat16 on the CPU build" 'model\.dtype' 1 "$(c bf16)"
expect_error "num_experts_per_tok > num_experts" \
    'model\.num_experts_per_tok = 5 must be 1\.\.model\.num_experts = 4' 1 "$(c moe_topk)"
expect_error "no expert size" 'model\.moe_intermediate_size = 0' 1 "$(c moe_size)"
expect_error "tp does not divide the expert size" \
    'distributed\.tp_size = 2 does not divide model\.moe_intermediate_size = 129' 1 "$(c moe_tp)"
expect_error "negative aux coefficient" 'model\.router_aux_loss_coef = -1' 1 "$(c moe_coef)"
expect_error "negative capacity factor" 'model\.moe_capacity_factor = -0\.5' 1 \
    "$(c moe_capacity)"
expect_error "capacity with cp" \
    'model\.moe_capacity_factor = 1\.25 needs distributed\.cp_size = 1' 1 "$(c moe_capacity_cp)"
expect_error "negative num_experts" 'model\.num_experts = -2 must be at least 0' 1 \
    "$(c moe_negative)"
expect_error "ep without experts" 'distributed\.ep_size = 2 needs a mixture of experts' 2 \
    "$(c ep_dense)"
expect_error "ep not dividing dp" 'distributed\.ep_size = 2 must divide distributed\.dp_size = 3' \
    3 "$(c ep_dp)"
expect_error "ep not dividing the experts" \
    'distributed\.ep_size = 4 does not divide model\.num_experts = 6' 4 "$(c ep_experts)"
expect_error "ep with zero1" 'distributed\.zero_stage = 1 \(or zero1\) with distributed\.ep_size = 2' 2 "$(c ep_zero1)"
expect_error "ep with dp_naive" 'distributed\.dp_naive with distributed\.ep_size = 2' 2 \
    "$(c ep_naive)"
expect_error "zero_stage of 4" 'distributed\.zero_stage = 4 must be at most 3' 1 "$(c zero_stage_4)"
expect_error "zero_stage 3 with dp_naive" 'distributed\.zero_stage = 3 \(or zero1\) and distributed\.dp_naive = true' 2 "$(c zero3_naive)"
expect_error "ep of 0" 'distributed\.ep_size = 0 must be at least 1' 1 "$(c ep_zero)"
expect_error "world size != tp*cp*pp*dp" \
    'tp\*cp\*pp\*dp = 1\*1\*1\*1 = 1 but mpirun started 2 ranks' 2 "$(c valid)"
expect_error "nonexistent config" 'does_not_exist\.json' 1 "$(c does_not_exist)"
expect_error "no --config" '--config' 1
expect_error "unknown train flag" '--bogus' 1 --config "$tmp/valid.json" --bogus

echo "$failures of $cases cases failed"
[ "$failures" -eq 0 ]
