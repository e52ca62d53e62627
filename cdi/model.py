"""The CDI spec format as immutable records, with strict decoding and deterministic encoding.

Decoding is strict like the reference library: unknown fields, wrong types and missing
required fields are errors. It collects every structural problem with its field path
instead of stopping at the first. Semantic rules (names, versions, hook types) live in
``validate.py``; this module only knows shapes.

JSON keys are those of the spec and the reference Go types (``additionalGids``,
``schemata``), not the typos of the spec's prose sketch.
"""

import re
from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, NamedTuple

from cdi.errors import FieldError, SpecError

# Records are ``typing.NamedTuple``s, not frozen dataclasses: a frozen slotted dataclass
# compiles its methods from source when it is defined and builds instances through
# object.__setattr__, which every short-lived command that loads specs pays for. Build them
# with keywords, change them with ``_replace``. Modules that define records on start-up
# paths do without ``from __future__ import annotations``: NamedTuple would compile every
# string annotation into a ForwardRef.

UINT32_MAX = 2**32 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Aliases in YAML can make a small file decode into an enormous tree; no real spec comes
# near this many values, so past it we stop instead of eating the node's memory.
MAX_DECODED_VALUES = 2_000_000


# Shared by every record without annotations: read-only, so sharing is safe.
EMPTY_MAP: Mapping[str, str] = MappingProxyType({})


class DeviceNode(NamedTuple):
    path: str
    host_path: str | None = None
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    permissions: str | None = None
    uid: int | None = None
    gid: int | None = None

    @property
    def host(self) -> str:
        return self.host_path or self.path


class Mount(NamedTuple):
    host_path: str
    container_path: str
    type: str | None = None
    options: tuple[str, ...] = ()


class Hook(NamedTuple):
    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None


class IntelRdt(NamedTuple):
    clos_id: str | None = None
    l3_cache_schema: str | None = None
    mem_bw_schema: str | None = None
    schemata: tuple[str, ...] | None = None  # 1.1.0
    enable_monitoring: bool | None = None  # 1.1.0
    enable_cmt: bool | None = None  # 0.7.0 .. 1.0.x, removed in 1.1.0
    enable_mbm: bool | None = None  # 0.7.0 .. 1.0.x, removed in 1.1.0


class NetDevice(NamedTuple):
    host_interface_name: str
    name: str


class ContainerEdits(NamedTuple):
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    intel_rdt: IntelRdt | None = None
    additional_gids: tuple[int, ...] = ()
    net_devices: tuple[NetDevice, ...] = ()

    def is_empty(self) -> bool:
        # Every field is a tuple, empty or not, or intel_rdt: None or a record (a tuple).
        return not any(self)


NO_EDITS = ContainerEdits()


class DeviceData(NamedTuple):
    name: str
    annotations: Mapping[str, str] = EMPTY_MAP
    container_edits: ContainerEdits = NO_EDITS


class SpecData(NamedTuple):
    cdi_version: str
    kind: str
    devices: tuple[DeviceData, ...]
    annotations: Mapping[str, str] = EMPTY_MAP
    container_edits: ContainerEdits = NO_EDITS


def edits_by_path(spec: SpecData) -> list[tuple[str, ContainerEdits]]:
    """The spec's edits and each device's, with their field paths."""
    return [("containerEdits", spec.container_edits)] + [
        (f"devices[{i}].containerEdits", d.container_edits) for i, d in enumerate(spec.devices)
    ]


# --------------------------------------------------------------------------------------
# Field tables: JSON key, attribute, value kind, required. One table drives both the
# decoder and the encoder, so the two cannot disagree.

Decoder = Callable[[Any, str, "_Context"], Any]


class _Field(NamedTuple):
    key: str
    attr: str
    decode: Decoder
    required: bool = False
    # Encode even when empty: a required list, or a present-but-empty object whose mere
    # presence means something (``intelRdt: {}`` raises the minimum version).
    keep_empty: bool = False


class BadScalar(NamedTuple):
    """What the YAML loader gives for an explicitly tagged value it cannot honour
    (``!!bool x``, ``!!int ""``, an unknown tag): every field decoder rejects it, so the
    error names the field instead of surfacing as a loader traceback."""

    tag: str
    text: str
    why: str


INVALID: Any = object()  # a value that failed to decode (its error is already recorded)


class _Context:
    def __init__(self) -> None:
        self.errors: list[FieldError] = []
        self.values = 0

    def error(self, path: str, message: str) -> Any:
        self.errors.append(FieldError(path, message))
        return INVALID

    def count(self, path: str) -> bool:
        self.values += 1
        if self.values == MAX_DECODED_VALUES:
            self.error(path, f"spec has more than {MAX_DECODED_VALUES} values")
        return self.values < MAX_DECODED_VALUES


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, BadScalar):
        return f"{value.tag} {value.text!r} ({value.why})"
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "mapping",
    }.get(type(value), type(value).__name__)


def text_problem(value: str) -> str | None:
    """Why a string cannot be used in a spec: a NUL cannot pass through a system call or
    an environment, and a lone surrogate is not Unicode (it cannot be encoded as UTF-8
    for a path, the runtime or a log line). None when it is fine."""
    if "\0" in value:
        return "must not contain a NUL character"
    if value.isascii():  # O(1) on CPython: the common case costs nothing more
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (it contains a lone surrogate)"
    return None


def _string(value: Any, path: str, ctx: _Context) -> Any:
    if not isinstance(value, str):
        return ctx.error(path, f"must be a string, not {_type_name(value)}")
    problem = text_problem(value)
    if problem:
        return ctx.error(path, problem)
    return value


def _boolean(value: Any, path: str, ctx: _Context) -> Any:
    if not isinstance(value, bool):
        return ctx.error(path, f"must be a boolean, not {_type_name(value)}")
    return value


def _integer(low: int, high: int) -> Decoder:
    def decode(value: Any, path: str, ctx: _Context) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            return ctx.error(path, f"must be an integer, not {_type_name(value)}")
        if not low <= value <= high:
            return ctx.error(path, f"must be between {low} and {high}, not {value}")
        return value

    return decode


_uint32 = _integer(0, UINT32_MAX)
_int64 = _integer(INT64_MIN, INT64_MAX)  # also Go's int, for hook timeouts


def _list_of(item: Decoder) -> Decoder:
    def decode(value: Any, path: str, ctx: _Context) -> Any:
        if not isinstance(value, list):
            return ctx.error(path, f"must be a list, not {_type_name(value)}")
        items = []
        for index, element in enumerate(value):
            if not ctx.count(path):
                return INVALID
            items.append(item(element, f"{path}[{index}]", ctx))
        return INVALID if any(i is INVALID for i in items) else tuple(items)

    return decode


def _string_map(value: Any, path: str, ctx: _Context) -> Any:
    if not isinstance(value, dict):
        return ctx.error(path, f"must be a mapping of strings, not {_type_name(value)}")
    before = len(ctx.errors)
    for key, item in value.items():
        ctx.count(path)
        if not isinstance(key, str):
            ctx.error(path, f"key {key!r} must be a string, not {_type_name(key)}")
        elif text_problem(key):
            ctx.error(f"{path}[{key!r}]", f"key {text_problem(key)}")
        elif not isinstance(item, str):
            ctx.error(f"{path}[{key!r}]", f"must be a string, not {_type_name(item)}")
        elif text_problem(item):
            ctx.error(f"{path}[{key!r}]", str(text_problem(item)))
    return INVALID if len(ctx.errors) > before else MappingProxyType(dict(value))


def _object(cls: type) -> Decoder:
    return partial(_decode_object, cls)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


def key_path(path: str, key: Any) -> str:
    """Where an unknown key sits: ``path.key`` for a plain name, ``path['k\\n']`` (repr)
    for anything else, so that an empty, odd or non-string key is visible and one error
    stays one line."""
    if isinstance(key, str) and _PLAIN_KEY.fullmatch(key):
        return _join(path, key)
    return f"{path}[{key!r}]"


def _decode_object(cls: Any, value: Any, path: str, ctx: _Context) -> Any:
    fields: tuple[_Field, ...] = _FIELDS[cls]
    if not isinstance(value, dict):
        return ctx.error(path, f"must be a mapping, not {_type_name(value)}")
    if not ctx.count(path):
        return INVALID
    before = len(ctx.errors)
    known = {f.key: f for f in fields}
    for key in value:
        if key not in known:
            ctx.error(key_path(path, key), "unknown field")
    kwargs = {}
    for spec in fields:
        if spec.key not in value:
            if spec.required:
                ctx.error(_join(path, spec.key), "required field is missing")
            continue
        raw = value[spec.key]
        if raw is None and not spec.required:
            continue  # an explicit null is the same as absent, as in Go's decoder
        kwargs[spec.attr] = spec.decode(raw, _join(path, spec.key), ctx)
    if len(ctx.errors) > before:
        return INVALID
    return cls(**kwargs)


_FIELDS: dict[type, tuple[_Field, ...]] = {}
_FIELDS[DeviceNode] = (
    _Field("path", "path", _string, required=True),
    _Field("hostPath", "host_path", _string),
    _Field("type", "type", _string),
    _Field("major", "major", _int64),
    _Field("minor", "minor", _int64),
    _Field("fileMode", "file_mode", _uint32),
    _Field("permissions", "permissions", _string),
    _Field("uid", "uid", _uint32),
    _Field("gid", "gid", _uint32),
)
_FIELDS[Mount] = (
    _Field("hostPath", "host_path", _string, required=True),
    _Field("containerPath", "container_path", _string, required=True),
    _Field("type", "type", _string),
    _Field("options", "options", _list_of(_string)),
)
_FIELDS[Hook] = (
    _Field("hookName", "hook_name", _string, required=True),
    _Field("path", "path", _string, required=True),
    _Field("args", "args", _list_of(_string)),
    _Field("env", "env", _list_of(_string)),
    _Field("timeout", "timeout", _int64),
)
_FIELDS[IntelRdt] = (
    _Field("closID", "clos_id", _string),
    _Field("l3CacheSchema", "l3_cache_schema", _string),
    _Field("memBwSchema", "mem_bw_schema", _string),
    _Field("schemata", "schemata", _list_of(_string), keep_empty=True),
    _Field("enableMonitoring", "enable_monitoring", _boolean),
    _Field("enableCMT", "enable_cmt", _boolean),
    _Field("enableMBM", "enable_mbm", _boolean),
)
_FIELDS[NetDevice] = (
    _Field("hostInterfaceName", "host_interface_name", _string, required=True),
    _Field("name", "name", _string, required=True),
)
_FIELDS[ContainerEdits] = (
    _Field("env", "env", _list_of(_string)),
    _Field("deviceNodes", "device_nodes", _list_of(_object(DeviceNode))),
    _Field("mounts", "mounts", _list_of(_object(Mount))),
    _Field("hooks", "hooks", _list_of(_object(Hook))),
    _Field("intelRdt", "intel_rdt", _object(IntelRdt), keep_empty=True),
    _Field("additionalGids", "additional_gids", _list_of(_uint32)),
    _Field("netDevices", "net_devices", _list_of(_object(NetDevice))),
)
_FIELDS[DeviceData] = (
    _Field("name", "name", _string, required=True),
    _Field("annotations", "annotations", _string_map),
    _Field(
        "containerEdits", "container_edits", _object(ContainerEdits), required=True, keep_empty=True
    ),
)
_FIELDS[SpecData] = (
    _Field("cdiVersion", "cdi_version", _string, required=True),
    _Field("kind", "kind", _string, required=True),
    _Field("annotations", "annotations", _string_map),
    _Field("devices", "devices", _list_of(_object(DeviceData)), required=True, keep_empty=True),
    _Field("containerEdits", "container_edits", _object(ContainerEdits)),
)


def spec_from_dict(document: Any) -> SpecData:
    """Decode a parsed JSON/YAML document; raise SpecError listing every structural problem."""
    ctx = _Context()
    if document is None:
        raise SpecError([FieldError("", "spec is empty")])
    result = _decode_object(SpecData, document, "", ctx)
    if ctx.errors or result is INVALID:
        raise SpecError(ctx.errors)
    return result  # type: ignore[no-any-return]


_SCALARS = (str, int, bool, float)


def to_dict(value: Any) -> Any:
    """Encode a model value as plain JSON data, in field-table order, leaving out empty
    optional fields, so that equal values always give equal (and stable) output."""
    fields = _FIELDS.get(type(value))
    if fields is None:
        return _plain(value)
    out: dict[str, Any] = {}
    for spec in fields:
        item = getattr(value, spec.attr)
        if item is None:
            continue
        if type(item) in _SCALARS:  # the common case, and never "empty"
            out[spec.key] = item
        elif spec.required or spec.keep_empty or not _is_empty(item):
            out[spec.key] = to_dict(item)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [item if type(item) in _SCALARS else to_dict(item) for item in value]
    if isinstance(value, Mapping):
        return {key: value[key] for key in sorted(value)}
    return value


def _is_empty(item: Any) -> bool:
    # ContainerEdits is a tuple of seven fields: empty when every field is.
    return item.is_empty() if isinstance(item, ContainerEdits) else not item
