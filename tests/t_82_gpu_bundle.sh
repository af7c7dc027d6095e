#!/usr/bin/env bash
# tests/gpu/bundle.sh packs what tests/gpu/check.sh needs on the GPU machine (an image with CUDA
# and PyTorch, without MPICH, cJSON or BLIS, and no registry), and the bundle is complete:
#   1. the script runs here (make GPU=1 for x86-64-v3, Debian's packages); bundle/ is under 40 MiB
#      and carries no CUDA runtime, cuBLAS or NCCL
#   2. ldd of every program and library in it, its lib/ first, names nothing outside the bundle but
#      the expected set: glibc's libraries (libc, libm, libpthread, libdl, librt, libresolv,
#      ld-linux-x86-64, the vDSO), libstdc++ and libgcc_s, which every glibc image has, and CUDA
#      13's libcudart, libcublas, libcublasLt and libnccl, which the GPU machine has (its toolkit
#      or PyTorch's nvidia wheels: check.sh's probe finds them). libgomp is carried
#   3. without a GPU, check.sh's prebuilt mode stops in its probe, in one line, at once; with a
#      stand-in nvidia-smi and driver library, its probe finds CUDA's libraries in the toolkit, and
#      in PyTorch's wheel layout (site-packages/nvidia/*/lib) where no toolkit is
#   4. the rehearsal: the emulator's bundle (bundle.sh --emulate: the GPU build on the CUDA
#      emulator, the same libraries) trains 3 steps on 2 ranks with its own mpirun while this
#      machine's MPICH, cJSON and BLIS are hidden (tests/gpu/rehearse_bundle.sh)
#   5. check.sh's prebuilt mode passes its dry run on the emulator's bundle, hidden the same way
#      (PICOTRON_CHECK_GPU=emulate): its probe (every program and library of the bundle found,
#      the bundle's mpirun starting 2 ranks), then the steps t_81 leaves to it, the layouts dp2,
#      tp2, tp2 sequence-parallel, pp2, cp2 and experts on ep2 with the mpi backend against one
#      rank (the harness at 2 steps) and the benchmark at SmolLM-1.7B's shape; its logs under $OUT.
#      t_81 runs check.sh's other steps from source, so that each runs once in the suite; where
#      no bundle can be made (exit 77), this test runs these two from source before it skips
# Without nvcc, 1-3 check the emulator's bundle instead. Runs in a copy of the tree (bundle.sh
# builds in build-bundle/ and writes bundle/); the .deb files come from this tree's
# build-bundle/debs, apt's cache or the Debian archive.
cd "$(dirname "$0")/.." || exit 1
if [ "$(uname -m)" != x86_64 ]; then
    echo "the bundle is for an x86-64 GPU machine, and the CUDA emulator needs x86-64; this is $(uname -m)"
    exit 77
fi
EXPECTED_RE='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|lib(c|m|pthread|dl|rt|resolv)\.so\.[0-9]+|libstdc\+\+\.so\.6|libgcc_s\.so\.1|lib(cudart|cublas|cublasLt)\.so\.13|libnccl\.so\.2)$'
LIMIT_MIB=40
status=0
fail() { echo "FAIL: $*"; status=1; }
t0=$(date +%s)
lap() { echo "    ($(($(date +%s) - t0)) s so far)"; }
tree=$(mktemp -d /tmp/picotron_bundle_test.XXXXXX)
trap 'rm -rf "$tree"' EXIT
tar --exclude=./.git --exclude=./build --exclude=./build-gpu --exclude=./build-asan \
    --exclude=./build-emu --exclude=./build-bundle --exclude=./bundle --exclude=./tmp \
    --exclude=./train --exclude=./create_config -cf - . | tar -xf - -C "$tree"
if [ -d build-bundle/debs ]; then
    mkdir -p "$tree/build-bundle/debs" && cp build-bundle/debs/*.deb "$tree/build-bundle/debs/" 2>/dev/null
fi
cd "$tree" && mkdir -p .logs || exit 1

# check.sh's steps that t_81 leaves to this test (5., the emulator's own limits)
export PICOTRON_CHECK_STEPS="3 5" STEPS=2 # 2 steps: an update, and one on top of its AdamW state
# bundle [--emulate]: runs bundle.sh, prints its lines; its exit 77 (no packages to be had) ends
# this test as a skip, once check.sh has run those steps from source instead
bundle() {
    local log=.logs/bundle${1:-}
    bash tests/gpu/bundle.sh "$@" >"$log" 2>&1
    local rc=$?
    sed 's/^/    /' "$log"
    if [ $rc -eq 77 ]; then
        echo "no bundle: check.sh's steps $PICOTRON_CHECK_STEPS from source"
        PICOTRON_CHECK_GPU=emulate timeout 900 bash tests/gpu/check.sh >.logs/source 2>&1
        rc=$?
        grep -E '^(ok|FAIL)|passed' .logs/source | sed 's/^/    /'
        if [ $rc -ne 0 ] || ! tail -n 1 .logs/source | grep -q ' 0 failed$'; then
            grep -E '^ {4}' .logs/source | tail -n 30
            echo "FAIL: check.sh's steps $PICOTRON_CHECK_STEPS from source (exit $rc)"
            exit 1
        fi
        grep -m1 '^bundle.sh:' "$log"
        exit 77
    fi
    return $rc
}
if [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
    echo "1. bash tests/gpu/bundle.sh (make GPU=1)"
    bundle || fail "tests/gpu/bundle.sh (exit $?)"
    archive=bundle/picotron-gpu.tar.gz
else
    echo "1. no nvcc in ${CUDA_HOME:-/usr/local/cuda}/bin: the GPU bundle cannot be built here;" \
         "1-3 check the emulator's bundle"
    archive=
fi
echo "   bash tests/gpu/bundle.sh --emulate"
bundle --emulate || fail "tests/gpu/bundle.sh --emulate (exit $?)"
emu_archive=build-bundle/out-emu/picotron-emu.tar.gz
lap
[ $status -eq 0 ] || exit 1

# 1, 2: size, contents, ldd
for a in $archive $emu_archive; do
    dir=$(dirname "$a")
    bytes=$(du -sb "$dir" | cut -f1)
    mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
    if [ "$bytes" -lt $((LIMIT_MIB * 1048576)) ]; then
        echo "size: $dir/ holds $mib MiB (limit $LIMIT_MIB MiB)"
    else
        fail "$dir/ holds $mib MiB, over the $LIMIT_MIB MiB limit"
    fi
    root=.logs/unpacked-$(basename "$a" .tar.gz)
    if ! { mkdir -p "$root" && tar -xzf "$a" -C "$root"; }; then
        fail "cannot unpack $a"
        continue
    fi
    root=$PWD/$root/$(basename "$a" .tar.gz)
    cuda=$(find "$root" -name 'libcudart*' -o -name 'libcublas*' -o -name 'libnccl*' -o -name 'libcuda.*')
    [ -z "$cuda" ] || fail "$a carries the GPU machine's own libraries: $cuda"
    files=0 outside=()
    while read -r f; do
        [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
        files=$((files + 1))
        while read -r soname arrow path _; do
            [ "$arrow" = "=>" ] || continue
            [[ $path == "$root/lib/"* ]] && continue
            [[ $soname =~ $EXPECTED_RE ]] && [ "$path" != not ] && continue
            outside+=("${f#"$root/"}: $soname => $path")
        done < <(LD_LIBRARY_PATH=$root/lib ldd "$f" 2>&1)
    done < <(find "$root" -type f)
    if [ ${#outside[@]} -eq 0 ]; then
        echo "ldd: $files programs and libraries in $(basename "$a") resolve inside it or to the" \
             "expected set ($(find "$root/lib" -name '*.so*' | wc -l) libraries carried)"
    else
        printf '    %s\n' "${outside[@]}" | head -n 20
        fail "${#outside[@]} libraries of $(basename "$a") resolve outside it and the expected set"
    fi
done

# 3. the GPU bundle's probe: without a GPU, one line at once; with a stand-in nvidia-smi and driver,
# it finds CUDA's libraries in the toolkit, or in PyTorch's wheel layout when no toolkit is there
if [ -n "$archive" ]; then
    start=$(date +%s)
    fake=$PWD/.logs/fake
    mkdir -p "$fake/bin" "$fake/driver" "$fake/site/nvidia/cu13/lib" "$fake/site/nvidia/nccl/lib"
    printf '#!/bin/sh\necho "NVIDIA H200, 580.159.04, 143771 MiB"\n' >"$fake/bin/nvidia-smi"
    printf '#!/bin/sh\necho %s\n' "$fake/site" >"$fake/bin/python3"
    chmod +x "$fake/bin/nvidia-smi" "$fake/bin/python3"
    : >"$fake/driver/libcuda.so.1"
    cuda_lib=$(dirname "$(LD_LIBRARY_PATH='' ldd .logs/unpacked-picotron-gpu/picotron-gpu/bin/train |
        awk '$1 == "libcudart.so.13" { print $3 }')")
    for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
        ln -s "$cuda_lib/$lib" "$fake/site/nvidia/cu13/lib/$lib"
    done
    nccl=$(LD_LIBRARY_PATH='' ldd .logs/unpacked-picotron-gpu/picotron-gpu/bin/train |
        awk '$1 == "libnccl.so.2" { print $3 }')
    ln -s "$nccl" "$fake/site/nvidia/nccl/lib/libnccl.so.2"
    if ! command -v nvidia-smi >/dev/null; then
        PICOTRON_CHECK_PREBUILT=bundle timeout 60 bash tests/gpu/check.sh >.logs/probe 2>&1
        rc=$?
        if [ $rc -ne 0 ] && [ "$(grep -c '^FAIL' .logs/probe)" -eq 1 ] &&
            grep -q '^FAIL probe.*nvidia-smi is not on PATH' .logs/probe &&
            tail -n 1 .logs/probe | grep -q '^0 passed, 1 failed$'; then
            echo "3. probe without a GPU: exit $rc, $(grep '^FAIL' .logs/probe)"
        else
            sed 's/^/    /' .logs/probe | tail -n 10
            fail "check.sh's probe did not stop in one line without a GPU (exit $rc)"
        fi
    fi
    for where in "CUDA toolkit" "PyTorch's nvidia wheel"; do # as the probe names them
        cuda_home=${CUDA_HOME:-/usr/local/cuda}
        [ "$where" = "CUDA toolkit" ] || cuda_home=/nonexistent
        PATH=$fake/bin:$PATH LD_LIBRARY_PATH=$fake/driver CUDA_HOME=$cuda_home PICOTRON_CHECK_PROBE_ONLY=1 \
            PICOTRON_CHECK_PREBUILT=bundle timeout 60 bash tests/gpu/check.sh >.logs/probe 2>&1
        rc=$?
        # the toolkit holds the runtime and cuBLAS; NCCL may be elsewhere (a system package)
        found=$(grep -cE "^lib(cudart|cublas|cublasLt)\.so\.13: .*\($where\)" .logs/probe)
        [ "$where" = "CUDA toolkit" ] || found=$((found + $(grep -c "^libnccl.so.2: .*($where)" .logs/probe)))
        want=3
        [ "$where" = "CUDA toolkit" ] || want=4
        if [ $rc -eq 0 ] && [ "$found" -eq $want ] && grep -q '^ok   probe' .logs/probe; then
            echo "   probe with a stand-in nvidia-smi, $where: $found CUDA libraries found there" \
                 "($(grep -m1 '^libcudart' .logs/probe | cut -d' ' -f2)); $(grep '^libnccl' .logs/probe)"
        else
            sed 's/^/    /' .logs/probe | grep -v '^ *lib\|linux-vdso\|ld-linux' | tail -n 12
            fail "check.sh's probe did not find CUDA's libraries in the $where (exit $rc, $found of $want)"
        fi
    done
    echo "    ($(($(date +%s) - start)) s)"
fi

# 4. the rehearsal
echo "4. bash tests/gpu/rehearse_bundle.sh $emu_archive"
bash tests/gpu/rehearse_bundle.sh "$emu_archive" >.logs/rehearsal 2>&1
rc=$?
sed 's/^/    /' .logs/rehearsal
[ $rc -eq 0 ] || fail "the rehearsal with the emulator's bundle (exit $rc)"
lap

# 5. check.sh's prebuilt dry run on the emulator's bundle, this machine's libraries hidden
echo "5. check.sh, prebuilt, on the emulator's bundle: the probe, steps $PICOTRON_CHECK_STEPS (STEPS=$STEPS)"
emu_root=$PWD/.logs/unpacked-picotron-emu/picotron-emu
export OUT=$PWD/.logs/out PICOTRON_CHECK_GPU=emulate PICOTRON_CHECK_PREBUILT=$PWD/$emu_archive
timeout 900 bash tests/gpu/bundle_only.sh "$emu_root" bash tests/gpu/check.sh >.logs/dry 2>&1
rc=$?
if [ $rc -eq 3 ] && grep -q '^bundle_only.sh: cannot bind' .logs/dry; then
    echo "    $(head -n 1 .logs/dry | sed 's/^bundle_only.sh: //'): the dry run uses PATH order alone"
    timeout 900 bash tests/gpu/check.sh >.logs/dry 2>&1
    rc=$?
fi
unset OUT STEPS PICOTRON_CHECK_GPU PICOTRON_CHECK_PREBUILT PICOTRON_CHECK_STEPS
grep -E '^(ok|FAIL)|passed' .logs/dry | sed 's/^/    /'
if [ $rc -ne 0 ] || ! tail -n 1 .logs/dry | grep -q ' 0 failed$'; then
    grep -E '^ {4}' .logs/dry | tail -n 30
    fail "check.sh's prebuilt mode on the emulator's bundle (exit $rc)"
fi
for log in check.log check-steps.log; do
    [ -s ".logs/out/$log" ] || fail "check.sh left no $log under \$OUT"
done
[ $status -eq 0 ] && echo "logs under \$OUT: $(cd .logs/out && echo *)"
echo "t_82: $(($(date +%s) - t0)) s"
exit $status
