#!/usr/bin/env bash
# How fast a checkpoint is written, against the disk itself: the 512-hidden, 8-layer model
# (27M parameters: 3 x 108 MB of model and AdamW moments) saved by 1 process and by 8 ranks
# (dp2 x tp2 x pp2: the 4 ranks of the first data-parallel replica each write their blocks), each
# beside `dd` writing the same number of bytes with fsync, in the same run. Prints MB/s of each and
# the ratio to dd. A benchmark, not a test.
#   bash bench/bench_checkpoint.sh
cd "$(dirname "$0")/.." || exit 1
if [ ! -x ./train ] || [ ! -x ./create_config ]; then
    echo "./train or ./create_config is missing: run make" >&2
    exit 1
fi
tmp=$(mktemp -d "${BENCH_DIR:-/tmp}/picotron-bench-ckpt.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# saves one checkpoint after one step; prints "MB seconds"
save() {
    local name=$1 np=$2
    shift 2
    ./create_config --out_dir "$tmp" --exp_name "$name" --model_name picotron-tiny \
        --hidden_size 512 --intermediate_size 1536 --num_hidden_layers 8 --num_attention_heads 8 \
        --num_key_value_heads 4 --seq_len 64 --mbs 1 --total_train_steps 1 --save_frequency 1 \
        --use_cpu --overwrite "$@" >/dev/null || return 1
    mpirun -np "$np" ./train --config "$tmp/$name/config.json" >"$tmp/$name.log" 2>&1 ||
        { tail -n 3 "$tmp/$name.log" >&2; return 1; }
    sed -n 's/.*checkpoint .*: \([0-9.]*\) MB in \([0-9.]*\) s/\1 \2/p' "$tmp/$name.log"
}
# the disk: as many bytes, written and synced by dd; prints seconds
disk() {
    local start end
    sync # what earlier runs left in the page cache is not this write's to flush
    start=$(date +%s.%N)
    dd if=/dev/zero of="$tmp/dd.bin" bs=1M count="$1" conv=fsync status=none
    end=$(date +%s.%N)
    rm -f "$tmp/dd.bin"
    echo "$start $end" | awk '{ printf "%.3f", $2 - $1 }'
}
echo "checkpoint writes against dd (fsync) of the same bytes, in $tmp"
for layout in "1_rank 1" "dp2_tp2_pp2 8 --dp 2 --tp 2 --pp 2 --grad_acc_steps 1"; do
    set -- $layout
    dd_secs=$(disk 305) # the model's 305 MB, just before the save, the disk as the save finds it
    sync
    read -r mb secs < <(save "$@") || exit 1
    awk -v n="$1" -v mb="$mb" -v s="$secs" -v d="$dd_secs" 'BEGIN {
        printf "%-12s %7.1f MB in %6.2f s = %7.1f MB/s; dd: %7.1f MB/s; ratio %.2f\n",
               n, mb, s, mb / s, 305 / d, (mb / s) / (305 / d) }'
done
