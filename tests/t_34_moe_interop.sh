#!/usr/bin/env bash
# A mixture-of-experts checkpoint is a Mixtral, both ways:
#  1. transformers' own MixtralForCausalLM folder (tests/fixtures/hf_mixtral_tiny, made by
#     tests/reference/make_mixtral_fixture.py: 4 experts, top-2, save_pretrained's names), loaded by
#     checkpoint.init_from under 1 rank, tp2 x dp2 x ep2 and pp2: the first loss equals
#     transformers' loss on the same batch (expected_loss.json) within TOL relative, and so does
#     the first aux_loss (the mean over layers of each layer's load-balancing loss);
#  2. what tp2 x dp2 x ep2 and pp2 saved after one step at learning rate 1e-30 (too small to move
#     an fp32 weight), read by tests/reference/safetensors_read.py: exactly the tensors of a
#     Mixtral of its config.json, a config.json that is a Mixtral's and the fixture's model, every
#     checksum agrees with state.json, and the weights equal transformers' file bit for bit;
#  3. a run from the fixture saved under tp2 x dp2 x ep2, resumed under pp2 (every expert on one
#     rank), continues with the loss of the run that never stopped;
#  4. with PyTorch (TORCH_PYTHON, default python3): transformers loads step 1's folder with no
#     missing or unexpected keys (hf_loss.py refuses any), and its loss and aux_loss on step 2's
#     batch equal the C run's;
#  5. ./create_config (which writes every config here) says it builds a mixture of experts from
#     the fixture and writes its sizes; another model_type gets one line saying what is built, and
#     a sliding window is refused.
# One sequence per micro-batch (dp x grad_acc = 8): the aux is a function of each micro-batch's
# tokens, so only then is it the same in every layout (the cross-entropy is for any grouping).
# TOL is t_32's: the experts' routing stays clear of ties in the fixture (its MIN_GAP).
cd "$(dirname "$0")/.." || exit 1
TOL=1e-6
fixture=tests/fixtures/hf_mixtral_tiny
dir=$(mktemp -d /tmp/picotron-moe-interop.XXXXXX)
trap 'rm -rf "$dir"' EXIT
reader=tests/reference/safetensors_read.py
. tests/check_lib.sh
# configure NAME tp pp dp ep grad_acc steps learning_rate FLAGS...: ./create_config writes
# $dir/NAME/config.json (its checkpoints in $dir/NAME/<step>), the model from FLAGS' --init_from
# or --model_config folder: one sequence per micro-batch, step by step saves, a metrics file
configure() {
    ./create_config --out_dir "$dir" --exp_name "$1" --tp "$2" --pp "$3" --dp "$4" --ep "$5" \
        --grad_acc_steps "$6" --total_train_steps "$7" --learning_rate "$8" --mbs 1 --seq_len 32 \
        --dataset data/pride_and_prejudice.txt --save_frequency 1 --metrics_file "$dir/$1.jsonl" \
        --use_cpu "${@:9}" >"$dir/$1.create.log" 2>&1 || cat "$dir/$1.create.log"
}
train() { timeout 120 mpirun -np "$1" ./train --config "$dir/$2/config.json" >"$dir/$2.log" 2>&1; }
field_at() { sed -n "s/.*\"step\": $2, .*\"$3\": \([-0-9.e+]*\).*/\1/p" "$dir/$1.jsonl"; }
# relative difference of $1 from $2; `close` is its test against TOL
rel() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; printf "%.2e", (d < 0 ? -d : d) / b }'; }
close() { [ -n "$1" ] && [ -n "$2" ] && awk -v r="$(rel "$1" "$2")" -v tol="$TOL" 'BEGIN { exit !(r <= tol) }'; }
expected() { sed -n "s/.*\"$1\": \([-0-9.e+]*\).*/\1/p" $fixture/expected_loss.json; }

# 1. transformers' Mixtral in three layouts
want=$(expected loss) want_aux=$(expected aux_loss)
for layout in "one_rank 1 1 1 1 1 8" "tp2_dp2_ep2 4 2 1 2 2 4" "pp2 2 1 2 1 1 8"; do
    set -- $layout
    configure "$1" "$3" "$4" "$5" "$6" "$7" 1 1e-30 --init_from $fixture
    train "$2" "$1"
    got=$(field_at "$1" 1 loss) aux=$(field_at "$1" 1 aux_loss)
    check "$1: first loss $got, transformers $want (rel diff $(rel "$got" "$want"))" \
        close "$got" "$want"
    check "$1: first aux_loss $aux, transformers' layers $want_aux (rel diff $(rel "$aux" "$want_aux"))" \
        close "$aux" "$want_aux"
done
note=$(grep '^note: model_type' "$dir/one_rank.create.log")
check "create_config --init_from the fixture: $note" \
    grep -q 'model_type "mixtral": picotron.c builds a mixture of experts, 4 experts of 32 features in each layer, top-2' "$dir/one_rank.create.log"
check "and writes num_experts 4, moe_intermediate_size 32, router_aux_loss_coef 0.02" python3 -c "
import json, sys; m = json.load(open('$dir/one_rank/config.json'))['model']
sys.exit(not (m['num_experts'], m['moe_intermediate_size'], m['router_aux_loss_coef']) == (4, 32, 0.02))"

# 2. what the ep and pp runs saved, read by the independent reader
for run in tp2_dp2_ep2 pp2; do
    saved=$dir/$run/1
    check "$run saved a Mixtral: $(python3 $reader expect-mixtral "$saved/model.safetensors" "$saved/config.json" $fixture/config.json 2>&1 | tail -n 1)" \
        python3 $reader expect-mixtral "$saved/model.safetensors" "$saved/config.json" $fixture/config.json
    check "$run checksums: $(python3 $reader verify "$saved" 2>&1 | tail -n 1)" python3 $reader verify "$saved"
    check "$run weights equal transformers' file: $(python3 $reader compare $fixture/model.safetensors "$saved/model.safetensors" 0 2>&1 | tail -n 1)" \
        python3 $reader compare $fixture/model.safetensors "$saved/model.safetensors" 0
done
python3 $reader expect-mixtral "$dir/pp2/1/model.safetensors" "$dir/pp2/1/config.json" \
    $fixture/config.json 2>&1 | head -n 1 | sed 's/^/     /'
optimizer=$(python3 $reader list "$dir/pp2/1/optimizer.safetensors" | grep -c 'block_sparse_moe.*exp_avg')
check "optimizer.safetensors holds both moments of the 26 expert and router tensors under their Mixtral names ($optimizer)" \
    test "$optimizer" = 52

# 3. saved under tp2 x dp2 x ep2, resumed under pp2
# (the resumed config takes the architecture from the saved config.json, with a dense MLP size
# of 128 that a mixture of experts does not build: only the experts' 32 must match)
configure trained 2 1 2 2 4 2 1e-2 --init_from $fixture
train 4 trained
configure resumed 1 2 1 1 8 2 1e-2 --model_config "$dir/trained/1" --intermediate_size 128 \
    --moe_intermediate_size 32 --load_path "$dir/trained/1"
train 2 resumed
got=$(field_at resumed 2 loss) want2=$(field_at trained 2 loss)
check "resumed under pp2 from tp2 x dp2 x ep2's step 1: step 2 loss $got, the run that never stopped $want2 (rel diff $(rel "$got" "$want2"))" \
    close "$got" "$want2"

# 4. transformers opens step 1's folder
python=${TORCH_PYTHON:-python3}
if $python -c "import torch, transformers" 2>/dev/null; then
    out=$($python tests/reference/hf_loss.py "$dir/trained/1" --dataset data/pride_and_prejudice.txt \
        --seq_length 32 --micro_batch_size 1 --gradient_accumulation_steps 4 --dp_size 2 --step 2 2>&1)
    hf=$(echo "$out" | sed -n 's/^loss //p') hf_aux=$(echo "$out" | sed -n 's/^aux_loss //p')
    [ -n "$hf" ] || echo "$out" | tail -n 3
    got=$(field_at trained 2 loss) aux=$(field_at trained 2 aux_loss)
    check "transformers loads step 1's folder (no missing or unexpected keys): its loss on step 2's batch $hf, the C run's $got (rel diff $(rel "$got" "$hf"))" \
        close "$got" "$hf"
    check "and its aux_loss $hf_aux, the C run's $aux (rel diff $(rel "$aux" "$hf_aux"))" \
        close "$aux" "$hf_aux"
else
    echo "skip transformers loading a checkpoint written here: no PyTorch in $python (set TORCH_PYTHON)"
fi

# 5. other model types
mkdir -p "$dir/qwen2" "$dir/window"
sed 's/"mixtral"/"qwen2"/' $fixture/config.json >"$dir/qwen2/config.json"
./create_config --out_dir "$dir" --exp_name from_qwen2 --model_config "$dir/qwen2" >"$dir/qwen2.log" 2>&1
check "model_type qwen2: $(grep '^note' "$dir/qwen2.log")" \
    grep -q 'model_type "qwen2" is neither llama nor mixtral' "$dir/qwen2.log"
sed 's/"sliding_window": null/"sliding_window": 16/' $fixture/config.json >"$dir/window/config.json"
./create_config --out_dir "$dir" --exp_name from_window --model_config "$dir/window" >"$dir/window.log" 2>&1
rc=$?
check "sliding_window 16 refused (exit $rc): $(head -n 1 "$dir/window.log")" \
    test $rc -ne 0 -a "$(grep -c 'sliding_window = 16 is not supported' "$dir/window.log")" = 1
exit $((failures > 0))
