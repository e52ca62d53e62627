"""CDI spec versions and the minimum version a spec's content needs (CDI spec, versions).

A generator should declare the minimum so that older runtimes accept its specs; a loader
rejects a spec that declares less than its content needs.
"""

from collections.abc import Iterator
from typing import NamedTuple

from cdi.model import ContainerEdits, SpecData, edits_by_path
from cdi.parser import parse_kind

# Newest first.
KNOWN_VERSIONS = (
    "1.1.0",
    "1.0.0",
    "0.8.0",
    "0.7.0",
    "0.6.0",
    "0.5.0",
    "0.4.0",
    "0.3.0",
    "0.2.0",
    "0.1.0",
)
EARLIEST_SUPPORTED = "0.3.0"


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``1.0.0`` or ``v1.0.0`` as a tuple; None when it is not one of the known versions."""
    bare = text.removeprefix("v")
    if bare not in KNOWN_VERSIONS:
        return None
    major, minor, patch = (int(part) for part in bare.split("."))
    return major, minor, patch


def version_key(version: str) -> tuple[int, int, int]:
    parsed = parse_version(version)
    if parsed is None:
        raise ValueError(f"unknown CDI version {version!r}")
    return parsed


class Requirement(NamedTuple):
    """Why a spec needs a version: the version and the field that needs it."""

    version: str
    path: str
    feature: str


def _requirements(spec: SpecData) -> Iterator[Requirement]:
    """Each use of a feature newer than 0.3.0. (0.8.0 and 1.0.0 changed only the Go API,
    so nothing in a document requires them.)"""
    for path, item in edits_by_path(spec):
        yield from _edits_requirements(path, item)
    if spec.annotations:
        yield Requirement("0.6.0", "annotations", "spec annotations")
    for index, device in enumerate(spec.devices):
        if device.annotations:
            yield Requirement("0.6.0", f"devices[{index}].annotations", "device annotations")
        if device.name[:1].isdigit():
            yield Requirement(
                "0.5.0", f"devices[{index}].name", "a device name starting with a digit"
            )
    if "." in parse_kind(spec.kind)[1]:
        yield Requirement("0.6.0", "kind", "a '.' in the class of kind")


def _edits_requirements(path: str, item: ContainerEdits) -> Iterator[Requirement]:
    if item.net_devices:
        yield Requirement("1.1.0", f"{path}.netDevices", "netDevices")
    rdt = item.intel_rdt
    if rdt is not None:
        if rdt.schemata is not None:
            yield Requirement("1.1.0", f"{path}.intelRdt.schemata", "intelRdt.schemata")
        if rdt.enable_monitoring:
            yield Requirement(
                "1.1.0", f"{path}.intelRdt.enableMonitoring", "intelRdt.enableMonitoring"
            )
        yield Requirement("0.7.0", f"{path}.intelRdt", "intelRdt")
    if item.additional_gids:
        yield Requirement("0.7.0", f"{path}.additionalGids", "additionalGids")
    for index, node in enumerate(item.device_nodes):
        if node.host_path:
            yield Requirement(
                "0.5.0", f"{path}.deviceNodes[{index}].hostPath", "deviceNodes[].hostPath"
            )
    for index, mount in enumerate(item.mounts):
        if mount.type:
            yield Requirement("0.4.0", f"{path}.mounts[{index}].type", "mounts[].type")


def minimum_requirement(spec: SpecData) -> Requirement | None:
    """The newest feature the spec uses (the first found of that version), or None when
    0.3.0 suffices."""
    return max(_requirements(spec), key=lambda r: version_key(r.version), default=None)

