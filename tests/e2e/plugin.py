"""``nri-cdi plugin`` as a process (the product's node_check.plugin), and a launcher for
containerd's own plugin_path (only tests start the plugin that way)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from nri_cdi_testbed.node_check.paths import REPO
from nri_cdi_testbed.node_check.plugin import PluginProcess

__all__ = ["REPO", "PluginProcess", "launcher_script"]


def launcher_script(path: Path, spec_dirs: Sequence[Path], log_path: Path) -> Path:
    """An executable for containerd's plugin_path. containerd starts it with an empty
    environment, so it names the interpreter and the code by absolute path."""
    dirs = " ".join(f"--spec-dir {d}" for d in spec_dirs)
    path.write_text(
        "#!/bin/sh\n"
        f"PYTHONPATH={REPO} exec {sys.executable} -m nri_plugin.ops.cli plugin {dirs} "
        f"--status-dir {log_path}.status --log-level debug 2>>{log_path}\n")
    path.chmod(0o755)
    return path
