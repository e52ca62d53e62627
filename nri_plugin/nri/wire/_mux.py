"""NRI connection multiplexer frames (docs/developer/nri-protocol.md §2).

Each frame is an 8-byte big-endian header (conn id, payload length) and a chunk
of that logical connection's byte stream. ttrpc messages are not aligned to mux
frames, so the reader hands out chunks and the ttrpc layer reassembles them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from nri_plugin.nri.wire._errors import FrameTooLargeError, RemoteProtocolError

HEADER = struct.Struct(">II")

# our Plugin service; the runtime is the ttrpc client (docs/developer/nri-protocol.md §2.2)
PLUGIN_CONN = 1
# the runtime's Runtime service; we are the client (docs/developer/nri-protocol.md §2.2)
RUNTIME_CONN = 2

# Go writers since NRI v0.7.0 split at 10 + 4 MiB; v0.2.0-v0.6.1 wrote up to 16 MiB
# in one frame (docs/developer/nri-protocol.md §2.1). Accept the larger, reject anything beyond it
# at the header.
MAX_PAYLOAD = 16 << 20

# The Go reader offers a 4096-byte buffer when it reads a ttrpc header, and fails
# the whole mux if the next frame is larger (docs/developer/nri-protocol.md §2.4): no frame that
# starts a ttrpc message may exceed this.
GO_READ_BUFFER = 4096


def take(buffer: bytearray, n: int) -> bytes | None:
    """Consume exactly ``n`` bytes from the front of a receive buffer, or return ``None``
    (need more data). CPython does it in O(bytes consumed): it moves the array's start
    instead of its content."""
    if len(buffer) < n:
        return None
    chunk = bytes(buffer[:n])
    del buffer[:n]
    return chunk


@dataclass(frozen=True, slots=True, kw_only=True)
class Chunk:
    """Part of one logical connection's byte stream."""

    conn_id: int
    data: bytes


def encode_frame(conn_id: int, payload: bytes) -> bytes:
    return HEADER.pack(conn_id, len(payload)) + payload


def frame_message(conn_id: int, message: bytes) -> bytes:
    """Mux frames for one whole ttrpc message: at most two, split after 4096 bytes
    (docs/developer/nri-protocol.md §2.4)."""
    if len(message) <= GO_READ_BUFFER:
        return encode_frame(conn_id, message)
    return encode_frame(conn_id, message[:GO_READ_BUFFER]) + encode_frame(
        conn_id, message[GO_READ_BUFFER:]
    )


class MuxReader:
    """Turns the trunk byte stream into per-connection chunks.

    Payload bytes are passed through as they arrive instead of waiting for the
    whole frame, so a frame never costs more memory than the bytes fed so far.
    """

    __slots__ = ("_buffer", "_conn_id", "_remaining")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._conn_id = 0
        self._remaining = 0

    @property
    def mid_frame(self) -> bool:
        """True while a header or a payload is only partly received."""
        return self._remaining > 0 or bool(self._buffer)

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes | memoryview) -> list[Chunk]:
        self._buffer += data
        chunks: list[Chunk] = []
        while True:
            if self._remaining == 0:
                if not self._next_header():
                    return chunks
                continue
            piece = take(self._buffer, min(self._remaining, len(self._buffer)))
            if not piece:
                return chunks
            self._remaining -= len(piece)
            chunks.append(Chunk(conn_id=self._conn_id, data=piece))

    def _next_header(self) -> bool:
        raw = take(self._buffer, HEADER.size)
        if raw is None:
            return False
        conn_id, length = HEADER.unpack(raw)
        if conn_id not in (PLUGIN_CONN, RUNTIME_CONN):
            # Go drops these silently (docs/developer/nri-protocol.md §2.1); NRI only ever uses 1
            # and 2, so a
            # different id means we are out of sync with the peer.
            raise RemoteProtocolError(f"mux frame for unknown conn id {conn_id}")
        if length > MAX_PAYLOAD:
            raise FrameTooLargeError(
                f"mux frame on conn {conn_id} announces {length} bytes (max {MAX_PAYLOAD})"
            )
        self._conn_id = conn_id
        self._remaining = length
        return True
