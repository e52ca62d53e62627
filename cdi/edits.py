"""Merging container edits and applying them to an OCI runtime spec (CDI spec, apply
semantics), each value as its OCI runtime-spec fragment. Pure: ``apply`` works on a copy
and never touches the host; device nodes must already be filled in (the cache does that
when it loads specs)."""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Iterable
from itertools import chain
from typing import Any

from cdi.errors import CDIError
from cdi.model import ContainerEdits, DeviceNode, Hook, IntelRdt, Mount, to_dict
from cdi.validate import HOOK_NAMES


def merge(parts: Iterable[ContainerEdits]) -> ContainerEdits:
    """Concatenate edits in order; ``intelRdt`` is last-one-wins."""
    parts = list(parts)
    rdts = [part.intel_rdt for part in parts if part.intel_rdt is not None]
    lists: dict[str, Any] = {name: tuple(chain.from_iterable(getattr(part, name) for part in parts))
             for name in ContainerEdits._fields if name != "intel_rdt"}
    return ContainerEdits(**lists, intel_rdt=rdts[-1] if rdts else None)


def mount_depth(destination: str) -> int:
    """Path components of a cleaned destination: the key mounts are stably sorted by, so
    that a parent folder is always mounted before what goes inside it."""
    return posixpath.normpath(destination).count("/")


def apply(oci: dict[str, Any], edits: ContainerEdits) -> dict[str, Any]:
    """A copy of the OCI runtime spec ``oci`` with ``edits`` applied."""
    result = copy.deepcopy(oci)
    _apply_env(result, edits.env)
    _apply_device_nodes(result, edits.device_nodes)
    if edits.net_devices:
        nets = result.setdefault("linux", {}).setdefault("netDevices", {})
        for dev in edits.net_devices:
            nets[dev.host_interface_name] = {"name": dev.name}
    if edits.mounts:
        _apply_mounts(result, edits.mounts)
    _apply_hooks(result, edits)
    if edits.intel_rdt is not None:
        result.setdefault("linux", {})["intelRdt"] = intel_rdt_to_oci(edits.intel_rdt)
    _apply_gids(result, edits.additional_gids)
    return result


def _apply_env(oci: dict[str, Any], env: tuple[str, ...]) -> None:
    if not env:
        return
    current: list[str] = oci.setdefault("process", {}).setdefault("env", [])
    index = {entry.partition("=")[0]: i for i, entry in enumerate(current)}
    for entry in env:
        name = entry.partition("=")[0]
        if name in index:
            current[index[name]] = entry
        else:
            index[name] = len(current)
            current.append(entry)


def _replace_by_key(current: list[dict[str, Any]], new: list[dict[str, Any]], key: str) -> None:
    """``current`` as if each new entry removed every entry with its key, then was appended.

    Linear instead of one pass over the list per entry: a GPU spec has dozens of mounts.
    """
    last = {entry[key]: index for index, entry in enumerate(new)}
    current[:] = [entry for entry in current if entry.get(key) not in last] + [
        entry for index, entry in enumerate(new) if last[entry[key]] == index
    ]


def _apply_device_nodes(oci: dict[str, Any], nodes: tuple[DeviceNode, ...]) -> None:
    if not nodes:
        return
    user = oci.get("process", {}).get("user", {})
    uid, gid = user.get("uid", 0), user.get("gid", 0)
    linux = oci.setdefault("linux", {})
    devices = [device_to_oci(node, process_uid=uid, process_gid=gid) for node in nodes]
    _replace_by_key(linux.setdefault("devices", []), devices, "path")
    rules = [cgroup_rule(node) for node in nodes if node.type in ("b", "c")]
    if rules:
        linux.setdefault("resources", {}).setdefault("devices", []).extend(rules)


def _apply_mounts(oci: dict[str, Any], mounts: tuple[Mount, ...]) -> None:
    current: list[dict[str, Any]] = oci.setdefault("mounts", [])
    _replace_by_key(current, [mount_to_oci(m) for m in mounts], "destination")
    current.sort(key=lambda m: mount_depth(m.get("destination", "")))  # stable


def _apply_hooks(oci: dict[str, Any], edits: ContainerEdits) -> None:
    for hook in edits.hooks:
        if hook.hook_name not in HOOK_NAMES:
            raise CDIError(f"unknown hook name {hook.hook_name!r}")
        oci.setdefault("hooks", {}).setdefault(hook.hook_name, []).append(hook_to_oci(hook))


def _apply_gids(oci: dict[str, Any], gids: tuple[int, ...]) -> None:
    wanted = [gid for gid in gids if gid != 0]
    if not wanted:
        return
    user = oci.setdefault("process", {}).setdefault("user", {})
    current: list[int] = user.setdefault("additionalGids", [])
    for gid in wanted:
        if gid not in current:
            current.append(gid)


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
