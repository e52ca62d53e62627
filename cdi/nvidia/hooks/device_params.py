"""``disable-device-node-modification``: the container sees ``ModifyDeviceFiles: 0``.

With ``ModifyDeviceFiles: 1`` in ``/proc/driver/nvidia/params`` (the driver's default),
``libnvidia-ml`` and ``nvidia-smi`` in a container try to create ``/dev/nvidia*`` nodes.
As NVIDIA's hook of the same name, the host's params are copied with ``0`` and mounted
read-only over the container's (a hook: runc refuses mounts inside ``/proc``); unlike it,
through the new mount API (Linux 5.12), onto the descriptor :class:`~cdi.hooks.rootfs.RootFS`
resolved (docs/developer/hook-safety.md §3). Without that API nothing is done.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
from types import SimpleNamespace

from cdi.hooks.rootfs import RootFS, RootFSError, syscall

PARAMS = "/proc/driver/nvidia/params"
_MAX_PARAMS = 64 << 10
# Syscall numbers: the same on x86_64 and on the generic table aarch64 uses.
_OPEN_TREE, _MOVE_MOUNT, _FSOPEN, _FSCONFIG, _FSMOUNT, _MOUNT_SETATTR = (
    428, 429, 430, 431, 432, 442)
_FSOPEN_CLOEXEC = 0x1
_FSCONFIG_SET_STRING = 1
_FSCONFIG_CMD_CREATE = 6
_FSMOUNT_CLOEXEC = 0x1
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV, _MOUNT_ATTR_NOEXEC = 0x1, 0x2, 0x4, 0x8
_OPEN_TREE_CLONE = 0x1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_AT_EMPTY_PATH = 0x1000
_MOVE_MOUNT_F_EMPTY_PATH, _MOVE_MOUNT_T_EMPTY_PATH = 0x4, 0x40


def modified_params(text: str) -> str | None:
    """``text`` with ``ModifyDeviceFiles: 1`` turned into ``0``; None when nothing needs
    hiding (already 0, or no such line)."""
    lines = text.splitlines()
    changed = False
    for i, line in enumerate(lines):
        if line.startswith("ModifyDeviceFiles: "):
            if line == "ModifyDeviceFiles: 0":
                return None
            if line == "ModifyDeviceFiles: 1":
                lines[i] = "ModifyDeviceFiles: 0"
                changed = True
    return "".join(f"{line}\n" for line in lines) if changed else None


def run(root: RootFS, args: SimpleNamespace) -> list[str]:
    """Mount a copy of the host's params with ``ModifyDeviceFiles: 0`` over the container's;
    nothing when nothing needs hiding or the kernel lacks the mount API."""
    host_params = args.host_params or PARAMS
    try:
        with open(host_params, "rb") as f:
            data = f.read(_MAX_PARAMS + 1)
    except FileNotFoundError:
        return []  # no NVIDIA driver on the host
    if len(data) > _MAX_PARAMS:
        raise RootFSError(f"{host_params} is larger than {_MAX_PARAMS} bytes")
    contents = modified_params(data.decode("utf-8", "replace"))
    if contents is None:
        return []
    try:
        target = root.open_path(PARAMS)
    except FileNotFoundError:
        return []  # no driver folder in the container's /proc
    try:
        if not stat.S_ISREG(os.fstat(target).st_mode):
            raise RootFSError(f"{root.where(PARAMS)} is not a regular file")
        _mount_copy(target, contents.encode())
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EPERM) or exc.filename != "mount API":
            raise
        # Linux < 5.12 or a seccomp filter: device node modification stays allowed
    finally:
        os.close(target)
    return []


# --- the new mount API through ctypes -------------------------------------------------------


def _mount_copy(target_fd: int, contents: bytes) -> None:
    def call(number: int, *args: object) -> int:
        return syscall(number, *args, what="mount API")

    c_int, c_uint, c_str = ctypes.c_int, ctypes.c_uint, ctypes.c_char_p
    fds: list[int] = []
    try:
        fs = call(_FSOPEN, c_str(b"tmpfs"), c_uint(_FSOPEN_CLOEXEC))
        fds.append(fs)
        for key, value in ((b"size", str(max(len(contents), 4096)).encode()),
                           (b"mode", b"0755")):
            call(_FSCONFIG, c_int(fs), c_uint(_FSCONFIG_SET_STRING), c_str(key),
                 c_str(value), c_int(0))
        call(_FSCONFIG, c_int(fs), c_uint(_FSCONFIG_CMD_CREATE), None, None, c_int(0))
        mnt = call(_FSMOUNT, c_int(fs), c_uint(_FSMOUNT_CLOEXEC), c_uint(
            _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | _MOUNT_ATTR_NOEXEC))
        fds.append(mnt)
        fd = os.open("params", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444,
                     dir_fd=mnt)
        try:
            os.write(fd, contents)
            os.fchmod(fd, 0o444)
        finally:
            os.close(fd)
        tree = call(_OPEN_TREE, c_int(mnt), c_str(b"params"),
                    c_uint(_OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC))
        fds.append(tree)
        attr = struct.pack("=QQQQ", _MOUNT_ATTR_RDONLY, 0, 0, 0)  # set, clr, propagation, userns
        call(_MOUNT_SETATTR, c_int(tree), c_str(b""), c_uint(_AT_EMPTY_PATH), c_str(attr),
             ctypes.c_size_t(len(attr)))
        call(_MOVE_MOUNT, c_int(tree), c_str(b""), c_int(target_fd), c_str(b""),
             c_uint(_MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH))
    finally:
        for fd in reversed(fds):
            os.close(fd)
