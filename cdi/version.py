"""CDI spec versions and the minimum version a spec's content needs (CDI spec, versions).

A generator should declare the minimum so that older runtimes accept its specs; a loader
rejects a spec that declares less than its content needs.
"""

from collections.abc import Callable, Iterator
from typing import NamedTuple

from cdi.model import ContainerEdits, SpecData
from cdi.parser import parse_kind

# Newest first: the minimum-version walk visits them in this order.
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
    bare = text[1:] if text.startswith("v") else text
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


def _all_edits(spec: SpecData) -> Iterator[tuple[str, ContainerEdits]]:
    yield "containerEdits", spec.container_edits
    for index, device in enumerate(spec.devices):
        yield f"devices[{index}].containerEdits", device.container_edits


def _needs_1_1_0(spec: SpecData) -> Iterator[Requirement]:
    for path, edits in _all_edits(spec):
        if edits.net_devices:
            yield Requirement("1.1.0", f"{path}.netDevices", "netDevices")
        rdt = edits.intel_rdt
        if rdt is not None and rdt.schemata is not None:
            yield Requirement("1.1.0", f"{path}.intelRdt.schemata", "intelRdt.schemata")
        if rdt is not None and rdt.enable_monitoring:
            yield Requirement(
                "1.1.0", f"{path}.intelRdt.enableMonitoring", "intelRdt.enableMonitoring"
            )


def _needs_0_7_0(spec: SpecData) -> Iterator[Requirement]:
    for path, edits in _all_edits(spec):
        if edits.intel_rdt is not None:
            yield Requirement("0.7.0", f"{path}.intelRdt", "intelRdt")
        if edits.additional_gids:
            yield Requirement("0.7.0", f"{path}.additionalGids", "additionalGids")


def _needs_0_6_0(spec: SpecData) -> Iterator[Requirement]:
    if spec.annotations:
        yield Requirement("0.6.0", "annotations", "spec annotations")
    for index, device in enumerate(spec.devices):
        if device.annotations:
            yield Requirement("0.6.0", f"devices[{index}].annotations", "device annotations")
    _, class_ = parse_kind(spec.kind)
    if "." in class_:
        yield Requirement("0.6.0", "kind", "a '.' in the class of kind")


def _needs_0_5_0(spec: SpecData) -> Iterator[Requirement]:
    for path, edits in _all_edits(spec):
        for index, node in enumerate(edits.device_nodes):
            if node.host_path:
                yield Requirement(
                    "0.5.0", f"{path}.deviceNodes[{index}].hostPath", "deviceNodes[].hostPath"
                )
    for index, device in enumerate(spec.devices):
        if device.name[:1].isdigit():
            yield Requirement(
                "0.5.0", f"devices[{index}].name", "a device name starting with a digit"
            )


def _needs_0_4_0(spec: SpecData) -> Iterator[Requirement]:
    for path, edits in _all_edits(spec):
        for index, mount in enumerate(edits.mounts):
            if mount.type:
                yield Requirement("0.4.0", f"{path}.mounts[{index}].type", "mounts[].type")


# 0.8.0 and 1.0.0 changed only the Go API, so nothing in a document requires them.
_CHECKS: tuple[Callable[[SpecData], Iterator[Requirement]], ...] = (
    _needs_1_1_0,
    _needs_0_7_0,
    _needs_0_6_0,
    _needs_0_5_0,
    _needs_0_4_0,
)


def minimum_requirement(spec: SpecData) -> Requirement | None:
    """The newest feature the spec uses, or None when 0.3.0 suffices."""
    for check in _CHECKS:
        for requirement in check(spec):
            return requirement
    return None


def minimum_version(spec: SpecData) -> str:
    requirement = minimum_requirement(spec)
    return requirement.version if requirement else EARLIEST_SUPPORTED
