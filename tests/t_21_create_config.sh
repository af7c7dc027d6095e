#!/usr/bin/env bash
# Claim: ./create_config writes the config its flags ask for: config_load reads back exactly the
# values given (checked against the flags and against python's own reading of the JSON), presets
# carry the Hugging Face numbers, --model_config takes them from a Hugging Face config.json, the
# printed global batch is mbs*grad_acc*dp sequences of seq_len tokens, the mixture-of-experts
# flags (and a Mixtral config.json) give their keys, and an existing experiment, an unknown flag
# or model, too many experts per token are refused with one line and a non-zero exit.
cd "$(dirname "$0")/.." || exit 1
BUILD=${PICOTRON_BUILD:-build}
[ -x ./create_config ] || { echo "./create_config not built"; exit 77; }
[ -x "$BUILD/tests/test_config" ] || { echo "$BUILD/tests/test_config not built"; exit 77; }
command -v python3 >/dev/null || { echo "python3 is needed to read the JSON"; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { failures=$((failures + 1)); echo "FAIL $*"; }

# check_values FILE "key value" ...: the values config_load read (test_config prints them)
check_values() {
    local file=$1
    shift
    "$BUILD/tests/test_config" "$file" >"$tmp/loaded" 2>"$tmp/loaded_err" ||
        { fail "test_config $file: $(cat "$tmp/loaded_err")"; return; }
    for kv in "$@"; do
        grep -qx -- "$kv" "$tmp/loaded" || fail "$file: config_load gives '$(grep -- "^${kv%% *} " \
            "$tmp/loaded")', want '$kv'"
    done
    echo "ok   $file: ${#@} values as asked; $(tail -n 1 "$tmp/loaded")"
}

# json_equals FILE 'python expression on cfg' ...: python's reading of the file
json_equals() {
    local file=$1
    shift
    python3 - "$file" "$@" <<'PY' || fail "$file: python's reading of the JSON"
import json, sys
cfg = json.load(open(sys.argv[1]))
bad = [e for e in sys.argv[2:] if not eval(e)]
for e in bad:
    print("    not true in the JSON:", e)
print(f"ok   {sys.argv[1]}: {len(sys.argv) - 2 - len(bad)} of {len(sys.argv) - 2} JSON checks hold")
sys.exit(1 if bad else 0)
PY
}

# expect_refusal NAME REGEX ARGS...: exit != 0 and exactly one stderr line matching REGEX
expect_refusal() {
    local name=$1 want=$2
    shift 2
    ./create_config "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$? lines
    lines=$(grep -c -v '^[[:space:]]*$' "$tmp/err")
    if [ $rc -eq 0 ] || [ "$lines" -ne 1 ] || ! grep -q -E -- "$want" "$tmp/err"; then
        fail "$name: exit $rc, $lines stderr lines, want one matching /$want/:"
        sed 's/^/    | /' "$tmp/err"
    else
        echo "ok   $name: exit $rc: $(cat "$tmp/err")"
    fi
}

# 1. a 4D layout with picotron's flag names, both --flag value and --flag=value
dp=2 tp=2 pp=2 mbs=3 acc=5 seq=64
./create_config --out_dir "$tmp/runs" --exp_name=layout --dp $dp --tp=$tp --pp $pp --cp 1 \
    --mbs $mbs --grad_acc_steps $acc --seq_len $seq --pp_engine afab --learning_rate 0.001 \
    --seed 7 --grad_clip 1.5 --metrics_file m.jsonl >"$tmp/out" 2>"$tmp/err" ||
    fail "create_config layout: $(cat "$tmp/err")"
file=$tmp/runs/layout/config.json
grep -q "Configs created successfully! Saved to $file" "$tmp/out" || fail "no success line"
want_seqs=$((mbs * acc * dp)) want_tokens=$((mbs * acc * dp * seq))
got=$(sed -n 's/^Global batch size: \([0-9]*\) sequences .* = \([0-9,]*\) tokens.*/\1 \2/p' \
    "$tmp/out" | tr -d ,)
[ "$got" = "$want_seqs $want_tokens" ] || fail "global batch printed '$got', want '$want_seqs \
$want_tokens' (mbs*grad_acc*dp, times seq_len)"
echo "ok   global batch: printed $got, mbs*grad_acc*dp = $want_seqs, *seq_len = $want_tokens"
check_values "$file" "dp_size $dp" "tp_size $tp" "pp_size $pp" "cp_size 1" "pp_engine afab" \
    "micro_batch_size $mbs" "gradient_accumulation_steps $acc" "seq_length $seq" \
    "learning_rate 0.00100000005" "seed 7" "grad_clip 1.5" "metrics_file m.jsonl" \
    "name picotron-tiny" "hidden_size 128" "vocab_size 256" "use_cpu 1" "backend mpi" \
    "run_name layout" "save_dir $tmp/runs/layout" "make_vocab_size_divisible_by 1"
json_equals "$file" 'cfg["distributed"]["dp_size"] == 2' 'cfg["distributed"]["tp_size"] == 2' \
    'cfg["training"]["learning_rate"] == 0.001' 'cfg["training"]["seq_length"] == 64' \
    'cfg["distributed"]["use_cpu"] is True' 'cfg["training"]["num_samples"] is None' \
    'set(cfg) == {"distributed", "model", "training", "dataset", "checkpoint", "logging", \
"environment"}'

# 2. a preset carries the Hugging Face numbers; -Instruct and picotron's no-op flags accepted
./create_config --out_dir "$tmp/runs" --exp_name smol --model_name \
    HuggingFaceTB/SmolLM-1.7B-Instruct --tp 4 --seq_len 1024 --hf_token hf_x --use_wandb \
    >"$tmp/out" 2>"$tmp/err" || fail "create_config SmolLM-1.7B: $(cat "$tmp/err")"
grep -q "^note: --hf_token" "$tmp/out" || fail "no note for --hf_token"
json_equals "$tmp/runs/smol/config.json" 'cfg["model"]["hidden_size"] == 2048' \
    'cfg["model"]["intermediate_size"] == 8192' 'cfg["model"]["num_hidden_layers"] == 24' \
    'cfg["model"]["num_attention_heads"] == 32' 'cfg["model"]["num_key_value_heads"] == 32' \
    'cfg["model"]["vocab_size"] == 49152' 'cfg["model"]["tie_word_embeddings"] is True' \
    'cfg["model"]["rms_norm_eps"] == 1e-5' 'cfg["model"]["rope_theta"] == 10000' \
    'cfg["model"]["name"] == "HuggingFaceTB/SmolLM-1.7B-Instruct"'
check_values "$tmp/runs/smol/config.json" "hidden_size 2048" "num_hidden_layers 24" "tp_size 4"

# 3. flags override a preset's architecture; the vocabulary padded (vocab_padding.c)
./create_config --out_dir "$tmp/runs" --exp_name llama3 --model_name meta-llama/Meta-Llama-3-8B \
    --num_hidden_layers 2 --num_attention_heads 16 --num_key_value_heads 4 \
    --make_vocab_size_divisible_by 128 \
    >"$tmp/out" 2>"$tmp/err" || fail "create_config Llama-3 override: $(cat "$tmp/err")"
check_values "$tmp/runs/llama3/config.json" "num_hidden_layers 2" "num_attention_heads 16" \
    "num_key_value_heads 4" "hidden_size 4096" "intermediate_size 14336" "vocab_size 128256" \
    "rope_theta 500000" "max_position_embeddings 8192" "tie_word_embeddings 0" \
    "make_vocab_size_divisible_by 128"

# 4. --model_config reads a Hugging Face config.json (num_key_value_heads absent: = heads)
mkdir -p "$tmp/hf"
cat >"$tmp/hf/config.json" <<'JSON'
{"_name_or_path": "someone/llama-mini", "architectures": ["LlamaForCausalLM"],
 "model_type": "llama", "hidden_size": 192, "intermediate_size": 512, "num_hidden_layers": 3,
 "num_attention_heads": 6, "vocab_size": 1000, "rms_norm_eps": 1e-06,
 "rope_theta": 50000.0, "max_position_embeddings": 512, "tie_word_embeddings": false,
 "torch_dtype": "bfloat16", "hidden_act": "silu"}
JSON
./create_config --out_dir "$tmp/runs" --exp_name hf --model_config "$tmp/hf/config.json" \
    --seq_len 256 >"$tmp/out" 2>"$tmp/err" || fail "create_config --model_config: $(cat "$tmp/err")"
check_values "$tmp/runs/hf/config.json" "name someone/llama-mini" "hidden_size 192" \
    "intermediate_size 512" "num_hidden_layers 3" "num_attention_heads 6" \
    "num_key_value_heads 6" "vocab_size 1000" "rms_norm_eps 9.99999997e-07" \
    "rope_theta 50000" "max_position_embeddings 512" "tie_word_embeddings 0" "seq_length 256"

# 4b. a mixture of experts: the flags, each expert's size defaulting to intermediate_size; and
# a Mixtral config.json (num_local_experts, experts as wide as intermediate_size)
./create_config --out_dir "$tmp/runs" --exp_name moe --num_experts 8 --num_experts_per_tok 2 \
    --router_aux_loss_coef 0.01 --moe_capacity_factor 1.25 --dp 4 --ep 2 >"$tmp/out" \
    2>"$tmp/err" || fail "create_config experts: $(cat "$tmp/err")"
check_values "$tmp/runs/moe/config.json" "num_experts 8" "num_experts_per_tok 2" \
    "moe_intermediate_size 384" "router_aux_loss_coef 0.00999999978" "moe_capacity_factor 1.25" \
    "dp_size 4" "ep_size 2"
grep -q "mpirun -np 4 " "$tmp/out" || fail "expert parallelism adds no ranks: want mpirun -np 4"
json_equals "$tmp/runs/moe/config.json" 'cfg["model"]["num_experts"] == 8' \
    'cfg["model"]["moe_intermediate_size"] == 384' 'cfg["model"]["router_aux_loss_coef"] == 0.01'
sed 's/"silu"}/"silu", "num_local_experts": 4, "num_experts_per_tok": 2}/' "$tmp/hf/config.json" \
    >"$tmp/hf/mixtral.json"
./create_config --out_dir "$tmp/runs" --exp_name mixtral --model_config "$tmp/hf/mixtral.json" \
    >"$tmp/out" 2>"$tmp/err" || fail "create_config --model_config Mixtral: $(cat "$tmp/err")"
check_values "$tmp/runs/mixtral/config.json" "num_experts 4" "num_experts_per_tok 2" \
    "moe_intermediate_size 512"
expect_refusal "more experts per token than experts" \
    'num_experts_per_tok = 3 must be 1\.\.model\.num_experts = 2' --num_experts 2 \
    --num_experts_per_tok 3 --out_dir "$tmp/runs" --exp_name never
expect_refusal "ep that does not divide the experts" \
    'distributed\.ep_size = 3 does not divide model\.num_experts = 8' --num_experts 8 --dp 3 \
    --ep 3 --out_dir "$tmp/runs" --exp_name never

# 5. refusals, each one line
before=$(cksum <"$file")
expect_refusal "existing experiment" 'layout.*--overwrite' --out_dir "$tmp/runs" \
    --exp_name layout
[ "$(cksum <"$file")" = "$before" ] || fail "the refused run changed $file"
./create_config --out_dir "$tmp/runs" --exp_name layout --overwrite --mbs 1 >/dev/null 2>&1 &&
    check_values "$file" "micro_batch_size 1" || fail "--overwrite did not rewrite $file"
expect_refusal "unknown flag" '--bogus_flag' --bogus_flag 3
expect_refusal "misspelt flag" '--grad_acc_step.*--grad_acc_steps' --grad_acc_step 2
expect_refusal "unknown model" 'no-such-model.*SmolLM-135M' --model_name no-such-model
expect_refusal "impossible layout" 'tp_size = 3.*num_attention_heads' --tp 3 \
    --out_dir "$tmp/runs" --exp_name never
[ ! -e "$tmp/runs/never" ] || fail "an invalid config was written"
expect_refusal "flag without value" '--dp' --dp
# tp across nodes: one warning line, from --ranks_per_node or Slurm's tasks per node; none inside
tp_warning() { ./create_config --out_dir "$tmp/runs" --exp_name nodes --overwrite --tp 2 --dp 2 \
    --num_key_value_heads 2 "$@" 2>&1 >/dev/null | grep -c '^warning: tp = 2 spans nodes of 1 ranks'; }
[ "$(tp_warning --ranks_per_node 1)" = 1 ] || fail "no warning for tp 2 on nodes of 1 rank"
[ "$(SLURM_NTASKS_PER_NODE=1 tp_warning)" = 1 ] || fail "no warning from SLURM_NTASKS_PER_NODE=1"
[ "$(tp_warning --ranks_per_node 4)" = 0 ] || fail "a warning for tp 2 on nodes of 4 ranks"
echo "tp across nodes: $(./create_config --out_dir "$tmp/runs" --exp_name nodes --overwrite --tp 2 \
    --num_key_value_heads 2 --ranks_per_node 1 2>&1 >/dev/null)"

echo "$failures failed"
[ "$failures" -eq 0 ]
