"""NVIDIA's request sources, as the injector's policy knows them (``sources.<name>``; their
defaults and why: docs/usage/policy.md), with the ways Kubernetes set-ups built for
NVIDIA's toolkit ask for GPUs: NVIDIA's NRI plugin's pod annotations and the device
plugin's ``/dev/null`` volume mounts (docs/reference/annotations-and-env.md). Pure.
``migCapabilitiesEnv`` and ``imexChannelsEnv`` ask for edits of no device: the verdict
(``rules``) reads them.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence

from cdi.cache import Snapshot
from nri_plugin.nri.api import nri_pb2
from nri_plugin.plugins.cdi_injector.context import ContainerContext, RequestSource
from nri_plugin.plugins.cdi_injector.policy import NO_NAMESPACE, SourceRule
from nri_plugin.plugins.cdi_injector.requests import DeviceRequest, comma_list_requests
from nri_plugin.vendors.nvidia.nodefacts import NodeFacts
from nri_plugin.vendors.nvidia.visible_devices import ENV as VISIBLE_ENV
from nri_plugin.vendors.nvidia.visible_devices import (
    IMEX_ENV,
    MIG_CONFIG_ENV,
    MIG_MONITOR_ENV,
    VOLUME_MOUNT_ROOT,
    VisibleDevicesError,
    resolve_ids,
    visible_device_names,
)

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
