"""NVIDIA's env requests in libnvidia-container's grammar
(docs/reference/annotations-and-env.md): NVIDIA_VISIBLE_DEVICES → CDI names of the
generated NVIDIA spec (an unknown id is an error, as there), and the requests that name no
CDI device (``NVIDIA_VISIBLE_DEVICES=none``, ``NVIDIA_MIG_CONFIG_DEVICES``/
``_MONITOR_DEVICES``, ``NVIDIA_IMEX_CHANNELS``; who may use each is the policy's business,
which the caller checks). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from cdi.cache import Snapshot
from cdi.model import ContainerEdits, DeviceNode
from nri_plugin.nri.wire import Code
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.vendors.nvidia.nodefacts import DeviceFacts, NodeFacts

ENV = "NVIDIA_VISIBLE_DEVICES"
GPU_KIND = "nvidia.com/gpu"
VOLUME_MOUNT_ROOT = "/var/run/nvidia-container-devices"
MIG_CONFIG_ENV = "NVIDIA_MIG_CONFIG_DEVICES"
MIG_MONITOR_ENV = "NVIDIA_MIG_MONITOR_DEVICES"
IMEX_ENV = "NVIDIA_IMEX_CHANNELS"


class VisibleDevicesError(Refusal):
    default_rule = "nvidia.visibleDevices"
    default_code = Code.INVALID_ARGUMENT


def visible_device_names(env: Mapping[str, str], snapshot: Snapshot, facts: NodeFacts,
                         *, legacy: bool = False) -> list[str]:
    """The CDI names the variable selects (empty: none). ``legacy``: unset means ``all``."""
    text = env.get(ENV, "all" if legacy else "")
    if text.rstrip("/") == VOLUME_MOUNT_ROOT:
        return []  # the device plugin's volume-mounts strategy: the mounts are the request
    return resolve_ids([i for i in listed(text) if i != "none"], snapshot, facts, ENV)


def items(text: str) -> list[str]:
    """The items of a comma list, stripped, empty ones left out."""
    return [i.strip() for i in text.split(",") if i.strip()]


def listed(text: str) -> list[str]:
    """The items of a comma list in libnvidia-container's grammar: none where it is empty,
    holds ``void`` or is ``none`` alone."""
    found = items(text)
    return [] if "void" in found or found == ["none"] else found


def resolve_ids(ids: Iterable[str], snapshot: Snapshot, facts: NodeFacts,
                label: str) -> list[str]:
    """CDI names for device ids in NVIDIA_VISIBLE_DEVICES' grammar (one id each; ``label``
    names where they came from in errors)."""
    known = [d for d in facts.devices.values() if d.name.startswith(GPU_KIND + "=")]
    names: list[str] = []
    for item in ids:
        names += _resolve(item, known, snapshot, label)
    return list(dict.fromkeys(names))


def _resolve(item: str, known: list[DeviceFacts], snapshot: Snapshot,
             label: str) -> list[str]:
    if "=" in item:  # already a CDI name
        return [item]
    if item == "all":
        return _all(known, snapshot)
    found = match_id(item, known)
    if found is not None:
        return [found]
    fallback = f"{GPU_KIND}={item}"  # no sidecar: the spec's own index/uuid names
    if fallback in snapshot.devices:
        return [fallback]
    raise VisibleDevicesError(f"{label}: unknown device {item!r}")


def _all(known: list[DeviceFacts], snapshot: Snapshot) -> list[str]:
    if f"{GPU_KIND}=all" in snapshot.devices:
        return [f"{GPU_KIND}=all"]
    # Each physical device is listed once per naming strategy: keep the first name.
    first: dict[tuple[str, str], str] = {}
    for d in sorted(known, key=lambda d: d.name):
        first.setdefault((d.gpu_uuid, d.mig_uuid), d.name)
    if not first:
        raise VisibleDevicesError(f"{ENV}=all: no {GPU_KIND} devices on this node")
    return list(first.values())


def match_id(item: str, known: list[DeviceFacts]) -> str | None:
    lowered = item.lower()
    candidates: list[DeviceFacts] = []
    if item.isdigit():
        candidates = [d for d in known if d.type == "gpu" and d.gpu_index == int(item)]
    elif ":" in item and all(p.isdigit() for p in item.split(":")) and item.count(":") == 1:
        gpu, mig = (int(p) for p in item.split(":"))
        candidates = [d for d in known if d.type == "mig" and d.gpu_index == gpu
                      and d.mig_index == mig]
    elif lowered.startswith("gpu-"):
        candidates = [d for d in known if d.type == "gpu" and d.gpu_uuid.lower() == lowered]
    elif lowered.startswith("mig-"):
        candidates = [d for d in known if d.mig_uuid.lower() == lowered]
    else:
        bus = _bus(lowered)
        candidates = [d for d in known if d.type == "gpu" and _bus(d.bus_id.lower()) == bus]
    if not candidates:
        return None
    # Prefer the name that is the id itself (index strategy), else the first by name.
    for d in candidates:
        if d.name == f"{GPU_KIND}={item}":
            return d.name
    return sorted(d.name for d in candidates)[0]


def _bus(text: str) -> str:
    """PCI bus id with the domain padded to 8 digits, so 0000:65:00.0 = 00000000:65:00.0."""
    domain, sep, rest = text.partition(":")
    return f"{domain.zfill(8)}:{rest}" if sep and rest else text


class ExtrasError(Refusal):
    default_rule = "nvidia.extras"


def wants_driver_only(env: Mapping[str, str]) -> bool:
    """``NVIDIA_VISIBLE_DEVICES=none`` (``void`` anywhere wins: nothing at all)."""
    found = items(env.get(ENV, ""))
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


def driver_only_edits(snapshot: Snapshot) -> tuple[str, ContainerEdits]:
    """The spec-level edits of the spec that serves ``nvidia.com/gpu`` (the one ``all``
    comes from, else the first): what ``none`` gives."""
    device = snapshot.devices.get(f"{GPU_KIND}=all")
    path = device.spec.path if device is not None else next(
        (p for p, loaded in snapshot.specs.items() if loaded.spec.kind == GPU_KIND), None)
    if path is None:
        raise ExtrasError(f"{ENV}=none: no {GPU_KIND} spec in the spec directories",
                          rule=f"nvidia.{ENV}")
    edits = snapshot.specs[path].edits
    if any(gid != 0 for gid in edits.additional_gids):
        raise ExtrasError(f"{ENV}=none: the spec-level edits of {path} carry "
                          "additionalGids, which NRI cannot add", rule=f"nvidia.{ENV}")
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
