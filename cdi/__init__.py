"""Container Device Interface (CDI): specs, qualified names, the spec registry and applying
edits to OCI runtime specs. Vendor-neutral; the NVIDIA generator lives in ``cdi.nvidia``."""

from __future__ import annotations

from .annotations import ANNOTATION_PREFIX, annotation_key, parse_annotations
from .cache import Snapshot, SpecCache
from .device import Device
from .dirs import DEFAULT_SPEC_DIRS
from .edits import apply, merge
from .errors import (
    AnnotationError,
    CDIError,
    DeviceNodeError,
    EditError,
    FieldError,
    QualifiedNameError,
    SpecError,
    UnresolvedDevicesError,
)
from .model import (
    ContainerEdits,
    DeviceData,
    DeviceNode,
    Hook,
    IntelRdt,
    Mount,
    NetDevice,
    SpecData,
)
from .parser import QualifiedName, is_qualified_name, parse_qualified_name, qualified_name
from .spec import Spec, dump_spec, parse_spec, read_spec, write_spec
from .version import CURRENT_VERSION, minimum_version

__all__ = [
    "ANNOTATION_PREFIX", "CURRENT_VERSION", "DEFAULT_SPEC_DIRS", "AnnotationError", "CDIError",
    "ContainerEdits", "Device", "DeviceData", "DeviceNode", "DeviceNodeError", "EditError",
    "FieldError", "Hook", "IntelRdt", "Mount", "NetDevice", "QualifiedName",
    "QualifiedNameError", "Snapshot", "Spec", "SpecCache", "SpecData", "SpecError",
    "UnresolvedDevicesError", "annotation_key", "apply", "dump_spec", "is_qualified_name",
    "merge", "minimum_version", "parse_annotations", "parse_qualified_name", "parse_spec",
    "qualified_name", "read_spec", "write_spec",
]
