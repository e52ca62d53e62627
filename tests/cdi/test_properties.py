"""Property-based tests: generated valid specs round-trip; mutated specs fail cleanly."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdi.errors import SpecError
from cdi.model import (
    ContainerEdits,
    DeviceData,
    DeviceNode,
    Hook,
    IntelRdt,
    Mount,
    NetDevice,
    SpecData,
    to_dict,
)
from cdi.spec import dump_spec, parse_spec
from cdi.validate import DEVICE_TYPES, HOOK_NAMES, validate_spec
from cdi.version import KNOWN_VERSIONS, version_key
from tests.cdi.test_spec_cases import minimum_version

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)
paths = st.from_regex(r"/[a-z0-9_./-]{0,20}", fullmatch=True)
env_entries = st.builds(
    lambda k, v: f"{k}={v}", st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True), text
)
uint32 = st.integers(0, 2**32 - 1)
qualifier = st.from_regex(r"[a-z]([a-z0-9_.-]{0,10}[a-z0-9])?", fullmatch=True)
device_names = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9_.:-]{0,10}[A-Za-z0-9])?", fullmatch=True)
annotation_keys = st.from_regex(
    r"([a-z0-9]{1,5}\.)?[a-z0-9]{1,5}/[A-Za-z0-9]([A-Za-z0-9_.-]{0,8}"
    r"[A-Za-z0-9])?",
    fullmatch=True,
)
annotations = st.dictionaries(annotation_keys, text, max_size=3)


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


device_nodes = st.builds(
    DeviceNode,
    path=paths,
    host_path=optional(paths),
    type=optional(st.sampled_from(DEVICE_TYPES)),
    major=optional(st.integers(0, 2**63 - 1)),
    minor=optional(st.integers(0, 2**63 - 1)),
    file_mode=optional(uint32),
    permissions=optional(st.sampled_from(["r", "rw", "rwm", "m", "none", "wm"])),
    uid=optional(uint32),
    gid=optional(uint32),
)
mounts = st.builds(
    Mount,
    host_path=paths,
    container_path=paths,
    type=optional(qualifier),
    options=st.lists(text, max_size=3).map(tuple),
)
hooks = st.builds(
    Hook,
    hook_name=st.sampled_from(HOOK_NAMES),
    path=paths,
    args=st.lists(text, max_size=3).map(tuple),
    env=st.lists(env_entries, max_size=2).map(tuple),
    timeout=optional(st.integers(1, 2**31)),
)
intel_rdt = st.builds(
    IntelRdt,
    clos_id=optional(st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True)),
    l3_cache_schema=optional(text),
    mem_bw_schema=optional(text),
    schemata=optional(st.lists(text, max_size=2).map(tuple)),
    enable_monitoring=optional(st.booleans()),
    enable_cmt=optional(st.booleans()),
    enable_mbm=optional(st.booleans()),
)
net_devices = st.lists(
    st.tuples(qualifier, qualifier), max_size=3, unique_by=(lambda t: t[0], lambda t: t[1])
).map(lambda pairs: tuple(NetDevice(host_interface_name=h, name=n) for h, n in pairs))
edits = st.builds(
    ContainerEdits,
    env=st.lists(env_entries, max_size=3).map(tuple),
    device_nodes=st.lists(device_nodes, max_size=3).map(tuple),
    mounts=st.lists(mounts, max_size=3).map(tuple),
    hooks=st.lists(hooks, max_size=2).map(tuple),
    intel_rdt=optional(intel_rdt),
    additional_gids=st.lists(uint32, max_size=3).map(tuple),
    net_devices=net_devices,
)


@st.composite
def valid_specs(draw: st.DrawFn) -> SpecData:
    names = draw(st.lists(device_names, min_size=1, max_size=4, unique=True))
    devices = []
    for name in names:
        device_edits = draw(edits.filter(lambda e: not e.is_empty()))
        devices.append(
            DeviceData(name=name, annotations=draw(annotations), container_edits=device_edits)
        )
    spec = SpecData(
        cdi_version="0.3.0",
        kind=f"{draw(qualifier)}/{draw(qualifier)}",
        devices=tuple(devices),
        annotations=draw(annotations),
        container_edits=draw(edits),
    )
    spec = _drop_removed_fields_if_needed(spec, draw(st.booleans()))
    floor = version_key(minimum_version(spec))
    allowed = [v for v in KNOWN_VERSIONS if version_key(v) >= floor]
    if _uses_removed_fields(spec):
        allowed = [v for v in allowed if version_key(v) < (1, 1, 0)]
    version = draw(st.sampled_from(allowed))
    return spec._replace(cdi_version=draw(st.sampled_from([version, "v" + version])))


def _edits_of(spec: SpecData) -> list[ContainerEdits]:
    return [spec.container_edits] + [d.container_edits for d in spec.devices]


def _uses_removed_fields(spec: SpecData) -> bool:
    return any(
        e.intel_rdt is not None
        and (e.intel_rdt.enable_cmt is not None or e.intel_rdt.enable_mbm is not None)
        for e in _edits_of(spec)
    )


def _drop_removed_fields_if_needed(spec: SpecData, keep_old: bool) -> SpecData:
    """enableCMT/MBM cannot be combined with 1.1.0 features: drop one or the other."""

    def fix(e: ContainerEdits) -> ContainerEdits:
        rdt = e.intel_rdt
        if keep_old:
            e = e._replace(net_devices=())
            return (
                e
                if rdt is None
                else e._replace(intel_rdt=rdt._replace(schemata=None, enable_monitoring=None))
            )
        return (
            e
            if rdt is None
            else e._replace(intel_rdt=rdt._replace(enable_cmt=None, enable_mbm=None))
        )

    uses_new = any(
        e.net_devices
        or (e.intel_rdt and (e.intel_rdt.schemata is not None or e.intel_rdt.enable_monitoring))
        for e in _edits_of(spec)
    )
    if not (uses_new and _uses_removed_fields(spec)):
        return spec

    def fix_device(e: ContainerEdits) -> ContainerEdits:
        fixed = fix(e)
        return fixed._replace(env=("KEPT=1",)) if fixed.is_empty() else fixed

    devices = tuple(d._replace(container_edits=fix_device(d.container_edits)) for d in spec.devices)
    return spec._replace(container_edits=fix(spec.container_edits), devices=devices)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_specs(), st.booleans())
def test_valid_specs_round_trip(spec: SpecData, as_json: bool) -> None:
    validate_spec(spec)
    text_form = dump_spec(spec, json_format=as_json)
    parsed = parse_spec(text_form, "spec.json" if as_json else "spec.yaml").data
    assert parsed == spec
    assert dump_spec(parsed, json_format=as_json) == text_form  # deterministic


junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=6,
)


def _containers(node: Any, trail: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [trail]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _containers(value, (*trail, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _containers(value, (*trail, index))
    return found


def _at(node: Any, trail: tuple[Any, ...]) -> Any:
    for step in trail:
        node = node[step]
    return node


@st.composite
def mutated_documents(draw: st.DrawFn) -> Any:
    document = to_dict(draw(valid_specs()))
    for _ in range(draw(st.integers(1, 4))):
        trail = draw(st.sampled_from(_containers(document)))
        if not trail:
            if draw(st.booleans()):
                document = draw(junk)
            continue
        parent, key = _at(document, trail[:-1]), trail[-1]
        action = draw(st.sampled_from(["replace", "delete", "unknown", "wrap"]))
        if action == "replace":
            parent[key] = draw(junk)
        elif action == "delete":
            del parent[key]
        elif action == "unknown" and isinstance(parent[key], dict):
            parent[key][draw(text)] = draw(junk)
        elif action == "wrap":
            parent[key] = [parent[key]]
        if not isinstance(document, (dict, list)):
            break
    return document


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_documents(), st.booleans())
def test_mutated_specs_raise_only_spec_errors(document: Any, as_json: bool) -> None:
    data = json.dumps(document) if as_json else json.dumps(document, indent=1)
    # json.dumps output is also YAML, so the YAML path sees the same document.
    try:
        parse_spec(data, "mutated.json" if as_json else "mutated.yaml")
    except SpecError as exc:
        assert exc.errors and all(str(e) for e in exc.errors)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_specs(), st.data())
def test_corrupted_bytes_raise_only_spec_errors(spec: SpecData, data: st.DataObject) -> None:
    raw = bytearray(dump_spec(spec).encode())
    for _ in range(data.draw(st.integers(1, 5))):
        position = data.draw(st.integers(0, len(raw) - 1))
        raw[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    with contextlib.suppress(SpecError):  # SpecError is the only acceptable failure
        parse_spec(bytes(raw[:cut]), "corrupt.yaml")
