"""Hostile sizes at the protocol core: rejections and error replies always fit a frame."""

from __future__ import annotations

from nri_plugin.nri.api import PLUGIN_SERVICE
from nri_plugin.nri.wire import MAX_DATA, Code, Connection, RequestReceived, RequestRejected
from tests.nri_runtime_peer import RawParser, mux_frame, request_bytes, ttrpc_frame

SERVICES = {PLUGIN_SERVICE: {"CreateContainer"}}


def reply_to(conn: Connection) -> tuple[int, str]:
    [message] = RawParser().feed(conn.data_to_send())
    status = message.response().status
    return status.code, status.message


def test_a_4mb_service_name_is_rejected_with_a_short_reply() -> None:
    conn = Connection(services=SERVICES)
    data = request_bytes("s" * (MAX_DATA - 100), "CreateContainer")
    [event] = conn.receive_data(mux_frame(1, ttrpc_frame(1, 1, data)))
    assert isinstance(event, RequestRejected) and len(event.service) <= 128
    code, message = reply_to(conn)
    assert code == Code.UNIMPLEMENTED and len(message) < 200


def test_a_4mb_method_name_is_rejected_with_a_short_reply() -> None:
    conn = Connection(services=SERVICES)
    data = request_bytes(PLUGIN_SERVICE, "m" * (MAX_DATA - 100))
    conn.receive_data(mux_frame(1, ttrpc_frame(1, 1, data)))
    code, message = reply_to(conn)
    assert code == Code.UNIMPLEMENTED and len(message) < 200


def test_error_replies_are_bounded() -> None:
    conn = Connection(services=SERVICES)
    [event] = conn.receive_data(mux_frame(1, ttrpc_frame(
        1, 1, request_bytes(PLUGIN_SERVICE, "CreateContainer"))))
    assert isinstance(event, RequestReceived)
    conn.send_response(1, code=Code.UNKNOWN, message="x" * (MAX_DATA + 1))  # no exception
    code, message = reply_to(conn)
    assert code == Code.UNKNOWN and len(message) == 2048
