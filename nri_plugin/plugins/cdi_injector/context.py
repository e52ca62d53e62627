"""One container as the injector sees it, built once per CreateContainer. Pure.

``ContainerContext`` holds the container's identity, env, annotations, mounts and user,
and the devices every request source asked for, read under the policy
(``read_context``). Everything after it (the policy's device rules, the vendors'
verdicts, the plan) reads this one immutable value; nothing goes back to the request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cdi.cache import Snapshot
from nri_plugin.api import nri_pb2
from nri_plugin.plugins.cdi_injector.policy import Policy
from nri_plugin.plugins.cdi_injector.requests import DeviceRequest, unique_requests
from nri_plugin.plugins.cdi_injector.vendor import RequestSource


@dataclass(frozen=True, slots=True)
class SourceRequests:
    """The devices one source asked for (never empty)."""

    source: RequestSource
    requests: tuple[DeviceRequest, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerContext:
    pod: str  # namespace/name, for messages
    namespace: str
    container_name: str
    container_id: str
    privileged: bool
    uid: int
    gid: int
    env: Mapping[str, str]
    # The request's own maps (not copied: read only); the same on every step.
    pod_annotations: Mapping[str, str]
    annotations: Mapping[str, str]
    mounts: tuple[tuple[str, str], ...]  # (destination, source): what kubelet asked for
    groups: tuple[SourceRequests, ...] = ()  # by source, in source order
    requests: tuple[DeviceRequest, ...] = ()  # each device once, at its first request


def bare_context(pod: nri_pb2.PodSandbox | None,
                 container: nri_pb2.Container) -> ContainerContext:
    """The container without its requests (what the request sources read)."""
    user = container.user if container.HasField("user") else None
    return ContainerContext(
        pod=f"{pod.namespace}/{pod.name}" if pod is not None else container.pod_sandbox_id,
        namespace=pod.namespace if pod is not None else "",
        container_name=container.name, container_id=container.id,
        privileged=is_privileged(container), uid=user.uid if user else 0,
        gid=user.gid if user else 0, env=env_map(container.env),
        pod_annotations=pod.annotations if pod is not None else {},
        annotations=container.annotations,
        mounts=tuple((m.destination, m.source) for m in container.mounts))


def read_context(pod: nri_pb2.PodSandbox | None, container: nri_pb2.Container,
                 sources: Sequence[tuple[RequestSource, object]], policy: Policy,
                 snapshot: Snapshot) -> ContainerContext:
    """The container with what every source asked for. ``sources``: (source, its vendor's
    facts), in source order. A source the policy does not allow and that is ignored then
    (``when_denied="ignore"``) is not read; the others are all read, and a malformed
    request raises its Refusal here. Whether the policy allows the sources that asked is
    ``check_sources``' business."""
    bare = bare_context(pod, container)
    groups: list[SourceRequests] = []
    for ignored_when_denied in (False, True):  # the env sources come last
        for source, facts in sources:
            if source.read is None or (source.when_denied == "ignore") != ignored_when_denied:
                continue
            if ignored_when_denied and policy.source_allowed(
                    source.name, bare.namespace, bare.privileged, source.default) is not None:
                continue
            found = source.read(bare, snapshot, facts)
            if found:
                groups.append(SourceRequests(source, tuple(found)))
    requests = unique_requests([r for group in groups for r in group.requests])
    return dataclasses.replace(bare, groups=tuple(groups), requests=tuple(requests))


def check_sources(context: ContainerContext, policy: Policy) -> None:
    """Raise PolicyDenied for the first source that asked and may not be used here."""
    for group in context.groups:
        policy.check_source(group.source.name, context.namespace, context.privileged,
                            default=group.source.default, asked_by=group.requests[0].source)


def is_privileged(container: nri_pb2.Container) -> bool:
    """NRI carries no privileged flag; a privileged container is the one whose device
    cgroup allows every device (containerd and CRI-O give privileged containers a single
    allow-all rule: allow, no type or type 'a', no major/minor)."""
    for rule in container.linux.resources.devices:
        if (rule.allow and rule.type in ("", "a") and not rule.HasField("major")
                and not rule.HasField("minor")):
            return True
    return False


def env_map(env: Sequence[str]) -> dict[str, str]:
    """``K=V`` entries → a dict; a later entry wins, as in execve's environment."""
    out: dict[str, str] = {}
    for entry in env:
        key, _, value = entry.partition("=")
        out[key] = value
    return out
