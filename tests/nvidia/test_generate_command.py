"""``nri-cdi generate`` as a person types it: the console script's entry
(``nri_plugin.ops.cli:entry``), whole process, imports only what generate needs.

Its speed is measured in bench/bench_generate_cli.py (against nvidia-ctk); here, what it
must not load: the other subcommands' modules, the plugin runtime, protobuf, asyncio,
jsonschema, and nvidia-ml-py outside nvml mode.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cdi.spec import parse_spec
from nri_cdi_testbed.simnode import BuiltNode, NodeLayout

REPO = Path(__file__).resolve().parents[2]
needs_nodes = pytest.mark.skipif(os.geteuid() != 0, reason="needs real device nodes (root)")

NEVER = ("asyncio", "google.protobuf", "jsonschema", "secrets",
         "nri_plugin.nri", "nri_plugin.plugins", "nri_plugin.vendors",
         "nri_plugin.ops.daemon", "nri_plugin.ops.doctor", "nri_plugin.ops.refresh",
         "nri_plugin.ops.settings", "nri_plugin.ops.units", "cdi.cli", "cdi.hooks.cli")
# What the console script runs (pip writes this for ``nri-cdi = nri_plugin.ops.cli:entry``),
# then the modules it loaded, from an exit hook: ``entry`` ends the process itself. What
# the interpreter had loaded before (site's start-up files on this machine) is not counted.
PROBE = """
import atexit, json, sys
before = set(sys.modules)
atexit.register(lambda: print(json.dumps(sorted(set(sys.modules) - before)), file=sys.stderr))
sys.argv[0] = "nri-cdi"
from nri_plugin.ops.cli import entry
entry()
"""


@pytest.fixture(scope="module")
def node(node_factory: Callable[[str, NodeLayout], BuiltNode]) -> BuiltNode:
    return node_factory("command-node", NodeLayout.uniform(2, mig={1: "3g.40gb"},
                                                           seed="command-node"))


def loaded(node: BuiltNode, tmp_path: Path, mode: str) -> set[str]:
    target = tmp_path / f"{mode}.yaml"
    argv = ["generate", "--driver-root", str(node.driver_root), "--mode", mode,
            "--output", str(target)]
    # -S with site-packages on the path, their .pth files not run: the modules a console
    # script in a clean virtual environment starts with (no editable-install finders).
    path = os.pathsep.join([str(REPO), *site.getsitepackages()])
    proc = subprocess.run([sys.executable, "-S", "-c", PROBE, *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": path})
    assert proc.returncode == 0, proc.stderr
    parse_spec(target.read_text(), str(target))
    return set(json.loads(proc.stderr.splitlines()[-1]))


def under(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


@needs_nodes
def test_procfs_mode_loads_only_the_generator(node: BuiltNode, tmp_path: Path) -> None:
    modules = loaded(node, tmp_path, "procfs")
    assert "cdi.nvidia.generate" in modules  # the probe sees what ran
    assert under(modules, (*NEVER, "pynvml", "ctypes")) == []


@needs_nodes
def test_nvml_mode_adds_nvidia_ml_py_and_nothing_else_heavy(node: BuiltNode,
                                                            tmp_path: Path) -> None:
    pytest.importorskip("pynvml")
    modules = loaded(node, tmp_path, "nvml")
    assert "pynvml" in modules
    assert under(modules, NEVER) == []

