"""``nri-cdi system create-device-nodes`` / ``create-dev-char-symlinks`` on a private dev root
(a simulated node: real mknod'ed nodes and its own /proc/devices), and ``generate`` seeing
the nodes they made."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cdi.nvidia.devnodes import char_majors, control_node_plan
from cdi.spec import parse_spec
from nri_cdi_testbed.simnode import BuiltNode, NodeLayout
from tests.helpers import run_generate as generate

REPO = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")

PROC_DEVICES = """Character devices:
  1 mem
195 nvidia-frontend
226 drm
508 nvidia-uvm
509 nvidia-caps

Block devices:
  8 sd
259 blkext
"""


def system(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "system", *argv],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, check=False)


def test_majors_and_plan() -> None:
    majors = char_majors(PROC_DEVICES)
    assert majors["nvidia-uvm"] == 508 and "sd" not in majors and "blkext" not in majors
    plan, missing = control_node_plan(majors)
    assert plan == [("nvidiactl", 195, 255), ("nvidia-modeset", 195, 254),
                    ("nvidia-uvm", 508, 0), ("nvidia-uvm-tools", 508, 1)]
    assert not missing
    plan, missing = control_node_plan(char_majors("Character devices:\n195 nvidia\n"))
    assert [p[0] for p in plan] == ["nvidiactl", "nvidia-modeset"]
    assert missing and "nvidia-uvm: no nvidia-uvm major" in missing[0]


@pytest.fixture
def node(node_factory: Callable[[str, NodeLayout], BuiltNode]) -> BuiltNode:
    return node_factory("devnodes", NodeLayout.uniform(1, seed="devnodes"))


@needs_root
def test_missing_and_stale_nodes_are_made(node: BuiltNode) -> None:
    dev = node.dev_root / "dev"
    (dev / "nvidia-uvm").unlink()
    (dev / "nvidiactl").unlink()
    os.unlink(dev / "nvidia-uvm-tools")  # and a stale major (from before a module reload):
    os.mknod(dev / "nvidia-uvm-tools", stat.S_IFCHR | 0o600, os.makedev(500, 1))
    rc, _, err = generate(["--driver-root", str(node.driver_root), "--mode", "procfs"])
    assert rc == 0 and f"{dev / 'nvidia-uvm-tools'} is 500:1 but the loaded module says 508:1" \
        in err and "/dev/nvidia-uvm, /dev/nvidiactl" in err
    dry = system("create-device-nodes", "--control-devices", "--dev-root", str(node.dev_root),
                 "--dry-run")
    assert dry.returncode == 0 and "would create" in dry.stderr
    assert not (dev / "nvidia-uvm").exists()
    proc = system("create-device-nodes", "--control-devices", "--dev-root", str(node.dev_root))
    assert proc.returncode == 0, proc.stderr
    assert f"created {dev / 'nvidia-uvm'} (508:0)" in proc.stderr
    assert f"replaced {dev / 'nvidia-uvm-tools'} (508:1, was 500:1)" in proc.stderr
    assert "nvidia-modeset" not in proc.stderr  # present and right: kept silently
    for name, numbers in (("nvidia-uvm", (508, 0)), ("nvidia-uvm-tools", (508, 1)),
                          ("nvidiactl", (195, 255))):
        st = os.stat(dev / name)
        assert stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == numbers
    assert not [p for p in dev.iterdir() if p.name.startswith(".")]  # no temporaries left
    rc, out, err = generate(["--driver-root", str(node.driver_root), "--mode", "procfs"])
    assert rc == 0 and "missing" not in err
    nodes = {n.path: n for n in parse_spec(out).data.container_edits.device_nodes}
    assert nodes["/dev/nvidia-uvm-tools"].major == 508


@needs_root
def test_dev_char_links(node: BuiltNode) -> None:
    dev = node.dev_root / "dev"
    os.mknod(dev / "nvidia-nvswitch0", stat.S_IFCHR | 0o666, os.makedev(240, 0))  # excluded
    char = dev / "char"
    char.mkdir(exist_ok=True)
    os.symlink("../elsewhere", char / "195:0")  # a wrong link is replaced
    proc = system("create-dev-char-symlinks", "--dev-root", str(node.dev_root))
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(char / "195:0") == "../nvidia0" and os.stat(char / "195:0").st_rdev == \
        os.stat(dev / "nvidia0").st_rdev
    assert os.readlink(char / "508:0") == "../nvidia-uvm"
    assert os.readlink(char / "509:1") == "../nvidia-caps/nvidia-cap1"
    assert not (char / "240:0").exists()
    again = system("create-dev-char-symlinks", "--dev-root", str(node.dev_root))
    assert again.returncode == 0 and again.stderr == ""  # idempotent and quiet


def test_refused_options(tmp_path: Path) -> None:
    for argv, message in (
        (["create-device-nodes", "--dev-root", str(tmp_path)], "--control-devices"),
        (["create-device-nodes", "--control-devices", "--load-kernel-modules"],
         "--load-kernel-modules is not supported"),
        (["create-dev-char-symlinks", "--create-all"], "--create-all is not supported"),
        (["create-device-nodes", "--control-devices", "--dev-root", str(tmp_path / "no")],
         "is not a folder"),
    ):
        proc = system(*argv)
        assert proc.returncode != 0 and message in proc.stderr, (argv, proc.stderr)
