"""CDI container edits → an NRI ContainerAdjustment, and what NRI cannot carry. Pure. The
edits are applied with the CDI library's ``apply`` to an empty OCI spec, so ordering and
replacement are the reference's; the OCI fragments are then translated one to one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cdi.edits import apply
from cdi.libpath import EXTRA_LIBRARY_PATH_ENV, LD_LIBRARY_PATH_ENV, merge_library_path
from cdi.model import ContainerEdits, DeviceNode
from cdi.oci import cgroup_access
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.derived import beyond_derived, derived_access, explicit_rule_needed
from nri_plugin.nri.errors import NRIPluginError
from nri_plugin.nri.versions import RuntimeInfo

_HOOK_FIELDS = {"prestart": "prestart", "createRuntime": "create_runtime",
                "createContainer": "create_container", "startContainer": "start_container",
                "poststart": "poststart", "poststop": "poststop"}


class UnsupportedEditsError(NRIPluginError):
    """Edits that an NRI adjustment cannot carry on this runtime; ``reasons`` says which."""

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = reasons
        super().__init__("; ".join(reasons))


def narrowed_permissions(edits: ContainerEdits) -> list[str]:
    """Device nodes whose ``permissions`` deny something that NRI would allow: NRI adds an
    allow rule of its own for each device node of an adjustment (ours only add to it)."""
    reasons = []
    for node in edits.device_nodes:
        if node.type not in ("c", "b"):
            continue
        granted = derived_access(node.type)
        lost = "".join(c for c in granted if c not in cgroup_access(node))
        if lost:
            reasons.append(f"permissions {node.permissions!r} of {node.path} (NRI allows "
                           f"{granted!r} on every device node it adds: {lost!r} would be "
                           "granted)")
    return reasons


def wider_than_nri(edits: ContainerEdits) -> list[str]:
    """The device nodes whose access NRI's own rule does not fully grant (e.g. ``m`` of a
    char device), as ``path (+letters)``: only the runtime's own CDI gives native CDI's one
    rule."""
    out = []
    for node in edits.device_nodes:
        if node.type not in ("c", "b"):
            continue
        extra = beyond_derived(node.type, cgroup_access(node))
        if extra:
            out.append(f"{node.path} (+{extra})")
    return out


def unsupported_edits(edits: ContainerEdits, runtime: RuntimeInfo) -> list[str]:
    """Why these edits cannot go into an NRI adjustment for ``runtime`` (empty: they can)."""
    reasons = narrowed_permissions(edits)
    if any(gid != 0 for gid in edits.additional_gids):
        reasons.append("additionalGids (NRI cannot add supplementary groups)")
    rdt = edits.intel_rdt
    if rdt is not None:
        if not runtime.supports_rdt_and_net_devices:
            reasons.append(f"intelRdt (needs NRI 0.11; runtime is {runtime.describe()})")
        elif rdt.l3_cache_schema or rdt.mem_bw_schema or rdt.enable_cmt or rdt.enable_mbm:
            reasons.append("intelRdt l3CacheSchema/memBwSchema/enableCMT/enableMBM "
                           "(NRI's RDT adjustment has only closID, schemata, monitoring)")
    if edits.net_devices and not runtime.supports_rdt_and_net_devices:
        reasons.append(f"netDevices (needs NRI 0.11; runtime is {runtime.describe()})")
    return reasons


def to_adjustment(
    edits: ContainerEdits,
    *,
    runtime: RuntimeInfo,
    uid: int = 0,
    gid: int = 0,
    image_library_path: str = "",
) -> nri_pb2.ContainerAdjustment:
    """The adjustment that gives a container ``edits``; raises UnsupportedEditsError.
    ``image_library_path``: the container's own LD_LIBRARY_PATH (``cdi.libpath``)."""
    reasons = unsupported_edits(edits, runtime)
    if reasons:
        raise UnsupportedEditsError(reasons)
    oci = apply({"process": {"user": {"uid": uid, "gid": gid}}}, edits)
    adjustment = nri_pb2.ContainerAdjustment()
    for entry in _with_library_path(oci["process"].get("env", []), image_library_path):
        name, _, value = entry.partition("=")
        adjustment.env.add(key=name, value=value)
    for mount in oci.get("mounts", []):
        adjustment.mounts.add(**mount)  # destination, source, type, options: NRI's names
    for hook_name, hooks in oci.get("hooks", {}).items():
        for hook in hooks:
            getattr(adjustment.hooks, _HOOK_FIELDS[hook_name]).add(
                path=hook["path"], args=hook.get("args", []), env=hook.get("env", []),
                **_optional(hook, timeout="timeout"))
    _add_linux(adjustment.linux, oci.get("linux", {}), runtime)
    return adjustment


def as_native_file_modes(edits: ContainerEdits, spec_nodes: Sequence[DeviceNode],
                         runtime: RuntimeInfo) -> ContainerEdits:
    """The edits with each device node's fileMode as the runtime's own CDI would give it.
    ``spec_nodes``: ``edits.device_nodes`` as the spec files wrote them. A CDI library
    before v1.1.0 does not fill an unset fileMode from the host node (runc then creates
    the node 0666): the adjustment leaves it unset too."""
    if runtime.native_fills_file_mode or len(spec_nodes) != len(edits.device_nodes):
        return edits
    nodes = tuple(
        node._replace(file_mode=None) if spec.file_mode is None and node.file_mode is not None
        else node
        for node, spec in zip(edits.device_nodes, spec_nodes, strict=True))
    return edits._replace(device_nodes=nodes)


def _with_library_path(env: list[str], image_library_path: str) -> tuple[str, ...]:
    """Fold the hook-free library folders into LD_LIBRARY_PATH, after the image's own
    folders (or the spec's LD_LIBRARY_PATH, which replaces them)."""
    if not any(e.startswith(EXTRA_LIBRARY_PATH_ENV + "=") for e in env):
        return tuple(env)
    base = [f"{LD_LIBRARY_PATH_ENV}={image_library_path}"] if image_library_path else []
    return merge_library_path(base + env)


def _optional(oci: dict[str, Any], **fields: str) -> dict[str, Any]:
    """The OCI keys ``oci`` has, as NRI's ``Optional*`` wrappers by field name (each
    ``fields`` entry: NRI field = OCI key)."""
    return {name: {"value": oci[key]} for name, key in fields.items() if key in oci}


def _add_linux(linux: nri_pb2.LinuxContainerAdjustment, oci_linux: dict[str, Any],
               runtime: RuntimeInfo) -> None:
    for device in oci_linux.get("devices", []):
        if "fileMode" in device:  # permission bits only (docs/developer/nri-protocol.md §4.3)
            device = {**device, "fileMode": device["fileMode"] & 0o7777}
        linux.devices.add(path=device["path"], type=device["type"], major=device["major"],
                          minor=device["minor"],
                          **_optional(device, file_mode="fileMode", uid="uid", gid="gid"))
    # NRI adds its own rule for each node (derived.py): only what it does not grant, and
    # only where this NRI version applies explicit rules, else the rule comes out twice.
    for rule in oci_linux.get("resources", {}).get("devices", []):
        if explicit_rule_needed(rule["type"], rule["access"], runtime.nri_version):
            linux.resources.devices.add(allow=rule["allow"], type=rule["type"],
                                        access=rule["access"],
                                        **_optional(rule, major="major", minor="minor"))
    for host_name, net in oci_linux.get("netDevices", {}).items():
        linux.net_devices[host_name].name = net["name"]
    rdt = oci_linux.get("intelRdt")
    if rdt is not None:
        linux.rdt.MergeFrom(nri_pb2.LinuxRdt(**_optional(
            rdt, clos_id="closID", schemata="schemata", enable_monitoring="enableMonitoring")))
        linux.rdt.SetInParent()
