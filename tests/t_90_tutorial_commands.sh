#!/usr/bin/env bash
# The tutorial's commands run as written and print what the chapters show. Every ```sh block of
# tutorial/[0-9][0-9]_*.md whose first line is "# run" runs, in chapter order, from the repo root (bash -e
# -o pipefail, each under timeout BLOCK_TIMEOUT_S), with OUT set to a temporary folder so the
# experiments land there and not in tmp/. A block fails when it exits non-zero, or when the
# ```output block that follows it (before the next ```sh block) shows a line it did not print.
#
# Matching (match_output): each non-blank shown line, masked, must equal a masked line of the
# actual output (trailing spaces stripped), in order: the shown lines are a subsequence of the
# printed ones. A shown line "..." matches nothing (it marks elided lines); a shown line ending in
# " ..." matches any printed line that starts with the part before " ...".
# Masking (mask, in match_output), the same on both sides, hides what depends on the machine:
#   - the values of "Tokens/s: X", "Tokens/s/GPU: X", "MFU: X%" and "Memory usage: XGB" become #;
#   - a number followed by " s", "s", " ms", "ms", " us" or "us" (a time) becomes #;
#   - the path of OUT becomes tmp, the reader's default.
# Losses, counts, shapes and parameter numbers are compared as printed.
# The self-check at the end makes the matcher fail on purpose: one block's shown output with one
# loss digit changed, against the output that block printed, must be reported as a mismatch (and
# the unchanged pair must match), so a chapter that no longer tells the truth fails this test.
#
# The pictures: every ![...](images/NAME) of a chapter must be a file tutorial/images/NAME that
# parses as XML when it is an .svg, and every file in tutorial/images/ must be shown by a chapter.
#
# TUTORIAL_VERBOSE=1 prints every block's output (to refresh the output pasted in the chapters);
# TUTORIAL_ONLY="02 04" runs only the blocks of tutorial/02*.md and tutorial/04*.md;
# TUTORIAL_OUT=DIR runs the experiments in DIR and keeps them (to copy a chapter's trace.svg or
# loss.svg into tutorial/images/ after a change).
cd "$(dirname "$0")/.." || exit 1
BLOCK_TIMEOUT_S=120
# make test-asan's binaries run several times slower (chapter 10's DoReMi block: 98 s of the 120)
[ -z "${PICOTRON_SANITIZE:-}" ] || BLOCK_TIMEOUT_S=600
command -v mpirun >/dev/null || { echo "mpirun not found: install mpich (make deps)"; exit 77; }
command -v gdb >/dev/null || { echo "gdb not found: the chapters' gdb blocks need it (apt-get install gdb)"; exit 77; }
command -v python3 >/dev/null || { echo "python3 not found: the output matcher needs it"; exit 77; }
for bin in ./train ./create_config; do
    [ -x "$bin" ] || { echo "$bin is missing: build it with make"; exit 1; }
done
chapters=()
for prefix in ${TUTORIAL_ONLY:-[0-9][0-9]_}; do chapters+=(tutorial/$prefix*.md); done
if [ -n "${TUTORIAL_OUT:-}" ]; then
    mkdir -p "$TUTORIAL_OUT" && OUT=$(cd "$TUTORIAL_OUT" && pwd) || exit 1
    rm -rf "$OUT/.blocks"
else
    OUT=$(mktemp -d /tmp/picotron-tutorial.XXXXXX)
    trap 'rm -rf "$OUT"' EXIT
fi
export OUT
blocks=$OUT/.blocks
mkdir -p "$blocks"

# match_output SHOWN ACTUAL: exit 0 when every line of the file SHOWN is printed in the file
# ACTUAL by the rules above; otherwise print the first shown line not found and ACTUAL's last
# lines, and exit 1.
match_output() {
    python3 - "$1" "$2" <<'EOF'
import os, re, sys

def mask(line):
    line = line.rstrip()
    if os.environ.get("OUT"):
        line = line.replace(os.environ["OUT"], "tmp")
    line = re.sub(r"(Tokens/s/GPU|Tokens/s|MFU|Memory usage):\s*[0-9.]+[A-Za-z%]*", r"\1: #", line)
    return re.sub(r"(?<![\w.])[0-9]+(\.[0-9]+)?(?= ?(s|ms|us)\b)", "#", line)

shown = open(sys.argv[1]).read().splitlines()
actual = [mask(line) for line in open(sys.argv[2], errors="replace").read().splitlines()]
at = 0
for number, line in enumerate(shown, 1):
    line = line.rstrip()
    if not line.strip() or line.strip() == "...":
        continue
    prefix = line.endswith(" ...")
    want = mask(line[:-4] if prefix else line)
    while at < len(actual) and not (actual[at].startswith(want) if prefix else actual[at] == want):
        at += 1
    if at == len(actual):
        print("    line %d of the output block is not printed (after the lines before it):" % number)
        print("    > " + line)
        print("    last lines printed (masked):")
        for printed in actual[-12:]:
            print("    | " + printed)
        sys.exit(1)
    at += 1
EOF
}

# one file per runnable block: NNN.sh, its origin (file:line) in NNN.where, and the ```output
# block that follows it in NNN.shown, with its origin in NNN.shown_where. An ```output block that
# follows no run block is listed in orphans: nothing would check it.
awk -v dir="$blocks" '
    FNR == 1 { inside = 0; pending = 0 }
    !inside && /^```/ {
        info = substr($0, 4)
        sub(/[[:space:]]+$/, "", info)
        inside = 1; first = (info == "sh"); keep = 0; file = ""
        if (info == "sh") pending = 0
        if (info == "output") {
            if (pending) {
                file = sprintf("%s/%03d.shown", dir, n)
                printf "%s:%d\n", FILENAME, FNR > sprintf("%s/%03d.shown_where", dir, n)
                close(sprintf("%s/%03d.shown_where", dir, n))
                keep = 1
            } else {
                printf "%s:%d\n", FILENAME, FNR > (dir "/orphans")
            }
            pending = 0
        }
        next
    }
    inside && /^```[[:space:]]*$/ {
        inside = 0
        if (keep) close(file)
        if (keep && info == "sh") pending = 1
        keep = 0
        next
    }
    inside && first {
        first = 0
        keep = ($0 ~ /^# run[[:space:]]*$/)
        if (keep) {
            n++
            file = sprintf("%s/%03d.sh", dir, n)
            printf "%s:%d\n", FILENAME, FNR - 1 > sprintf("%s/%03d.where", dir, n)
            close(sprintf("%s/%03d.where", dir, n))
        }
    }
    inside && keep { print > file }
' "${chapters[@]}"

ran=0 failed=0 start_all=$(date +%s)
if [ -s "$blocks/orphans" ]; then
    while read -r where; do
        echo "FAIL $where: an \`\`\`output block that follows no run block (nothing checks it)"
        failed=$((failed + 1))
    done <"$blocks/orphans"
fi
for block in "$blocks"/*.sh; do
    [ -e "$block" ] || break
    where=$(cat "${block%.sh}.where")
    log=${block%.sh}.log
    start=$(date +%s)
    timeout "$BLOCK_TIMEOUT_S" bash -e -o pipefail "$block" >"$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    ran=$((ran + 1))
    if [ $rc -ne 0 ]; then
        failed=$((failed + 1))
        echo "FAIL $where: exit $rc after ${secs}s$([ $rc -eq 124 ] && echo " (timeout)")"
        tail -n 15 "$log" | sed 's/^/    /'
    elif [ -e "${block%.sh}.shown" ] && ! report=$(match_output "${block%.sh}.shown" "$log"); then
        failed=$((failed + 1))
        echo "FAIL $(cat "${block%.sh}.shown_where"): the output shown is not what the block at $where printed"
        echo "$report"
    else
        shown=$([ -e "${block%.sh}.shown" ] && echo ", output as shown" || echo ", no output shown")
        echo "ok   $where (${secs}s$shown)"
        touch "${block%.sh}.ok"
    fi
    if [ -n "${TUTORIAL_VERBOSE:-}" ]; then
        sed 's/^/    | /' "$log"
    fi
done

# the pictures the chapters show, and the pictures no chapter shows
# xml_error FILE: nothing when FILE is well-formed XML, else the parser's complaint
xml_error() {
    python3 -c 'import sys, xml.dom.minidom as x; x.parse(sys.argv[1])' "$1" 2>&1 | tail -n 1
}
images=0 failed_before=$failed
for chapter in "${chapters[@]}"; do
    while read -r name; do
        images=$((images + 1))
        file=tutorial/images/$name
        if [ ! -f "$file" ]; then
            echo "FAIL $chapter: shows images/$name, which is not in tutorial/images/"
            failed=$((failed + 1))
        elif [[ $name == *.svg ]] && error=$(xml_error "$file") && [ -n "$error" ]; then
            echo "FAIL $chapter: images/$name is not well-formed XML: $error"
            failed=$((failed + 1))
        fi
    done < <(grep -o '](images/[^)]*)' "$chapter" | sed 's/^](images\///; s/)$//')
done
if [ -z "${TUTORIAL_ONLY:-}" ] && [ -d tutorial/images ]; then
    for file in tutorial/images/*; do
        [ -e "$file" ] || break
        grep -q "](images/${file#tutorial/images/})" tutorial/[0-9][0-9]_*.md ||
            { echo "FAIL $file: no chapter shows it"; failed=$((failed + 1)); }
    done
fi
[ $images -eq 0 ] || [ $failed -ne $failed_before ] ||
    echo "ok   pictures: $images shown by the chapters, each in tutorial/images/"

# the self-check: the first block that passed and shows a loss, with that loss's last digit changed,
# must be reported as a mismatch that names the changed line; unchanged, it must match
selfcheck=skipped
for shown in "$blocks"/*.shown; do
    log=${shown%.shown}.log
    [ -e "${shown%.shown}.ok" ] && grep -q 'Loss: [0-9]' "$shown" || continue
    where=$(cat "${shown%.shown}.shown_where")
    awk '!done && match($0, /Loss: [0-9]+\.[0-9]+/) {
             i = RSTART + RLENGTH - 1
             $0 = substr($0, 1, i - 1) (substr($0, i, 1) + 1) % 10 substr($0, i + 1)
             done = 1
         }
         { print }' "$shown" >"$OUT/selfcheck.shown"
    was=$(grep -o 'Loss: [0-9.]*' "$shown" | head -n 1)
    now=$(grep -o 'Loss: [0-9.]*' "$OUT/selfcheck.shown" | head -n 1)
    if ! match_output "$shown" "$log" >/dev/null; then
        selfcheck="FAIL: the unchanged output of $where does not match"
    elif report=$(match_output "$OUT/selfcheck.shown" "$log"); then
        selfcheck="FAIL: $where with $was changed to $now still matches"
    elif ! grep -q "^    > .*$now" <<<"$report"; then
        selfcheck="FAIL: $where with $was changed to $now: the report does not name that line"
    else
        selfcheck="ok: $where matches as shown; with $was changed to $now it is reported"
    fi
    break
done
echo "self-check $selfcheck"
[ "${selfcheck#FAIL}" = "$selfcheck" ] || failed=$((failed + 1))
[ $ran -gt 0 ] || echo "no run block in ${chapters[*]}"
echo "$ran tutorial blocks ran in $(( $(date +%s) - start_all ))s, $failed failed"
[ $ran -gt 0 ] && [ $failed -eq 0 ]
