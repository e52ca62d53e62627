"""NVIDIA's request sources, as the injector's policy knows them (``sources.<name>``; their
defaults and why: docs/usage/policy.md). Pure. ``migCapabilitiesEnv`` and
``imexChannelsEnv`` ask for edits of no device: the verdict (``rules``) reads them.
"""

from __future__ import annotations

from collections.abc import Mapping

from cdi.cache import Snapshot
from nri_plugin.plugins.cdi_injector.context import ContainerContext, RequestSource
from nri_plugin.plugins.cdi_injector.policy import NO_NAMESPACE, SourceRule
from nri_plugin.plugins.cdi_injector.requests import DeviceRequest
from nri_plugin.vendors.nvidia.k8s_sources import nvidia_nri_requests, volume_mount_requests
from nri_plugin.vendors.nvidia.no_device_requests import IMEX_ENV, MIG_CONFIG_ENV, MIG_MONITOR_ENV
from nri_plugin.vendors.nvidia.nodefacts import NodeFacts
from nri_plugin.vendors.nvidia.visible_devices import ENV as VISIBLE_ENV
from nri_plugin.vendors.nvidia.visible_devices import VOLUME_MOUNT_ROOT, visible_device_names

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
