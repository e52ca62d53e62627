"""One container as the injector sees it, with what every request source asked for, built
once per CreateContainer; every later step reads this one immutable value; and the
injector's own sources' grammar: which CDI devices pod and container annotations ask for
(docs/usage/requesting-devices.md). Pure. A pod's ``cdi.k8s.io/ctr.<container-name>``
cannot clash with device-plugin keys, which always hold a ``_`` that container names
cannot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from cdi.annotations import ANNOTATION_PREFIX, parse_annotation
from cdi.cache import Snapshot
from cdi.errors import AnnotationError
from cdi.parser import is_qualified_name
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.crio import own_annotations
from nri_plugin.nri.wire import Code
from nri_plugin.plugins.cdi_injector.policy import Policy, SourceRule
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


# Reads a source's requests from a container (pure): the container, the snapshot and the
# vendor's facts for it. Raises a Refusal for a malformed request.
Reader = Callable[["ContainerContext", Snapshot, object], list[DeviceRequest]]


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestSource:
    """One way of asking for devices, as the policy names it (``sources.<name>``)."""

    name: str
    default: SourceRule  # the rule without a policy file, with the source's title
    read_from: Literal["annotations", "env", "mounts"]
    # Where the policy does not allow the source: "refuse" the container (someone asked on
    # purpose) or "ignore" the source (images set such env variables in every container).
    when_denied: Literal["refuse", "ignore"] = "refuse"
    # None: the source asks for edits of no device, which the vendor's verdict reads.
    read: Reader | None = None
    # Whether the kubelet puts the request there from its own allocation (a device plugin,
    # a DRA claim). Any other source is checked against what the kubelet allocated to
    # other pods (``allocations``): the scheduler did not count it.
    allocated: bool = False


class SourceRequests(NamedTuple):
    """The devices one source asked for (never empty)."""

    source: RequestSource
    requests: tuple[DeviceRequest, ...]


class ContainerContext(NamedTuple):
    """One container, read once; immutable."""

    namespace: str
    pod_name: str
    container_name: str
    container_id: str
    privileged: bool
    uid: int
    gid: int
    # The entries whose names someone reads (``env_names``), not the whole env: Kubernetes
    # gives every container a few variables per service of its namespace.
    env: Mapping[str, str]
    # The request's own maps and list (not copied: read only); the same on every step.
    pod_annotations: Mapping[str, str]
    annotations: Mapping[str, str]
    mounts: Sequence[nri_pb2.Mount]  # what kubelet asked for (destination, source, ...)
    groups: tuple[SourceRequests, ...] = ()  # by source, in source order
    requests: tuple[DeviceRequest, ...] = ()  # each device once, at its first request

    @property
    def pod(self) -> str:
        """namespace/name, for messages."""
        return f"{self.namespace}/{self.pod_name}"


def bare_context(pod: nri_pb2.PodSandbox | None, container: nri_pb2.Container,
                 env_names: tuple[str, ...] | None = None) -> ContainerContext:
    """The container, no request read yet. ``env_names``: the prefixes of the env names
    the context keeps; None keeps them all."""
    pod = pod if pod is not None else nri_pb2.PodSandbox()
    user = container.user if container.HasField("user") else None
    return ContainerContext(
        pod.namespace, pod.name, container.name, container.id, is_privileged(container),
        user.uid if user else 0, user.gid if user else 0, env_map(container.env, env_names),
        # the container's own annotations: CRI-O shows the pod's among them
        pod.annotations, own_annotations(container), container.mounts)


def read_context(bare: ContainerContext, sources: Sequence[tuple[RequestSource, object]],
                 policy: Policy, snapshot: Snapshot) -> ContainerContext:
    """``bare`` with what every source (``asked.all_sources``) asked for. A source ignored
    where denied is read only where the policy allows it; the others are all read, and a
    malformed request raises its Refusal here."""
    groups: list[SourceRequests] = []
    for source, facts in sources:
        if source.read is None or (source.when_denied == "ignore" and policy.source_allowed(
                source.name, bare.namespace, bare.privileged, source.default) is not None):
            continue
        found = source.read(bare, snapshot, facts)
        if found:
            groups.append(SourceRequests(source, tuple(found)))
    if not groups:
        return bare
    requests = unique_requests([r for group in groups for r in group.requests])
    return bare._replace(groups=tuple(groups), requests=tuple(requests))


def check_sources(context: ContainerContext, policy: Policy) -> None:
    """Raise PolicyDenied for the first source that asked and may not be used here."""
    for group in context.groups:
        policy.check_source(group.source.name, context.namespace, context.privileged,
                            default=group.source.default, asked_by=group.requests[0].source)


def is_privileged(container: nri_pb2.Container) -> bool:
    """NRI carries no privileged flag; a privileged container is the one whose device
    cgroup allows every device (containerd and CRI-O give privileged containers a single
    allow-all rule: allow, no type or type 'a', no major/minor)."""
    return any(rule.allow and rule.type in ("", "a") and not rule.HasField("major")
               and not rule.HasField("minor") for rule in container.linux.resources.devices)


def env_map(env: Sequence[str], names: tuple[str, ...] | None = None) -> dict[str, str]:
    """``K=V`` entries → a dict, a later entry winning as in execve's environment; only the
    names that start with one of ``names`` (None: all)."""
    out: dict[str, str] = {}
    for entry in env:
        if names is None or entry.startswith(names):
            key, _, value = entry.partition("=")
            out[key] = value
    return out
