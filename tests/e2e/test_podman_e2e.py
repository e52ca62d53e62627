"""podman 4.3 (Debian bookworm's) as a second consumer of a generated spec.

podman resolves ``--device nvidia.com/gpu=0`` itself (its own vendored CDI library, which
reads cdiVersion up to 0.5.0), and runc runs our hooks: the dlopen program finds the
simulated driver's ``libcuda.so.1``.  Also ``nvidia.com/gpu=all``, an unknown device (fails
with podman's message), and a spec above podman's cdiVersion (what ``--cdi-version
podman-4.3`` guards against).

Nothing of the system's podman state is used: storage, run root and tmp dir are under the
test's tmp folder (``--root``, vfs) or on a fresh tmpfs mounted on /run in a private mount
namespace, one per podman command (``--runroot``, ``--tmpdir``, and /run/cdi: podman 4.3
has no spec-dir option and reads /etc/cdi and /var/run/cdi; a run root may not be longer
than 50 characters).  runc, not crun: crun refuses this
machine's hybrid cgroup layout; the ulimits are what this machine's podman needs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nri_cdi_testbed.simnode import NodeLayout, build_node
from tests import prerequisites
from tests.e2e.images import ImageConfig, image_from_tree
from tests.e2e.test_generated_spec_e2e import PROG_C
from tests.hooks.conftest import _cc, copy_glibc, host_loader

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/gpu/glibc:podman"
RUNC = shutil.which("runc") or "/usr/sbin/runc"
WRAPPER = """set -e
spec=$1; state=$2; shift 2
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/cdi
cp "$spec"/*.yaml /run/cdi/
exec podman --root "$state/root" --runroot /run/podman --tmpdir /run/libpod \
  --storage-driver vfs --cgroup-manager cgroupfs --events-backend file --runtime "$RUNC" "$@"
"""
RUN = ("run", "--rm", "--network", "none", "--ulimit", "nofile=4096:4096",
       "--ulimit", "nproc=4096:4096")


def _require() -> None:
    missing = [t for t in ("podman", "unshare", "gcc") if shutil.which(t) is None]
    if not os.path.exists(RUNC):
        missing.append("runc")
    if os.geteuid() != 0:
        missing.append("root")
    if missing:
        prerequisites.missing("e2e tests", f"podman e2e needs {', '.join(missing)} "
                              "(bash scripts/install-containerd.sh installs podman)")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    _require()
    out = tmp_path_factory.mktemp("podman")
    node = build_node(out / "node", NodeLayout.uniform(2, distro="rhel"))
    for name, extra in (("spec", ["--cdi-version", "podman-4.3"]),
                        ("spec-0.6", ["--cdi-version", "0.6.0"])):
        (out / name).mkdir()
        subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--mode",
                        "procfs", "--driver-root", str(node.driver_root), *extra,
                        "--output", str(out / name / "nvidia.yaml")],
                       check=True, cwd=REPO, capture_output=True)
    tree = out / "tree"
    ld, _ = host_loader()
    (tree / "lib64").mkdir(parents=True)
    shutil.copy2(ld, tree / "lib64/ld-linux-x86-64.so.2")
    copy_glibc(tree / "lib/x86_64-linux-gnu")
    _cc(["-o", str(tree / "prog")], PROG_C)
    archive = image_from_tree(IMAGE, tree, out / "glibc.tar", config=ImageConfig(cmd=("/prog",)))
    (out / "wrapper.sh").write_text(WRAPPER)
    world = {"out": out, "node": node.root, "state": out / "state"}
    proc = _podman(world, "spec", "load", "-i", str(archive))
    assert proc.returncode == 0, proc.stderr
    return world


def _podman(world: dict[str, Path], spec: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", str(world["out"] / "wrapper.sh"),
         str(world["out"] / spec), str(world["state"]), *args],
        env={**os.environ, "RUNC": RUNC}, capture_output=True, text=True, timeout=120,
        check=False)


def _node_id(world: dict[str, Path]) -> str:
    from nri_cdi_testbed.simnode import BuiltNode

    return str(BuiltNode.load(world["node"]).manifest["node_id"])


def test_one_gpu_with_our_hooks_under_runc(world: dict[str, Path]) -> None:
    proc = _podman(world, "spec", *RUN, "--device", "nvidia.com/gpu=0", IMAGE,
                   "sh", "-c", "/prog && ls /dev | grep nvidia | tr '\\n' ' '")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"cuda=13000 gpus=1 node={_node_id(world)}"
    assert lines[1].split() == ["nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0",
                                "nvidiactl"]


def test_all_gpus(world: dict[str, Path]) -> None:
    proc = _podman(world, "spec", *RUN, "--device", "nvidia.com/gpu=all", IMAGE,
                   "sh", "-c", "/prog && ls /dev | grep -c '^nvidia[0-9]'")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"cuda=13000 gpus=2 node={_node_id(world)}", "2"]


def test_unknown_device_fails_clearly(world: dict[str, Path]) -> None:
    proc = _podman(world, "spec", *RUN, "--device", "nvidia.com/gpu=7", IMAGE)
    assert proc.returncode != 0
    assert "unresolvable CDI devices nvidia.com/gpu=7" in proc.stderr


def test_spec_above_podmans_version_is_not_read(world: dict[str, Path]) -> None:
    """A 0.6.0 spec (--cdi-version 0.6.0 adds annotations) is invisible to podman 4.3, which
    says only "unresolvable": what --cdi-version podman-4.3 refuses to write, and generate
    warns about without it."""
    assert "cdiVersion: 0.6.0" in (world["out"] / "spec-0.6/nvidia.yaml").read_text()
    proc = _podman(world, "spec-0.6", *RUN, "--device", "nvidia.com/gpu=0", IMAGE)
    assert proc.returncode != 0 and "unresolvable CDI devices nvidia.com/gpu=0" in proc.stderr
