"""How Kubernetes set-ups built for NVIDIA's toolkit ask for GPUs, as request sources: NVIDIA's
NRI plugin's pod annotations and the device plugin's ``/dev/null`` volume mounts
(docs/reference/annotations-and-env.md). Pure.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence

from cdi.cache import Snapshot
from nri_plugin.nri.api import nri_pb2
from nri_plugin.plugins.cdi_injector.requests import DeviceRequest, comma_list_requests
from nri_plugin.vendors.nvidia.nodefacts import NodeFacts
from nri_plugin.vendors.nvidia.visible_devices import (
    VOLUME_MOUNT_ROOT,
    VisibleDevicesError,
    resolve_ids,
)

NRI_KEY = "nvidia.cdi.k8s.io"
NRI_KEY_PREFIX = NRI_KEY + "/container."


def nvidia_nri_key(pod_annotations: Mapping[str, str], container_name: str) -> str | None:
    """The one pod annotation NVIDIA's NRI plugin reads for a container, by containerd/nri's
    rule for a container's effective annotation: ``<key>/container.<name>``, else
    ``<key>/pod``, else the bare ``<key>``; ``<key>/container.*`` (this plugin's own, and
    NVIDIA's before its 1.20) comes after the container's own key."""
    for key in (NRI_KEY_PREFIX + container_name, NRI_KEY_PREFIX + "*", NRI_KEY + "/pod",
                NRI_KEY):
        if key in pod_annotations:
            return key
    return None


def nvidia_nri_requests(pod_annotations: Mapping[str, str],
                        container_name: str) -> list[DeviceRequest]:
    key = nvidia_nri_key(pod_annotations, container_name)
    return comma_list_requests(key, pod_annotations[key]) if key is not None else []


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
