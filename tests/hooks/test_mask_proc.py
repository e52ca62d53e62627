"""``mask-proc`` on real mounts: a private mount namespace (unshare -m), a real procfs at
the container's /proc, and the simulated driver's procfs copy as the source."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cdi.nvidia.hooks.mask_proc import procfs_bus_names

REPO = Path(__file__).resolve().parents[2]


def test_bus_names() -> None:
    assert procfs_bus_names("00000000:18:00.0") == ["00000000:18:00.0", "0000:18:00.0"]
    assert procfs_bus_names("0000:2A:00.0") == ["0000:2a:00.0"]


SCRIPT = r"""
set -e
mount --make-rprivate /
mount -t proc proc "$ROOT/proc"
"$PY" -c "
import sys
from cdi.hooks.rootfs import RootFSError
from cdi.nvidia.hooks.mask_proc import mask_proc
try:
    print(mask_proc(sys.argv[1], sys.argv[3:], sys.argv[2]))
except RootFSError as exc:
    print('error:', exc)
" "$ROOT" "$SRC" $GPUS
ls "$ROOT/proc/driver/nvidia/gpus" 2>/dev/null | tr '\n' ' '; echo
cat "$ROOT/proc/driver/nvidia/gpus/0000:18:00.0/information" 2>/dev/null | head -1
touch "$ROOT/proc/driver/nvidia/gpus/x" 2>/dev/null && echo writable || echo read-only
"""


def _run(tmp_path: Path, gpus: str) -> list[str]:
    if shutil.which("unshare") is None:
        pytest.skip("unshare is needed")
    src = tmp_path / "node" / "proc" / "driver" / "nvidia"
    for bus in ("0000:18:00.0", "0000:2a:00.0"):
        (src / "gpus" / bus).mkdir(parents=True, exist_ok=True)
        (src / "gpus" / bus / "information").write_text(f"Bus Location: {bus}\n")
    (tmp_path / "root" / "proc").mkdir(parents=True, exist_ok=True)
    env = {"ROOT": str(tmp_path / "root"), "SRC": str(src), "GPUS": gpus, "PY": sys.executable,
           "PYTHONPATH": str(REPO), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    done = subprocess.run(["unshare", "-m", "sh", "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=60)
    if done.returncode != 0 and "Operation not permitted" in done.stderr:
        pytest.skip("needs root (mount namespaces)")
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_only_the_given_gpu_is_listed(tmp_path: Path) -> None:
    lines = _run(tmp_path, "00000000:18:00.0")
    # No NVIDIA driver in this kernel: the hook builds driver/nvidia from the source copy.
    assert lines == ["driver", "0000:18:00.0 ", "Bus Location: 0000:18:00.0", "read-only"]


def test_no_gpu_lists_nothing(tmp_path: Path) -> None:
    assert _run(tmp_path, "") == ["driver", "", "read-only"]


def test_unknown_gpu_is_an_error(tmp_path: Path) -> None:
    assert _run(tmp_path, "0000:99:00.0")[0] == (
        f"error: GPU 0000:99:00.0: no folder for it under "
        f"{tmp_path}/node/proc/driver/nvidia/gpus")
