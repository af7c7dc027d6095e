#!/usr/bin/env bash
# No two files of the CPU build call each other, directly or round a circle (DESIGN.md: "No two
# files call each other both ways"). tests/call_circles.py reads the top-level .c files and
# backend/ (not backend/cuda/, tests/, bench/ or scripts/): file A -> file B when A names a
# non-static function that B defines (a call, a function pointer, or through a header's macro or
# static inline function). A strongly connected set of more than one file is a circle; each is
# printed with the names that tie it, and any circle fails the test.
# The self-check first runs it on a made-up tree where a.c and b.c call each other (b.c through a
# header's macro), c.c calls a.c, a static function of c.c shares a name with one of b.c, and a
# comment names a function: it must report exactly the circle a.c <-> b.c. Without b.c's call,
# the same tree must pass.
cd "$(dirname "$0")/.." || exit 1
command -v python3 >/dev/null || { echo "python3 not found: tests/call_circles.py needs it"; exit 77; }
dir=$(mktemp -d /tmp/picotron-circles.XXXXXX)
trap 'rm -rf "$dir"' EXIT

# the made-up tree
mkdir -p "$dir/tree/backend/cpu" "$dir/tree/backend/cuda" "$dir/tree/tests"
cat >"$dir/tree/a.h" <<'EOF'
#define CALL_A(x) a_fn((x) - 1)
EOF
cat >"$dir/tree/a.c" <<'EOF'
// c_fn() is only named in this comment, and "c_fn(" in a string
int a_fn(int x) { const char *s = "c_fn("; return b_fn(x) + (s != 0); }
EOF
cat >"$dir/tree/backend/cpu/b.c" <<'EOF'
#include "../../a.h"
int b_fn(int x) {
    if (x) return CALL_A(x);
    return 0;
}
EOF
cat >"$dir/tree/c.c" <<'EOF'
static int b_fn(int x) { return x; }
int c_fn(void) { return a_fn(1) + b_fn(2); }
EOF
# files the test does not read: a circle through them is not the CPU build's
echo 'int cuda_fn(void) { return c_fn(); }' >"$dir/tree/backend/cuda/k.c"
echo 'int test_fn(void) { return cuda_fn() + c_fn(); } int c_helper(void) { return 0; }' \
    >"$dir/tree/tests/t.c"
sed -i 's/^int c_fn(void) {/int c_fn(void) { test_fn(); cuda_fn();/' "$dir/tree/c.c"

failures=0
python3 tests/call_circles.py "$dir/tree" >"$dir/made_up.txt"
rc=$?
if [ $rc -eq 1 ] && grep -qx 'circle 1: a.c <-> backend/cpu/b.c' "$dir/made_up.txt" &&
   ! grep -q '^circle 2' "$dir/made_up.txt" &&
   grep -q 'backend/cpu/b.c -> a.c: a_fn via CALL_A' "$dir/made_up.txt"; then
    selfcheck="ok: the made-up circle a.c <-> backend/cpu/b.c is found, and nothing else"
else
    selfcheck="FAIL: on the made-up tree (exit $rc): $(tr '\n' ' ' <"$dir/made_up.txt")"
    failures=$((failures + 1))
fi
sed -i 's/return CALL_A(x);/return x;/' "$dir/tree/backend/cpu/b.c"
if python3 tests/call_circles.py "$dir/tree" >"$dir/no_circle.txt" &&
   grep -q ', 0 circles$' "$dir/no_circle.txt"; then
    selfcheck="$selfcheck; without b.c's call it passes"
else
    selfcheck="FAIL: without b.c's call: $(tr '\n' ' ' <"$dir/no_circle.txt")"
    failures=$((failures + 1))
fi
echo "self-check $selfcheck"

# the tree itself
python3 tests/call_circles.py . || failures=$((failures + 1))
echo "$failures failures"
[ $failures -eq 0 ]
