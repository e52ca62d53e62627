"""``disable-device-node-modification``: the params rewrite (table), and the hook itself in a
private mount namespace (``unshare -m``, as runc runs createContainer hooks in the
container's): the container's ``/proc/driver/nvidia/params`` reads ``ModifyDeviceFiles: 0``
and is read-only, while the host's file is untouched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cdi.hooks.entry import ENTRY_SCRIPT, HOOK_ENV
from cdi.nvidia.hooks.device_params import modified_params
from tests.hooks.conftest import make_bundle

PARAMS = "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n"


@pytest.mark.parametrize(("text", "expected"), [
    (PARAMS, PARAMS.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0")),
    (PARAMS.replace(": 1", ": 0"), None),  # already off
    ("DeviceFileUID: 0\n", None),  # no such line
    ("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0\n"),  # no final newline
    ("ModifyDeviceFiles: 2\n", None),  # a value we do not know: left alone, as NVIDIA's
])
def test_rewrite(text: str, expected: str | None) -> None:
    assert modified_params(text) == expected


def _in_private_namespace(tmp_path: Path, root: Path,
                          host: Path) -> subprocess.CompletedProcess[str]:
    """The hook, then a read and a write attempt, all inside one private mount namespace."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    state = make_bundle(tmp_path, root)
    target = root / "proc/driver/nvidia/params"
    script = (f"{sys.executable} -I -S {ENTRY_SCRIPT} disable-device-node-modification "
              f"--host-params {host} <&3 && cat {target} && "
              f"(echo x > {target} && echo WRITABLE || echo READONLY)")
    (tmp_path / "state.json").write_bytes(state)
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"exec 3<{tmp_path / 'state.json'}; {script}"],
        env=dict(e.split("=", 1) for e in HOOK_ENV), capture_output=True, text=True,
        check=False)


def test_mounted_over_the_container_params(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/params").write_text("as the image had it\n")
    host = tmp_path / "host-params"
    host.write_text(PARAMS)
    proc = _in_private_namespace(tmp_path, root, host)
    if "mount API" in proc.stderr:
        pytest.skip(proc.stderr)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "ModifyDeviceFiles: 0" in lines and "ResmanDebugLevel: 4294967295" in lines
    assert lines[-1] == "READONLY"
    # Outside that namespace nothing changed, and nothing was created in the root.
    assert (root / "proc/driver/nvidia/params").read_text() == "as the image had it\n"
    assert sorted(p.name for p in root.rglob("*")) == ["driver", "nvidia", "params", "proc"]


def test_nothing_to_do(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/params").write_text("mine\n")
    host = tmp_path / "host-params"
    host.write_text(PARAMS.replace(": 1", ": 0"))
    proc = _in_private_namespace(tmp_path, root, host)
    assert proc.returncode == 0 and proc.stdout.splitlines()[0] == "mine", proc.stderr
    # A container without the file (no driver on this host) or no host file: no-op, exit 0.
    host.unlink()
    assert _in_private_namespace(tmp_path, root, host).returncode == 0
    shutil.rmtree(root / "proc")
    host.write_text(PARAMS)
    proc = _in_private_namespace(tmp_path, root, host)
    assert "No such file" in proc.stderr and not (root / "proc").exists()  # cat fails, hook not


def test_params_planted_as_a_link_to_the_host_stays_inside(tmp_path: Path) -> None:
    """An image whose /proc/driver/nvidia/params is a link to a host path gets the mount on
    its own file (resolved inside the root), never on the host's."""
    root = tmp_path / "rootfs"
    (root / "proc/driver/nvidia").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("host file\n")
    (root / str(victim).lstrip("/")).parent.mkdir(parents=True)
    (root / str(victim).lstrip("/")).write_text("container file\n")
    os.symlink(str(victim), root / "proc/driver/nvidia/params")
    host = tmp_path / "host-params"
    host.write_text(PARAMS)
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1)")
    state = make_bundle(tmp_path, root)
    (tmp_path / "state.json").write_bytes(state)
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"{sys.executable} -I -S {ENTRY_SCRIPT} disable-device-node-modification "
         f"--host-params {host} < {tmp_path / 'state.json'} && cat {victim} && "
         f"cat {root / str(victim).lstrip('/')}"],
        capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "host file"
    assert "ModifyDeviceFiles: 0" in proc.stdout
