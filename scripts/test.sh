#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what the tests need (Python packages, the
# Debian tools, private containerds, NVIDIA's Debian driver for amd64 and arm64 and Docker,
# qemu-aarch64 and an arm64 root, the image roots; all cached under .cache/), lints (ruff,
# mypy --strict), builds the documentation site (mkdocs --strict: broken links and anchors
# fail), then runs pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/cdi -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -f scripts/install-containerd.sh ]; then
    bash scripts/install-containerd.sh
fi
# NVIDIA's real driver as Debian ships it, and Docker 28.5 (tests/nvidia, tests/e2e).
bash scripts/install-nvidia-debian.sh
# arm64 under qemu (tests/arm64.py): qemu-aarch64 and an arm64 root, NVIDIA's arm64 driver.
# Registering qemu with binfmt_misc is left to the tests (tests/e2e/binfmt.py).
bash scripts/install-arm64.sh
bash scripts/install-nvidia-debian.sh --arch arm64
# The Debian roots and wheels the DaemonSet test builds the nri-cdi images from (amd64, arm64).
bash scripts/install-image-root.sh
# The real Helm for the chart's tests (tests/ops/test_helm_chart.py).
bash scripts/install-helm.sh
python3 -m ruff check .
python3 -m mypy  # --strict on cdi/ and nri_plugin/ (pyproject.toml [tool.mypy])
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 python3 -m mkdocs build --strict --quiet --site-dir "$site"
rm -rf "$site"
python3 -m pytest "$@"
