"""All request sources of one container, under the policy, resolved to CDI names. Pure.

Sources: container annotations ``cdi.k8s.io/*`` (kubelet), pod annotations (users), the
other NRI CDI injectors' pod annotations (``cdi.nri.io``; the vendor's own, e.g. NVIDIA's
NRI plugin keys), what the vendor reads from the container's mounts (NVIDIA: the device
plugin's volume mounts), and whatever env variables the vendor rules read (NVIDIA:
``NVIDIA_VISIBLE_DEVICES``; off by default). An annotation or mount source the policy
does not allow here is a denial (the container fails, with the rule named): someone
asked on purpose. An env source is different: CUDA base images set
``NVIDIA_VISIBLE_DEVICES=all`` in every container, so where the policy does not allow it
the variable is ignored, not refused, or every CUDA image would break.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nri_plugin.nri.api import nri_pb2
from nri_plugin.plugins.cdi_injector.policy import Policy, PolicyDenied
from nri_plugin.plugins.cdi_injector.requests import (
    DeviceRequest,
    container_requests,
    nri_plugins_requests,
    pod_requests,
    unique_requests,
)
from nri_plugin.plugins.cdi_injector.vendor import Registry, VendorRules


@dataclass(frozen=True, slots=True)
class Gathered:
    requests: tuple[DeviceRequest, ...]
    denied: PolicyDenied | None = None  # the first source denial, naming the rule


def is_privileged(container: nri_pb2.Container) -> bool:
    """NRI carries no privileged flag; a privileged container is the one whose device
    cgroup allows every device (containerd and CRI-O give privileged containers a single
    allow-all rule: allow, no type or type 'a', no major/minor)."""
    linux = container.linux
    for rule in linux.resources.devices:
        if (rule.allow and rule.type in ("", "a") and not rule.HasField("major")
                and not rule.HasField("minor")):
            return True
    return False


def container_mounts(container: nri_pb2.Container) -> tuple[tuple[str, str], ...]:
    """(destination, source) of the container's mounts: what kubelet asked the runtime for
    (an image cannot add these)."""
    return tuple((m.destination, m.source) for m in container.mounts)


def env_map(env: Sequence[str]) -> dict[str, str]:
    """``K=V`` entries → a dict; a later entry wins, as in execve's environment."""
    out: dict[str, str] = {}
    for entry in env:
        key, _, value = entry.partition("=")
        out[key] = value
    return out


def gather(policy: Policy, vendors: Sequence[VendorRules], registry: Registry, *,
           namespace: str, container_name: str, pod_annotations: Mapping[str, str],
           container_annotations: Mapping[str, str], env: Mapping[str, str],
           privileged: bool, mounts: Sequence[tuple[str, str]] = ()) -> Gathered:
    """Every requested device once, in source order. Raises a Refusal (RequestError, or a
    vendor's) for a malformed annotation or an unknown id in an allowed env request."""
    requests: list[DeviceRequest] = []
    denied: PolicyDenied | None = None
    asked = [("podAnnotations", pod_requests(pod_annotations, container_name)),
             ("containerAnnotations", container_requests(container_annotations)),
             ("nriPluginsAnnotations", nri_plugins_requests(pod_annotations, container_name))]
    for vendor, facts in registry.paired(vendors):
        asked += vendor.other_requests(pod_annotations=pod_annotations,
                                       container_name=container_name, mounts=mounts,
                                       snapshot=registry.snapshot, facts=facts)
    for source, found in asked:
        if not found:
            continue
        denial = policy.source_denial(source, namespace, privileged)
        if denial is not None and denied is None:
            denied = PolicyDenied(f"{denial}; asked for by {found[0].source}",
                                  rule=denial.rule)
        requests += found
    for vendor, facts in registry.paired(vendors):
        if policy.source_denial(vendor.env_source, namespace, privileged) is None:
            requests += vendor.env_requests(env, registry.snapshot, facts)
    return Gathered(tuple(unique_requests(requests)), denied)
