"""All request sources of one container, under the policy, resolved to CDI names. Pure.

Sources: container annotations ``cdi.k8s.io/*`` (kubelet), pod annotations (users), and
``NVIDIA_VISIBLE_DEVICES`` in the container env (off by default). An annotation source the
policy does not allow here is a denial (the container fails, with the rule named): someone
asked on purpose. The env source is different: CUDA base images set
``NVIDIA_VISIBLE_DEVICES=all`` in every container, so where the policy does not allow it
the variable is ignored, not refused, or every CUDA image would break.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cdi.cache import Snapshot
from nri_plugin.api import nri_pb2
from nri_plugin.plugins.cdi_injector.policy import Policy
from nri_plugin.plugins.cdi_injector.requests import (
    DeviceRequest,
    container_requests,
    pod_requests,
    unique_requests,
)
from nri_plugin.vendors.nvidia.nodefacts import NodeFacts
from nri_plugin.vendors.nvidia.visible_devices import ENV as VISIBLE_ENV
from nri_plugin.vendors.nvidia.visible_devices import visible_device_names


@dataclass(frozen=True, slots=True)
class Gathered:
    requests: tuple[DeviceRequest, ...]
    denied: str | None = None  # the first source denial, naming the rule


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


def is_legacy_image(env: Mapping[str, str]) -> bool:
    """An image from before NVIDIA_REQUIRE_CUDA (§3.5): CUDA_VERSION set, no requirement."""
    return bool(env.get("CUDA_VERSION")) and "NVIDIA_REQUIRE_CUDA" not in env


def gather(policy: Policy, *, namespace: str, container_name: str,
           pod_annotations: Mapping[str, str], container_annotations: Mapping[str, str],
           env: Mapping[str, str], privileged: bool, snapshot: Snapshot,
           facts: NodeFacts) -> Gathered:
    """Every requested device once, in source order. Raises AnnotationError for a malformed
    annotation and VisibleDevicesError for an unknown id in an allowed env request."""
    requests: list[DeviceRequest] = []
    denied: str | None = None
    for source, found in (("podAnnotations", pod_requests(pod_annotations, container_name)),
                          ("containerAnnotations", container_requests(container_annotations))):
        if not found:
            continue
        why = policy.source_allowed(source, namespace, privileged)
        if why and denied is None:
            denied = f"{why}; asked for by {found[0].source}"
        requests += found
    wants_env = VISIBLE_ENV in env or is_legacy_image(env)
    if wants_env and policy.source_allowed("visibleDevicesEnv", namespace, privileged) is None:
        names = visible_device_names(env, snapshot, facts, legacy=is_legacy_image(env))
        source = f"env {VISIBLE_ENV}={env.get(VISIBLE_ENV, '(unset, legacy image)')}"
        requests += [DeviceRequest(n, source) for n in names]
    return Gathered(tuple(unique_requests(requests)), denied)
