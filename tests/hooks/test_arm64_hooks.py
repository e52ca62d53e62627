"""The hook entry on aarch64: Debian's arm64 python3 runs it under qemu-aarch64, started
explicitly (no binfmt_misc, so this runs wherever the arm64 parts are installed:
tests/arm64.py), so every syscall the hooks make is an aarch64 one, numbered from the
generic table and laid out for that ABI; the emulator's strace (``-strace``) shows each.

* ``disable-device-node-modification`` (as tests/hooks/test_device_params.py, in a private
  mount namespace): fsopen, fsconfig, fsmount, open_tree, mount_setattr and move_mount
  succeed, and the container's params read ``ModifyDeviceFiles: 0``, read-only;
* ``create-symlinks`` and ``update-ldcache`` on NVIDIA's real arm64 libraries: every path
  resolved by openat2(RESOLVE_IN_ROOT), and the cache written is one the arm64 glibc's own
  ``ldconfig -p`` reads, libcuda.so.1 tagged AArch64.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cdi.hooks.entry import ENTRY_SCRIPT, HOOK_ENV
from tests import arm64
from tests.hooks.conftest import make_bundle
from tests.hooks.test_device_params import PARAMS

# qemu's strace line of a call and its result: "PID name(args) = result"
_CALL = r"^\d+ {name}\((?P<args>.*)\) = (?P<result>-?\d+)"


@pytest.fixture(scope="module")
def parts() -> arm64.Arm64:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    return arm64.parts()


def _hook(parts: arm64.Arm64, tmp_path: Path, root: Path, *args: str,
          then: str = "") -> subprocess.CompletedProcess[str]:
    """The arm64 hook entry on a bundle around ``root``, under the emulator's strace, then
    ``then`` (a shell command) in the same private mount namespace."""
    (tmp_path / "state.json").write_bytes(make_bundle(tmp_path, root))
    argv = parts.under_qemu([*parts.python_argv(), "-I", "-S", ENTRY_SCRIPT, *args],
                            strace=True)
    script = f'exec 3<"$1"; shift; "$@" <&3 && {then or "true"}'
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
         str(tmp_path / "state.json"), *argv],
        env=dict(e.split("=", 1) for e in HOOK_ENV), capture_output=True, text=True,
        check=False, timeout=300)


def _results(strace: str, name: str) -> list[int]:
    return [int(m["result"]) for m in re.finditer(_CALL.format(name=name), strace, re.M)]


def test_the_mount_api_on_aarch64(parts: arm64.Arm64, tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "proc/driver/nvidia").mkdir(parents=True)
    target = root / "proc/driver/nvidia/params"
    target.write_text("as the image had it\n")
    host = tmp_path / "host-params"
    host.write_text(PARAMS)
    proc = _hook(parts, tmp_path, root, "disable-device-node-modification",
                 "--host-params", str(host),
                 then=f"cat {target} && (echo x > {target} && echo WRITABLE || echo READONLY)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "ModifyDeviceFiles: 0" in lines and lines[-1] == "READONLY", proc.stdout
    assert target.read_text() == "as the image had it\n"  # outside the namespace
    trace = proc.stderr
    assert re.search(r"^\d+ uname\(", trace, re.M)  # the emulator's own strace, aarch64
    for call in ("fsopen", "fsmount"):
        assert [r for r in _results(trace, call) if r >= 0], (call, trace[-3000:])
    assert _results(trace, "mount_setattr") == [0], trace[-3000:]
    assert _results(trace, "move_mount") == [0], trace[-3000:]
    # qemu's strace has no name for these two: they show as their aarch64 numbers.
    assert "Unknown syscall 431" in trace  # fsconfig
    assert "Unknown syscall 428" in trace  # open_tree
    assert "errno=38" not in "\n".join(
        line for line in trace.splitlines()
        if re.search(r" (fsopen|fsmount|mount_setattr|move_mount|openat2)\(", line))


def test_links_and_ld_cache_of_the_real_arm64_driver(parts: arm64.Arm64,
                                                     tmp_path: Path) -> None:
    driver = arm64.driver_root()
    root = tmp_path / "rootfs"
    libs = root / "usr/lib" / arm64.TRIPLET
    (libs / "nvidia/current").mkdir(parents=True)
    (root / "etc").mkdir()
    real = "libcuda.so.550.163.01"
    shutil.copy2(driver / "usr/lib" / arm64.TRIPLET / "nvidia/current" / real,
                 libs / "nvidia/current" / real)
    proc = _hook(parts, tmp_path, root, "create-symlinks",
                 "--link", f"nvidia/current/{real}::/usr/lib/{arm64.TRIPLET}/libcuda.so.1",
                 "update-ldcache", "--folder", f"/usr/lib/{arm64.TRIPLET}/nvidia/current")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert os.readlink(libs / "libcuda.so.1") == f"nvidia/current/{real}"
    opened = re.findall(r'^\d+ openat2\(\d+,"([^"]*)",\{[^}]*RESOLVE_IN_ROOT[^}]*\},24\) = '
                        r"(-?\d+)", proc.stderr, re.M)
    assert (f"usr/lib/{arm64.TRIPLET}/nvidia/current", ) == tuple(
        {p for p, fd in opened if p.endswith("nvidia/current") and int(fd) >= 0}), opened
    # The arm64 glibc's own reader of the cache we wrote (ldconfig is static).
    listing = subprocess.run(
        parts.under_qemu([str(parts.ldconfig), "-p", "-C", str(root / "etc/ld.so.cache")]),
        capture_output=True, text=True, check=True, timeout=120).stdout
    entries = [line.strip() for line in listing.splitlines() if "libcuda.so.1" in line]
    assert entries == [f"libcuda.so.1 (libc6,AArch64) => /usr/lib/{arm64.TRIPLET}/nvidia/"
                       f"current/libcuda.so.1"], listing
