"""The sans-IO NRI connection: mux + two ttrpc sessions, the events it returns, and the
stream ids of each session (docs/developer/nri-protocol.md §1, §1.2, §2).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from nri_plugin.nri.wire._bounded import bound_message, clip
from nri_plugin.nri.wire._errors import LocalProtocolError, RemoteProtocolError
from nri_plugin.nri.wire._mux import PLUGIN_CONN, RUNTIME_CONN, MuxReader, frame_message
from nri_plugin.nri.wire._ttrpc import (
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


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestReceived:
    """The peer called one of the methods we serve; answer with ``send_response``."""

    stream_id: int
    service: str
    method: str
    payload: bytes
    # the peer's remaining deadline; 0 = none (docs/developer/nri-protocol.md §1.3)
    timeout_nano: int = 0
    metadata: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRejected:
    """A request the core answered by itself (bad stream id, unknown method, ...).

    Informational: the error reply is already queued in ``data_to_send()``.
    """

    stream_id: int
    service: str
    method: str
    code: Code
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseReceived:
    """The reply to one of our ``send_request`` calls."""

    stream_id: int
    service: str
    method: str
    payload: bytes
    code: int = Code.OK
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.code == Code.OK


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionClosed:
    """The peer closed the trunk cleanly; ``pending`` calls will never be answered."""

    pending: tuple[int, ...] = ()


Event = RequestReceived | RequestRejected | ResponseReceived | ConnectionClosed


MAX_STREAM_ID = (1 << 32) - 1  # the header field is a uint32


class ConnectionState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"  # the peer closed the trunk cleanly
    ERROR = "error"  # a protocol error happened; the connection cannot be used again


class Role(enum.Enum):
    """Which end of the trunk we are; it fixes which conn we serve
    (docs/developer/nri-protocol.md §2.2)."""

    PLUGIN = "plugin"
    RUNTIME = "runtime"  # only used by tests, to play the runtime


class Connection:
    """One NRI trunk: we serve ttrpc on one conn id and call out on the other.

    ``services`` maps each service name we serve to its method names; requests for anything
    else are answered UNIMPLEMENTED here, which is also what makes v0.12 runtimes fall back to
    StateChange (docs/developer/nri-protocol.md §1.3, §3.6). ``None`` passes every request
    through.
    """

    def __init__(
        self,
        *,
        role: Role = Role.PLUGIN,
        services: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        self.role = role
        # The conn ids we serve on and call out on.
        self._server_conn, self._client_conn = (
            (PLUGIN_CONN, RUNTIME_CONN) if role is Role.PLUGIN else (RUNTIME_CONN, PLUGIN_CONN))
        self.state = ConnectionState.OPEN
        self._services = (
            None if services is None else {k: frozenset(v) for k, v in services.items()}
        )
        self._mux = MuxReader()
        self._readers = {PLUGIN_CONN: FrameReader(), RUNTIME_CONN: FrameReader()}
        # Stream ids (docs/developer/nri-protocol.md §1.2): our calls take odd ids 1, 3, 5,
        # ... and wait for their replies in ``_pending``; the peer's calls to us must each
        # take a new odd id above the last, and stay ``_in_flight`` until answered.
        self._next_id = 1
        self._pending: dict[int, tuple[str, str]] = {}  # stream id: (service, method)
        self._last_id = 0
        self._in_flight: set[int] = set()
        self._outbound = bytearray()

    # --- inbound ---------------------------------------------------------

    def receive_data(self, data: bytes | memoryview) -> list[Event]:
        """Feed bytes read from the socket; ``b""`` means EOF. What is kept is copied, so
        the caller may reuse ``data``'s buffer once this returns."""
        if self.state is ConnectionState.ERROR:
            raise RemoteProtocolError("connection already failed; no more data accepted")
        if self.state is ConnectionState.CLOSED:
            raise LocalProtocolError("data received after EOF")
        try:
            if not data:
                return [self._eof()]
            events: list[Event] = []
            for chunk in self._mux.feed(data):
                for frame in self._readers[chunk.conn_id].feed(chunk.data):
                    events.append(self._handle_frame(chunk.conn_id, frame))
            return events
        except RemoteProtocolError:
            self.state = ConnectionState.ERROR
            raise

    def _eof(self) -> ConnectionClosed:
        if self._mux.mid_frame or any(r.mid_frame for r in self._readers.values()):
            raise RemoteProtocolError("connection closed in the middle of a frame")
        self.state = ConnectionState.CLOSED
        pending = tuple(sorted(self._pending))
        self._pending.clear()
        return ConnectionClosed(pending=pending)

    def _handle_frame(self, conn_id: int, frame: Frame) -> Event:
        serving = conn_id == self._server_conn
        expected = MessageType.REQUEST if serving else MessageType.RESPONSE
        if frame.type != expected:
            raise RemoteProtocolError(
                f"ttrpc message type {frame.type} on conn {conn_id} stream {frame.stream_id}; "
                f"only {expected.name.lower()}s are valid there"
            )
        if serving:
            return self._handle_request(frame.stream_id, frame.data)
        return self._handle_response(frame.stream_id, frame.data)

    # Service and method names are quoted in rejections; a hostile peer may send 4 MiB ones.
    NAME_LIMIT = 128

    def _handle_request(self, stream_id: int, data: bytes) -> Event:
        # Rejected as Go's server does.
        if stream_id % 2 == 0:
            return self._reject(stream_id, ("", ""), Code.INVALID_ARGUMENT,
                                f"StreamID must be odd for client initiated streams: {stream_id}")
        if stream_id <= self._last_id:
            return self._reject(stream_id, ("", ""), Code.INVALID_ARGUMENT,
                                f"StreamID cannot be re-used and must increment: {stream_id}")
        self._last_id = stream_id
        try:
            request = decode_request(data, stream_id)
        except RemoteProtocolError as exc:
            # Framing is intact, so only this call fails (Go answers it the same way).
            return self._reject(stream_id, ("", ""), Code.INVALID_ARGUMENT, str(exc))
        service, method = request.service, request.method
        if self._services is not None and method not in self._services.get(service, ()):
            unknown = (f"method {clip(method, self.NAME_LIMIT)}" if service in self._services
                       else f"service {clip(service, self.NAME_LIMIT)}")
            return self._reject(stream_id, (service, method), Code.UNIMPLEMENTED, unknown)
        self._in_flight.add(stream_id)  # until answered
        return RequestReceived(
            stream_id=stream_id,
            service=service,
            method=method,
            payload=request.payload,
            timeout_nano=request.timeout_nano,
            metadata=tuple((kv.key, kv.value) for kv in request.metadata),
        )

    def _reject(self, stream_id: int, called: tuple[str, str], code: Code,
                message: str) -> RequestRejected:
        # ``called``: (service, method), ("", "") when unreadable. Bounded so that the
        # reply always fits in a frame (a 4 MiB service name quoted in "service X" would
        # not) and the event is cheap to log (the stub logs it).
        service, method = clip(called[0], self.NAME_LIMIT), clip(called[1], self.NAME_LIMIT)
        message = bound_message(message)
        frame = encode_frame(stream_id, MessageType.RESPONSE, encode_response(b"", code, message))
        self._outbound += frame_message(self._server_conn, frame)
        return RequestRejected(
            stream_id=stream_id, service=service, method=method, code=code, message=message
        )

    def _handle_response(self, stream_id: int, data: bytes) -> ResponseReceived:
        called = self._pending.pop(stream_id, None)
        if called is None:
            raise RemoteProtocolError(
                f"ttrpc response for stream {stream_id}, which has no call pending")
        service, method = called
        try:
            response = decode_response(data, stream_id)
        except RemoteProtocolError as exc:
            # The call is answered, just unreadably: fail that call, not the trunk.
            payload, code, message = b"", int(Code.DATA_LOSS), str(exc)
        else:
            payload = response.payload
            code, message = response.status.code, response.status.message
        return ResponseReceived(stream_id=stream_id, service=service, method=method,
                                payload=payload, code=code, message=message)

    # --- outbound --------------------------------------------------------

    def send_request(
        self,
        service: str,
        method: str,
        payload: bytes,
        *,
        timeout_nano: int = 0,
        metadata: Iterable[tuple[str, str]] = (),
    ) -> int:
        """Queue a call on our client conn; return its stream id."""
        self._check_usable()
        data = encode_request(
            service, method, payload, timeout_nano=timeout_nano, metadata=metadata
        )
        stream_id = self._next_id
        if stream_id > MAX_STREAM_ID:
            raise LocalProtocolError("ttrpc stream ids exhausted on this connection")
        # Encode before taking the stream id: an oversize call then leaves no gap or trace.
        frame = encode_frame(stream_id, MessageType.REQUEST, data)
        self._next_id += 2
        self._pending[stream_id] = (service, method)
        self._outbound += frame_message(self._client_conn, frame)
        return stream_id

    def send_response(
        self, stream_id: int, payload: bytes = b"", *, code: int = Code.OK, message: str = ""
    ) -> None:
        """Answer a ``RequestReceived``. A non-OK ``code`` sends an error status.

        Raises ``MessageTooLargeError`` (the stream stays open) when the reply is
        above 4 MiB, so the caller can answer RESOURCE_EXHAUSTED instead. Error
        messages are bounded (``bound_message``), so an error reply always fits.
        """
        self._check_usable()
        if stream_id not in self._in_flight:
            raise LocalProtocolError(f"no request in flight on stream {stream_id}")
        if code != Code.OK:
            message = bound_message(message)
        data = encode_response(payload, code, message)
        frame = encode_frame(stream_id, MessageType.RESPONSE, data)
        self._in_flight.remove(stream_id)
        self._outbound += frame_message(self._server_conn, frame)

    def _check_usable(self) -> None:
        if self.state is not ConnectionState.OPEN:
            raise LocalProtocolError(f"connection is {self.state.value}; cannot send")

    def data_to_send(self) -> bytes:
        """Drain the bytes queued so far (whole mux frames, ready to write)."""
        data = bytes(self._outbound)
        self._outbound.clear()
        return data

    @property
    def buffered(self) -> int:
        """Received bytes held for incomplete frames (bounded, see ``FrameReader``)."""
        return self._mux.buffered + sum(r.buffered for r in self._readers.values())
