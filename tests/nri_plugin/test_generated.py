"""The committed *_pb2 modules must match our .proto files."""

from __future__ import annotations

import importlib.util
import re
import tempfile
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from nri_plugin.nri.api import Event, EventMask, nri_pb2, ttrpc_pb2

pytest.importorskip("grpc_tools", reason="grpcio-tools is needed to regenerate")

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "generate_protobuf.py"
_spec = importlib.util.spec_from_file_location("generate_protobuf", _SCRIPT)
assert _spec is not None and _spec.loader is not None
generate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generate)

VERSION = re.compile(rb"^# Protobuf Python Version: (\S+)$", re.M)


def _descriptor(pb2_source: bytes) -> descriptor_pb2.FileDescriptorProto:
    """Rebuild the FileDescriptorProto embedded in a generated module's source."""
    namespace: dict[str, object] = {}
    match = re.search(rb"AddSerializedFile\((b'.*?')\)\n", pb2_source, re.S)
    assert match, "generated module layout changed"
    exec(compile(b"blob = " + match.group(1), "<pb2>", "exec"), namespace)  # a bytes literal
    return descriptor_pb2.FileDescriptorProto.FromString(namespace["blob"])  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def fresh() -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        return generate.generate(Path(tmp))


@pytest.mark.parametrize("name", [p.removesuffix(".proto") + "_pb2.py" for p in generate.PROTOS])
def test_committed_descriptors_match_the_proto(fresh: dict[str, bytes], name: str) -> None:
    committed = (generate.ROOT / name).read_bytes()
    assert _descriptor(committed) == _descriptor(fresh[name]), (
        f"{name} is stale: run python3 scripts/generate_protobuf.py"
    )


def test_committed_files_are_byte_identical_with_the_same_protoc(fresh: dict[str, bytes]) -> None:
    name = "nri_plugin/nri/api/nri_pb2.py"
    committed = (generate.ROOT / name).read_bytes()
    ours, theirs = VERSION.search(committed), VERSION.search(fresh[name])
    assert ours and theirs
    if ours.group(1) != theirs.group(1):
        pytest.skip(f"installed protoc makes {theirs.group(1)!r}, committed is {ours.group(1)!r}")
    assert generate.stale_files() == []


def test_generated_modules_carry_the_wire_names() -> None:
    assert nri_pb2.DESCRIPTOR.services_by_name["Plugin"].full_name == "nri.pkg.api.v1alpha1.Plugin"
    assert nri_pb2.DESCRIPTOR.name == "nri_plugin/nri/api/nri.proto"
    assert ttrpc_pb2.DESCRIPTOR.name == "nri_plugin/nri/api/ttrpc.proto"


def test_event_enum_matches_the_proto() -> None:
    for event in Event:
        assert nri_pb2.Event.Value(event.name) == event.value
        assert EventMask[event.name] == 1 << (event.value - 1)


def test_event_mask_helpers() -> None:
    mask = EventMask.of([Event.CREATE_CONTAINER, Event.REMOVE_CONTAINER])
    assert int(mask) == 0x408
    assert mask == EventMask.CREATE_CONTAINER | EventMask.REMOVE_CONTAINER
