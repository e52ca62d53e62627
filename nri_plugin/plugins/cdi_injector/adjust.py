"""CDI container edits → an NRI ContainerAdjustment, and what NRI cannot carry. Pure. The
edits are applied with the CDI library's ``apply`` to an empty OCI spec, so ordering and
replacement are the reference's; the OCI fragments are then translated one to one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cdi.edits import apply, cgroup_access
from cdi.libpath import EXTRA_LIBRARY_PATH_ENV, LD_LIBRARY_PATH_ENV, merge_library_path
from cdi.model import ContainerEdits, DeviceNode
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
        adjustment.mounts.add(destination=mount["destination"], source=mount["source"],
                              type=mount.get("type", ""), options=mount.get("options", []))
    for hook_name, hooks in oci.get("hooks", {}).items():
        for hook in hooks:
            _add_hook(getattr(adjustment.hooks, _HOOK_FIELDS[hook_name]), hook)
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


def _add_hook(target: Any, hook: dict[str, Any]) -> None:
    added = target.add(path=hook["path"], args=hook.get("args", []), env=hook.get("env", []))
    if "timeout" in hook:
        added.timeout.value = hook["timeout"]


def _add_linux(linux: nri_pb2.LinuxContainerAdjustment, oci_linux: dict[str, Any],
               runtime: RuntimeInfo) -> None:
    for device in oci_linux.get("devices", []):
        added = linux.devices.add(path=device["path"], type=device["type"],
                                  major=device["major"], minor=device["minor"])
        if "fileMode" in device:
            # permission bits only (docs/developer/nri-protocol.md §4.3)
            added.file_mode.value = device["fileMode"] & 0o7777
        if "uid" in device:
            added.uid.value = device["uid"]
        if "gid" in device:
            added.gid.value = device["gid"]
    # NRI adds its own rule for each node (derived.py): only what it does not grant, and
    # only where this NRI version applies explicit rules, else the rule comes out twice.
    for rule in oci_linux.get("resources", {}).get("devices", []):
        if not explicit_rule_needed(rule["type"], rule["access"], runtime.nri_version):
            continue
        added_rule = linux.resources.devices.add(allow=rule["allow"], type=rule["type"],
                                                 access=rule["access"])
        added_rule.major.value = rule["major"]
        added_rule.minor.value = rule["minor"]
    for host_name, net in oci_linux.get("netDevices", {}).items():
        linux.net_devices[host_name].name = net["name"]
    rdt = oci_linux.get("intelRdt")
    if rdt is not None:
        _add_rdt(linux, rdt)


def _add_rdt(linux: nri_pb2.LinuxContainerAdjustment, rdt: dict[str, Any]) -> None:
    if "closID" in rdt:
        linux.rdt.clos_id.value = rdt["closID"]
    if "schemata" in rdt:
        linux.rdt.schemata.value.extend(rdt["schemata"])
    if "enableMonitoring" in rdt:
        linux.rdt.enable_monitoring.value = rdt["enableMonitoring"]
    linux.rdt.SetInParent()
