#!/usr/bin/env bash
# A Mamba checkpoint is transformers' MambaForCausalLM, both ways:
#  1. transformers' own folder (tests/fixtures/hf_mamba_tiny, made by
#     tests/reference/make_mamba_hf_fixture.py: 2 layers, tied, save_pretrained's names), loaded by
#     checkpoint.init_from under 1 rank, dp2 and pp2: the first loss equals transformers' loss on
#     the same batch (expected_loss.json, its slow path) within TOL relative;
#  2. what dp2 and pp2 saved after one step at learning rate 1e-30 (too small to move an fp32
#     weight), read by tests/reference/safetensors_read.py: every checksum agrees with state.json,
#     and the weights equal transformers' file bit for bit (conv1d.weight saved (I, 1, W));
#  3. a run from the fixture saved under dp2, resumed under pp2 (checkpoints hold full tensors),
#     continues with the loss of the run that never stopped;
#  4. with PyTorch (TORCH_PYTHON, default python3): transformers loads step 1's folder with no
#     missing or unexpected keys (hf_loss.py refuses any), its loss on step 2's batch equals
#     the C run's, and its greedy decoding (MambaForCausalLM.generate) equals ./generate's, which
#     keeps each layer's recurrent state (and gives the ids of the whole window per token);
#  5. a fresh Mamba's A_log, D, dt_proj and conv bias start as transformers' _init_weights has them;
#  6. what a Mamba does not run yet is refused in one line naming the key.
cd "$(dirname "$0")/.." || exit 1
TOL=1e-6
fixture=tests/fixtures/hf_mamba_tiny
dir=$(mktemp -d /tmp/picotron-mamba-interop.XXXXXX)
trap 'rm -rf "$dir"' EXIT
reader=tests/reference/safetensors_read.py
. tests/check_lib.sh
# configure NAME pp dp grad_acc steps learning_rate FLAGS...: ./create_config writes
# $dir/NAME/config.json (checkpoints in $dir/NAME/<step>), micro-batches of 2 sequences of 32
configure() {
    ./create_config --out_dir "$dir" --exp_name "$1" --pp "$2" --dp "$3" --grad_acc_steps "$4" \
        --total_train_steps "$5" --learning_rate "$6" --mbs 2 --seq_len 32 \
        --dataset data/pride_and_prejudice.txt --save_frequency 1 --metrics_file "$dir/$1.jsonl" \
        --use_cpu "${@:7}" >"$dir/$1.create.log" 2>&1 || cat "$dir/$1.create.log"
}
train() { timeout 120 mpirun -np "$1" ./train --config "$dir/$2/config.json" >"$dir/$2.log" 2>&1; }
loss_at() { loss_in "$dir/$1.jsonl" "$2"; } # rel and close: tests/check_lib.sh

# 1. transformers' Mamba in three layouts
want=$(sed -n 's/.*"loss": \([-0-9.e+]*\).*/\1/p' $fixture/expected_loss.json)
for layout in "one_rank 1 1 1 4" "dp2 2 1 2 2" "pp2 2 2 1 4"; do
    set -- $layout
    configure "$1" "$3" "$4" "$5" 1 1e-30 --init_from $fixture
    train "$2" "$1"
    got=$(loss_at "$1" 1)
    check "$1: first loss $got, transformers $want (rel diff $(rel "$got" "$want"))" \
        close "$got" "$want"
done
check "create_config --init_from the fixture: $(grep '^note: model_type' "$dir/one_rank.create.log")" \
    grep -q 'model_type "mamba": picotron.c builds a Mamba, 2 layers of 128 channels, 8 states each' \
    "$dir/one_rank.create.log"

# 2. what the dp and pp runs saved, read by the independent reader
for run in dp2 pp2; do
    saved=$dir/$run/1
    check "$run checksums: $(python3 $reader verify "$saved" 2>&1 | tail -n 1)" python3 $reader verify "$saved"
    check "$run weights equal transformers' file: $(python3 $reader compare $fixture/model.safetensors "$saved/model.safetensors" 0 2>&1 | tail -n 1)" \
        python3 $reader compare $fixture/model.safetensors "$saved/model.safetensors" 0
done
check "config.json says MambaForCausalLM, model_type mamba" python3 -c "
import json, sys; c = json.load(open('$dir/dp2/1/config.json'))
sys.exit(not (c['architectures'] == ['MambaForCausalLM'] and c['model_type'] == 'mamba'))"

# 3. saved under dp2, resumed under pp2
configure trained 1 2 2 2 1e-2 --init_from $fixture
train 2 trained
configure resumed 2 1 4 2 1e-2 --model_config "$dir/trained/1" --load_path "$dir/trained/1"
train 2 resumed
got=$(loss_at resumed 2) want2=$(loss_at trained 2)
check "resumed under pp2 from dp2's step 1: step 2 loss $got, the run that never stopped $want2 (rel diff $(rel "$got" "$want2"))" \
    close "$got" "$want2"

# ./generate's recurrent state (each layer's conv window and scan state, stepped a token at a time)
# gives the ids of the training forward over the whole window
prompt="It is a truth universally"
gen() { timeout 60 ./generate --checkpoint "$dir/trained/1" --prompt "$prompt" --max_new_tokens 16 \
    --print_ids "$@" 2>/dev/null | grep -E '^[0-9 ]+$'; }
state_ids=$(gen) window_ids=$(gen --no_kv_cache)
check "./generate with the recurrent state: '$state_ids', the whole window per token: '$window_ids'" \
    test -n "$state_ids" -a "$state_ids" = "$window_ids"

# 4. transformers opens step 1's folder
python=${TORCH_PYTHON:-python3}
if $python -c "import torch, transformers" 2>/dev/null; then
    out=$($python tests/reference/hf_loss.py "$dir/trained/1" --dataset data/pride_and_prejudice.txt \
        --seq_length 32 --micro_batch_size 2 --gradient_accumulation_steps 2 --dp_size 2 --step 2 2>&1)
    hf=$(echo "$out" | sed -n 's/^loss //p')
    [ -n "$hf" ] || echo "$out" | tail -n 3
    got=$(loss_at trained 2)
    check "transformers loads step 1's folder (no missing or unexpected keys): its loss on step 2's batch $hf, the C run's $got (rel diff $(rel "$got" "$hf"))" \
        close "$got" "$hf"
    # greedy decoding of the same folder: MambaForCausalLM.generate and ./generate (bytes)
    hf_ids=$($python -c "
import sys, torch, transformers
transformers.utils.logging.set_verbosity_error()
m = transformers.AutoModelForCausalLM.from_pretrained('$dir/trained/1', dtype=torch.float32).eval()
ids = torch.tensor([list(b'$prompt')])
out = m.generate(ids, do_sample=False, max_new_tokens=16, pad_token_id=0)
print(' '.join(str(t) for t in out[0, ids.shape[1]:].tolist()))" 2>/dev/null | tail -n 1)
    check "greedy decoding of step 1's folder: transformers' 16 ids '$hf_ids', ./generate's '$state_ids'" \
        test -n "$hf_ids" -a "$hf_ids" = "$state_ids"
else
    echo "skip transformers loading a checkpoint written here: no PyTorch in $python (set TORCH_PYTHON)"
fi

# 5. a fresh Mamba starts as transformers' _init_weights has it: A_log = log(1..S) in every
# channel, D = 1, softplus(dt_proj.bias) in [time_step_min, time_step_max], the conv's bias 0,
# dt_proj.weight within +-time_step_rank^-0.5 (the step at lr 1e-30 moves each by ~1e-30 at most)
configure fresh 1 1 1 1 1e-30 --model_type mamba --hidden_size 64 --num_hidden_layers 1 \
    --state_size 8 --time_step_rank 8 --time_step_min 0.002 --time_step_max 0.05
train 1 fresh
init=$(python3 -c "
import math, sys
sys.path.insert(0, 'tests/reference')
import safetensors_read as r
t = r.open_checkpoint('$dir/fresh/1/model.safetensors')
v = lambda n: list(t['backbone.layers.0.mixer.' + n].values())
A, D, b, w, c = v('A_log'), v('D'), v('dt_proj.bias'), v('dt_proj.weight'), v('conv1d.bias')
dt = [math.log1p(math.exp(x)) for x in b]
ok = max(abs(a - math.log(1 + i % 8)) for i, a in enumerate(A)) < 1e-6 and set(D) == {1.0}
ok = ok and 0.002 * (1 - 1e-5) <= min(dt) and max(dt) <= 0.05 * (1 + 1e-5)
ok = ok and max(abs(x) for x in c) < 1e-20 and max(abs(x) for x in w) <= 8 ** -0.5
print('softplus(dt_proj.bias) in [%.4g, %.4g], |dt_proj.weight| <= %.4f'
      % (min(dt), max(dt), max(abs(x) for x in w)))
sys.exit(not ok)" 2>&1)
rc=$?
check "a fresh Mamba's A_log, D, dt_proj and conv1d.bias are transformers' init: $(echo "$init" | tail -n 1)" \
    test $rc -eq 0

# 6. refusals, one line each
for bad in "--use_bias 1:model.use_bias" "--cp 2 --cp_zigzag:distributed.cp_zigzag" \
    "--num_experts 4:model.num_experts" \
    "--time_step_init_scheme x:model.time_step_init_scheme"; do
    ./create_config --out_dir "$dir" --exp_name bad --overwrite --model_type mamba ${bad%%:*} \
        >"$dir/bad.log" 2>&1
    rc=$?
    check "--model_type mamba ${bad%%:*} refused (exit $rc): $(head -n 1 "$dir/bad.log")" \
        test $rc -ne 0 -a "$(wc -l <"$dir/bad.log")" = 1 -a "$(grep -c "${bad#*:}" "$dir/bad.log")" = 1
done
exit $((failures > 0))
