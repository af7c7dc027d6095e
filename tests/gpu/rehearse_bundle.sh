#!/usr/bin/env bash
# A bundle is complete: without a GPU, the emulator's bundle (tests/gpu/bundle.sh --emulate: the
# GPU build's sources on the CUDA emulator, with the same MPICH, cJSON, BLIS and OpenMP libraries
# the GPU bundle carries) trains the tiny model for 3 steps on 2 ranks (dp=2, the mpi backend)
# started by the bundle's own mpirun, while this machine's MPICH, cJSON and BLIS are unreachable
# (tests/gpu/bundle_only.sh: a mount namespace in which they read as empty). Then the dynamic
# loader's own record (LD_DEBUG=libs) of every process (mpiexec, the proxy, both ranks) must show
# each library it loaded coming from the bundle or from the system set (glibc, libstdc++,
# libgcc_s). Prints the ranks' step lines and what was loaded from where.
# usage: bash tests/gpu/rehearse_bundle.sh [ARCHIVE | UNPACKED_BUNDLE]
#   (default build-bundle/out-emu/picotron-emu.tar.gz; a GPU bundle works too where a GPU is)
# Where the namespace cannot be made (no root or CAP_SYS_ADMIN) it says so, and the loader's
# record alone is the proof.
cd "$(dirname "$0")/../.." || exit 1
bundle=${1:-build-bundle/out-emu/picotron-emu.tar.gz}
SYSTEM_RE='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|lib(c|m|pthread|dl|rt|resolv|util)\.so\.[0-9]+|libstdc\+\+\.so\.6|libgcc_s\.so\.1)$'
GPU_RE='^lib(cudart|cublas|cublasLt|nccl|cuda|nvidia-.*)\.so\.[0-9.]+$'
tmp=$(mktemp -d /tmp/picotron_rehearsal.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
if [ -f "$bundle" ]; then
    tar -xzf "$bundle" -C "$tmp" || { echo "rehearse_bundle.sh: cannot unpack $bundle"; exit 1; }
    root=$(find "$tmp" -maxdepth 2 -name MANIFEST -printf '%h\n' | head -n 1)
elif [ -f "$bundle/MANIFEST" ]; then
    root=$(cd "$bundle" && pwd)
fi
if [ -z "${root:-}" ]; then
    echo "rehearse_bundle.sh: '$bundle' is neither a bundle archive nor an unpacked bundle" \
         "(make one with bash tests/gpu/bundle.sh --emulate)"
    exit 1
fi
cat >"$tmp/config.json" <<JSON
{"distributed": {"dp_size": 2, "use_cpu": false, "backend": "mpi"},
 "model": {"name": "picotron-tiny", "hidden_size": 128, "intermediate_size": 256,
           "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
           "vocab_size": 256, "dtype": "float32"},
 "training": {"total_train_steps": 3, "seq_length": 32, "micro_batch_size": 2,
              "gradient_accumulation_steps": 1},
 "dataset": {"name": "data/pride_and_prejudice.txt"}}
JSON
mkdir -p "$tmp/ld"
run=(env LD_DEBUG=libs LD_DEBUG_OUTPUT="$tmp/ld/ld" mpirun -np 2 "$root/bin/train" --config
     "$tmp/config.json")
start=$(date +%s)
timeout 300 bash tests/gpu/bundle_only.sh "$root" "${run[@]}" >"$tmp/log" 2>&1
rc=$?
how="this machine's MPICH, cJSON and BLIS hidden by bundle_only.sh"
if [ $rc -eq 3 ] && grep -q '^bundle_only.sh: cannot bind' "$tmp/log"; then
    how="NOT hidden ($(head -n 1 "$tmp/log" | sed 's/^bundle_only.sh: //')): the loader's record is the proof"
    rm -f "$tmp/ld"/*
    PATH=$root/bin:$PATH LD_LIBRARY_PATH=$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
        timeout 300 "${run[@]}" >"$tmp/log" 2>&1
    rc=$?
fi
echo "rehearsal: mpirun -np 2 bin/train (dp=2, mpi backend, CUDA emulator) from $bundle, $how"
grep -E 'Step: ' "$tmp/log" | sed 's/^/    /'
steps=$(grep -cE 'Step: ' "$tmp/log")
if [ $rc -ne 0 ] || [ "$steps" -lt 3 ]; then
    tail -n 15 "$tmp/log" | sed 's/^/    /'
    echo "FAIL: training with the bundle alone: exit $rc, $steps step lines of 3" \
         "(a 'file too short' above names a library the bundle lacks)"
    exit 1
fi

# the loader's record: each process wrote $tmp/ld/ld.<pid>; "calling init: PATH" per library
processes=$(find "$tmp/ld" -name 'ld.*' | wc -l)
bundled=() system=() other=()
while read -r path; do
    name=$(basename "$path")
    if [[ $path == "$root/lib/"* ]]; then
        bundled+=("${path#"$root/lib/"}")
    elif [[ $name =~ $SYSTEM_RE ]]; then
        system+=("$name")
    elif [[ $name =~ $GPU_RE ]]; then
        system+=("$name (GPU machine)")
    else
        other+=("$path")
    fi
done < <(cat "$tmp/ld"/ld.* 2>/dev/null | sed -n 's/.*calling init: //p' | sort -u)
echo "loaded by $processes processes (mpiexec, proxy, ranks), $(($(date +%s) - start)) s:"
echo "    from the bundle: ${bundled[*]}"
echo "    from the system set: $(printf '%s\n' "${system[@]}" | sort -u | tr '\n' ' ')"
if [ "$processes" -lt 4 ] || [ ${#bundled[@]} -eq 0 ]; then
    echo "FAIL: the loader's record covers $processes processes (4 expected) and" \
         "${#bundled[@]} bundled libraries: LD_DEBUG_OUTPUT did not reach every process"
    exit 1
fi
if [ ${#other[@]} -gt 0 ]; then
    echo "FAIL: loaded from outside the bundle and the system set: ${other[*]}"
    exit 1
fi
echo "ok: the bundle alone trained 3 steps on 2 ranks"
