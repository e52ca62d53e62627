"""Sans-IO core of the NRI protocol: mux frames, ttrpc frames and stream state.

Feed bytes to ``Connection.receive_data`` and get events back; send with
``send_request``/``send_response`` and write out ``data_to_send()``. This package
must not import asyncio, socket or os (tests/test_layering.py checks).
"""

from __future__ import annotations

from nri_plugin.nri.wire._bounded import bound_message, clip
from nri_plugin.nri.wire._connection import (
    Connection,
    ConnectionClosed,
    ConnectionState,
    RequestReceived,
    RequestRejected,
    ResponseReceived,
    Role,
)
from nri_plugin.nri.wire._errors import (
    FrameTooLargeError,
    LocalProtocolError,
    MessageTooLargeError,
    ProtocolError,
    RemoteProtocolError,
)
from nri_plugin.nri.wire._ttrpc import MAX_DATA, Code

__all__ = [
    "MAX_DATA",
    "Code",
    "Connection",
    "ConnectionClosed",
    "ConnectionState",
    "FrameTooLargeError",
    "LocalProtocolError",
    "MessageTooLargeError",
    "ProtocolError",
    "RemoteProtocolError",
    "RequestReceived",
    "RequestRejected",
    "ResponseReceived",
    "Role",
    "bound_message",
    "clip",
]
