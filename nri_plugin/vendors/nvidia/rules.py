"""NVIDIA's rules behind the injector's ``VendorRules`` interface: ``NVIDIA_REQUIRE_*``
checked against the facts of the specs a requested device comes from,
``NVIDIA_DRIVER_CAPABILITIES`` as an edit filter (only the driver files of the capabilities
asked for, as the generator's sidecar assigns them: docs/usage/policy.md, "Driver
capabilities"), and the GPUs and MIG devices a device covers (``allocations``). Facts
come from the generator's sidecars (``nodefacts``), loaded in the refresher's thread;
everything else here is pure.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

from cdi.cache import Snapshot
from cdi.edits import merge
from cdi.model import ContainerEdits, DeviceNode, Hook, Mount
from nri_plugin.nri.wire import Code
from nri_plugin.plugins.cdi_injector.context import ContainerContext, RequestSource
from nri_plugin.plugins.cdi_injector.policy import Policy, PolicyDenied
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.vendors.nvidia.nodefacts import DeviceFacts, NodeFacts, SpecFacts, load_facts
from nri_plugin.vendors.nvidia.requirements import RequirementError, check, requirements_from_env
from nri_plugin.vendors.nvidia.sources import (
    GPU_KIND,
    IMEX_CHANNELS,
    IMEX_ENV,
    MIG_CAPABILITIES,
    MIG_CONFIG_ENV,
    MIG_MONITOR_ENV,
    NRI_ANNOTATIONS,
    NRI_KEY,
    SOURCES,
    VISIBLE_DEVICES,
    VISIBLE_ENV,
    ExtrasError,
    driver_only_edits,
    facts_of,
    imex_channel_ids,
    imex_channels,
    is_legacy_image,
    match_id,
    mig_capability_node,
    wants_driver_only,
    wants_mig_capability,
)

CAPABILITIES_ENV = "NVIDIA_DRIVER_CAPABILITIES"
ALL_CAPABILITIES = frozenset({"compute", "compat32", "graphics", "utility", "video", "display",
                              "ngx"})
DEFAULT_CAPABILITIES = frozenset({"utility", "compute"})
# What one capability brings along: video needs the compute libraries; display is
# the graphics libraries plus the modeset node.
_IMPLIES = {"video": frozenset({"compute"}), "display": frozenset({"graphics"})}


class CapabilityError(Refusal):
    default_rule = "nvidia.capabilities"
    default_code = Code.INVALID_ARGUMENT


def requested_capabilities(env: Mapping[str, str], *, legacy: bool = False) -> frozenset[str]:
    """The capability set a container asks for. Unset or empty: utility,compute (a legacy
    image without the variable: all). Raises CapabilityError for an unknown name."""
    text = env.get(CAPABILITIES_ENV, "")
    names = {n.strip() for n in text.split(",") if n.strip()}
    if not names:
        return ALL_CAPABILITIES if legacy else _expand(DEFAULT_CAPABILITIES)
    if "all" in names:
        return ALL_CAPABILITIES
    unknown = sorted(names - ALL_CAPABILITIES)
    if unknown:
        raise CapabilityError(f"{CAPABILITIES_ENV}: unknown capability "
                              f"{', '.join(map(repr, unknown))} "
                              f"(known: all, {', '.join(sorted(ALL_CAPABILITIES))})")
    return _expand(frozenset(names))


def _expand(names: frozenset[str]) -> frozenset[str]:
    return names.union(*(_IMPLIES.get(name, ()) for name in names))


def filter_edits(edits: ContainerEdits, capability_of: Mapping[str, str],
                 wanted: frozenset[str]) -> ContainerEdits:
    """``edits`` without the mounts of driver files that belong to a capability not in
    ``wanted``. A mount is known by the host file it mounts: a hook-free spec mounts one
    library at its versioned name and at each link name. Older sidecars record container
    paths: a mount is then known by its container path, else by another mount of the same
    host file that is."""
    if wanted >= ALL_CAPABILITIES or not capability_of:
        return edits
    by_host = {m.host_path: capability_of[m.container_path] for m in edits.mounts
               if m.container_path in capability_of}

    def capability(mount: Mount) -> str:
        return (capability_of.get(mount.host_path) or capability_of.get(mount.container_path)
                or by_host.get(mount.host_path, "other"))

    kept = tuple(m for m in edits.mounts if capability(m) in wanted or capability(m) == "other")
    if len(kept) == len(edits.mounts):
        return edits
    return edits._replace(mounts=kept)


# The resource names NVIDIA's device plugin registers (nvidia.com/gpu, nvidia.com/mig-1g.10gb,
# a renamed or shared resource): all under its domain.
RESOURCE_DOMAIN = "nvidia.com/"
CAPS_FOLDER = "/dev/nvidia-caps/"


class CapabilityFilter(NamedTuple):
    """Keep the driver mounts of the capabilities in ``wanted`` (and files of none), after
    adding ``extra``: edits of no device (the driver alone, MIG and IMEX nodes)."""

    # Each involved spec's driver file (host path) -> capability, a later one winning; read
    # only where a plan is made (most containers reuse one).
    capability_maps: tuple[Mapping[str, str], ...]
    wanted: frozenset[str]
    extra: ContainerEdits = ContainerEdits()

    @property
    def cache_key(self) -> Hashable:
        # The capability maps follow from the registry and the devices.
        return (self.wanted, self.extra)

    def apply(self, edits: ContainerEdits) -> ContainerEdits:
        if not self.extra.is_empty():
            edits = merge([edits, self.extra])
        if not self.capability_maps:
            return edits
        return filter_edits(edits, {file: capability for m in self.capability_maps
                                    for file, capability in m.items()}, self.wanted)


class NvidiaRules:
    """The NVIDIA semantics of a container's request, for the CDI injector."""

    name = "nvidia"
    sources: tuple[RequestSource, ...] = SOURCES
    # management.nvidia.com/* exposes every GPU for management tools.
    default_denials: tuple[str, ...] = ("management.nvidia.com/*",)
    hooks: tuple[str, ...] = ("mask-proc",)
    annotation_prefixes: tuple[str, ...] = (NRI_KEY,)
    env_request_prefixes: tuple[str, ...] = (
        VISIBLE_ENV + "=", "CUDA_VERSION=", MIG_CONFIG_ENV + "=", MIG_MONITOR_ENV + "=",
        IMEX_ENV + "=")
    verdict_env: tuple[str, ...] = ("NVIDIA_", "CUDA_VERSION")
    extras_env: tuple[str, ...] = (VISIBLE_ENV, MIG_CONFIG_ENV, MIG_MONITOR_ENV, IMEX_ENV)
    filter_env: tuple[str, ...] = (CAPABILITIES_ENV,)

    def __init__(self) -> None:
        self._last: NodeFacts | None = None  # refresher thread only

    def load_facts(self, snapshot: Snapshot) -> NodeFacts:
        facts = load_facts(snapshot, previous=self._last)
        self._last = facts
        return facts

    def verdict(self, context: ContainerContext, names: Sequence[str], policy: Policy,
                snapshot: Snapshot, facts: object) -> CapabilityFilter | None:
        """Check NVIDIA_REQUIRE_*, add what ``none``, the MIG capabilities and IMEX
        channels ask for, and return the capability filter (None: nothing to add or
        drop)."""
        env = context.env
        node = facts_of(facts)
        specs = {s.path: s for s in (node.spec_of(n, snapshot) for n in names)
                 if s is not None}
        extra, extra_spec = self._extras(policy, names, context, snapshot, node)
        if extra_spec is not None and extra_spec in node.specs:
            specs.setdefault(extra_spec, node.specs[extra_spec])
        by_node = _by_device_node(names, snapshot, node)
        if policy.enforce_requirements:
            requirements = requirements_from_env(env)
            if (requirements and names and not specs and policy.unknown_facts == "deny"
                    and not by_node):
                raise RequirementError(
                    f"cannot check {requirements[0].env}: no recorded node facts for "
                    f"{', '.join(names)} (policy requirements.unknownFacts: deny)",
                    rule="requirements.unknownFacts", device=names[0])
            for spec in specs.values():
                check(requirements, spec.versions, _gpus(names, spec))
            # GPUs named by another spec (the device plugin's own, another generator's):
            # recognised by their /dev/nvidia<minor> node, checked with our spec's facts.
            for path, gpus in by_node.items():
                check(requirements, node.specs[path].versions, gpus)
        capability_maps: tuple[Mapping[str, str], ...] = ()
        if policy.filter_capabilities and not _whole_devices(context):
            # A DRA claim's or the device plugin's spec mounts the same driver files at
            # the same container paths: our spec's facts say which capability each serves.
            capability_maps = tuple(m for m in (
                *(spec.capability_of for spec in specs.values()),
                *(node.specs[path].capability_of for path in by_node)) if m)
        if not capability_maps and extra.is_empty():
            return None
        wanted = requested_capabilities(env, legacy=is_legacy_image(env))
        return CapabilityFilter(capability_maps, wanted, extra)

    def device_units(self, name: str, snapshot: Snapshot, facts: object) -> frozenset[str]:
        """A GPU is unit ``GPU-<uuid>``, a MIG device ``GPU-<uuid>/MIG-<uuid>``: a device
        of a spec with facts by its facts (``all``: every device of its spec), another
        spec's (a DRA claim's) by the device nodes it carries."""
        node = facts_of(facts)
        known = node.devices.get(name)
        if known is not None:
            return frozenset({_unit(known)})
        device = snapshot.devices.get(name)
        if device is None:
            return frozenset()
        spec = node.specs.get(device.spec.path)
        if spec is not None:  # a name of our spec without facts of its own: its "all"
            return frozenset(_unit(d) for d in spec.devices.values()) if (
                name == f"{spec.kind}=all") else frozenset()
        return _units_by_nodes({n.path for n in device.edits.device_nodes}, snapshot, node)

    def allocated_units(self, resource: str, device_id: str, snapshot: Snapshot,
                        facts: object) -> frozenset[str]:
        """The units of one of NVIDIA's device plugin's ids (a GPU or MIG uuid, an index)."""
        if not resource.startswith(RESOURCE_DOMAIN):
            return frozenset()
        # A GPU shared by time-slicing or MPS is listed once per replica: "<id>::<replica>".
        node = facts_of(facts)
        known = [d for d in node.devices.values() if d.name.startswith(GPU_KIND + "=")]
        name = match_id(device_id.partition("::")[0], known)
        return frozenset({_unit(node.devices[name])}) if name is not None else frozenset()

    def _extras(self, policy: Policy, names: Sequence[str], context: ContainerContext,
                snapshot: Snapshot,
                node: NodeFacts) -> tuple[ContainerEdits, str | None]:
        """Edits of no device that the env asks for and the policy allows, and the NVIDIA
        spec ``none``'s edits came from."""
        env = context.env
        parts: list[ContainerEdits] = []
        spec_path = None
        if wants_driver_only(env) and not names and _allows(policy, VISIBLE_DEVICES, context):
            spec_path, edits = driver_only_edits(snapshot)
            parts.append(edits)
        nodes: list[DeviceNode] = []
        for variable, which in ((MIG_CONFIG_ENV, "migConfig"), (MIG_MONITOR_ENV, "migMonitor")):
            if not wants_mig_capability(env, variable):
                continue
            try:
                policy.check_source(MIG_CAPABILITIES.name, context.namespace,
                                    context.privileged, default=MIG_CAPABILITIES.default)
            except PolicyDenied as denial:
                raise ExtrasError(f"{variable}: {denial}", rule=denial.reason.rule) from None
            mig = [n for n in names if node.devices.get(n) is not None
                   and node.devices[n].type == "mig"]
            if mig:
                raise ExtrasError(f"{variable}: cannot be used with specific MIG devices "
                                  f"selected ({', '.join(mig)})", rule=f"nvidia.{variable}")
            nodes.append(mig_capability_node(node, which, variable))
        # Like NVIDIA_VISIBLE_DEVICES, and as NVIDIA's CDI modes do, the variable is
        # ignored where the policy does not allow it (images and job scripts set it).
        if env.get(IMEX_ENV) and _allows(policy, IMEX_CHANNELS, context):
            channels = imex_channels(node)
            wanted = imex_channel_ids(env, list(channels))
            nodes += [channels[c] for c in wanted]
        if nodes:
            parts.append(ContainerEdits(device_nodes=tuple(nodes)))
        if policy.mask_proc:
            hook = _mask_hook(names, snapshot, node, spec_path)
            if hook is not None:
                parts.append(ContainerEdits(hooks=(hook,)))
        return merge(parts) if parts else ContainerEdits(), spec_path


def _unit(device: DeviceFacts) -> str:
    return f"{device.gpu_uuid}/{device.mig_uuid}" if device.type == "mig" else device.gpu_uuid


def _units_by_nodes(paths: set[str], snapshot: Snapshot, facts: NodeFacts) -> frozenset[str]:
    """Units whose device nodes ``paths`` hold: a MIG device by its capability nodes
    (``/dev/nvidia-caps/``, which tell one MIG device of a GPU from another; all of them
    present), else a GPU by its ``/dev/nvidia<minor>``."""
    mig = set()
    for facts_device in facts.devices.values():
        device = snapshot.devices.get(facts_device.name)
        if facts_device.type != "mig" or device is None:
            continue
        caps = {n.path for n in device.edits.device_nodes if n.path.startswith(CAPS_FOLDER)}
        if caps and caps <= paths:
            mig.add(_unit(facts_device))
    return frozenset(mig) or frozenset(
        _unit(d) for d in facts.devices.values()
        if d.type == "gpu" and d.minor is not None and f"/dev/nvidia{d.minor}" in paths)


def _whole_devices(context: ContainerContext) -> bool:
    """Whether the container gets its devices whole, as CDI defines them: asked for only
    through NVIDIA's NRI plugin's annotations, without NVIDIA_DRIVER_CAPABILITIES. That
    plugin hands the names to the runtime's own CDI, which applies every edit; a pod moved
    from it keeps the container it had (docs/install/migrate.md)."""
    return (bool(context.groups) and CAPABILITIES_ENV not in context.env
            and all(g.source is NRI_ANNOTATIONS for g in context.groups))


def _by_device_node(names: Sequence[str], snapshot: Snapshot,
                    node: NodeFacts) -> dict[str, list[DeviceFacts]]:
    """For requested devices of specs without facts: the recorded GPUs whose
    ``/dev/nvidia<minor>`` node they carry, by the spec path whose facts know them."""
    minors: dict[str, tuple[str, DeviceFacts]] = {}
    for spec in node.specs.values():
        for d in spec.devices.values():
            if d.type == "gpu" and d.minor is not None:
                minors.setdefault(f"/dev/nvidia{d.minor}", (spec.path, d))
    out: dict[str, list[DeviceFacts]] = {}
    for name in names:
        device = snapshot.devices.get(name)
        if device is None or device.spec.path in node.specs:
            continue
        for dev_node in device.edits.device_nodes:
            found = minors.get(dev_node.path)
            if found is not None:
                out.setdefault(found[0], []).append(replace(found[1], name=name))
    return out


def _mask_hook(names: Sequence[str], snapshot: Snapshot, node: NodeFacts,
               driver_only_spec: str | None) -> Hook | None:
    """``mask-proc`` with one ``--gpu`` per GPU the container gets from NVIDIA specs that
    record the hook (a MIG device: its parent); None when no such spec is involved."""
    involved = [node.specs.get(driver_only_spec)] if driver_only_spec else []
    buses: list[str] = []
    for name in names:
        spec = node.spec_of(name, snapshot)
        if spec is None or spec.mask_hook is None:
            continue
        involved.append(spec)
        if name == f"{spec.kind}=all":
            buses += [d.bus_id for d in spec.devices.values()]
        elif name in spec.devices:
            buses.append(spec.devices[name].bus_id)
    hooks = [s.mask_hook for s in involved if s is not None and s.mask_hook is not None]
    if not hooks:
        return None
    gpus = [arg for bus in sorted({b for b in buses if b}) for arg in ("--gpu", bus)]
    return hooks[-1]._replace(args=(*hooks[-1].args, *gpus))


def _allows(policy: Policy, source: RequestSource, context: ContainerContext) -> bool:
    return policy.source_allowed(source.name, context.namespace, context.privileged,
                                 source.default) is None


def _gpus(names: Sequence[str], spec: SpecFacts) -> list[DeviceFacts]:
    if f"{spec.kind}=all" in names:  # "all": every device of that spec
        return list(spec.devices.values())
    return [spec.devices[n] for n in names if n in spec.devices]
