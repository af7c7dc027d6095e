#!/usr/bin/env bash
# Token files read back exactly (.txt bytes, .tok width 2 and 4, llm.c .bin), windows have stride
# seq_length, every dp x grad_acc layout reads the same global batch with sample i on rank i mod dp,
# and each bad dataset (missing, bad magic, truncated, too short, unknown type) ends the run with
# exit 1 and exactly one line on stderr naming the file.
bin=${PICOTRON_BUILD:-build}/tests/test_data
[ -x "$bin" ] || { echo "$bin is not built (run make)"; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$bin" all "$dir" || exit 1

bad=0
for kind in missing tok_magic bin_magic truncated short extension; do
    "$bin" error "$kind" "$dir" >"$dir/out" 2>"$dir/err"
    rc=$?
    lines=$(wc -l <"$dir/err")
    msg=$(head -n 1 "$dir/err")
    if [ $rc -ne 0 ] && [ "$lines" -eq 1 ] && [[ $msg == "dataset error: $dir/"* ]]; then
        echo "error $kind: exit $rc, 1 line: ${msg//$dir/DIR}"
    else
        echo "FAIL error $kind: exit $rc, $lines lines on stderr:"; cat "$dir/err" "$dir/out"
        bad=1
    fi
done
exit $bad
