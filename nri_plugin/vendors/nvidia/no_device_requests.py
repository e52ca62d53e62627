"""NVIDIA requests that name no CDI device, with libnvidia-container's value grammar
(``NVIDIA_VISIBLE_DEVICES=none``, ``NVIDIA_MIG_CONFIG_DEVICES``/``_MONITOR_DEVICES``,
``NVIDIA_IMEX_CHANNELS``; docs/reference/annotations-and-env.md). Pure. Who may use each
is the policy's business (its sources); the caller checks that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cdi.cache import Snapshot
from cdi.model import ContainerEdits, DeviceNode
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.vendors.nvidia.nodefacts import NodeFacts
from nri_plugin.vendors.nvidia.visible_devices import ENV as VISIBLE_ENV
from nri_plugin.vendors.nvidia.visible_devices import GPU_KIND, items, listed

MIG_CONFIG_ENV = "NVIDIA_MIG_CONFIG_DEVICES"
MIG_MONITOR_ENV = "NVIDIA_MIG_MONITOR_DEVICES"
IMEX_ENV = "NVIDIA_IMEX_CHANNELS"


class ExtrasError(Refusal):
    default_rule = "nvidia.extras"


def wants_driver_only(env: Mapping[str, str]) -> bool:
    """``NVIDIA_VISIBLE_DEVICES=none`` (``void`` anywhere wins: nothing at all)."""
    found = items(env.get(VISIBLE_ENV, ""))
    return bool(found) and "void" not in found and all(i == "none" for i in found)


def wants_mig_capability(env: Mapping[str, str], variable: str) -> bool:
    """True for ``all``; False when unset or empty; ExtrasError for anything else."""
    found = items(env.get(variable, ""))
    for item in found:
        if item.lower() != "all":
            raise ExtrasError(f"{variable}={env[variable]}: {item!r}: only 'all' is "
                              "supported (as in libnvidia-container)", rule=f"nvidia.{variable}")
    return bool(found)


def imex_channel_ids(env: Mapping[str, str], available: Sequence[int]) -> list[int]:
    """The channels ``NVIDIA_IMEX_CHANNELS`` asks for ([] for unset, empty, void, none)."""
    text = env.get(IMEX_ENV, "")
    asked = listed(text)
    if not asked:
        return []
    if any(i.lower() == "all" for i in asked):
        if not available:
            raise ExtrasError(f"{IMEX_ENV}=all: this node has no IMEX channel nodes",
                              rule=f"nvidia.{IMEX_ENV}")
        return sorted(available)
    out: list[int] = []
    for item in asked:
        if not item.isdigit():
            raise ExtrasError(f"{IMEX_ENV}={text}: {item!r} is not a channel number",
                              rule=f"nvidia.{IMEX_ENV}")
        if int(item) not in available:
            raise ExtrasError(f"{IMEX_ENV}={text}: channel {item} does not exist on this node "
                              f"(have: {', '.join(map(str, sorted(available))) or 'none'})",
                              rule=f"nvidia.{IMEX_ENV}")
        out.append(int(item))
    return sorted(set(out))


def nvidia_spec_path(snapshot: Snapshot) -> str | None:
    """The spec that serves ``nvidia.com/gpu`` (the one ``all`` comes from, else the first)."""
    device = snapshot.devices.get(f"{GPU_KIND}=all")
    if device is not None:
        return device.spec.path
    for path, loaded in snapshot.specs.items():
        if loaded.spec.kind == GPU_KIND:
            return path
    return None


def driver_only_edits(snapshot: Snapshot) -> tuple[str, ContainerEdits]:
    """The NVIDIA spec's own (spec-level) edits: what ``none`` gives."""
    path = nvidia_spec_path(snapshot)
    if path is None:
        raise ExtrasError(f"{VISIBLE_ENV}=none: no {GPU_KIND} spec in the spec directories",
                          rule=f"nvidia.{VISIBLE_ENV}")
    edits = snapshot.specs[path].edits
    if any(gid != 0 for gid in edits.additional_gids):
        raise ExtrasError(f"{VISIBLE_ENV}=none: the spec-level edits of {path} carry "
                          "additionalGids, which NRI cannot add", rule=f"nvidia.{VISIBLE_ENV}")
    return path, edits


def mig_capability_node(facts: NodeFacts, which: str, variable: str) -> DeviceNode:
    """The recorded ``migConfig`` / ``migMonitor`` node of the node's NVIDIA spec."""
    for spec in facts.specs.values():
        node = spec.nodes.get(which)
        if node is not None:
            return node
    raise ExtrasError(f"{variable}=all: no MIG {which[3:].lower()} capability recorded for "
                      "this node (no MIG-capable GPU, or the spec was generated without "
                      "/proc/driver/nvidia-caps/mig-minors)", rule=f"nvidia.{variable}")


def imex_channels(facts: NodeFacts) -> dict[int, DeviceNode]:
    out: dict[int, DeviceNode] = {}
    for spec in facts.specs.values():
        out.update(spec.imex_channels)
    return out
