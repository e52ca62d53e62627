"""Mux frames (docs/developer/nri-protocol.md §2)."""

from __future__ import annotations

import struct

import pytest

from nri_plugin.nri.wire import FrameTooLargeError, RemoteProtocolError
from nri_plugin.nri.wire._mux import (
    GO_READ_BUFFER,
    MAX_PAYLOAD,
    Chunk,
    MuxReader,
    encode_frame,
    frame_message,
)
from tests.wire.feeding import bytewise, chunked, whole


def raw(conn_id: int, payload: bytes) -> bytes:
    return struct.pack(">II", conn_id, len(payload)) + payload


def joined(chunks: list[Chunk]) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    for c in chunks:
        out[c.conn_id] = out.get(c.conn_id, b"") + c.data
    return out


def test_header_layout_is_conn_then_length_big_endian() -> None:
    assert encode_frame(2, b"xyz") == b"\x00\x00\x00\x02\x00\x00\x00\x03xyz"


@pytest.mark.parametrize(
    ("size", "frames"),
    [
        (10, [10]),
        (GO_READ_BUFFER, [GO_READ_BUFFER]),
        (GO_READ_BUFFER + 1, [GO_READ_BUFFER, 1]),
        (4 << 20, [GO_READ_BUFFER, (4 << 20) - GO_READ_BUFFER]),
    ],
    ids=["small", "exactly-4096", "4097", "4MiB"],
)
def test_frame_message_follows_the_go_read_buffer_rule(size: int, frames: list[int]) -> None:
    message = (bytes(range(251)) * (size // 251 + 1))[:size]
    out = frame_message(1, message)
    sizes = []
    rest = out
    while rest:
        conn_id, length = struct.unpack(">II", rest[:8])
        assert conn_id == 1
        sizes.append(length)
        rest = rest[8 + length :]
    assert sizes == frames
    assert joined(MuxReader().feed(out)) == {1: message}


STREAM = raw(1, b"hello") + raw(2, b"") + raw(2, b"world!") + raw(1, b"!")


@pytest.mark.parametrize("feeder", [whole, bytewise, lambda f, d: chunked(f, d, 5)])
def test_reader_reassembles_per_conn(feeder) -> None:  # type: ignore[no-untyped-def]
    reader = MuxReader()
    assert joined(feeder(reader.feed, STREAM)) == {1: b"hello!", 2: b"world!"}
    assert not reader.mid_frame


def test_reader_passes_payload_through_before_the_frame_is_complete() -> None:
    reader = MuxReader()
    assert reader.feed(raw(1, b"abcdef")[:10]) == [Chunk(conn_id=1, data=b"ab")]
    assert reader.mid_frame
    assert reader.buffered == 0  # payload bytes are not held back
    assert reader.feed(b"cdef") == [Chunk(conn_id=1, data=b"cdef")]
    assert not reader.mid_frame


def test_trailing_partial_header_is_kept() -> None:
    reader = MuxReader()
    trailing = raw(2, b"next")[:5]
    assert joined(reader.feed(raw(1, b"one") + trailing)) == {1: b"one"}
    assert reader.mid_frame
    assert reader.buffered == 5
    assert joined(reader.feed(raw(2, b"next")[5:])) == {2: b"next"}


def test_each_header_byte_alone_yields_nothing() -> None:
    reader = MuxReader()
    frame = raw(1, b"")
    for i in range(len(frame)):
        assert reader.feed(frame[i : i + 1]) == []
    assert not reader.mid_frame


@pytest.mark.parametrize("conn_id", [0, 3, 7, 0x01000000])
def test_unknown_conn_id_is_a_remote_error(conn_id: int) -> None:
    with pytest.raises(RemoteProtocolError, match=f"conn id {conn_id}"):
        MuxReader().feed(raw(conn_id, b"x"))


def test_oversize_length_rejected_at_the_header() -> None:
    header_only = struct.pack(">II", 1, MAX_PAYLOAD + 1)
    reader = MuxReader()
    with pytest.raises(FrameTooLargeError):
        reader.feed(header_only)  # no payload byte needed to decide


def test_largest_allowed_length_is_accepted() -> None:
    reader = MuxReader()
    assert reader.feed(struct.pack(">II", 1, MAX_PAYLOAD)) == []
    assert reader.mid_frame
