"""What the generator recorded about the node: ``<spec>.meta`` sidecars, loaded ahead.

``load_facts`` does the file I/O, at start and after each registry refresh, and returns an
immutable ``NodeFacts``; the CreateContainer path only reads that. A sidecar is used only
when its ``spec.sha256`` matches the spec file it sits next to: a sidecar left from
another version of the spec would give wrong versions and capability lists.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from cdi.cache import Snapshot
from nri_plugin.vendors.nvidia.requirements import GpuInfo, NodeVersions

log = logging.getLogger("nri_cdi.facts")
SIDECAR_SUFFIX = ".meta"  # as written by ``nri-cdi generate``
_MAX_SIDECAR_BYTES = 16 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceFacts:
    name: str  # qualified CDI name
    type: str  # gpu or mig
    gpu_index: int | None = None
    gpu_uuid: str = ""
    bus_id: str = ""
    mig_index: int | None = None
    mig_uuid: str = ""
    arch: str | None = None
    brand: str | None = None

    def gpu_info(self) -> GpuInfo:
        return GpuInfo(name=self.name, arch=self.arch, brand=self.brand)


@dataclass(frozen=True, slots=True, kw_only=True)
class SpecFacts:
    path: str
    kind: str
    versions: NodeVersions
    # container path of a driver file → its capability (utility, compute, ..., other)
    capability_of: Mapping[str, str]
    devices: Mapping[str, DeviceFacts]


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class NodeFacts:
    specs: Mapping[str, SpecFacts] = field(default_factory=_empty)  # by spec path
    devices: Mapping[str, DeviceFacts] = field(default_factory=_empty)  # by CDI name
    generation: int = 0  # the snapshot generation they were loaded for
    # Sidecars that did not match their spec (probably not rewritten yet): worth a retry.
    stale: tuple[str, ...] = ()

    def spec_of(self, device_name: str, snapshot: Snapshot) -> SpecFacts | None:
        device = snapshot.devices.get(device_name)
        return self.specs.get(device.spec.path) if device is not None else None


def load_facts(snapshot: Snapshot) -> NodeFacts:
    """Read every spec's sidecar (I/O); problems are logged and that sidecar skipped."""
    specs: dict[str, SpecFacts] = {}
    devices: dict[str, DeviceFacts] = {}
    stale: list[str] = []
    for path, loaded in snapshot.specs.items():
        doc = _read_sidecar(path)
        if doc is _STALE:
            stale.append(path)
            continue
        if doc is None:
            continue
        try:
            facts = parse_sidecar(path, loaded.spec.kind, doc)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("%s%s: unusable metadata (%s); no requirement or capability data "
                        "for this spec", path, SIDECAR_SUFFIX, exc)
            continue
        specs[path] = facts
        devices.update(facts.devices)
    return NodeFacts(MappingProxyType(specs), MappingProxyType(devices), snapshot.generation,
                     tuple(stale))


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
            brand=_str(meta.get("brand")))
    return SpecFacts(path=path, kind=kind, versions=versions,
                     capability_of=MappingProxyType(capability_of),
                     devices=MappingProxyType(devices))


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _str(value: Any) -> str | None:
    return None if value in (None, "") else str(value)


class FactsHolder:
    """The current NodeFacts for the plugin, reloaded after each registry refresh (in the
    refresher's thread). A sidecar that does not match its spec yet is retried shortly:
    the generator writes it just after the spec, and only the spec's change wakes us."""

    RETRY_DELAY = 0.5
    RETRIES = 20

    def __init__(self, current: Callable[[], Snapshot]) -> None:
        self._current = current
        self._facts = NodeFacts()

    def get(self) -> NodeFacts:
        return self._facts

    def reload(self, snapshot: Snapshot, retries: int = RETRIES) -> None:
        if snapshot is not self._current():
            return  # a newer snapshot has its own reload
        facts = load_facts(snapshot)
        self._facts = facts
        if facts.stale and retries > 0:
            timer = threading.Timer(self.RETRY_DELAY, self.reload, (snapshot, retries - 1))
            timer.daemon = True
            timer.start()
