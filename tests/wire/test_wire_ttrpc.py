"""ttrpc frames and envelopes (docs/developer/nri-protocol.md §1)."""

from __future__ import annotations

import struct

import pytest

from nri_plugin.nri.api import nri_pb2, ttrpc_pb2
from nri_plugin.nri.wire import FrameTooLargeError, MessageTooLargeError, RemoteProtocolError
from nri_plugin.nri.wire._ttrpc import (
    MAX_DATA,
    Code,
    Frame,
    FrameReader,
    MessageType,
    decode_request,
    decode_response,
    encode_frame,
    encode_request,
    encode_response,
)
from tests.wire.feeding import bytewise, chunked, whole


def raw(stream_id: int, mtype: int, data: bytes, flags: int = 0) -> bytes:
    return struct.pack(">IIBB", len(data), stream_id, mtype, flags) + data


def test_header_layout() -> None:
    assert encode_frame(5, MessageType.RESPONSE, b"ab") == (
        b"\x00\x00\x00\x02" + b"\x00\x00\x00\x05" + b"\x02" + b"\x00" + b"ab"
    )
    assert MAX_DATA == 4_194_304


def test_encode_refuses_more_than_4_mib() -> None:
    assert len(encode_frame(1, MessageType.REQUEST, bytes(MAX_DATA))) == MAX_DATA + 10
    with pytest.raises(MessageTooLargeError, match="stream 3"):
        encode_frame(3, MessageType.REQUEST, bytes(MAX_DATA + 1))


STREAM = raw(1, 1, b"first") + raw(3, 1, b"") + raw(5, 2, b"x" * 300, flags=0)
EXPECTED = [
    Frame(stream_id=1, type=1, data=b"first"),
    Frame(stream_id=3, type=1, data=b""),
    Frame(stream_id=5, type=2, data=b"x" * 300),
]


@pytest.mark.parametrize(
    "feeder",
    [whole, bytewise, lambda f, d: chunked(f, d, 7)],
    ids=["whole", "bytewise", "chunks-of-7"],
)
def test_reader(feeder) -> None:  # type: ignore[no-untyped-def]
    reader = FrameReader()
    assert feeder(reader.feed, STREAM) == EXPECTED
    assert not reader.mid_frame


def test_bytewise_yields_only_on_the_last_byte() -> None:
    reader = FrameReader()
    frame = raw(9, 1, b"payload")
    for i in range(len(frame) - 1):
        assert reader.feed(frame[i : i + 1]) == []
    assert reader.feed(frame[-1:]) == [Frame(stream_id=9, type=1, data=b"payload")]


def test_trailing_bytes_stay_buffered() -> None:
    reader = FrameReader()
    nxt = raw(3, 1, b"second")
    assert reader.feed(raw(1, 1, b"first") + nxt[:12]) == [
        Frame(stream_id=1, type=1, data=b"first")
    ]
    assert reader.mid_frame
    assert reader.feed(nxt[12:]) == [Frame(stream_id=3, type=1, data=b"second")]


def test_oversize_rejected_as_soon_as_the_header_parses() -> None:
    reader = FrameReader()
    with pytest.raises(FrameTooLargeError, match="stream 7"):
        reader.feed(struct.pack(">IIBB", MAX_DATA + 1, 7, 1, 0))


def test_oversize_message_names_the_limit() -> None:
    reader = FrameReader()
    with pytest.raises(FrameTooLargeError) as caught:
        reader.feed(struct.pack(">IIBB", MAX_DATA + 1, 3, 1, 0))
    assert str(caught.value) == (
        f"ttrpc frame on stream 3 announces {MAX_DATA + 1} bytes (max {MAX_DATA})")


def test_request_envelope_field_numbers() -> None:
    data = encode_request("svc", "M", b"\x01", timeout_nano=5, metadata=[("k", "v")])
    # 1 service, 2 method, 3 payload, 4 timeout_nano, 5 metadata{1 key, 2 value}
    # (docs/developer/nri-protocol.md §1.3)
    assert data == b"\x0a\x03svc\x12\x01M\x1a\x01\x01\x20\x05\x2a\x06\x0a\x01k\x12\x01v"
    req = decode_request(data, 1)
    assert (req.service, req.method, req.payload, req.timeout_nano) == ("svc", "M", b"\x01", 5)


def test_ok_response_omits_status_like_go() -> None:
    assert encode_response(b"\x08\x01") == b"\x12\x02\x08\x01"  # only field 2, payload
    resp = decode_response(encode_response(b"", Code.UNIMPLEMENTED, "method X"), 1)
    assert not resp.payload
    assert (resp.status.code, resp.status.message) == (12, "method X")
    # status is field 1 with {1 code, 2 message}: wire-equal to google.rpc.Status
    assert encode_response(b"", Code.NOT_FOUND, "m") == b"\x0a\x05\x08\x05\x12\x01m"


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 2_097_152, MAX_DATA - 16])
def test_ok_responses_carry_their_payload_and_no_status(size: int) -> None:
    """Response(payload=...) with no status on success: lengths of 1 to 4 varint bytes,
    and an empty payload left out."""
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    assert encode_response(payload) == ttrpc_pb2.Response(payload=payload).SerializeToString()
    assert decode_response(encode_response(payload), 1).payload == payload


def test_status_details_from_a_go_peer_are_skipped() -> None:
    any_detail = b"\x0a\x01t\x12\x01v"  # google.protobuf.Any{type_url, value}
    status = b"\x08\x02\x12\x01e" + b"\x1a" + bytes([len(any_detail)]) + any_detail
    resp = decode_response(b"\x0a" + bytes([len(status)]) + status, 1)
    assert (resp.status.code, resp.status.message) == (2, "e")


@pytest.mark.parametrize("garbage", [b"\xff", b"\x0a\x05ab", b"\x0a\x02\xff\xfe"])
def test_undecodable_envelopes_are_remote_errors(garbage: bytes) -> None:
    with pytest.raises(RemoteProtocolError, match="stream 3"):
        decode_request(garbage, 3)
    with pytest.raises(RemoteProtocolError, match="stream 3"):
        decode_response(garbage, 3)


def test_nri_field_numbers_that_runtimes_depend_on() -> None:
    # ConfigureResponse.events is field 2 (docs/developer/nri-protocol.md §3.4).
    assert nri_pb2.ConfigureResponse(events=8).SerializeToString() == b"\x10\x08"
    # SynchronizeResponse.more is field 2; ContainerAdjustment.CDI_devices is 8.
    assert nri_pb2.SynchronizeResponse(more=True).SerializeToString() == b"\x10\x01"
    adj = nri_pb2.ContainerAdjustment(CDI_devices=[nri_pb2.CDIDevice(name="a/b=c")])
    assert adj.SerializeToString() == b"\x42\x07\x0a\x05a/b=c"
    reg = nri_pb2.RegisterPluginRequest(plugin_name="n", plugin_idx="10", NRI_version="v")
    assert reg.SerializeToString() == b"\x0a\x01n\x12\x0210\x1a\x01v"
    assert ttrpc_pb2.Status.DESCRIPTOR.fields_by_name["message"].number == 2
