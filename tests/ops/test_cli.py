"""The top-level ``nri-cdi`` command: its version and where its documentation is."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _nri_cdi(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"})


def test_version_is_the_installed_distributions() -> None:
    done = _nri_cdi("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"nri-cdi {version('nri-cdi')}\n"


def test_help_says_where_the_documentation_is() -> None:
    done = _nri_cdi("--help")
    assert done.returncode == 0
    assert "Documentation: the docs/ folder of the nri-cdi source repository" in done.stdout
    assert "--version" in done.stdout
    for command in ("uninstall-units", "install-plugin-launcher", "uninstall-plugin-launcher"):
        assert command in done.stdout
    assert "install-launcher " not in done.stdout.replace("plugin-launcher", "")
