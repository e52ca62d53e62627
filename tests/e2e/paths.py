"""Where the private containerds are (the product's node_check.paths), and which of them the
e2e tests run on."""

from __future__ import annotations

import os

from nri_cdi_testbed.node_check.paths import (
    DEFAULT_RUNTIME,
    INSTALL_SCRIPT,
    REPO,
    RUNTIMES,
    bin_dir,
    busybox,
    cache_dir,
    missing_prerequisites,
)

__all__ = ["DEFAULT_RUNTIME", "INSTALL_SCRIPT", "REPO", "RUNTIMES", "bin_dir", "busybox",
           "cache_dir", "missing_prerequisites", "runtimes"]


def runtimes() -> list[str]:
    """The versions to run the e2e tests on: all of RUNTIMES, or the comma-separated list
    in $NRI_CDI_E2E_RUNTIMES (a developer's shortcut, ignored when $CI is set: CI runs
    every version)."""
    chosen = "" if os.environ.get("CI") else os.environ.get("NRI_CDI_E2E_RUNTIMES", "")
    wanted = [v.strip() for v in chosen.split(",") if v.strip()] or list(RUNTIMES)
    unknown = [v for v in wanted if v not in RUNTIMES]
    if unknown:
        raise ValueError(f"NRI_CDI_E2E_RUNTIMES: unknown containerd version(s) {unknown}, "
                         f"known: {sorted(RUNTIMES)}")
    return wanted

