"""NVIDIA_DRIVER_CAPABILITIES: mount only the driver files of the capabilities asked for,
as the generator's sidecar assigns them (docs/usage/policy.md, "Driver capabilities"). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from cdi.model import ContainerEdits, Mount
from nri_plugin.nri.wire import Code
from nri_plugin.plugins.cdi_injector.refusal import Refusal

ENV = "NVIDIA_DRIVER_CAPABILITIES"
KNOWN = frozenset({"compute", "compat32", "graphics", "utility", "video", "display", "ngx"})
DEFAULT = frozenset({"utility", "compute"})
# What one capability brings along: video needs the compute libraries; display is
# the graphics libraries plus the modeset node.
_IMPLIES = {"video": frozenset({"compute"}), "display": frozenset({"graphics"})}


class CapabilityError(Refusal):
    default_rule = "nvidia.capabilities"
    default_code = Code.INVALID_ARGUMENT


def requested_capabilities(env: Mapping[str, str], *, legacy: bool = False) -> frozenset[str]:
    """The capability set a container asks for. Unset or empty: utility,compute (a legacy
    image without the variable: all). Raises CapabilityError for an unknown name."""
    text = env.get(ENV, "")
    names = {n.strip() for n in text.split(",") if n.strip()}
    if not names:
        return KNOWN if legacy else _expand(DEFAULT)
    if "all" in names:
        return KNOWN
    unknown = sorted(names - KNOWN)
    if unknown:
        raise CapabilityError(f"{ENV}: unknown capability {', '.join(map(repr, unknown))} "
                              f"(known: all, {', '.join(sorted(KNOWN))})")
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
    if wanted >= KNOWN or not capability_of:
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
