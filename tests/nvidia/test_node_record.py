"""A spec regenerated from a record of a node, compared with the spec generated on it.

``nri-cdi doctor --e2e --record-node FILE`` records what the generator reads on a node
(``nri_cdi_testbed.node_record``); ``rebuild`` makes roots that answer as the node did. On a
simulated node the round trip must give the same spec as the node itself. A real node's
record (tests/data/real-node-*/node-record.json) must regenerate the spec recorded there.

The five real-node records made before ``--record-node`` existed cannot be regenerated:
node.txt lists the driver root's files on three of them but not the firmware files the
specs mount, nor any ELF SONAME, nor where the ld cache's /lib entries lead, nor /sys; the
second and third H200 records have no file list at all. ``WITHOUT_RECORD`` names them, so a
new record without ``node-record.json`` fails here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from nri_cdi_testbed.node_record import rebuild, record
from nri_cdi_testbed.simnode import BuiltNode, NodeLayout
from tests.nvidia.conftest import CAN_MKNOD, HAVE_GCC

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
ROOT = "/@ROOT@"
WITHOUT_RECORD = {"real-node-h100-580.159.04", "real-node-h100-580.159.04-second",
                  "real-node-h200-580.159.04", "real-node-h200-580.159.04-second",
                  "real-node-h200-580.159.04-third"}
pytestmark = pytest.mark.skipif(not (CAN_MKNOD and HAVE_GCC and shutil.which("ldconfig")),
                                reason="rebuilding a node needs root (mknod), gcc and ldconfig")


def generate(driver: Path, dev: Path, *options: str) -> str:
    """The spec, both roots written ROOT, without the fingerprint (a digest of the paths)."""
    proc = subprocess.run(
        [sys.executable, "-m", "cdi.nvidia.cli", "--mode", "procfs", "--driver-root",
         str(driver), "--dev-root", str(dev), *options],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for root in sorted({os.fspath(driver), os.fspath(dev)}, key=len, reverse=True):
        text = text.replace(root, ROOT)
    return "".join(line for line in text.splitlines(keepends=True)
                   if not line.startswith("# fingerprint:"))


@pytest.fixture(scope="module")
def node(node_factory: Callable[[str, NodeLayout], BuiltNode]) -> BuiltNode:
    return node_factory("record-node", NodeLayout.uniform(
        2, mig={1: "3g.40gb,2g.20gb"}, seed="record", mps_pipe_dir=True))


@pytest.mark.parametrize("link", ["hooks", "mounts"])
def test_a_rebuilt_node_gives_the_same_spec(node: BuiltNode, tmp_path: Path, link: str) -> None:
    doc = json.loads(json.dumps(record(node.driver_root, node.dev_root)))  # as written
    driver, dev = rebuild(doc, tmp_path)
    options = ("--link-mode", link)
    original = generate(node.driver_root, node.dev_root, *options)
    assert "/dev/nvidia-caps/" in original and "libcuda.so" in original
    assert generate(driver, dev, *options) == original


def test_a_missing_file_shows(node: BuiltNode, tmp_path: Path) -> None:
    """The comparison sees a driver file the record lacks."""
    doc = record(node.driver_root, node.dev_root)
    (name,) = [p for p in doc["driver_files"] if p.endswith("/nvidia-smi")]
    del doc["driver_files"][name]
    driver, dev = rebuild(doc, tmp_path)
    assert generate(driver, dev) != generate(node.driver_root, node.dev_root)


RECORDED = sorted(DATA.glob("real-node-*/node-record.json"))


def test_which_real_nodes_have_a_record() -> None:
    nodes = {p.name for p in DATA.glob("real-node-*")}
    assert nodes - {p.parent.name for p in RECORDED} == WITHOUT_RECORD


@pytest.mark.parametrize("path", RECORDED, ids=[p.parent.name for p in RECORDED])
@pytest.mark.parametrize("link", ["hooks", "mounts"])
def test_a_real_node_regenerates_its_spec(path: Path, link: str, tmp_path: Path) -> None:
    """The record's node, rebuilt, gives the spec recorded beside it (made with
    ``--mode procfs --link-mode LINK --cdi-version 0.6.0`` and the default hook program)."""
    driver, dev = rebuild(json.loads(path.read_text()), tmp_path)
    ours = generate(driver, dev, "--link-mode", link, "--cdi-version", "0.6.0")
    recorded = (path.parent / f"spec-procfs-{link}.yaml").read_text()
    recorded = "".join(line for line in recorded.splitlines(keepends=True)
                       if not line.startswith("# fingerprint:"))
    assert ours == recorded.replace("hostPath: /", f"hostPath: {ROOT}/")


def test_doctor_e2e_writes_the_record(node: BuiltNode, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``doctor --e2e --record-node FILE`` writes the record before the end-to-end run
    (which is replaced here: it needs a containerd)."""
    from nri_cdi_testbed.node_check import check
    from nri_plugin.ops import doctor
    from nri_plugin.ops.cli import build_parser

    ran: list[check.Options] = []

    def e2e(opts: check.Options) -> check.Report:
        ran.append(opts)
        return check.Report()

    monkeypatch.setattr(check, "run", e2e)
    out = tmp_path / "node-record.json"
    args = build_parser("doctor").parse_args(
        ["doctor", "--e2e", "--driver-root", str(node.driver_root), "--record-node", str(out)])
    assert doctor.cmd_doctor(args) == 0
    assert [opts.driver_root for opts in ran] == [node.driver_root]
    doc = json.loads(out.read_text())
    assert any(p.endswith("/libcuda.so.1") for p in doc["driver_files"])
    assert doc["ld.so.cache"]


def test_doctor_refuses_to_record_a_simulated_node(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from nri_plugin.ops import doctor
    from nri_plugin.ops.cli import build_parser

    args = build_parser("doctor").parse_args(
        ["doctor", "--e2e", "--simulated", "--record-node", str(tmp_path / "x.json")])
    assert doctor.cmd_doctor(args) == 2
    assert "--record-node records a real node" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
