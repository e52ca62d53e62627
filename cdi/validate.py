"""Semantic rules of a CDI spec (CDI spec validation rules; reference library behaviour).

Every rule adds a FieldError with the path of the offending field; ``validate_spec``
raises one SpecError carrying all of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping

from cdi.errors import FieldError, SpecError
from cdi.model import ContainerEdits, DeviceNode, Hook, IntelRdt, SpecData, edits_by_path
from cdi.parser import device_name_error, kind_error, parse_kind
from cdi.version import EARLIEST_SUPPORTED, KNOWN_VERSIONS, minimum_requirement, version_key

# OCI hook points; ``prestart`` is deprecated by OCI but still accepted by the reference.
HOOK_NAMES = (
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
)
DEVICE_TYPES = ("b", "c", "u", "p")
MAX_ANNOTATIONS_SIZE = 256 * 1024
MAX_CLOS_ID_LENGTH = 4096

_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN_RE = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*")
_QUALIFIED_NAME_RE = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?")


def validate_spec(spec: SpecData) -> None:
    errors = list(_version_errors(spec))
    problem = kind_error(spec.kind)
    if problem:
        errors.append(FieldError("kind", problem))
    errors += _annotation_errors(spec.annotations, "annotations")
    errors += _device_errors(spec)
    errors += _edits_errors(spec.container_edits, "containerEdits")
    if errors:
        raise SpecError(errors)


def _version_errors(spec: SpecData) -> Iterator[FieldError]:
    declared = spec.cdi_version
    if declared.removeprefix("v") not in KNOWN_VERSIONS:
        known = ", ".join(reversed(KNOWN_VERSIONS[:-2]))
        yield FieldError("cdiVersion", f"invalid version {declared!r}: known versions are {known}")
        return
    requirement = minimum_requirement(spec)
    if requirement and version_key(declared) < version_key(requirement.version):
        yield FieldError("cdiVersion", f"version {declared} is too old for this spec: "
                         f"{requirement.feature} ({requirement.path}) needs at least "
                         f"{requirement.version}")
    elif version_key(declared) < version_key(EARLIEST_SUPPORTED):
        yield FieldError("cdiVersion", f"version {declared} is not supported: it must be at "
                         f"least {EARLIEST_SUPPORTED}")
    if version_key(declared) >= (1, 1, 0):  # enableCMT/enableMBM existed up to 1.0.x
        for path in _cmt_mbm_paths(spec):
            yield FieldError(path, f"removed in CDI 1.1.0 (spec declares {declared}); use "
                                   "enableMonitoring")


def _cmt_mbm_paths(spec: SpecData) -> Iterator[str]:
    """The field paths of every intelRdt.enableCMT/enableMBM the spec sets."""
    for path, item in edits_by_path(spec):
        rdt = item.intel_rdt
        if rdt is not None and rdt.enable_cmt is not None:
            yield f"{path}.intelRdt.enableCMT"
        if rdt is not None and rdt.enable_mbm is not None:
            yield f"{path}.intelRdt.enableMBM"


def interop_warnings(spec: SpecData) -> list[FieldError]:
    """What is valid by the spec but breaks other CDI implementations; worth a warning
    (docs/developer/cdi-library.md, "Interop warnings")."""
    warnings = []
    vendor, class_ = parse_kind(spec.kind)
    if vendor and class_ and (len(vendor) == 1 or len(class_) == 1):
        warnings.append(FieldError("kind", f"warning: a one-letter vendor or class "
                                   f"({spec.kind!r}) makes the Go CDI library up to 1.1.0 "
                                   "panic (containerd 1.7, podman 4 go down with it)"))
    warnings += [FieldError(path, "warning: dropped by the Go CDI library 1.1.0 at every "
                                  "cdiVersion; runtimes built on it refuse this file")
                 for path in _cmt_mbm_paths(spec)]
    return warnings


def _device_errors(spec: SpecData) -> Iterator[FieldError]:
    if not spec.devices:
        yield FieldError("devices", "a spec must define at least one device")
    seen: dict[str, int] = {}
    for index, device in enumerate(spec.devices):
        path = f"devices[{index}]"
        problem = device_name_error(device.name)
        if problem:
            yield FieldError(f"{path}.name", problem)
        elif device.name in seen:
            yield FieldError(f"{path}.name", f"duplicate device name {device.name!r} "
                                             f"(also devices[{seen[device.name]}])")
        else:
            seen[device.name] = index
        yield from _annotation_errors(device.annotations, f"{path}.annotations")
        if device.container_edits.is_empty():
            yield FieldError(f"{path}.containerEdits", "invalid device, empty device edits")
        yield from _edits_errors(device.container_edits, f"{path}.containerEdits")


def _annotation_errors(annotations: Mapping[str, str], path: str) -> Iterator[FieldError]:
    """Kubernetes annotation rules: qualified-name keys, at most 256 KiB in all."""
    total = 0
    for key, value in annotations.items():
        total += len(key.encode()) + len(value.encode())  # bytes, as Kubernetes counts
        problem = _annotation_key_error(key)
        if problem:
            yield FieldError(f"{path}[{key!r}]", problem)
    if total > MAX_ANNOTATIONS_SIZE:
        yield FieldError(path, f"annotations are {total} bytes in all, more than the limit of "
                               f"{MAX_ANNOTATIONS_SIZE}")


def _annotation_key_error(key: str) -> str | None:
    # Kubernetes compares annotation keys lower-cased.
    prefix, sep, name = key.lower().rpartition("/")
    if sep:
        if not prefix:
            return "key prefix before '/' is empty"
        if len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(prefix):
            return f"key prefix {prefix!r} must be a DNS subdomain of at most 253 characters"
    if not name:
        return "key name is empty"
    if len(name) > 63 or not _QUALIFIED_NAME_RE.fullmatch(name):
        return (
            f"key name {name!r} must be at most 63 characters, start and end with a letter "
            "or digit, and contain only letters, digits, '-', '_' and '.'"
        )
    return None


def _edits_errors(edits: ContainerEdits, path: str) -> Iterator[FieldError]:
    yield from _env_errors(edits.env, f"{path}.env")
    for index, node in enumerate(edits.device_nodes):
        yield from _device_node_errors(node, f"{path}.deviceNodes[{index}]")
    for index, mount in enumerate(edits.mounts):
        where = f"{path}.mounts[{index}]"
        if not mount.host_path:
            yield FieldError(f"{where}.hostPath", "must not be empty")
        if not mount.container_path:
            yield FieldError(f"{where}.containerPath", "must not be empty")
    for index, hook in enumerate(edits.hooks):
        yield from _hook_errors(hook, f"{path}.hooks[{index}]")
    if edits.intel_rdt is not None:
        yield from _intel_rdt_errors(edits.intel_rdt, f"{path}.intelRdt")
    yield from _net_device_errors(edits, f"{path}.netDevices")


def _env_errors(env: Iterable[str], path: str) -> Iterator[FieldError]:
    for i, entry in enumerate(env):
        if entry.find("=") <= 0:
            yield FieldError(f"{path}[{i}]", f"invalid environment variable {entry!r}: must "
                                             "have the form NAME=VALUE")


def _device_node_errors(node: DeviceNode, path: str) -> Iterator[FieldError]:
    if not node.path:
        yield FieldError(f"{path}.path", "must not be empty")
    for key, number in (("major", node.major), ("minor", node.minor)):
        if number is not None and number < 0:
            # -1 is the wildcard of a device-cgroup rule: it would allow every device
            yield FieldError(f"{path}.{key}", f"must not be negative, not {number}")
    if node.type and node.type not in DEVICE_TYPES:
        yield FieldError(f"{path}.type", f"must be one of {', '.join(DEVICE_TYPES)}")
    perms = node.permissions
    if perms and perms != "none" and set(perms) - set("rwm"):
        yield FieldError(f"{path}.permissions",
                         f"invalid permissions {perms!r}: use r, w and m, or none")


def _hook_errors(hook: Hook, path: str) -> Iterator[FieldError]:
    if hook.hook_name not in HOOK_NAMES:
        yield FieldError(f"{path}.hookName", f"invalid hook name {hook.hook_name!r}: must be "
                                             f"one of {', '.join(HOOK_NAMES)}")
    if not hook.path:
        yield FieldError(f"{path}.path", "must not be empty")
    elif not hook.path.startswith("/"):
        yield FieldError(f"{path}.path", f"must be an absolute path, not {hook.path!r}")
    if hook.timeout is not None and hook.timeout <= 0:
        yield FieldError(f"{path}.timeout", f"must be greater than 0, not {hook.timeout}")
    yield from _env_errors(hook.env, f"{path}.env")


def _intel_rdt_errors(rdt: IntelRdt, path: str) -> Iterator[FieldError]:
    clos = rdt.clos_id
    if clos is None or clos == "/":  # "/" names the root CLOS
        return
    if len(clos) >= MAX_CLOS_ID_LENGTH:
        yield FieldError(f"{path}.closID", f"longer than {MAX_CLOS_ID_LENGTH - 1} characters")
    elif clos in (".", "..") or "/" in clos or "\n" in clos:
        yield FieldError(f"{path}.closID", f"invalid CLOS id {clos!r}: must not be '.' or '..' "
                                           "or contain '/' or a newline")


def _net_device_errors(edits: ContainerEdits, path: str) -> Iterator[FieldError]:
    host_names: set[str] = set()
    names: set[str] = set()
    for index, dev in enumerate(edits.net_devices):
        for key, value, seen in (
            ("hostInterfaceName", dev.host_interface_name, host_names),
            ("name", dev.name, names),
        ):
            if not value:
                yield FieldError(f"{path}[{index}].{key}", "must not be empty")
            elif value in seen:
                yield FieldError(f"{path}[{index}].{key}", f"duplicate {key} {value!r}")
            seen.add(value)
