"""What the kubelet allocated to which pod (its pod-resources API, read by the daemon), and
the one check made with it: a device asked for through a source the kubelet does not
allocate from must not be one the kubelet gave another pod. Pure. Devices are compared by
the units they cover, which a vendor names as paths ("GPU-1", "GPU-1/MIG-2": a MIG device
lies under its GPU); a device no vendor knows covers its CDI name only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cdi.cache import Snapshot
from nri_plugin.plugins.cdi_injector.context import ContainerContext
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.plugins.cdi_injector.vendor import Registry, VendorRules


@dataclass(frozen=True, slots=True, kw_only=True)
class Holding:
    """One container's allocation, as the kubelet lists it."""

    pod: str  # namespace/name
    container: str
    resource: str = ""  # a device plugin's resource name; "" for a DRA claim
    device_ids: tuple[str, ...] = ()  # the device plugin's own ids
    claim: str = ""  # a DRA claim's namespace/name
    cdi_devices: tuple[str, ...] = ()  # the claim's CDI device names

    def describe(self) -> str:
        what = f"resource {self.resource}" if self.resource else f"claim {self.claim}"
        return f"pod {self.pod} ({what})"


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeletAllocations:
    """Every allocation the kubelet reported last, or why they are not known now."""

    holdings: tuple[Holding, ...] = ()
    unknown: str = ""  # why not known ("": known)


class DeviceHeld(Refusal):
    """A device asked for outside the kubelet's allocation that the kubelet gave another
    pod, or the kubelet's allocations could not be read to tell."""

    default_rule = "allocations"


def overlaps(a: str, b: str) -> bool:
    """Whether units ``a`` and ``b`` share hardware: equal, or one under the other."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


# (vendor, its facts), as ``Registry.paired`` gives them.
Paired = Sequence[tuple[VendorRules, object]]


def device_units(name: str, snapshot: Snapshot, vendors: Paired) -> frozenset[str]:
    """The units a CDI device covers: what its vendor says, and its name."""
    return frozenset({f"cdi:{name}"}).union(
        *(vendor.device_units(name, snapshot, facts) for vendor, facts in vendors))


def held_units(holding: Holding, snapshot: Snapshot, vendors: Paired) -> frozenset[str]:
    """The units of a holding: its device plugin ids as the vendors map them, its claim's
    CDI devices as any device."""
    return frozenset[str]().union(
        *(vendor.allocated_units(holding.resource, device_id, snapshot, facts)
          for device_id in holding.device_ids for vendor, facts in vendors),
        *(device_units(name, snapshot, vendors) for name in holding.cdi_devices))


def check_not_held(context: ContainerContext, registry: Registry,
                   vendors: Sequence[VendorRules],
                   current: Callable[[], KubeletAllocations | None]) -> None:
    """Raise DeviceHeld for the first device asked for by a source the kubelet does not
    allocate through that another pod holds and this pod does not (a device shared by
    the device plugin is held by each pod it went to). ``current`` gives the allocations,
    asked only when such a source asked; None: no kubelet on this node, nothing to check."""
    asked = [r for group in context.groups if not group.source.allocated
             for r in group.requests]
    if not asked:
        return
    allocations = current()
    if allocations is None:
        return
    if allocations.unknown:
        raise DeviceHeld(
            f"cannot check that {asked[0].name} ({asked[0].source}) is not allocated to "
            f"another pod: the kubelet's device allocations are not known right now",
            device=asked[0].name, node_detail=allocations.unknown)
    snapshot, paired = registry.snapshot, registry.paired(vendors)
    own, held = _units_held(allocations, context.pod, snapshot, paired)
    for request in asked:
        mine = device_units(request.name, snapshot, paired)
        if _covered(mine, own):
            continue
        for holding, units in held:
            if any(overlaps(a, b) for a in mine for b in units):
                raise DeviceHeld(
                    f"device {request.name} ({request.source}) is allocated by the kubelet "
                    f"to {holding.describe()}; the scheduler does not count devices asked "
                    f"for by annotation or env: ask for it in the pod's resources or a "
                    f"resource claim", device=request.name)


def _units_held(allocations: KubeletAllocations, pod: str, snapshot: Snapshot,
                vendors: Paired) -> tuple[set[str], list[tuple[Holding, frozenset[str]]]]:
    """The units allocated to ``pod``, and the other pods' holdings with their units."""
    own: set[str] = set()
    held: list[tuple[Holding, frozenset[str]]] = []
    for holding in allocations.holdings:
        units = held_units(holding, snapshot, vendors)
        if holding.pod == pod:
            own |= units
        elif units:
            held.append((holding, units))
    return own, held


def _covered(mine: frozenset[str], own: set[str]) -> bool:
    """Whether the pod's own allocation covers a device: each of its units is one of the
    pod's or lies under one (its CDI name alone counts only where no vendor said more)."""
    hardware = [u for u in mine if not u.startswith("cdi:")] or list(mine)
    return all(any(u == o or u.startswith(o + "/") for o in own) for u in hardware)
