"""CDI model values as OCI runtime-spec (``config.json``) fragments. Pure."""

from __future__ import annotations

from typing import Any

from cdi.model import DeviceNode, Hook, IntelRdt, Mount, to_dict


def cgroup_access(node: DeviceNode) -> str:
    """Device-cgroup access string: the permissions, ``rwm`` when unset, "" for ``none``."""
    if node.permissions == "none":
        return ""
    return node.permissions or "rwm"


def device_to_oci(
    node: DeviceNode, *, process_uid: int = 0, process_gid: int = 0
) -> dict[str, Any]:
    """``linux.devices`` entry. A node without an owner takes the process user's (when not
    root), so a non-root container can open its own devices."""
    device: dict[str, Any] = {"path": node.path, "type": node.type or "",
                              "major": node.major or 0, "minor": node.minor or 0}
    if node.file_mode is not None:
        device["fileMode"] = node.file_mode
    uid = node.uid if node.uid is not None else (process_uid or None)
    gid = node.gid if node.gid is not None else (process_gid or None)
    if uid is not None:
        device["uid"] = uid
    if gid is not None:
        device["gid"] = gid
    return device


def cgroup_rule(node: DeviceNode) -> dict[str, Any]:
    return {
        "allow": True,
        "type": node.type,
        "major": node.major or 0,
        "minor": node.minor or 0,
        "access": cgroup_access(node),
    }


def mount_to_oci(mount: Mount) -> dict[str, Any]:
    result: dict[str, Any] = {"destination": mount.container_path, "source": mount.host_path}
    if mount.type:
        result["type"] = mount.type
    if mount.options:
        result["options"] = list(mount.options)
    return result


def hook_to_oci(hook: Hook) -> dict[str, Any]:
    # The spec's hook is the OCI runtime spec's (path, args, env, timeout) and its hookName.
    return {key: value for key, value in to_dict(hook).items() if key != "hookName"}


def intel_rdt_to_oci(rdt: IntelRdt) -> dict[str, Any]:
    # The spec's keys are the OCI runtime spec's; like its Go type, no "" and no false.
    return {key: value for key, value in to_dict(rdt).items() if value not in ("", False)}
