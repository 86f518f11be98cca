#!/usr/bin/env bash
# Installs what SparSEEty's tests, benchmarks and eBPF backend need, skipping
# what is already there. Idempotent; run as root (CI and the dev machines are).
#   scripts/install-deps.sh           # everything for tests and benchmarks + the package, editable
#   scripts/install-deps.sh --runtime # only what running it needs (build the eBPF object, libbpf)
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"

need_apt=()
if [ "$mode" != "--runtime" ]; then
  command -v systemd-analyze >/dev/null || need_apt+=(systemd)
  command -v tshark >/dev/null || need_apt+=(tshark)
  command -v dumpcap >/dev/null || need_apt+=(wireshark-common)
  ldconfig -p | grep -q 'libpcap.so.0.8' || need_apt+=(libpcap0.8)
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)  # store tests
  command -v prometheus >/dev/null || need_apt+=(prometheus)  # dashboard and rules tests (promtool too)
  command -v tmux >/dev/null || need_apt+=(tmux)  # 'sparseety top' driven as a person would
  command -v chromium >/dev/null || need_apt+=(chromium)  # the HTML reports, rendered headless
fi
command -v clang >/dev/null || need_apt+=(clang llvm)
command -v bpftool >/dev/null || need_apt+=(bpftool)
[ -e /usr/include/bpf/libbpf.h ] || need_apt+=(libbpf-dev)
ldconfig -p | grep -q 'libbpf.so.1' || need_apt+=(libbpf1)

if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "install-deps: apt-get install ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    echo 'wireshark-common wireshark-common/install-setuid boolean false' | debconf-set-selections 2>/dev/null || true
    # The postgresql package must not start a system cluster (tests start their own).
    mkdir -p /etc/postgresql-common
    [ -e /etc/postgresql-common/createcluster.conf ] || echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "install-deps: missing Debian packages (${need_apt[*]}); run as root to install them" >&2
  fi
fi

if [ "$mode" != "--runtime" ]; then
  # torch first and pinned (the CPU build): diff --reference-model and its tests
  # need it, and nothing installed after it may pull another torch.
  python3 -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null \
    || python3 -m pip install -q --disable-pip-version-check 'torch==2.13.0'
  python3 -m pip install -q --disable-pip-version-check -e '.[test,reference]'
fi
