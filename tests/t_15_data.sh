#!/usr/bin/env bash
# Token files read back exactly (.txt bytes, .tok width 2 and 4, llm.c .bin), windows have stride
# seq_length, every dp x grad_acc layout reads the same global batch with sample i on rank i mod dp.
# Each bad dataset (missing, a directory, a pipe, unreadable, bad magic, a header count the file
# does not hold, a count that overflows count * width, stray bytes, a token id too large, too
# short, a corpus larger than memory, unknown type) makes test_data's dataset_open, and the real
# ./train on 1 and 2 ranks, exit non-zero within MAX_SECONDS with exactly one line on stderr that
# names the file, after MPICH's own abort lines are removed.
cd "$(dirname "$0")/.." || exit 1
MAX_SECONDS=10
bin=${PICOTRON_BUILD:-build}/tests/test_data
[ -x "$bin" ] || { echo "$bin is not built (run make)"; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
chmod 1777 "$dir" # the unreadable case runs as nobody when this runs as root

"$bin" all "$dir" || exit 1

# what the one line must say after "dataset error: <the file>", for each kind test_data writes
declare -A want=(
    [missing]=': no such file'
    [directory]=' is a directory, not a file \(name a file\); dataset\.name must be a \.txt, '
    [fifo]=' is a FIFO \(named pipe\), not a regular file'
    [unreadable]=' cannot be opened: Permission denied'
    [tok_magic]=': not a \.tok file'
    [bin_magic]=': not an llm\.c token shard'
    [truncated]=': its header says 8 tokens but its 74 bytes hold 5 '
    [huge_count]=': its header says 9223372036854775808 tokens but its 64 bytes hold 0 '
    [stray_byte]=': its header says 8 tokens but its 81 bytes hold 8 .*stray bytes'
    [bin_count]=': its header says 4294967295 tokens but its 1040 bytes hold 8 '
    [big_token]=': token 2147483647 at position 5 is above the largest id'
    [short]=': 8 tokens, fewer than one sample'
    [huge_txt]=': 8796093022208 tokens need 32768\.0 GiB on every rank'
    [extension]=': unknown file type'
)
kinds=(missing directory fifo unreadable tok_magic bin_magic truncated huge_count stray_byte
       bin_count big_token short huge_txt extension)

# lines MPICH prints itself when a rank calls MPI_Abort or a process dies, and the warning
# AddressSanitizer prints itself when an allocation fails (make test-asan)
MPICH_LINES='^Abort\([0-9]+\) on node [0-9]+ \(rank [0-9]+ in comm [0-9]+\): application called MPI_Abort|^=+$|^=   |^\[unset\]: |^YOU CAN IGNORE|^==[0-9]+==WARNING: AddressSanitizer failed to allocate'

# root reads every file: the unreadable case runs as nobody, through setpriv
as_nobody=()
[ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null &&
    as_nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
# a checkout nobody cannot enter (under /root) leaves the case to skip
[ ${#as_nobody[@]} -eq 0 ] || "${as_nobody[@]}" test -x "$bin" || as_nobody=()

# ./train's config: a tiny model, one step, dp = the number of ranks
write_config() { # write_config FILE NP DATASET
    cat >"$1" <<JSON
{"distributed": {"tp_size": 1, "cp_size": 1, "pp_size": 1, "dp_size": $2},
 "model": {"name": "picotron-tiny", "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 256},
 "training": {"total_train_steps": 1, "seq_length": 16, "micro_batch_size": 1},
 "dataset": {"name": "$3"},
 "checkpoint": {"save_dir": "$dir/ckpt", "save_frequency": 0}}
JSON
    chmod 644 "$1"
}

bad=0
# check LABEL WANT CMD...: CMD must fail within MAX_SECONDS with one stderr line that reads
# "dataset error: $path" then matches WANT; an empty $path is taken from CMD's first stdout line
# (test_data prints the file it wrote). Exit 77 from CMD: it cannot run here, a skip.
check() {
    local label=$1 suffix=$2 start ms lines problem="" regex
    shift 2
    start=$(date +%s%N)
    timeout 20 "$@" >"$dir/out" 2>"$dir/err" </dev/null
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    if [ $rc -eq 77 ]; then echo "skip $label: $(tail -n 1 "$dir/out")"; return; fi
    [ -n "$path" ] || path=$(head -n 1 "$dir/out")
    regex="^dataset error: ${path//./\\.}$suffix"
    grep -v -E "$MPICH_LINES" "$dir/err" | grep -v '^[[:space:]]*$' >"$dir/lines"
    lines=$(wc -l <"$dir/lines")
    if [ $rc -eq 0 ]; then problem="exit status 0"
    elif [ $rc -eq 124 ]; then problem="did not end within 20 s"
    elif [ $ms -gt $((MAX_SECONDS * 1000)) ]; then problem="took $ms ms > $MAX_SECONDS s"
    elif [ "$lines" -ne 1 ]; then problem="$lines stderr lines instead of 1"
    elif ! grep -q -E -- "$regex" "$dir/lines"; then problem="the line does not match /$regex/"
    fi
    if [ -n "$problem" ]; then
        echo "FAIL $label: $problem (exit $rc); stderr and stdout were:"
        sed 's/^/    | /' "$dir/err" "$dir/out"
        bad=1
    else
        echo "ok   $label: exit $rc, $ms ms: $(sed "s|$dir|DIR|g" "$dir/lines")"
    fi
}

train_runs=1
command -v mpirun >/dev/null || { echo "mpirun not found: ./train runs skipped"; train_runs=0; }
[ -x ./train ] || { echo "./train not built: ./train runs skipped"; train_runs=0; }
if [ $train_runs -eq 1 ]; then # the control: the same configs train on a good file
    for np in 1 2; do
        write_config "$dir/ok$np.json" $np "$dir/small.txt"
        if timeout 60 mpirun -np $np ./train --config "$dir/ok$np.json" >"$dir/out" 2>&1; then
            echo "ok   control, np $np: ./train runs one step on DIR/small.txt"
        else
            echo "FAIL control, np $np: ./train failed on a good file:"; sed 's/^/    | /' "$dir/out"
            bad=1
        fi
    done
fi

for kind in "${kinds[@]}"; do
    runner=()
    [ "$kind" = unreadable ] && runner=("${as_nobody[@]}")
    # a larger-than-memory corpus is only refused where the allocation fails up front; under
    # AddressSanitizer (make test-asan) it fails by returning NULL too, as malloc does
    if [ "$kind" = huge_txt ] && [ "$(cat /proc/sys/vm/overcommit_memory 2>/dev/null)" = 1 ]; then
        echo "skip $kind: vm.overcommit_memory = 1 lets a 32 TiB allocation succeed"
        continue
    fi
    [ "$kind" = huge_txt ] &&
        runner=(env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1")
    path=""
    check "test_data $kind" "${want[$kind]}" "${runner[@]}" "$bin" error "$kind" "$dir"
    [ $rc -ne 77 ] && [ -n "$path" ] || continue
    [ $train_runs -eq 1 ] || continue
    for np in 1 2; do
        write_config "$dir/$kind$np.json" $np "$path"
        check "./train np $np $kind" "${want[$kind]}" "${runner[@]}" mpirun -np $np ./train \
            --config "$dir/$kind$np.json"
    done
done
exit $bad
