#!/bin/sh
# Build the SparSEEty eBPF object next to this script:
#   vmlinux.h        from the running kernel's BTF (git-ignored)
#   sparseety.bpf.o  CO-RE object loaded by loader.py (git-ignored)
# Needs: clang, bpftool, libbpf-dev (Debian: apt-get install -y clang llvm libbpf-dev bpftool).
# Usage: sh build.sh [--force]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
btf=${BTF:-/sys/kernel/btf/vmlinux}
clang=${CLANG:-clang}
bpftool=${BPFTOOL:-bpftool}
out="$here/sparseety.bpf.o"
src="$here/sparseety.bpf.c"

if [ "${1:-}" != "--force" ] && [ -f "$out" ] && [ "$out" -nt "$src" ]; then
    echo "up to date: $out"
    exit 0
fi
command -v "$clang" >/dev/null || { echo "build.sh: clang not found (apt-get install -y clang llvm)" >&2; exit 1; }
[ -r /usr/include/bpf/bpf_helpers.h ] || { echo "build.sh: bpf/bpf_helpers.h not found (apt-get install -y libbpf-dev)" >&2; exit 1; }
if [ ! -s "$here/vmlinux.h" ] || [ "${1:-}" = "--force" ]; then
    [ -r "$btf" ] || { echo "build.sh: kernel has no BTF ($btf missing)" >&2; exit 1; }
    command -v "$bpftool" >/dev/null || { echo "build.sh: bpftool not found (apt-get install -y bpftool)" >&2; exit 1; }
    "$bpftool" btf dump file "$btf" format c > "$here/vmlinux.h.tmp"
    mv "$here/vmlinux.h.tmp" "$here/vmlinux.h"
fi
arch=$(uname -m | sed -e 's/x86_64/x86/' -e 's/aarch64/arm64/')
"$clang" -target bpf -O2 -g -Wall -Werror -D__TARGET_ARCH_"$arch" \
    -I"$here" -c "$src" -o "$out.tmp"
mv "$out.tmp" "$out"
echo "built $out"
