"""NVIDIA's rules behind the injector's ``VendorRules`` interface.

* ``NVIDIA_VISIBLE_DEVICES`` (and legacy CUDA images, which get every GPU) as a request
  source, resolved against the facts the generator recorded (indices, UUIDs, bus ids);
* ``NVIDIA_REQUIRE_*`` / ``NVIDIA_DISABLE_REQUIRE`` checked against the driver and GPU facts
  of every NVIDIA spec a requested device comes from;
* ``NVIDIA_DRIVER_CAPABILITIES`` as an edit filter that drops the driver mounts of the
  capabilities not asked for.

Facts come from the generator's ``<spec>.meta`` sidecars (``nodefacts``), loaded in the
refresher's thread; everything else here is pure.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

from cdi.cache import Snapshot
from cdi.model import ContainerEdits
from nri_plugin.plugins.cdi_injector.requests import DeviceRequest
from nri_plugin.vendors.nvidia.capabilities import filter_edits, requested_capabilities
from nri_plugin.vendors.nvidia.nodefacts import NodeFacts, SpecFacts, load_facts
from nri_plugin.vendors.nvidia.requirements import (
    GpuInfo,
    RequirementError,
    check,
    requirements_from_env,
)
from nri_plugin.vendors.nvidia.visible_devices import ENV as VISIBLE_ENV
from nri_plugin.vendors.nvidia.visible_devices import visible_device_names

if TYPE_CHECKING:
    from nri_plugin.plugins.cdi_injector.policy import Policy

EMPTY_FACTS = NodeFacts()


def is_legacy_image(env: Mapping[str, str]) -> bool:
    """An image from before NVIDIA_REQUIRE_CUDA (§3.5): CUDA_VERSION set, no requirement."""
    return bool(env.get("CUDA_VERSION")) and "NVIDIA_REQUIRE_CUDA" not in env


class CapabilityFilter(NamedTuple):
    """Keep the driver mounts of the capabilities in ``wanted`` (and files of none)."""

    capability_of: Mapping[str, str]  # container path -> capability
    wanted: frozenset[str]

    @property
    def cache_key(self) -> Hashable:
        # capability_of follows from the registry and the device names, which the plan
        # cache keys on already.
        return self.wanted

    def apply(self, edits: ContainerEdits) -> ContainerEdits:
        return filter_edits(edits, self.capability_of, self.wanted)


class NvidiaRules:
    """The NVIDIA semantics of a container's request, for the CDI injector."""

    name = "nvidia"
    env_source = "visibleDevicesEnv"
    env_request_prefixes: tuple[str, ...] = (VISIBLE_ENV + "=", "CUDA_VERSION=")

    def __init__(self) -> None:
        self._last: NodeFacts | None = None  # refresher thread only

    def load_facts(self, snapshot: Snapshot) -> NodeFacts:
        facts = load_facts(snapshot, previous=self._last)
        self._last = facts
        return facts

    def env_requests(self, env: Mapping[str, str], snapshot: Snapshot,
                     facts: object) -> list[DeviceRequest]:
        legacy = is_legacy_image(env)
        if VISIBLE_ENV not in env and not legacy:
            return []
        names = visible_device_names(env, snapshot, _facts(facts), legacy=legacy)
        source = f"env {VISIBLE_ENV}={env.get(VISIBLE_ENV, '(unset, legacy image)')}"
        return [DeviceRequest(n, source) for n in names]

    def decision_key(self, env: Mapping[str, str]) -> Hashable:
        return tuple(sorted((k, v) for k, v in env.items()
                            if k.startswith("NVIDIA_") or k == "CUDA_VERSION"))

    def check(self, policy: Policy, names: Sequence[str], env: Mapping[str, str],
              snapshot: Snapshot, facts: object) -> CapabilityFilter | None:
        """Check NVIDIA_REQUIRE_* against the facts of the requested devices' specs and
        return the capability filter for NVIDIA_DRIVER_CAPABILITIES (None: no facts)."""
        node = _facts(facts)
        specs = {s.path: s for s in (node.spec_of(n, snapshot) for n in names)
                 if s is not None}
        if policy.enforce_requirements:
            requirements = requirements_from_env(env)
            if requirements and not specs and policy.unknown_facts == "deny":
                raise RequirementError(
                    f"cannot check {requirements[0].env}: no recorded node facts for "
                    f"{', '.join(names)} (policy requirements.unknownFacts: deny)",
                    rule="requirements.unknownFacts", device=names[0] if names else None)
            for spec in specs.values():
                check(requirements, spec.versions, _gpus(names, spec))
        if not policy.filter_capabilities or not specs:
            return None
        wanted = requested_capabilities(env, legacy=is_legacy_image(env))
        capability_of: dict[str, str] = {}
        for spec in specs.values():
            capability_of.update(spec.capability_of)
        return CapabilityFilter(MappingProxyType(capability_of), wanted)


def _facts(facts: object) -> NodeFacts:
    return facts if isinstance(facts, NodeFacts) else EMPTY_FACTS


def _gpus(names: Sequence[str], spec: SpecFacts) -> list[GpuInfo]:
    devices = spec.devices
    requested = [devices[n] for n in names if n in devices]
    if f"{spec.kind}=all" in names:  # "all": every device of that spec
        requested = list(devices.values())
    return [d.gpu_info() for d in requested]
