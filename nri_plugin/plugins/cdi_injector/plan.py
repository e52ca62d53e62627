"""From looked-up devices to a ContainerAdjustment: what the plugin applies itself, what it
hands to the runtime's own CDI (``CDI_devices``) and when, and the mounts it takes back of
what the runtime's CDI injected (docs/developer/architecture.md, step 7). Pure.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from cdi.cache import Device, Snapshot
from cdi.errors import UnresolvedDevicesError
from cdi.libpath import EXTRA_LIBRARY_PATH_ENV
from cdi.model import ContainerEdits
from nri_plugin.nri import adjustment as adj
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.versions import Reach, RuntimeInfo
from nri_plugin.plugins.cdi_injector.adjust import (
    as_native_file_modes,
    to_adjustment,
    unsupported_edits,
    wider_than_nri,
)
from nri_plugin.plugins.cdi_injector.delegation import delegation_problems
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.plugins.cdi_injector.requests import DeviceRequest
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
                 plan_for: PlanFor | None = None) -> Injection:
    plan_for = plan_for if plan_for is not None else PlanFor()
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


def removes_runtime_mounts(runtime: RuntimeInfo) -> bool:
    """Whether NRI mount removals reach the mounts the runtime's own CDI injected: seen
    with containerd 2.1.9; containerd 1.7.24 accepts the removals and keeps the mounts."""
    return not (runtime.is_containerd and runtime.version is not None
                and runtime.version < (2, 0, 0))


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
