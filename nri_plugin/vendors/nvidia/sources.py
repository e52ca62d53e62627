"""NVIDIA's request sources, as the injector's policy knows them (``sources.<name>``; their
defaults and why: docs/usage/policy.md), with the ways Kubernetes set-ups built for
NVIDIA's toolkit ask for GPUs (docs/reference/annotations-and-env.md): NVIDIA's NRI
plugin's pod annotations, the device plugin's ``/dev/null`` volume mounts, and the env in
libnvidia-container's grammar: NVIDIA_VISIBLE_DEVICES → CDI names of the generated NVIDIA
spec (an unknown id is an error, as there), and the requests that name no CDI device
(``NVIDIA_VISIBLE_DEVICES=none``, ``NVIDIA_MIG_CONFIG_DEVICES``/``_MONITOR_DEVICES``,
``NVIDIA_IMEX_CHANNELS``), which the verdict (``rules``) reads; who may use each is the
policy's business, which the caller checks. Pure.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence

from cdi.cache import Snapshot
from cdi.model import ContainerEdits, DeviceNode
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.wire import Code
from nri_plugin.plugins.cdi_injector.context import (
    ContainerContext,
    DeviceRequest,
    RequestSource,
    comma_list_requests,
)
from nri_plugin.plugins.cdi_injector.policy import NO_NAMESPACE, SourceRule
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.vendors.nvidia.nodefacts import DeviceFacts, NodeFacts

VISIBLE_ENV = "NVIDIA_VISIBLE_DEVICES"
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
    text = env.get(VISIBLE_ENV, "all" if legacy else "")
    if text.rstrip("/") == VOLUME_MOUNT_ROOT:
        return []  # the device plugin's volume-mounts strategy: the mounts are the request
    return resolve_ids([i for i in listed(text) if i != "none"], snapshot, facts, VISIBLE_ENV)


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
    return list(dict.fromkeys(name for item in ids
                              for name in _resolve(item, known, snapshot, label)))


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
        raise VisibleDevicesError(f"{VISIBLE_ENV}=all: no {GPU_KIND} devices on this node")
    return list(first.values())


def match_id(item: str, known: list[DeviceFacts]) -> str | None:
    lowered = item.lower()
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
    # Prefer the name that is the id itself (index strategy), else the first by name.
    names, own = sorted(d.name for d in candidates), f"{GPU_KIND}={item}"
    return own if own in names else next(iter(names), None)


def _bus(text: str) -> str:
    """PCI bus id with the domain padded to 8 digits, so 0000:65:00.0 = 00000000:65:00.0."""
    domain, sep, rest = text.partition(":")
    return f"{domain.zfill(8)}:{rest}" if sep and rest else text


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


def driver_only_edits(snapshot: Snapshot) -> tuple[str, ContainerEdits]:
    """The spec-level edits of the spec that serves ``nvidia.com/gpu`` (the one ``all``
    comes from, else the first): what ``none`` gives."""
    device = snapshot.devices.get(f"{GPU_KIND}=all")
    path = device.spec.path if device is not None else next(
        (p for p, loaded in snapshot.specs.items() if loaded.spec.kind == GPU_KIND), None)
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
    return {n: node for spec in facts.specs.values() for n, node in spec.imex_channels.items()}


NRI_KEY = "nvidia.cdi.k8s.io"
NRI_KEY_PREFIX = NRI_KEY + "/container."


def nvidia_nri_requests(pod_annotations: Mapping[str, str],
                        container_name: str) -> list[DeviceRequest]:
    """What the one pod annotation NVIDIA's NRI plugin reads for a container asks for, by
    containerd/nri's rule for a container's effective annotation: ``<key>/container.<name>``,
    else ``<key>/pod``, else the bare ``<key>``; ``<key>/container.*`` (this plugin's own,
    and NVIDIA's before its 1.20) comes after the container's own key."""
    for key in (NRI_KEY_PREFIX + container_name, NRI_KEY_PREFIX + "*", NRI_KEY + "/pod",
                NRI_KEY):
        if key in pod_annotations:
            return comma_list_requests(key, pod_annotations[key])
    return []


def volume_mount_ids(mounts: Sequence[nri_pb2.Mount]) -> list[tuple[str, str]]:
    """(id, destination) for each ``/dev/null`` mount under the device-list root."""
    out = []
    for mount in mounts:
        source = mount.source
        # normpath only drops "." and ".." parts and doubled slashes: a source that
        # becomes /dev/null has "null" in it (most mounts do not: no normpath for them).
        if "null" not in source or posixpath.normpath(source) != "/dev/null":
            continue
        destination = mount.destination
        path = posixpath.normpath(destination)
        if not path.startswith(VOLUME_MOUNT_ROOT + "/"):
            continue
        device = path[len(VOLUME_MOUNT_ROOT) + 1:].strip("/")
        if device:
            out.append((device, destination))
    return out


def volume_mount_requests(mounts: Sequence[nri_pb2.Mount], snapshot: Snapshot,
                          facts: NodeFacts) -> list[DeviceRequest]:
    requests: list[DeviceRequest] = []
    for device, destination in volume_mount_ids(mounts):
        source = f"volume mount {destination}"
        if device.startswith("cdi/"):
            parts = device[4:].split("/")
            if len(parts) < 3:
                raise VisibleDevicesError(f"{source}: expected cdi/<vendor>/<class>/<name>",
                                          rule="nvidia.volumeMounts")
            name = f"{'/'.join(parts[:-2])}/{parts[-2]}={parts[-1]}"
            requests.append(DeviceRequest(name, source))
            continue
        if device.startswith("imex/"):
            raise VisibleDevicesError(f"{source}: IMEX channels as volume mounts are not "
                                      "supported; use NVIDIA_IMEX_CHANNELS or a CDI name",
                                      rule="nvidia.volumeMounts")
        requests += [DeviceRequest(n, source)
                     for n in resolve_ids([device], snapshot, facts, source)]
    return requests


EMPTY_FACTS = NodeFacts()


def facts_of(facts: object) -> NodeFacts:
    return facts if isinstance(facts, NodeFacts) else EMPTY_FACTS


def is_legacy_image(env: Mapping[str, str]) -> bool:
    """An image from before NVIDIA_REQUIRE_CUDA: CUDA_VERSION set, no requirement."""
    return bool(env.get("CUDA_VERSION")) and "NVIDIA_REQUIRE_CUDA" not in env


def _visible_devices(context: ContainerContext, snapshot: Snapshot,
                     facts: object) -> list[DeviceRequest]:
    env = context.env
    legacy = is_legacy_image(env)
    if VISIBLE_ENV not in env and not legacy:
        return []
    names = visible_device_names(env, snapshot, facts_of(facts), legacy=legacy)
    source = f"env {VISIBLE_ENV}={env.get(VISIBLE_ENV, '(unset, legacy image)')}"
    return [DeviceRequest(n, source) for n in names]


NRI_ANNOTATIONS = RequestSource(
    name="nvidiaNriAnnotations", read_from="annotations",
    read=lambda context, snapshot, facts: nvidia_nri_requests(context.pod_annotations,
                                                              context.container_name),
    default=SourceRule(title="NVIDIA NRI plugin annotations (nvidia.cdi.k8s.io/)",
                       enabled=True, namespaces=NO_NAMESPACE))
VOLUME_MOUNTS = RequestSource(
    name="volumeMounts", read_from="mounts",
    read=lambda context, snapshot, facts: volume_mount_requests(context.mounts, snapshot,
                                                                facts_of(facts)),
    default=SourceRule(title=f"device-plugin volume mounts ({VOLUME_MOUNT_ROOT}/)",
                       enabled=False))
VISIBLE_DEVICES = RequestSource(
    name="visibleDevicesEnv", read_from="env", when_denied="ignore", read=_visible_devices,
    default=SourceRule(title=VISIBLE_ENV, enabled=False, privileged_only=True))
MIG_CAPABILITIES = RequestSource(
    name="migCapabilitiesEnv", read_from="env",
    default=SourceRule(title=f"{MIG_CONFIG_ENV}/{MIG_MONITOR_ENV}", enabled=True,
                       privileged_only=True))
IMEX_CHANNELS = RequestSource(
    name="imexChannelsEnv", read_from="env", when_denied="ignore",
    default=SourceRule(title=IMEX_ENV, enabled=False, privileged_only=True))

SOURCES = (NRI_ANNOTATIONS, VOLUME_MOUNTS, VISIBLE_DEVICES, MIG_CAPABILITIES, IMEX_CHANNELS)
