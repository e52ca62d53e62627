"""Which CDI devices a container asks for, from pod and container annotations. Pure.

Sources (CDI annotation convention, ``cdi.k8s.io/`` prefix):

- container annotations ``cdi.k8s.io/<anything>``: what kubelet sets from device plugins
  (and what containerd's own CDI support reads);
- pod annotations ``cdi.k8s.io/<anything>``: apply to every container of the pod — the
  simple way for users to ask, e.g. ``cdi.k8s.io/gpu: nvidia.com/gpu=0``;
- pod annotations ``cdi.k8s.io/ctr.<container-name>``: apply to that container only.
  The key stays within the annotation key rules (at most 63 characters after the prefix,
  so container names up to 59 characters), and cannot clash with device-plugin keys,
  which always contain a ``_`` (``<plugin>_<device id>``) that container names cannot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cdi.annotations import ANNOTATION_PREFIX, parse_annotation
from cdi.errors import AnnotationError

CONTAINER_KEY_PREFIX = ANNOTATION_PREFIX + "ctr."


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    name: str
    source: str  # e.g. "pod annotation 'cdi.k8s.io/gpu'", for error messages


def container_key(container_name: str) -> str:
    return CONTAINER_KEY_PREFIX + container_name


def pod_requests(pod_annotations: Mapping[str, str], container_name: str) -> list[DeviceRequest]:
    """Requests from the pod's ``cdi.k8s.io/`` annotations (pod-wide and this container's)."""
    requests: list[DeviceRequest] = []
    own_key = container_key(container_name)
    for key in sorted(pod_annotations):
        if not key.startswith(ANNOTATION_PREFIX):
            continue
        if key.startswith(CONTAINER_KEY_PREFIX) and key != own_key:
            continue  # another container's request
        source = f"pod annotation {key!r}"
        requests += [DeviceRequest(n, source) for n in _parse(key, pod_annotations[key], "pod")]
    return requests


def container_requests(container_annotations: Mapping[str, str]) -> list[DeviceRequest]:
    """Requests from the container's ``cdi.k8s.io/`` annotations (kubelet: device plugins,
    DRA)."""
    requests: list[DeviceRequest] = []
    for key in sorted(container_annotations):
        if key.startswith(ANNOTATION_PREFIX):
            source = f"container annotation {key!r}"
            requests += [DeviceRequest(n, source)
                         for n in _parse(key, container_annotations[key], "container")]
    return requests


def _parse(key: str, value: str, where: str) -> list[str]:
    try:
        return parse_annotation(key, value)
    except AnnotationError as exc:
        raise AnnotationError(f"{where} {exc}") from None


def unique_requests(requests: list[DeviceRequest]) -> list[DeviceRequest]:
    """Each device once, at its first request (its source names the first asker)."""
    seen: set[str] = set()
    result = []
    for request in requests:
        if request.name not in seen:
            seen.add(request.name)
            result.append(request)
    return result
