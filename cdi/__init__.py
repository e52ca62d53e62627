"""Container Device Interface (CDI): specs, qualified names, the spec registry and applying
edits to OCI runtime specs. Vendor-neutral; a vendor's generator and hook operations live
in a subpackage of their own.

Public names are imported on first use, so that ``import cdi.linux.elf`` (the generator's
start-up path) or ``import cdi.parser`` does not pay for the whole library.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing would slow every hook process's start
if TYPE_CHECKING:
    from typing import Any

_EXPORTS = {
    "ANNOTATION_PREFIX": "annotations",
    "annotation_key": "annotations",
    "parse_annotations": "annotations",
    "Snapshot": "cache",
    "SpecCache": "cache",
    "Device": "device",
    "DEFAULT_SPEC_DIRS": "dirs",
    "apply": "edits",
    "merge": "edits",
    "AnnotationError": "errors",
    "CDIError": "errors",
    "DeviceNodeError": "errors",
    "EditError": "errors",
    "FieldError": "errors",
    "QualifiedNameError": "errors",
    "SpecError": "errors",
    "UnresolvedDevicesError": "errors",
    "ContainerEdits": "model",
    "DeviceData": "model",
    "DeviceNode": "model",
    "Hook": "model",
    "IntelRdt": "model",
    "Mount": "model",
    "NetDevice": "model",
    "SpecData": "model",
    "QualifiedName": "parser",
    "is_qualified_name": "parser",
    "parse_qualified_name": "parser",
    "qualified_name": "parser",
    "Spec": "spec",
    "dump_spec": "spec",
    "parse_spec": "spec",
    "read_spec": "spec",
    "write_spec": "spec",
    "CURRENT_VERSION": "version",
    "minimum_version": "version",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cdi' has no attribute {name!r}")
    import importlib  # here: importlib imports warnings, on every hook's start

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
