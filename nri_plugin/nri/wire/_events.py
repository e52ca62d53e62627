"""Events returned by ``Connection.receive_data``."""

from __future__ import annotations

from dataclasses import dataclass

from nri_plugin.nri.wire._ttrpc import Code


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
