"""NVIDIA's request sources, as the injector's policy knows them (``sources.<name>``). Pure.

* ``nvidiaNriAnnotations``: NVIDIA's NRI plugin's pod annotations (``k8s_sources``); on,
  the same trust as the injector's own pod annotations;
* ``volumeMounts``: the device plugin's volume mounts under
  ``/var/run/nvidia-container-devices/``; off unless the cluster keeps pods from making
  such mounts (docs/install/kubernetes.md, "With NVIDIA's device plugin");
* ``visibleDevicesEnv``: ``NVIDIA_VISIBLE_DEVICES`` in the container env; off, and ignored
  (not refused) where not allowed: CUDA base images set it to ``all``, so honouring it
  hands every GPU to any pod (k8s-device-plugin#87/#548/#1605);
* ``migCapabilitiesEnv`` (``NVIDIA_MIG_CONFIG_DEVICES``/``NVIDIA_MIG_MONITOR_DEVICES``):
  as NVIDIA, the MIG management nodes for privileged containers only; refused elsewhere;
* ``imexChannelsEnv`` (``NVIDIA_IMEX_CHANNELS``): off, ignored where not allowed.

The last two ask for edits of no device: the verdict (``rules``) reads them.
"""

from __future__ import annotations

from collections.abc import Mapping

from cdi.cache import Snapshot
from nri_plugin.plugins.cdi_injector.context import ContainerContext, RequestSource
from nri_plugin.plugins.cdi_injector.policy import SourceRule
from nri_plugin.plugins.cdi_injector.requests import DeviceRequest
from nri_plugin.vendors.nvidia.extras import IMEX_ENV, MIG_CONFIG_ENV, MIG_MONITOR_ENV
from nri_plugin.vendors.nvidia.k8s_sources import nvidia_nri_requests, volume_mount_requests
from nri_plugin.vendors.nvidia.nodefacts import NodeFacts
from nri_plugin.vendors.nvidia.visible_devices import ENV as VISIBLE_ENV
from nri_plugin.vendors.nvidia.visible_devices import VOLUME_MOUNT_ROOT, visible_device_names

EMPTY_FACTS = NodeFacts()


def facts_of(facts: object) -> NodeFacts:
    return facts if isinstance(facts, NodeFacts) else EMPTY_FACTS


def is_legacy_image(env: Mapping[str, str]) -> bool:
    """An image from before NVIDIA_REQUIRE_CUDA: CUDA_VERSION set, no requirement."""
    return bool(env.get("CUDA_VERSION")) and "NVIDIA_REQUIRE_CUDA" not in env


def _nri_annotations(context: ContainerContext, snapshot: Snapshot,
                     facts: object) -> list[DeviceRequest]:
    return nvidia_nri_requests(context.pod_annotations, context.container_name)


def _volume_mounts(context: ContainerContext, snapshot: Snapshot,
                   facts: object) -> list[DeviceRequest]:
    return volume_mount_requests(context.mounts, snapshot, facts_of(facts))


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
    name="nvidiaNriAnnotations", read_from="annotations", read=_nri_annotations,
    default=SourceRule(title="NVIDIA NRI plugin annotations (nvidia.cdi.k8s.io/)",
                       enabled=True))
VOLUME_MOUNTS = RequestSource(
    name="volumeMounts", read_from="mounts", read=_volume_mounts,
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
