"""NVIDIA_VISIBLE_DEVICES → CDI names of the generated NVIDIA spec, in the toolkit's grammar
(docs/reference/annotations-and-env.md); an unknown id is an error, as there. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cdi.cache import Snapshot
from nri_plugin.nri.wire import Code
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.vendors.nvidia.nodefacts import DeviceFacts, NodeFacts

ENV = "NVIDIA_VISIBLE_DEVICES"
GPU_KIND = "nvidia.com/gpu"
VOLUME_MOUNT_ROOT = "/var/run/nvidia-container-devices"


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
    names = _one_name_each(known)
    if not names:
        raise VisibleDevicesError(f"{ENV}=all: no {GPU_KIND} devices on this node")
    return names


def _one_name_each(known: Iterable[DeviceFacts]) -> list[str]:
    # Each physical device is listed once per naming strategy: keep the first name.
    seen: set[tuple[object, ...]] = set()
    out = []
    for d in sorted(known, key=lambda d: d.name):
        key = (d.gpu_uuid, d.mig_uuid)
        if key not in seen:
            seen.add(key)
            out.append(d.name)
    return out


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
