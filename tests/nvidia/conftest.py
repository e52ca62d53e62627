"""Shared fixtures: simulated nodes (built once per module) and the pynvml double."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from nri_cdi_testbed.simnode import BuiltNode, NodeLayout, build_node
from nri_cdi_testbed.tegra import BuiltTegraNode, TegraLayout, build_tegra_node

FAKE_PYNVML = Path(__file__).resolve().parents[1] / "fake_pynvml" / "pynvml.py"

HAVE_GCC = shutil.which("gcc") is not None
needs_gcc = pytest.mark.skipif(not HAVE_GCC, reason="gcc is needed to build ELF objects")


def _can_mknod() -> bool:
    return os.geteuid() == 0  # CAP_MKNOD in practice; a failure shows as SimNodeError


CAN_MKNOD = _can_mknod()


def _gcc_m32_works(tmp: Path) -> bool:
    if not HAVE_GCC:
        return False
    src = tmp / "m32.c"
    src.write_text("int f(void) { return 1; }\n")
    proc = subprocess.run(
        ["gcc", "-m32", "-nostdlib", "-shared", "-fPIC", "-o", str(tmp / "m32.so"), str(src)],
        capture_output=True,
    )
    return proc.returncode == 0


@pytest.fixture(scope="session")
def simnode_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Compiled-object cache shared by every node in the session ($SIMNODE_CACHE wins)."""
    env = os.environ.get("SIMNODE_CACHE")
    return Path(env) if env else tmp_path_factory.mktemp("simnode-cache")


@pytest.fixture(scope="session")
def gcc_m32(tmp_path_factory: pytest.TempPathFactory) -> bool:
    return _gcc_m32_works(tmp_path_factory.mktemp("m32"))


NodeFactory = Callable[[str, NodeLayout], BuiltNode]


@pytest.fixture(scope="session")
def node_factory(tmp_path_factory: pytest.TempPathFactory, simnode_cache: Path) -> NodeFactory:
    """``node_factory(name, layout)`` builds a node in a fresh folder (no mknod unless root)."""

    def make(name: str, layout: NodeLayout) -> BuiltNode:
        if not HAVE_GCC:
            pytest.skip("gcc is needed to build a simulated node")
        if not CAN_MKNOD and layout.device_nodes:
            layout = replace(layout, device_nodes=False)
        return build_node(tmp_path_factory.mktemp(name) / "node", layout, cache_dir=simnode_cache)

    return make


# The 8-GPU node used by several modules: MIG on GPUs 0 and 3, minors not equal to indices.
EIGHT_GPU_LAYOUT = NodeLayout.uniform(
    8,
    mig={0: "1g.10gb*7", 3: "3g.40gb,2g.20gb+gfx"},
    minors=[0, 1, 2, 3, 7, 6, 5, 4],
    seed="eight",
)


@pytest.fixture(scope="session")
def node8(node_factory: NodeFactory) -> BuiltNode:
    """8 GPUs; MIG on GPU 0 (7 x 1g.10gb) and GPU 3 (3g.40gb + 2g.20gb+gfx); minors permuted."""
    return node_factory("node8", EIGHT_GPU_LAYOUT)


@pytest.fixture(scope="session")
def can_mknod() -> bool:
    return CAN_MKNOD


@pytest.fixture
def fake_pynvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """A fresh copy of the double, installed as ``pynvml`` for the duration of one test."""
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_PYNVML)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before running it: dataclasses look their module up in sys.modules.
    monkeypatch.setitem(sys.modules, "pynvml", module)
    spec.loader.exec_module(module)
    monkeypatch.delenv("FAKE_PYNVML_MANIFEST", raising=False)
    monkeypatch.delenv("FAKE_PYNVML_LOAD_LIBRARY", raising=False)
    yield module


TegraFactory = Callable[[str, TegraLayout], BuiltTegraNode]


@pytest.fixture(scope="session")
def tegra_factory(tmp_path_factory: pytest.TempPathFactory,
                  simnode_cache: Path) -> TegraFactory:
    """``tegra_factory(name, layout)`` builds a simulated Jetson in a fresh folder; skipped
    without gcc, or without root (its device nodes are what a CSV spec is made of)."""
    built: dict[TegraLayout, BuiltTegraNode] = {}

    def make(name: str, layout: TegraLayout) -> BuiltTegraNode:
        if not HAVE_GCC:
            pytest.skip("gcc is needed to build a simulated Jetson")
        if not CAN_MKNOD:
            pytest.skip("a simulated Jetson needs real device nodes (root)")
        if layout not in built:
            built[layout] = build_tegra_node(tmp_path_factory.mktemp(name) / "node", layout,
                                             cache_dir=simnode_cache)
        return built[layout]

    return make
