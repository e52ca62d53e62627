"""What the generator recorded about the node: ``<spec>.meta`` sidecars, read in the
refresher's thread into an immutable ``NodeFacts`` swapped in with its snapshot. A sidecar
counts only when its ``spec.sha256`` matches the spec beside it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from cdi.cache import Snapshot
from cdi.model import DeviceNode, Hook
from cdi.nvidia.sidecar import SUFFIX as SIDECAR_SUFFIX

log = logging.getLogger("nri_cdi.facts")
_MAX_SIDECAR_BYTES = 16 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeVersions:
    driver: str | None = None  # RM version, e.g. 550.54.15
    cuda: str | None = None  # the newest CUDA the driver supports, e.g. 12.4


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceFacts:
    name: str  # qualified CDI name
    type: str  # gpu or mig
    gpu_index: int | None = None
    gpu_uuid: str = ""
    bus_id: str = ""
    mig_index: int | None = None
    mig_uuid: str = ""
    arch: str | None = None  # compute capability, e.g. 8.0
    brand: str | None = None  # e.g. tesla, nvidia
    minor: int | None = None  # of /dev/nvidia<minor> (the parent GPU's, for MIG)


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class SpecFacts:
    path: str
    kind: str
    versions: NodeVersions
    # container path of a driver file → its capability (utility, compute, ..., other)
    capability_of: Mapping[str, str]
    devices: Mapping[str, DeviceFacts]
    # Device nodes that belong to no CDI device: ``migConfig`` / ``migMonitor`` capability
    # nodes, and the IMEX channel nodes by channel number (sidecar ``nodes``).
    nodes: Mapping[str, DeviceNode] = field(default_factory=_empty)
    imex_channels: Mapping[int, DeviceNode] = field(default_factory=_empty)
    # ``nri-cdi hook mask-proc`` as the generator would start it (sidecar ``procMask``).
    mask_hook: Hook | None = None


@dataclass(frozen=True, slots=True)
class NodeFacts:
    specs: Mapping[str, SpecFacts] = field(default_factory=_empty)  # by spec path
    devices: Mapping[str, DeviceFacts] = field(default_factory=_empty)  # by CDI name
    # The parsed spec object each spec's facts were read for (the registry keeps the
    # object of an unchanged file), so that a later load can tell they still apply.
    loaded_for: Mapping[str, object] = field(default_factory=_empty)

    def spec_of(self, device_name: str, snapshot: Snapshot) -> SpecFacts | None:
        device = snapshot.devices.get(device_name)
        return self.specs.get(device.spec.path) if device is not None else None


def load_facts(snapshot: Snapshot, previous: NodeFacts | None = None) -> NodeFacts:
    """Read every spec's sidecar (I/O); problems are logged and that sidecar skipped. A
    sidecar that does not match its spec keeps ``previous``'s facts for that spec when the
    spec file did not change since."""
    specs: dict[str, SpecFacts] = {}
    loaded_for: dict[str, object] = {}
    for path, loaded in snapshot.specs.items():
        doc = _read_sidecar(path)
        if doc is _STALE:  # one of the two is being rewritten
            kept = (previous.specs.get(path) if previous is not None
                    and previous.loaded_for.get(path) is loaded.spec else None)
            if kept is not None:
                specs[path], loaded_for[path] = kept, loaded.spec
            continue
        if doc is None:
            continue
        try:
            facts = parse_sidecar(path, loaded.spec.kind, doc)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("%s%s: unusable metadata (%s); no requirement or capability data "
                        "for this spec", path, SIDECAR_SUFFIX, exc)
            continue
        specs[path], loaded_for[path] = facts, loaded.spec
    devices = {name: d for facts in specs.values() for name, d in facts.devices.items()}
    return NodeFacts(MappingProxyType(specs), MappingProxyType(devices),
                     MappingProxyType(loaded_for))


_STALE: dict[str, Any] = {}


def _read_sidecar(spec_path: str) -> dict[str, Any] | None:
    try:
        with open(spec_path, "rb") as spec_file:
            digest = hashlib.sha256(spec_file.read()).hexdigest()
        with open(spec_path + SIDECAR_SUFFIX, "rb") as meta_file:
            doc = json.loads(meta_file.read(_MAX_SIDECAR_BYTES))
    except FileNotFoundError:
        return None  # a spec from another generator: no facts, checks are skipped
    except (OSError, ValueError) as exc:
        log.warning("%s%s: cannot read (%s)", spec_path, SIDECAR_SUFFIX, exc)
        return None
    if not isinstance(doc, dict) or doc.get("spec", {}).get("sha256") != digest:
        # The generator writes the sidecar just after the spec: we may be in between.
        log.info("%s%s belongs to another version of the spec (sha256 differs); ignored",
                 spec_path, SIDECAR_SUFFIX)
        return _STALE
    return doc


def parse_sidecar(path: str, kind: str, doc: Mapping[str, Any]) -> SpecFacts:
    """The facts of one sidecar document (pure); raises KeyError/TypeError/ValueError."""
    driver = doc.get("driver") or {}
    versions = NodeVersions(driver=driver.get("version") or None,
                            cuda=driver.get("cudaVersion") or None)
    capability_of = {str(p): str(cap) for cap, paths in (doc.get("capabilities") or {}).items()
                     for p in paths}
    devices = {}
    for name, meta in (doc.get("devices") or {}).items():
        qualified = f"{kind}={name}"
        devices[qualified] = DeviceFacts(
            name=qualified, type=str(meta.get("type", "gpu")),
            gpu_index=_int(meta.get("gpuIndex")), gpu_uuid=str(meta.get("gpuUuid") or ""),
            bus_id=str(meta.get("busId") or ""), mig_index=_int(meta.get("migIndex")),
            mig_uuid=str(meta.get("migUuid") or ""), arch=_str(meta.get("arch")),
            brand=_str(meta.get("brand")), minor=_int(meta.get("minor")))
    recorded = doc.get("nodes") or {}
    nodes = {key: _node(recorded[key]) for key in ("migConfig", "migMonitor")
             if recorded.get(key)}
    imex = {int(n): _node(v) for n, v in (recorded.get("imexChannels") or {}).items()}
    mask = (doc.get("procMask") or {}).get("hook")
    mask_hook = None if not mask else Hook(
        hook_name="createContainer", path=str(mask["path"]),
        args=tuple(str(a) for a in mask["args"]), env=tuple(str(e) for e in mask["env"]))
    return SpecFacts(path=path, kind=kind, versions=versions,
                     capability_of=MappingProxyType(capability_of),
                     devices=MappingProxyType(devices), nodes=MappingProxyType(nodes),
                     imex_channels=MappingProxyType(imex), mask_hook=mask_hook)


def _node(meta: Mapping[str, Any]) -> DeviceNode:
    return DeviceNode(path=str(meta["path"]), host_path=_str(meta.get("hostPath")), type="c",
                      major=int(meta["major"]), minor=int(meta["minor"]),
                      file_mode=_int(meta.get("fileMode")), permissions="rw",
                      gid=_int(meta.get("gid")) or None)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _str(value: Any) -> str | None:
    return None if value in (None, "") else str(value)
