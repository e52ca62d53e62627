"""Per-connection ttrpc stream bookkeeping (docs/developer/nri-protocol.md §1.2). No bytes here."""

from __future__ import annotations

import enum

from nri_plugin.nri.wire._errors import LocalProtocolError, RemoteProtocolError

MAX_STREAM_ID = (1 << 32) - 1  # the header field is a uint32


class ConnectionState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"  # the peer closed the trunk cleanly
    ERROR = "error"  # a protocol error happened; the connection cannot be used again


class ClientStreams:
    """Calls we made on one logical connection: odd ids 1, 3, 5, ...
    (docs/developer/nri-protocol.md §1.2)."""

    __slots__ = ("_next_id", "pending")

    def __init__(self) -> None:
        self._next_id = 1
        self.pending: dict[int, tuple[str, str]] = {}

    @property
    def next_id(self) -> int:
        if self._next_id > MAX_STREAM_ID:
            raise LocalProtocolError("ttrpc stream ids exhausted on this connection")
        return self._next_id

    def open(self, service: str, method: str) -> int:
        stream_id = self.next_id
        self._next_id += 2
        self.pending[stream_id] = (service, method)
        return stream_id

    def close(self, stream_id: int) -> tuple[str, str]:
        try:
            return self.pending.pop(stream_id)
        except KeyError:
            raise RemoteProtocolError(
                f"ttrpc response for stream {stream_id}, which has no call pending"
            ) from None


class ServerStreams:
    """Calls the peer made to us: each new id odd and above the last
    (docs/developer/nri-protocol.md §1.2)."""

    __slots__ = ("in_flight", "last_id")

    def __init__(self) -> None:
        self.last_id = 0
        self.in_flight: set[int] = set()

    def accept(self, stream_id: int) -> str | None:
        """Record a new request; return why it is invalid instead, like Go's server."""
        if stream_id % 2 == 0:
            return f"StreamID must be odd for client initiated streams: {stream_id}"
        if stream_id <= self.last_id:
            return f"StreamID cannot be re-used and must increment: {stream_id}"
        self.last_id = stream_id
        self.in_flight.add(stream_id)
        return None

    def check_open(self, stream_id: int) -> None:
        if stream_id not in self.in_flight:
            raise LocalProtocolError(f"no request in flight on stream {stream_id}")

    def close(self, stream_id: int) -> None:
        self.check_open(stream_id)
        self.in_flight.remove(stream_id)
