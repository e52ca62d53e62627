#!/usr/bin/env bash
# Installs what nri-cdi and its tests need on a Debian bookworm machine (idempotent):
# the Debian tools the simulated GPU node is built with, and the Python packages.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
# systemd-analyze: the unit tests verify our systemd units with it. aarch64-linux-gnu-gcc:
# the arm64 tests' probes and the simulated node built for aarch64 (tests/arm64.py).
for tool in gcc:gcc ldconfig:libc-bin readelf:binutils systemd-analyze:systemd \
    aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || need_apt+=("${tool##*:}")
done
[ -e /usr/include/dirent.h ] || need_apt+=(libc6-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m pip install -q -e '.[test,docs]'
