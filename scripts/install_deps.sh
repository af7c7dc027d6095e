#!/usr/bin/env bash
# Installs what building and running picotron.c on the CPU needs, and only what is missing:
# gcc, make, pkg-config, MPICH (mpicc, mpirun), cJSON, and BLIS (cblas.h, libblis.so) and g++ for
# the GPU build's CPU emulator (make GPU=emulate, tests/t_81_gpu_emulated.sh); BLIS is also
# bench/bench_gemm.c's reference. ./train itself needs no BLIS: its products are
# backend/cpu/gemm.c's.
# Silent and fast when everything is present (no apt-get update then). Debian/Ubuntu only; on
# other systems it names what to install. The CUDA toolkit and NCCL for `make GPU=1` are not
# installed here.
set -uo pipefail

missing=()   # Debian package names
need_package() { [[ " ${missing[*]-} " == *" $1 "* ]] || missing+=("$1"); }

command -v gcc >/dev/null 2>&1 || need_package gcc
command -v g++ >/dev/null 2>&1 || need_package g++
command -v make >/dev/null 2>&1 || need_package make
command -v pkg-config >/dev/null 2>&1 || need_package pkg-config
command -v mpicc >/dev/null 2>&1 || need_package libmpich-dev
command -v mpirun >/dev/null 2>&1 || need_package mpich

# a library is present when a tiny program including its header links against it
links() {   # links HEADER SYMBOL LIB
    command -v gcc >/dev/null 2>&1 || return 1
    local exe
    exe=$(mktemp) || return 1
    printf '#include <%s>\nint main(void) { return (int)(long)&%s; }\n' "$1" "$2" |
        gcc -x c - -o "$exe" "$3" >/dev/null 2>&1
    local rc=$?
    rm -f "$exe"
    return $rc
}
links cjson/cJSON.h cJSON_Parse -lcjson || need_package libcjson-dev
links cblas.h cblas_sgemm -lblis || need_package libblis-dev

[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_deps: missing ${missing[*]} (Debian names); this is not Debian/Ubuntu, so" \
         "install MPICH, cJSON and BLIS with your package manager, then run make again" >&2
    exit 1
fi
sudo=()
if [ "$EUID" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install_deps: missing ${missing[*]}; run as root:" \
             "apt-get update && apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
    sudo=(sudo)
fi
echo "install_deps: installing ${missing[*]}"
as_root() { ${sudo[@]+"${sudo[@]}"} "$@"; }
as_root apt-get update -qq &&
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" || {
    echo "install_deps: apt-get could not install ${missing[*]}; install them by hand" \
         "(apt-get install ${missing[*]}) and run make again" >&2
    exit 1
}
