"""From looked-up devices to a ContainerAdjustment: what the plugin applies itself, what it
hands to the runtime's own CDI (``CDI_devices``) and when, and the mounts it takes back of
what the runtime's CDI injected (docs/developer/architecture.md, step 7); and how CDI edits
become an adjustment, and what NRI cannot carry. Pure. The edits are applied with the CDI
library's ``apply`` to an empty OCI spec, so ordering and replacement are the reference's;
the OCI fragments are then translated one to one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from cdi.cache import Device, Snapshot
from cdi.edits import apply, cgroup_access
from cdi.errors import UnresolvedDevicesError
from cdi.libpath import EXTRA_LIBRARY_PATH_ENV, LD_LIBRARY_PATH_ENV, merge_library_path
from cdi.model import ContainerEdits, DeviceNode
from nri_plugin.nri import adjustment as adj
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.derived import beyond_derived, derived_access, explicit_rule_needed
from nri_plugin.nri.errors import NRIPluginError
from nri_plugin.nri.versions import Reach, RuntimeInfo
from nri_plugin.plugins.cdi_injector.context import DeviceRequest
from nri_plugin.plugins.cdi_injector.delegation import delegation_problems
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.plugins.cdi_injector.vendor import EditFilter

_LIBRARY_PATH_ENTRY = EXTRA_LIBRARY_PATH_ENV + "="


class InjectionError(Refusal):
    default_rule = "injection"


@dataclass(frozen=True, slots=True, kw_only=True)
class Injection:
    adjustment: nri_pb2.ContainerAdjustment
    devices: tuple[str, ...]  # injected by us
    delegated: tuple[str, ...]  # handed to the runtime's own CDI resolver
    # additionalGids left out (policy additionalGids: drop) where the plugin applies the
    # devices itself: narrower than the spec, never wider.
    dropped_gids: tuple[int, ...] = ()
    # Why the devices were not handed to the runtime's CDI although it could take them
    # (what would have been lost), for the log; empty where that did not come up.
    kept_because: str = ""


def lookup_devices(snapshot: Snapshot, requests: Sequence[DeviceRequest]) -> list[Device]:
    """The requested devices, in request order; InjectionError naming each unknown one and
    its source."""
    try:
        return snapshot.lookup(r.name for r in requests)
    except UnresolvedDevicesError as exc:
        source = {r.name: r.source for r in requests}
        detail = "; ".join(f"{name} (from {source[name]}): {why}"
                           for name, why in exc.reasons.items())
        raise InjectionError(f"unresolvable CDI devices: {detail}", rule="unresolvable",
                             device=next(iter(exc.reasons), None)) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanFor:
    """What a plan depends on besides the devices and the runtime. ``library_path``: the
    container's own LD_LIBRARY_PATH, which hook-free specs add their folders to;
    ``drop_gids``: where additionalGids are all the plugin cannot apply itself, apply the
    rest without them instead of refusing."""

    uid: int = 0
    gid: int = 0
    edit_filter: EditFilter | None = None
    library_path: str = ""
    drop_gids: bool = False

    @property
    def cache_key(self) -> Hashable:
        return (self.uid, self.gid,
                None if self.edit_filter is None else self.edit_filter.cache_key,
                self.library_path, self.drop_gids)


def plan_devices(snapshot: Snapshot, devices: Sequence[Device], runtime: RuntimeInfo,
                 plan_for: PlanFor) -> Injection:
    edit_filter, drop_gids = plan_for.edit_filter, plan_for.drop_gids
    edits = snapshot.merged_edits(devices) if devices else ContainerEdits()
    filtered = edit_filter.apply(edits) if edit_filter is not None else edits
    lost = _lost_by_handing_over(edits, filtered)
    delegate, dropped = _hand_over(snapshot, devices, runtime, drop_gids, lost)
    if delegate:
        adjustment = nri_pb2.ContainerAdjustment()
        for device in devices:
            adjustment.CDI_devices.add(name=device.qualified_name)
        return Injection(adjustment=adjustment, devices=(),
                         delegated=tuple(d.qualified_name for d in devices))
    if dropped:
        edits = edits._replace(additional_gids=())
    # fileModes first, on the devices' own nodes as the spec files wrote them (what the
    # runtime's own CDI fills in or not); then the filter (which may add nodes).
    written = tuple(n for part in snapshot.edits_in_order(devices, as_written=True)
                    for n in part.device_nodes)
    edits = as_native_file_modes(edits, written, runtime)
    if edit_filter is not None:
        edits = edit_filter.apply(edits)
    adjustment = to_adjustment(edits, runtime=runtime, uid=plan_for.uid, gid=plan_for.gid,
                               image_library_path=plan_for.library_path)
    return Injection(adjustment=adjustment, devices=tuple(d.qualified_name for d in devices),
                     delegated=(), dropped_gids=dropped,
                     kept_because=lost if runtime.supports_cdi_devices else "")


def _lost_by_handing_over(edits: ContainerEdits, filtered: ContainerEdits) -> str:
    """What the runtime's own CDI would not do of the plugin's work ("" : nothing)."""
    lost = []
    if filtered.mounts != edits.mounts:
        lost.append(f"{len(edits.mounts) - len(filtered.mounts)} driver mount(s) the "
                    "container did not ask for would be added")
    if filtered != edits._replace(mounts=filtered.mounts):
        lost.append("edits of no device the container asked for would be missing")
    if any(e.startswith(_LIBRARY_PATH_ENTRY) for e in edits.env):
        lost.append("the spec's library folders would not reach LD_LIBRARY_PATH")
    return "; ".join(lost)


def _hand_over(snapshot: Snapshot, devices: Sequence[Device], runtime: RuntimeInfo,
               drop_gids: bool, lost: str) -> tuple[bool, tuple[int, ...]]:
    """(whether every device goes to the runtime's own CDI, the additionalGids left out).
    All or nothing: NRI applies our edits before the runtime's CDI, so a mix would merge
    env, mounts and device rules in another order than native CDI."""
    if not devices:
        return False, ()
    can_hand_over = runtime.supports_cdi_devices and not delegation_problems(devices, runtime)
    by_spec: dict[str, list[Device]] = {}
    for device in devices:
        by_spec.setdefault(device.spec.path, []).append(device)
    dropped: set[int] = set()
    for group in by_spec.values():
        edits = snapshot.merged_edits(group)
        reasons = unsupported_edits(edits, runtime)
        if not reasons:
            continue
        gids_only = not unsupported_edits(edits._replace(additional_gids=()), runtime)
        if can_hand_over and not lost:
            return True, ()
        if gids_only and drop_gids:
            dropped.update(g for g in edits.additional_gids if g != 0)
            continue
        names = ", ".join(d.qualified_name for d in group)
        why = (f"handing them to the runtime's own CDI, which could, would lose this: {lost}"
               if can_hand_over else _why_not(devices, runtime))
        raise InjectionError(
            f"CDI devices {names} need edits that NRI cannot apply on {runtime.describe()} "
            f"({'; '.join(reasons)}), and {why}"
            + ("; policy additionalGids: drop would apply the rest without the groups"
               if gids_only else ""),
            rule="unsupportedEdits", device=group[0].qualified_name)
    # Access NRI cannot grant exactly (mknod on a char device): the runtime's own CDI can.
    if (not dropped and can_hand_over and not lost
            and runtime.cdi_spec_dirs.reach is not Reach.UNKNOWN
            and wider_than_nri(snapshot.merged_edits(devices))):
        return True, ()
    return False, tuple(sorted(dropped))


def _why_not(devices: Sequence[Device], runtime: RuntimeInfo) -> str:
    if not runtime.supports_cdi_devices:
        return ("this runtime cannot take them through its own CDI (containerd >= 2.1 or "
                ">= 1.7.30, CRI-O >= 1.34 can)")
    return "the runtime's own CDI would fail on them: " + "; ".join(
        delegation_problems(devices, runtime))


def mount_removals(snapshot: Snapshot, names: Sequence[str], edit_filter: EditFilter,
                   container: nri_pb2.Container) -> nri_pb2.ContainerAdjustment | None:
    """The removal of the mounts the runtime's CDI gave a container for ``names`` that
    ``edit_filter`` would not have given (None: none)."""
    known = [n for n in names if n in snapshot.devices]
    if not known:
        return None
    edits = snapshot.resolve(known)
    kept = {m.container_path for m in edit_filter.apply(edits).mounts}
    present = {m.destination for m in container.mounts}
    drop = sorted({m.container_path for m in edits.mounts if m.container_path not in kept}
                  & present)
    if not drop:
        return None
    adjustment = nri_pb2.ContainerAdjustment()
    for path in drop:
        adj.remove_mount(adjustment, path)
    return adjustment


class PlanCache:
    """The plans made under the registry in force, by everything else a plan depends on:
    pods of one Deployment ask alike, and planning a driver's worth of mounts is most of a
    container's decision. A new registry snapshot empties it; a kept plan's adjustment is
    shared, never changed."""

    SIZE = 256

    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        self._plans: OrderedDict[Hashable, Injection] = OrderedDict()

    def plan(self, snapshot: Snapshot, devices: Sequence[Device], runtime: RuntimeInfo,
             plan_for: PlanFor) -> Injection:
        if snapshot is not self._snapshot:
            self._snapshot = snapshot
            self._plans.clear()
        key = (tuple(d.qualified_name for d in devices), runtime, plan_for.cache_key)
        kept = self._plans.get(key)
        if kept is not None:
            self._plans.move_to_end(key)
            return kept
        made = plan_devices(snapshot, devices, runtime, plan_for)
        self._plans[key] = made
        if len(self._plans) > self.SIZE:
            self._plans.popitem(last=False)
        return made


# --- CDI edits -> an NRI adjustment ---------------------------------------------------------

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
    if not any(e.startswith(_LIBRARY_PATH_ENTRY) for e in env):
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
