"""Which CDI devices a container asks for, from pod and container annotations
(docs/usage/requesting-devices.md). Pure. A pod's ``cdi.k8s.io/ctr.<container-name>``
cannot clash with device-plugin keys, which always hold a ``_`` that container names
cannot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cdi.annotations import ANNOTATION_PREFIX, parse_annotation
from cdi.errors import AnnotationError
from cdi.parser import is_qualified_name
from nri_plugin.nri.wire import Code
from nri_plugin.plugins.cdi_injector.refusal import Refusal

CONTAINER_KEY_PREFIX = ANNOTATION_PREFIX + "ctr."


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    name: str
    source: str  # e.g. "pod annotation 'cdi.k8s.io/gpu'", for error messages


def pod_requests(pod_annotations: Mapping[str, str], container_name: str) -> list[DeviceRequest]:
    """Requests from the pod's ``cdi.k8s.io/`` annotations (pod-wide and this container's)."""
    requests: list[DeviceRequest] = []
    own_key = CONTAINER_KEY_PREFIX + container_name
    for key in sorted(pod_annotations):
        if not key.startswith(ANNOTATION_PREFIX):
            continue
        if key.startswith(CONTAINER_KEY_PREFIX) and key != own_key:
            continue  # another container's request
        requests += _annotation_requests("pod", key, pod_annotations[key])
    return requests


def container_requests(container_annotations: Mapping[str, str]) -> list[DeviceRequest]:
    """Requests from the container's ``cdi.k8s.io/`` annotations (the kubelet's)."""
    requests: list[DeviceRequest] = []
    for key in sorted(container_annotations):
        if key.startswith(ANNOTATION_PREFIX):
            requests += _annotation_requests("container", key, container_annotations[key])
    return requests


def _annotation_requests(where: str, key: str, value: str) -> list[DeviceRequest]:
    try:
        names = parse_annotation(key, value)
    except AnnotationError as exc:
        raise RequestError(f"{where} {exc}", annotation=key) from None
    source = f"{where} annotation {key!r}"
    return [DeviceRequest(n, source) for n in names]


NRI_PLUGINS_DOMAIN = "cdi.nri.io"  # containers/nri-plugins' cdi-device-injector


def nri_plugins_requests(pod_annotations: Mapping[str, str],
                         container_name: str) -> list[DeviceRequest]:
    """The pod annotations of containers/nri-plugins' CDI device injector, all of which
    apply together as there."""
    requests: list[DeviceRequest] = []
    for key in (f"{NRI_PLUGINS_DOMAIN}/container.{container_name}",
                f"{NRI_PLUGINS_DOMAIN}/pod", NRI_PLUGINS_DOMAIN):
        if key in pod_annotations:
            requests += comma_list_requests(key, pod_annotations[key])
    return requests


def comma_list_requests(key: str, value: str) -> list[DeviceRequest]:
    """A pod annotation whose value is a comma list of qualified CDI names (the other NRI
    injectors' format)."""
    source = f"pod annotation {key!r}"
    out = []
    for item in value.split(","):
        name = item.strip()
        if not is_qualified_name(name):
            raise RequestError(f"pod annotation {key!r}: {name!r} is not a fully qualified "
                               "CDI device name (vendor/class=name)", annotation=key)
        out.append(DeviceRequest(name, source))
    return out


class RequestError(Refusal):
    """A malformed request; ``reason.annotation`` names its key."""

    default_rule = "request.annotation"
    default_code = Code.INVALID_ARGUMENT


def unique_requests(requests: list[DeviceRequest]) -> list[DeviceRequest]:
    """Each device once, at its first request (its source names the first asker)."""
    first: dict[str, DeviceRequest] = {}
    for request in requests:
        first.setdefault(request.name, request)
    return list(first.values())
