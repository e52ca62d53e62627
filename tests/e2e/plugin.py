"""``nri-cdi plugin`` as a process (the product's node_check.plugin), and a launcher for
containerd's own plugin_path (only tests start the plugin that way)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from nri_cdi_testbed.node_check.paths import REPO
from nri_cdi_testbed.node_check.plugin import PluginProcess, annotation_policy

__all__ = ["REPO", "PluginProcess", "annotation_policy", "launcher_script"]


def launcher_script(path: Path, spec_dirs: Sequence[Path], log_path: Path) -> Path:
    """An executable for containerd's plugin_path. containerd starts it with an empty
    environment, so it names the interpreter and the code by absolute path."""
    dirs = " ".join(f"--spec-dir {d}" for d in spec_dirs)
    # Its pods ask by annotation, as PluginProcess's do.
    policy = log_path.with_name(log_path.name + ".policy.yaml")
    policy.write_text(annotation_policy(["*"]))
    path.write_text(
        "#!/bin/sh\n"
        f"PYTHONPATH={REPO} exec {sys.executable} -m nri_plugin.ops.cli plugin {dirs} "
        f"--status-dir {log_path}.status --policy {policy} --log-level debug "
        f"2>>{log_path}\n")
    path.chmod(0o755)
    return path
