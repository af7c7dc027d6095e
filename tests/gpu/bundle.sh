#!/usr/bin/env bash
# Builds here what tests/gpu/check.sh needs on a GPU machine whose image has the CUDA toolkit and
# PyTorch but no MPICH, cJSON or BLIS and no package registry, and packs it into one git-ignored
# folder, bundle/ (a gzipped tar: MPICH's library alone is 40 MiB unpacked), that travels with the
# working tree. Prints the bundle's size and fails at 40 MiB or more. Inside, picotron-gpu/:
#   bin/          train, create_config (make GPU=1 for x86-64-v3, not -march=native: the GPU
#                 machine's CPU is unknown); mpiexec.hydra (mpirun, mpiexec) and hydra_pmi_proxy
#   build/tests/  the test programs check.sh runs (tests/gpu/build_test.sh's, t_30's, the
#                 harness's checkpoint comparer), so PICOTRON_BUILD=<bundle>/build finds them
#   lib/          every library these load that is neither the system set nor the GPU machine's
#                 own: MPICH, its transports (UCX and its shared-memory module, hwloc, numa, udev,
#                 Slurm's client library, which mpiexec links), cJSON, BLIS, libgomp; each taken
#                 from its Debian package (apt-get download + dpkg -x; the packages are those
#                 dpkg -S names for what ldd resolves here, at the installed versions)
#   MANIFEST      what was built from which commit with which flags, the packages and versions,
#                 the oldest glibc it runs on, and the libraries the GPU machine must provide
# Not carried:
#   the GPU machine's: the CUDA runtime, cuBLAS, cuBLASLt, NCCL (libcudart.so.13, libcublas.so.13,
#     libcublasLt.so.13, libnccl.so.2 for CUDA 13; the toolkit under /usr/local/cuda or the
#     PyTorch wheels' site-packages/nvidia/*/lib: check.sh's probe finds them and says which) and
#     the driver's libcuda.so.1;
#   the system set, in every glibc image: libc, libm, libpthread, libdl, librt, libresolv,
#     ld-linux-x86-64, libstdc++, libgcc_s.
# usage: bash tests/gpu/bundle.sh [--emulate] [--out DIR]
#   --emulate   the CPU emulator build (make GPU=emulate) instead: the same bundle for a machine
#               without a GPU, for rehearsing check.sh's prebuilt mode (tests/t_82_gpu_bundle.sh)
#   --out DIR   where the archive goes (default bundle/, or build-bundle/out-emu with --emulate)
# Builds in build-bundle/ (objects, the staged tree, the .deb files), never ./train. Exit status:
# 0 built, 77 the Debian packages cannot be had here (no registry, none cached), 1 anything else.
cd "$(dirname "$0")/../.." || exit 1
set -uo pipefail

flavour=gpu
out_dir=
while [ $# -gt 0 ]; do
    case $1 in
        --emulate) flavour=emu ;;
        --out)
            [ $# -ge 2 ] || { echo "bundle.sh: --out needs a folder"; exit 1; }
            out_dir=$2
            shift
            ;;
        *)
            echo "bundle.sh: unknown argument '$1' (usage: bash tests/gpu/bundle.sh [--emulate] [--out DIR])"
            exit 1
            ;;
    esac
    shift
done
LIMIT_MIB=40
OPT=${BUNDLE_OPT:--O2 -g -march=x86-64-v3}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
WORK=build-bundle
BUILD=$WORK/$flavour
NAME=picotron-$flavour
STAGE=$WORK/stage-$flavour/$NAME
PKGROOT=$WORK/pkgroot-$flavour
DEBS=$WORK/debs
if [ "$flavour" = gpu ]; then
    out_dir=${out_dir:-bundle}
    make_gpu=1
else
    out_dir=${out_dir:-$WORK/out-emu}
    make_gpu=emulate
fi
# sonames every image has (glibc, the C++ runtime), and those the GPU machine brings
SYSTEM_RE='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|lib(c|m|pthread|dl|rt|resolv|util)\.so\.[0-9]+|libstdc\+\+\.so\.6|libgcc_s\.so\.1)$'
GPU_RE='^lib(cudart|cublas|cublasLt|nccl|cuda)\.so\.[0-9]+$'

fail() {
    echo "bundle.sh: $1"
    [ $# -ge 2 ] && echo "    hint: $2"
    exit 1
}
start=$(date +%s)

# ---- what it needs here
[ "$(uname -m)" = x86_64 ] || fail "this is $(uname -m): the GPU machine is x86-64" \
    "build the bundle on an x86-64 machine"
for tool in mpicc make dpkg dpkg-query apt-get ldd readelf tar gzip; do
    command -v "$tool" >/dev/null || fail "$tool is missing" \
        "Debian or Ubuntu with scripts/install_deps.sh's packages (make deps) is needed"
done
if [ "$flavour" = gpu ] && [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
    fail "no nvcc in $CUDA_HOME/bin: the GPU build cannot be made here" \
        "set CUDA_HOME to the CUDA toolkit, or use --emulate for the emulator's bundle"
fi
mkdir -p "$WORK" "$DEBS" || fail "cannot create $WORK/"

# ---- build: the trainer and every test program check.sh runs, in $BUILD
targets=("$BUILD/bin/train" "$BUILD/bin/create_config" "$BUILD/tests/test_model_vs_torch"
         "$BUILD/tests/tool_compare_checkpoints")
build_log=$WORK/build-$flavour.log
if ! { make GPU=$make_gpu BUILD="$BUILD" OPT="$OPT" -j"$(nproc)" "${targets[@]}" &&
       OPT="$OPT" PICOTRON_GPU_BUILD=$BUILD bash tests/gpu/build_test.sh; } >"$build_log" 2>&1; then
    tail -n 15 "$build_log" | sed 's/^/    /'
    fail "make GPU=$make_gpu BUILD=$BUILD failed (log: $build_log)" \
        "fix the build; make GPU=$make_gpu in a copy of the tree shows the same error"
fi
echo "built with make GPU=$make_gpu OPT=\"$OPT\" in $BUILD ($(($(date +%s) - start)) s)"

# ---- stage the programs
rm -rf "$WORK/stage-$flavour" "$PKGROOT"
mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/build/tests/gpu" "$PKGROOT" || fail "cannot create $STAGE"
cp "$BUILD/bin/train" "$BUILD/bin/create_config" "$STAGE/bin/"
cp "$BUILD/tests/test_model_vs_torch" "$BUILD/tests/tool_compare_checkpoints" "$STAGE/build/tests/"
for prog in test_kernels_vs_cpu test_model_bf16 test_nccl_one_gpu; do
    cp "$BUILD/tests/gpu/$prog" "$STAGE/build/tests/gpu/" || fail "$BUILD/tests/gpu/$prog is missing"
done
mpiexec=$(readlink -f "$(command -v mpiexec.hydra)") || fail "mpiexec.hydra is missing" \
    "install MPICH (apt-get install mpich)"
proxy=$(command -v hydra_pmi_proxy) || fail "hydra_pmi_proxy is missing" "install mpich"

# ---- which libraries: ldd of everything staged, plus MPICH's launcher, resolved on this machine
declare -A lib_path=()   # soname -> where it resolves here, for the ones the bundle carries
declare -A gpu_libs=()   # sonames the GPU machine provides
scan() {   # scan ELF...: sort every library ldd names into system, GPU machine, or bundle
    local line soname path
    while read -r line; do
        case $line in
            *"=> not found"*)
                fail "${line%% *} is not found for $1 here" "install it, then run this again" ;;
            *"=>"*)
                soname=${line%% *}
                path=${line#*=> }
                path=${path%% (*}
                ;;
            *) continue ;;
        esac
        if [[ $soname =~ $SYSTEM_RE ]]; then continue; fi
        if [[ $soname =~ $GPU_RE ]]; then gpu_libs[$soname]=1; continue; fi
        lib_path[$soname]=$path
    done < <(ldd "$@" 2>&1)
}
elves=("$STAGE"/bin/* "$STAGE"/build/tests/* "$STAGE"/build/tests/gpu/* "$mpiexec" "$proxy")
for elf in "${elves[@]}"; do [ -f "$elf" ] && scan "$elf"; done

# the Debian package that owns a path here (usr-merged: /lib is /usr/lib)
owner() {
    local p=$1 real pkg
    real=$(readlink -f "$p")
    for candidate in "$real" "$p" "${real/#\/usr\/lib\//\/lib\/}" "${p/#\/lib\//\/usr\/lib\/}"; do
        pkg=$(dpkg -S "$candidate" 2>/dev/null | head -n 1 | cut -d: -f1)
        [ -n "$pkg" ] && { echo "$pkg"; return 0; }
    done
    return 1
}
declare -A packages=()
for soname in "${!lib_path[@]}"; do
    pkg=$(owner "${lib_path[$soname]}") || fail "no Debian package owns ${lib_path[$soname]} ($soname)" \
        "the bundle takes libraries from Debian packages only: install $soname with apt-get"
    packages[$pkg]=1
done
packages[$(owner "$mpiexec")]=1 # mpich: mpiexec.hydra, hydra_pmi_proxy

# ---- fetch the packages: the installed version from our cache, apt's cache or the registry; else
# the registry's current one of the same release, else the newest cached (same ABI: one soname)
deb_for() {   # deb_for PKG: the path of a .deb of PKG, fetched if need be
    local pkg=$1 version arch file newest
    version=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null) || return 1
    arch=$(dpkg-query -W -f='${Architecture}' "$pkg")
    file=${pkg}_${version//:/%3a}_$arch.deb
    if [ -f "$DEBS/$file" ]; then echo "$DEBS/$file"; return 0; fi
    if [ -f "/var/cache/apt/archives/$file" ] && cp "/var/cache/apt/archives/$file" "$DEBS/"; then
        echo "$DEBS/$file"
        return 0
    fi
    if (cd "$DEBS" && apt-get download -q "$pkg=$version") >>"$WORK/apt.log" 2>&1 &&
        [ -f "$DEBS/$file" ]; then
        echo "$DEBS/$file"
        return 0
    fi
    (cd "$DEBS" && apt-get download -q "$pkg") >>"$WORK/apt.log" 2>&1
    newest=$(find "$DEBS" /var/cache/apt/archives -maxdepth 1 -name "${pkg}_*_$arch.deb" 2>/dev/null |
        sort -V | tail -n 1)
    [ -n "$newest" ] && echo "$newest"
}
apt_updated=0
manifest_packages=()
for pkg in $(printf '%s\n' "${!packages[@]}" | sort); do
    deb=$(deb_for "$pkg")
    if [ -z "$deb" ] && [ $apt_updated -eq 0 ] && [ "$EUID" -eq 0 ]; then
        apt-get update -q >>"$WORK/apt.log" 2>&1
        apt_updated=1
        deb=$(deb_for "$pkg")
    fi
    if [ -z "$deb" ]; then
        echo "bundle.sh: cannot get the Debian package $pkg=$(dpkg-query -W -f='${Version}' "$pkg")" \
             "(not in $DEBS or /var/cache/apt/archives, and apt-get download failed: $WORK/apt.log)"
        echo "    hint: run this where apt-get reaches the Debian archive (apt-get update first)," \
             "or put the .deb into $DEBS"
        exit 77
    fi
    dpkg -x "$deb" "$PKGROOT" || fail "dpkg -x $deb failed"
    manifest_packages+=("$pkg=$(dpkg-deb -f "$deb" Version)")
done

# ---- copy each library from the unpacked packages under its soname
for soname in "${!lib_path[@]}"; do
    found=$(find "$PKGROOT" -name "$soname" \( -type f -o -type l \) | sort | head -n 1)
    [ -n "$found" ] || fail "$soname is in none of the unpacked packages" \
        "dpkg -S ${lib_path[$soname]} names its package; add it to the fetch"
    cp -L "$found" "$STAGE/lib/$soname" || fail "cannot copy $found"
done
cp "$PKGROOT/usr/bin/mpiexec.hydra" "$PKGROOT/usr/bin/hydra_pmi_proxy" "$STAGE/bin/" ||
    fail "mpiexec.hydra or hydra_pmi_proxy is not in the mpich package"
ln -s mpiexec.hydra "$STAGE/bin/mpirun"
ln -s mpiexec.hydra "$STAGE/bin/mpiexec"
# outside ELF: what ELF loads from neither the bundle nor the system set nor the GPU machine's set
outside() {
    local soname arrow path rest
    LD_LIBRARY_PATH=$PWD/$STAGE/lib ldd "$1" 2>/dev/null | while read -r soname arrow path rest; do
        [ "$arrow" = "=>" ] || continue
        [[ $soname =~ $SYSTEM_RE || $soname =~ $GPU_RE ]] && continue
        [[ $path == "$PWD/$STAGE/lib/"* ]] && continue
        echo "$soname => $path $rest"
    done
}
# UCX's loadable transports: those whose libraries are all here (cma: single-copy shared memory
# between ranks); InfiniBand's and RDMA-CM's need rdma-core, and a one-GPU machine has no HCA
ucx_modules=()
for module in "$PKGROOT"/usr/lib/x86_64-linux-gnu/ucx/libuct_*.so.0; do
    [ -e "$module" ] || continue
    if [ -z "$(outside "$module")" ]; then
        mkdir -p "$STAGE/lib/ucx"
        cp -L "$module" "$STAGE/lib/ucx/"
        ucx_modules+=("$(basename "$module")")
    fi
done

# ---- check: every program resolves inside the bundle, the system set and the GPU machine's set
bad=()
glibc_min=2.2.5 glibcxx_min=3.4
for elf in "$STAGE"/bin/* "$STAGE"/build/tests/* "$STAGE"/build/tests/gpu/* "$STAGE"/lib/*.so* \
           "$STAGE"/lib/ucx/*; do
    [ -f "$elf" ] || continue
    while read -r line; do bad+=("$(basename "$elf"): $line"); done < <(outside "$elf")
    versions=$(readelf -V "$elf" 2>/dev/null)
    need=$(grep -o 'GLIBC_[0-9][0-9.]*' <<<"$versions" | sed 's/GLIBC_//' | sort -V | tail -n 1)
    [ -n "$need" ] && glibc_min=$(printf '%s\n%s\n' "$glibc_min" "$need" | sort -V | tail -n 1)
    need=$(grep -o 'GLIBCXX_[0-9][0-9.]*' <<<"$versions" | sed 's/GLIBCXX_//' | sort -V | tail -n 1)
    [ -n "$need" ] && glibcxx_min=$(printf '%s\n%s\n' "$glibcxx_min" "$need" | sort -V | tail -n 1)
done
if [ ${#bad[@]} -gt 0 ]; then
    printf '    %s\n' "${bad[@]}"
    fail "${#bad[@]} libraries resolve outside the bundle" "add their packages to the fetch"
fi

# ---- MANIFEST, then the archive
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git status --porcelain 2>/dev/null | head -n 1)" ] && commit="$commit+changes"
nvcc_version=none
[ "$flavour" = gpu ] && nvcc_version=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
gpu_list=$(printf '%s\n' "${!gpu_libs[@]}" | sort | tr '\n' ' ')
cat >"$STAGE/MANIFEST" <<EOF
flavour=$flavour
commit=$commit
built=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -n 1 | awk '{print "glibc " $NF}')
make=make GPU=$make_gpu OPT="$OPT"
nvcc=$nvcc_version
glibc_min=$glibc_min
glibcxx_min=$glibcxx_min
packages=${manifest_packages[*]}
libraries=$(cd "$STAGE/lib" && echo *.so*)
ucx_modules=${ucx_modules[*]}
gpu_machine_libraries=${gpu_list% }
system_libraries=libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libresolv.so.2 ld-linux-x86-64.so.2 libstdc++.so.6 libgcc_s.so.1
EOF
mkdir -p "$out_dir" || fail "cannot create $out_dir"
rm -f "$out_dir/$NAME.tar.gz"
if ! { tar -C "$WORK/stage-$flavour" -cf - "$NAME" | gzip -6 >"$out_dir/$NAME.tar.gz.part" &&
       mv "$out_dir/$NAME.tar.gz.part" "$out_dir/$NAME.tar.gz"; }; then
    fail "cannot write $out_dir/$NAME.tar.gz"
fi

bytes=$(du -sb "$out_dir" | cut -f1)
unpacked=$(du -sb "$STAGE" | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
echo "packages: ${manifest_packages[*]}"
echo "libraries: $(cd "$STAGE/lib" && echo *.so*)${ucx_modules[*]:+ + ucx/${ucx_modules[*]}}"
if [ "$flavour" = gpu ]; then
    echo "not carried, from the GPU machine: ${gpu_list% } (and the driver's libcuda.so.1)"
fi
echo "needs glibc >= $glibc_min, libstdc++ >= GLIBCXX_$glibcxx_min; built from $commit"
echo "bundle: $out_dir/$NAME.tar.gz, $(mib "$bytes") MiB in $out_dir/ (limit $LIMIT_MIB MiB;" \
     "$(mib "$unpacked") MiB unpacked), $(($(date +%s) - start)) s"
if [ "$bytes" -ge $((LIMIT_MIB * 1048576)) ]; then
    fail "$out_dir/ is $(mib "$bytes") MiB, over the $LIMIT_MIB MiB limit" \
        "remove other files from $out_dir/, or carry fewer test programs"
fi
