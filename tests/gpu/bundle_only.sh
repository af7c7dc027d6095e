#!/usr/bin/env bash
# Runs a command as it would run on a machine without this one's MPICH, cJSON and BLIS: in a
# private mount namespace (unshare -m) where every file under /usr/lib, /lib and /usr/bin of the
# Debian packages a bundle carries (its MANIFEST's packages=), and of every installed package built
# from the same sources as MPICH, hwloc, UCX, BLIS and cJSON (their -dev packages, hwloc's plugins,
# UCX's tools), reads as empty (/dev/null is bound over it). The loader then fails loudly, "file
# too short", on any library that the bundle should carry but does not, and this machine's
# mpiexec, mpicc and hydra_pmi_proxy cannot run: what works inside, works with the bundle alone.
# The bundle's bin/ and lib/ go first in PATH and LD_LIBRARY_PATH.
# usage: bash tests/gpu/bundle_only.sh BUNDLE_ROOT COMMAND [ARGS...]
#   (BUNDLE_ROOT: an unpacked bundle of tests/gpu/bundle.sh, the folder holding MANIFEST)
# Exit status: the command's; 3 when the namespace cannot be made here (unshare and mount need
# root or CAP_SYS_ADMIN), with one line saying so, before the command has run.
set -uo pipefail
if [ $# -lt 2 ] || [ ! -f "$1/MANIFEST" ]; then
    echo "usage: bash tests/gpu/bundle_only.sh BUNDLE_ROOT COMMAND [ARGS...] (BUNDLE_ROOT: an" \
         "unpacked bundle of tests/gpu/bundle.sh, with its MANIFEST; got '${1:-}')"
    exit 2
fi
root=$(cd "$1" && pwd)
shift
command -v unshare >/dev/null || { echo "bundle_only.sh: unshare (util-linux) is missing"; exit 3; }

packages=()
for entry in $(sed -n 's/^packages=//p' "$root/MANIFEST"); do packages+=("${entry%%=*}"); done
[ ${#packages[@]} -gt 0 ] || { echo "bundle_only.sh: $root/MANIFEST names no packages"; exit 2; }
# the installed packages of the sources whose libraries the bundle stands in for
while read -r pkg source; do
    case $source in mpich | hwloc | ucx | blis | cjson) packages+=("$pkg") ;; esac
done < <(dpkg-query -W -f='${binary:Package} ${source:Package}\n' 2>/dev/null)
hide=$(mktemp /tmp/picotron_bundle_only.XXXXXX)
trap 'rm -f "$hide"' EXIT
for pkg in $(printf '%s\n' "${packages[@]}" | sort -u); do
    dpkg -L "$pkg" 2>/dev/null | while read -r path; do
        case $path in /usr/lib/* | /lib/* | /usr/bin/* | /bin/* | /usr/sbin/*) ;; *) continue ;; esac
        [ -f "$path" ] && [ ! -L "$path" ] && readlink -f "$path"
    done
done | sort -u >"$hide"

first=$(head -n 1 "$hide")
if ! unshare -m --propagation private mount --bind /dev/null "$first" 2>/dev/null; then
    echo "bundle_only.sh: cannot bind /dev/null over $first in a private mount namespace" \
         "(unshare -m and mount need root or CAP_SYS_ADMIN)"
    exit 3
fi
export PATH=$root/bin:$PATH
export LD_LIBRARY_PATH=$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
BUNDLE_ONLY_HIDDEN=$(wc -l <"$hide") # for the command to quote
export BUNDLE_ONLY_HIDDEN
# shellcheck disable=SC2016
unshare -m --propagation private bash -c '
    while read -r path; do
        mount --bind /dev/null "$path" || exit 3
    done <"$1"
    shift
    exec "$@"' bash "$hide" "$@"
