#!/usr/bin/env bash
# The shipped fixtures are what tests/reference/make_fixture.py, make_moe_fixture.py,
# make_moe_model_fixture.py and make_mamba_fixture.py write:
# regenerated here, they are byte-identical (checked with torch 2.15 / transformers 5.24,
# single-threaded). Another torch version may change the last bits of a float; then every value
# must agree within TOL relative to its tensor's max |value|, and the script says so.
cd "$(dirname "$0")/.." || exit 1
TOL=1e-6
if ! python3 -c "import torch, transformers" 2>/dev/null; then
    echo "PyTorch/transformers not installed: fixture not regenerated (the shipped one is used)"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 tests/reference/make_fixture.py --out "$tmp" || exit 1
python3 tests/reference/make_moe_fixture.py --out "$tmp" || exit 1
python3 tests/reference/make_moe_model_fixture.py --out "$tmp" || exit 1
python3 tests/reference/make_mamba_fixture.py --out "$tmp" || exit 1
status=0
for f in tests/fixtures/llama_tiny_tied.bin tests/fixtures/llama_tiny_untied.bin \
    tests/fixtures/moe_mixtral.bin tests/fixtures/mixtral_tiny.bin \
    tests/fixtures/mamba_block.bin tests/fixtures/mamba_tiny.bin; do
    new=$tmp/$(basename "$f")
    if cmp -s "$f" "$new"; then
        echo "$f: byte-identical ($(stat -c %s "$f") bytes)"
        continue
    fi
    python3 - "$f" "$new" "$TOL" <<'PY' || status=1
import struct, sys
import numpy as np

def records(path):
    buf, o, out = open(path, "rb").read(), 0, {}
    while o < len(buf):
        n, = struct.unpack_from("<I", buf, o); o += 4
        name = buf[o:o + n].decode(); o += n
        nd, = struct.unpack_from("<I", buf, o); o += 4
        dims = struct.unpack_from("<%dq" % nd, buf, o); o += 8 * nd
        count = int(np.prod(dims))
        out[name] = (dims, np.frombuffer(buf, "<f4", count, o).astype(np.float64)); o += 4 * count
    return out

old, new, tol = records(sys.argv[1]), records(sys.argv[2]), float(sys.argv[3])
if list(old) != list(new):
    sys.exit("%s: record names differ from the regenerated fixture" % sys.argv[1])
worst, where = 0.0, ""
for name, (dims, a) in old.items():
    dims2, b = new[name]
    if dims != dims2:
        sys.exit("%s: %s has shape %s, regenerated %s" % (sys.argv[1], name, dims, dims2))
    err = np.abs(a - b).max() / max(np.abs(a).max(), 1e-30)
    if err > worst:
        worst, where = err, name
print("%s: not byte-identical; max rel-to-max diff %.2e (%s), tol %.0e" % (sys.argv[1], worst,
      where, tol))
sys.exit(0 if worst <= tol else 1)
PY
done
exit $status
