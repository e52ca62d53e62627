"""Filling in device-node details from the host (reference ``fillMissingInfo``).

This is I/O (``lstat``); the cache calls it while loading specs, never on the request
path, and keeps the result (or the error) with the device.
"""

from __future__ import annotations

import os
import stat

from cdi.errors import DeviceNodeError
from cdi.model import ContainerEdits, DeviceNode

_HOST_TYPES = {stat.S_IFCHR: "c", stat.S_IFBLK: "b", stat.S_IFIFO: "p"}


def _is_minimal(node: DeviceNode) -> bool:
    """Type given and a major number (or a pipe, which has none): nothing to look up."""
    return bool(node.type) and (bool(node.major) or node.type == "p")


def fill_device_node(node: DeviceNode) -> DeviceNode:
    """The node with type, major/minor and file mode taken from the host where unset.

    Raises DeviceNodeError with the reference library's wording when the host path cannot
    be stat'ed, is not a device node, or has another type than the spec says.
    """
    host = node.host
    try:
        info = os.lstat(host)
    except OSError as exc:
        if _is_minimal(node):
            return node
        raise DeviceNodeError(
            f"failed to stat CDI host device {host!r}: {exc.strerror or exc}"
        ) from None
    host_type = _HOST_TYPES.get(stat.S_IFMT(info.st_mode))
    file_mode = node.file_mode if node.file_mode is not None else stat.S_IMODE(info.st_mode)
    if _is_minimal(node):
        return node._replace(file_mode=file_mode)
    if host_type is None:
        raise DeviceNodeError(f"failed to stat CDI host device {host!r}: not a device node")
    if node.type and node.type != host_type:
        raise DeviceNodeError(
            f"CDI device ({node.path!r}, {host!r}), host type mismatch ({node.type}, {host_type})"
        )
    filled = node._replace(type=node.type or host_type, file_mode=file_mode)
    if host_type != "p" and not node.major:
        filled = filled._replace(major=os.major(info.st_rdev), minor=os.minor(info.st_rdev))
    return filled


def fill_edits(edits: ContainerEdits) -> ContainerEdits:
    """The edits with every device node filled in; raises DeviceNodeError on the first bad one."""
    if not edits.device_nodes:
        return edits
    return edits._replace(device_nodes=tuple(fill_device_node(n) for n in edits.device_nodes))
