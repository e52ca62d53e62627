"""``mask-proc``: the container sees only its own GPUs under ``/proc/driver/nvidia/gpus``
(policy ``procMasking``; docs/usage/policy.md). A hook, as runc refuses any mount inside
``/proc``; it runs in the container's mount namespace before pivot_root. A read-only tmpfs
goes over the container's ``/proc/driver/nvidia/gpus`` and each of its GPUs gets its folder
back, bound read-only. Without an NVIDIA driver in this kernel (a simulated node) the tmpfs
goes over ``driver`` and ``nvidia/gpus/<bus id>`` is built in it from ``--proc-root``.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from types import SimpleNamespace

from cdi.hooks.rootfs import RootFS, RootFSError, libc

PROC_ROOT = "/proc/driver/nvidia"
PROC_SUPER_MAGIC = 0x9FA0
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
_SAFE = MS_NOSUID | MS_NODEV | MS_NOEXEC


class _Statfs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 120)]


def _fs_type(fd: int) -> int:
    buf = _Statfs()
    if libc().fstatfs(fd, ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(buf.f_type)


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    enc = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    if libc().mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]) != 0:
        err = ctypes.get_errno()
        raise RootFSError(f"mount {target}: {os.strerror(err)}")


def procfs_bus_names(bus: str) -> list[str]:
    """Folder names a bus id may have under ``gpus/``: as given (lower case), then with the
    4-digit domain procfs uses (NVML gives 8 digits)."""
    bus = bus.lower()
    names = [bus]
    domain, sep, rest = bus.partition(":")
    if sep and len(domain) == 8 and domain.startswith("0000"):
        names.append(f"{domain[4:]}:{rest}")
    return names


def _source(proc_root: str, bus: str) -> str:
    for name in procfs_bus_names(bus):
        path = os.path.join(proc_root, "gpus", name)
        if os.path.isdir(path):
            return path
    raise RootFSError(f"GPU {bus}: no folder for it under {proc_root}/gpus")


def run(root: RootFS, args: SimpleNamespace) -> list[str]:
    mask_proc(root.path, args.gpu, args.proc_root or PROC_ROOT)
    return []


def mask_proc(root: str, gpus: Sequence[str], proc_root: str = PROC_ROOT) -> str:
    """Mask the container at ``root`` (host path of its root folder, in its mount
    namespace); returns which folder was covered."""
    sources = [(procfs_bus_names(b)[-1], _source(proc_root, b)) for b in gpus]
    try:
        proc = os.open(os.path.join(root, "proc"), os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise RootFSError(f"{root}/proc: {exc.strerror}") from None
    try:
        if _fs_type(proc) != PROC_SUPER_MAGIC:
            raise RootFSError(f"{root}/proc is not a procfs mount")
        real = _open_dir(proc, "driver/nvidia/gpus")
        fd = real if real is not None else _open_dir(proc, "driver")
        if fd is None:
            raise RootFSError(f"{root}/proc has no driver folder")
        try:
            target = f"/proc/self/fd/{fd}"
            _mount("tmpfs", target, "tmpfs", _SAFE, "mode=0755,size=64k")
            # The new tmpfs is reached again through the path: the descriptor still names
            # the folder underneath it.
            mounted = os.path.realpath(target)
            gpus_dir = mounted
            if real is None:
                os.mkdir(os.path.join(mounted, "nvidia"), 0o555)
                gpus_dir = os.path.join(mounted, "nvidia", "gpus")
                os.mkdir(gpus_dir, 0o555)
            for name, source in sources:  # each GPU's folder back, read-only
                folder = os.path.join(gpus_dir, name)
                os.mkdir(folder, 0o555)
                _mount(source, folder, None, MS_BIND | MS_REC)
                _mount(None, folder, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _SAFE)
            os.chmod(mounted, 0o555)
            _mount(None, mounted, None, MS_REMOUNT | MS_RDONLY | _SAFE)
        finally:
            os.close(fd)
        return "driver/nvidia/gpus" if real is not None else "driver"
    finally:
        os.close(proc)


def _open_dir(parent: int, path: str) -> int | None:
    try:
        return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    except FileNotFoundError:
        return None
