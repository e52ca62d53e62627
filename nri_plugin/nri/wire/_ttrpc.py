"""ttrpc frames and the Request/Response envelopes (docs/developer/nri-protocol.md §1).

A frame is a 10-byte big-endian header (data length, stream id, message type,
flags) followed by the data: a serialized ``ttrpc.Request`` or ``ttrpc.Response``.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from nri_plugin.nri.api import ttrpc_pb2
from nri_plugin.nri.wire._errors import (
    FrameTooLargeError,
    MessageTooLargeError,
    RemoteProtocolError,
)
from nri_plugin.nri.wire._mux import take

HEADER = struct.Struct(">IIBB")
MAX_DATA = 4 << 20  # messageLengthMax (docs/developer/nri-protocol.md §1.1)


class MessageType(enum.IntEnum):
    REQUEST = 1
    RESPONSE = 2  # and 3, DATA: streaming only; NRI never sends it


class Code(enum.IntEnum):
    """The gRPC status codes carried in ttrpc responses that this library sends or reads
    (docs/developer/nri-protocol.md §1.4)."""

    OK = 0
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    UNIMPLEMENTED = 12
    DATA_LOSS = 15


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    stream_id: int
    type: int  # a MessageType value, or whatever unknown byte the peer sent
    data: bytes


def encode_frame(stream_id: int, mtype: MessageType, data: bytes) -> bytes:
    if len(data) > MAX_DATA:
        # Go's sender refuses the same way (OversizedMessageErr,
        # docs/developer/nri-protocol.md §1.1).
        raise MessageTooLargeError(
            f"ttrpc message on stream {stream_id} is {len(data)} bytes (max {MAX_DATA})"
        )
    return HEADER.pack(len(data), stream_id, mtype, 0) + data  # no flags: NRI sets none


class FrameReader:
    """Reassembles ttrpc frames from one logical connection's chunks.

    Holds at most one incomplete frame: the length is checked as soon as the
    header is complete, so buffering is bounded by ``HEADER.size + MAX_DATA`` plus
    whatever the caller fed in one go.
    """

    __slots__ = ("_buffer", "_header")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._header: tuple[int, int, int] | None = None

    @property
    def mid_frame(self) -> bool:
        return self._header is not None or bool(self._buffer)

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames = []
        while (frame := self._next_frame()) is not None:
            frames.append(frame)
        return frames

    def _next_frame(self) -> Frame | None:
        if self._header is None:
            raw = take(self._buffer, HEADER.size)
            if raw is None:
                return None
            length, stream_id, mtype, _flags = HEADER.unpack(raw)
            if length > MAX_DATA:
                # Go discards the data and answers RESOURCE_EXHAUSTED; no conforming
                # NRI peer sends this (its own sender refuses), so we treat it as a
                # broken peer rather than buffer or skip up to 4 GiB.
                raise FrameTooLargeError(
                    f"ttrpc frame on stream {stream_id} announces {length} bytes "
                    f"(max {MAX_DATA})"
                )
            self._header = (length, stream_id, mtype)
        length, stream_id, mtype = self._header
        data = take(self._buffer, length)
        if data is None:
            return None
        self._header = None
        return Frame(stream_id=stream_id, type=mtype, data=data)


def encode_request(
    service: str,
    method: str,
    payload: bytes,
    *,
    timeout_nano: int = 0,
    metadata: Iterable[tuple[str, str]] = (),
) -> bytes:
    return ttrpc_pb2.Request(
        service=service, method=method, payload=payload, timeout_nano=timeout_nano,
        metadata=[{"key": key, "value": value} for key, value in metadata],
    ).SerializeToString()


def decode_request(data: bytes, stream_id: int) -> ttrpc_pb2.Request:
    try:
        return ttrpc_pb2.Request.FromString(data)
    except DecodeError as exc:
        raise RemoteProtocolError(f"undecodable ttrpc request on stream {stream_id}") from exc


def encode_response(payload: bytes, code: int = Code.OK, message: str = "") -> bytes:
    # Status unset on success, as Go servers leave it (docs/developer/nri-protocol.md §1.4).
    status = None if code == Code.OK else {"code": code, "message": message}
    return ttrpc_pb2.Response(payload=payload, status=status).SerializeToString()


def decode_response(data: bytes, stream_id: int) -> ttrpc_pb2.Response:
    try:
        return ttrpc_pb2.Response.FromString(data)
    except DecodeError as exc:
        raise RemoteProtocolError(f"undecodable ttrpc response on stream {stream_id}") from exc
