#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what the tests need (Python packages, the
# Debian tools, private containerds, NVIDIA's Debian driver and Docker, the image root; all
# cached under .cache/), lints (ruff, mypy --strict), builds the documentation site
# (mkdocs --strict: broken links and anchors fail), then runs pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/cdi -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -f scripts/install-containerd.sh ]; then
    bash scripts/install-containerd.sh
fi
# NVIDIA's real driver as Debian ships it, and Docker 28.5 (tests/nvidia, tests/e2e).
bash scripts/install-nvidia-debian.sh
# The Debian root and wheels the DaemonSet test builds the nri-cdi image from.
bash scripts/install-image-root.sh
python3 -m ruff check .
python3 -m mypy  # --strict on cdi/ and nri_plugin/ (pyproject.toml [tool.mypy])
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 python3 -m mkdocs build --strict --quiet --site-dir "$site"
rm -rf "$site"
python3 -m pytest "$@"
