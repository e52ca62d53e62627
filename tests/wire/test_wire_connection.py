"""``Connection``: mux + ttrpc sessions on both conns (docs/developer/nri-protocol.md §1, §2)."""

from __future__ import annotations

import struct

import pytest

from nri_plugin.nri.api import PLUGIN_SERVICE, RUNTIME_SERVICE
from nri_plugin.nri.wire import (
    Code,
    Connection,
    ConnectionClosed,
    ConnectionState,
    FrameTooLargeError,
    LocalProtocolError,
    MessageTooLargeError,
    RemoteProtocolError,
    RequestReceived,
    RequestRejected,
    ResponseReceived,
    Role,
)
from tests.nri_runtime_peer import RawParser, mux_frame, request_bytes, response_bytes, ttrpc_frame
from tests.wire.feeding import bytewise

SERVICES = {PLUGIN_SERVICE: {"Configure", "CreateContainer"}}


class ChannelPair:
    """A plugin-side and a runtime-side Connection; every send is checked by a receive."""

    def __init__(self) -> None:
        self.plugin = Connection(role=Role.PLUGIN, services=SERVICES)
        self.runtime = Connection(role=Role.RUNTIME)

    def to_runtime(self) -> list[object]:
        return self.runtime.receive_data(self.plugin.data_to_send())

    def to_plugin(self) -> list[object]:
        return self.plugin.receive_data(self.runtime.data_to_send())


def test_register_and_configure_race() -> None:
    """Configure may arrive before the RegisterPlugin reply (docs/developer/nri-protocol.md §3.2);
    both are delivered."""
    pair = ChannelPair()
    reg = pair.plugin.send_request(RUNTIME_SERVICE, "RegisterPlugin", b"reg")
    assert reg == 1
    [req] = pair.to_runtime()
    assert isinstance(req, RequestReceived)
    assert (req.service, req.method, req.payload) == (RUNTIME_SERVICE, "RegisterPlugin", b"reg")
    conf = pair.runtime.send_request(PLUGIN_SERVICE, "Configure", b"cfg", timeout_nano=2_000_000)
    pair.runtime.send_response(req.stream_id, b"")
    configure, registered = pair.to_plugin()
    assert configure == RequestReceived(
        stream_id=conf,
        service=PLUGIN_SERVICE,
        method="Configure",
        payload=b"cfg",
        timeout_nano=2_000_000,
    )
    assert registered == ResponseReceived(
        stream_id=1, service=RUNTIME_SERVICE, method="RegisterPlugin", payload=b""
    )
    pair.plugin.send_response(conf, b"\x10\x08")
    [reply] = pair.to_runtime()
    assert isinstance(reply, ResponseReceived)
    assert reply.ok
    assert reply.payload == b"\x10\x08"


def test_client_stream_ids_are_odd_and_increasing_per_conn() -> None:
    pair = ChannelPair()
    ids = [pair.plugin.send_request(RUNTIME_SERVICE, "UpdateContainers", b"") for _ in range(3)]
    assert ids == [1, 3, 5]
    # the other conn has its own counter (docs/developer/nri-protocol.md §1.2)
    assert pair.runtime.send_request(PLUGIN_SERVICE, "Configure", b"") == 1
    assert pair.plugin.receive_data(b"") == [ConnectionClosed(pending=(1, 3, 5))]


def test_out_of_order_responses_match_their_calls() -> None:
    pair = ChannelPair()
    a = pair.plugin.send_request(RUNTIME_SERVICE, "A", b"")
    b = pair.plugin.send_request(RUNTIME_SERVICE, "B", b"")
    ra, rb = pair.to_runtime()
    pair.runtime.send_response(rb.stream_id, b"for-b")
    pair.runtime.send_response(ra.stream_id, b"", code=Code.NOT_FOUND, message="no a")
    first, second = pair.to_plugin()
    assert (first.stream_id, first.method, first.payload) == (b, "B", b"for-b")
    assert (second.stream_id, second.method, second.ok) == (a, "A", False)
    assert (second.code, second.message) == (Code.NOT_FOUND, "no a")


@pytest.mark.parametrize(
    ("service", "method", "message"),
    [
        ("nri.pkg.api.v1alpha1.HostFunctions", "Log", "service nri.pkg.api.v1alpha1.HostFunctions"),
        (PLUGIN_SERVICE, "ValidateContainerAdjustment", "method ValidateContainerAdjustment"),
    ],
    ids=["unknown-service", "unknown-method"],
)
def test_unknown_services_and_methods_get_unimplemented(
    service: str, method: str, message: str
) -> None:
    pair = ChannelPair()
    stream = pair.runtime.send_request(service, method, b"")
    [event] = pair.to_plugin()
    assert event == RequestRejected(
        stream_id=stream, service=service, method=method, code=Code.UNIMPLEMENTED, message=message
    )
    [reply] = pair.to_runtime()
    assert (reply.stream_id, reply.code, reply.message) == (stream, Code.UNIMPLEMENTED, message)
    with pytest.raises(LocalProtocolError, match="no request in flight"):
        pair.plugin.send_response(stream)  # answered already


def raw_request(stream_id: int, method: str = "Configure") -> bytes:
    data = request_bytes(PLUGIN_SERVICE, method)
    return mux_frame(1, ttrpc_frame(stream_id, 1, data))


@pytest.mark.parametrize(
    ("ids", "bad", "why"),
    [([2], 2, "must be odd"), ([3, 1], 1, "must increment"), ([5, 5], 5, "must increment")],
    ids=["even", "decreasing", "reused"],
)
def test_bad_stream_ids_are_answered_invalid_argument(ids: list[int], bad: int, why: str) -> None:
    plugin = Connection(role=Role.PLUGIN, services=SERVICES)
    events = plugin.receive_data(b"".join(raw_request(i) for i in ids))
    rejected = events[-1]
    assert isinstance(rejected, RequestRejected)
    assert (rejected.stream_id, rejected.code) == (bad, Code.INVALID_ARGUMENT)
    assert why in rejected.message
    replies = RawParser().feed(plugin.data_to_send())
    assert replies[-1].stream_id == bad
    assert replies[-1].response().status.code == Code.INVALID_ARGUMENT
    assert plugin.state is ConnectionState.OPEN


def test_undecodable_request_fails_only_its_stream() -> None:
    plugin = Connection(role=Role.PLUGIN, services=SERVICES)
    garbage = mux_frame(1, ttrpc_frame(1, 1, b"\xff\xff"))
    [event] = plugin.receive_data(garbage + raw_request(3))[:1]
    assert isinstance(event, RequestRejected)
    assert event.code == Code.INVALID_ARGUMENT
    with pytest.raises(LocalProtocolError, match="no request in flight"):
        plugin.send_response(1)  # answered already
    plugin.send_response(3, b"")
    replies = RawParser().feed(plugin.data_to_send())
    assert [(m.stream_id, m.response().status.code) for m in replies] == [(1, 3), (3, 0)]


def test_whole_exchange_byte_by_byte() -> None:
    pair = ChannelPair()
    pair.runtime.send_request(PLUGIN_SERVICE, "Configure", b"x" * 5000)
    pair.runtime.send_request(PLUGIN_SERVICE, "CreateContainer", b"y")
    events = bytewise(pair.plugin.receive_data, pair.runtime.data_to_send())
    assert [(e.stream_id, e.method, len(e.payload)) for e in events] == [
        (1, "Configure", 5000),
        (3, "CreateContainer", 1),
    ]


def test_large_reply_is_split_by_the_4096_rule() -> None:
    pair = ChannelPair()
    stream = pair.runtime.send_request(PLUGIN_SERVICE, "CreateContainer", b"")
    pair.to_plugin()
    pair.plugin.send_response(stream, b"z" * 100_000)
    parser = RawParser()
    [reply] = parser.feed(pair.plugin.data_to_send())
    assert parser.violations == []
    assert [size for _, size in parser.mux_frames] == [
        4096,
        10 + 1 + 3 + 100_000 - 4096,
    ]  # header, tag, varint len
    assert reply.response().payload == b"z" * 100_000


def test_oversize_reply_leaves_the_stream_open_for_an_error() -> None:
    pair = ChannelPair()
    stream = pair.runtime.send_request(PLUGIN_SERVICE, "CreateContainer", b"")
    pair.to_plugin()
    with pytest.raises(MessageTooLargeError):
        pair.plugin.send_response(stream, bytes(4 << 20))
    assert pair.plugin.data_to_send() == b""
    pair.plugin.send_response(stream, code=Code.RESOURCE_EXHAUSTED, message="too big")
    [reply] = pair.to_runtime()
    assert reply.code == Code.RESOURCE_EXHAUSTED


def test_oversize_request_uses_no_stream_id() -> None:
    pair = ChannelPair()
    with pytest.raises(MessageTooLargeError):
        pair.plugin.send_request(RUNTIME_SERVICE, "UpdateContainers", bytes(4 << 20))
    assert pair.plugin.send_request(RUNTIME_SERVICE, "UpdateContainers", b"") == 1


def test_answering_a_stream_twice_is_a_local_error() -> None:
    pair = ChannelPair()
    stream = pair.runtime.send_request(PLUGIN_SERVICE, "Configure", b"")
    pair.to_plugin()
    pair.plugin.send_response(stream, b"")
    with pytest.raises(LocalProtocolError, match=f"stream {stream}"):
        pair.plugin.send_response(stream, b"")
    assert pair.plugin.state is ConnectionState.OPEN


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (mux_frame(2, ttrpc_frame(1, 2, response_bytes())), "no call pending"),
        (mux_frame(1, ttrpc_frame(1, 2, response_bytes())), "only requests"),
        (mux_frame(2, ttrpc_frame(1, 1, request_bytes(RUNTIME_SERVICE, "X"))), "only responses"),
        (mux_frame(1, ttrpc_frame(1, 3, b"")), "type 3"),
        (mux_frame(1, ttrpc_frame(1, 9, b"")), "type 9"),
        (mux_frame(4, b"x"), "conn id 4"),
        (struct.pack(">II", 1, 20 << 20), "announces"),
        (mux_frame(1, struct.pack(">IIBB", (4 << 20) + 1, 1, 1, 0)), "announces"),
    ],
    ids=[
        "response-without-call",
        "response-on-server-conn",
        "request-on-client-conn",
        "data-frame",
        "unknown-type",
        "unknown-conn",
        "mux-oversize",
        "ttrpc-oversize",
    ],
)
def test_remote_errors_put_the_connection_in_error_state(data: bytes, error: str) -> None:
    plugin = Connection(role=Role.PLUGIN, services=SERVICES)
    with pytest.raises(RemoteProtocolError, match=error):
        plugin.receive_data(data)
    assert plugin.state is ConnectionState.ERROR
    with pytest.raises(RemoteProtocolError):
        plugin.receive_data(raw_request(1))
    with pytest.raises(LocalProtocolError):
        plugin.send_request(RUNTIME_SERVICE, "RegisterPlugin", b"")


def test_oversize_errors_are_frame_too_large() -> None:
    plugin = Connection()
    with pytest.raises(FrameTooLargeError):
        plugin.receive_data(mux_frame(1, struct.pack(">IIBB", 0xFFFFFFFF, 1, 1, 0)))


def test_clean_eof_reports_pending_calls() -> None:
    pair = ChannelPair()
    pair.plugin.send_request(RUNTIME_SERVICE, "RegisterPlugin", b"")
    assert pair.plugin.receive_data(b"") == [ConnectionClosed(pending=(1,))]
    assert pair.plugin.state is ConnectionState.CLOSED
    with pytest.raises(LocalProtocolError):
        pair.plugin.send_request(RUNTIME_SERVICE, "RegisterPlugin", b"")
    with pytest.raises(LocalProtocolError):
        pair.plugin.receive_data(b"more")


@pytest.mark.parametrize(
    "cut", [3, 8, 12, 20], ids=["mux-header", "mux-payload0", "ttrpc-header", "ttrpc-data"]
)
def test_eof_mid_frame_is_a_remote_error(cut: int) -> None:
    plugin = Connection(services=SERVICES)
    data = raw_request(1)
    assert cut < len(data)
    assert plugin.receive_data(data[:cut]) == []
    with pytest.raises(RemoteProtocolError, match="middle of a frame"):
        plugin.receive_data(b"")
    assert plugin.state is ConnectionState.ERROR


def test_undecodable_response_fails_only_that_call() -> None:
    plugin = Connection()
    plugin.send_request(RUNTIME_SERVICE, "RegisterPlugin", b"")
    plugin.send_request(RUNTIME_SERVICE, "UpdateContainers", b"")
    data = mux_frame(2, ttrpc_frame(1, 2, b"\xff")) + mux_frame(2, ttrpc_frame(3, 2, b""))
    bad, good = plugin.receive_data(data)
    assert (bad.stream_id, bad.code) == (1, Code.DATA_LOSS)
    assert (good.stream_id, good.ok) == (3, True)


def test_services_none_passes_every_request() -> None:
    plugin = Connection()
    [event] = plugin.receive_data(raw_request(1, "Anything"))
    assert isinstance(event, RequestReceived)


@pytest.mark.parametrize("request_data", [
    request_bytes(PLUGIN_SERVICE, "CreateContainer", b"p" * 3000),
    request_bytes(PLUGIN_SERVICE, "Nope", b""),
    request_bytes("other.Service", "CreateContainer", b""),
    b"\xff\xff undecodable",
], ids=["request", "unknown-method", "unknown-service", "undecodable"])
@pytest.mark.parametrize("stream_id", [1, 2])
def test_a_whole_request_in_one_read_is_what_the_readers_make_of_it(
        request_data: bytes, stream_id: int) -> None:
    # One mux frame holding one request, nothing buffered: handled without the readers'
    # buffers; the same bytes in two reads go through both readers.
    data = mux_frame(1, ttrpc_frame(stream_id, 1, request_data))
    one, split = (Connection(role=Role.PLUGIN, services=SERVICES) for _ in range(2))
    whole_events = one.receive_data(data)
    split_events = split.receive_data(data[:9]) + split.receive_data(data[9:])
    assert whole_events == split_events and len(whole_events) == 1
    assert one.data_to_send() == split.data_to_send()
    assert one._in_flight == split._in_flight
    assert one.buffered == split.buffered == 0


def test_a_whole_frame_after_a_partial_one_is_read_in_order() -> None:
    plugin = Connection(role=Role.PLUGIN, services=SERVICES)
    first = mux_frame(1, ttrpc_frame(1, 1, request_bytes(PLUGIN_SERVICE, "Configure", b"a")))
    second = mux_frame(1, ttrpc_frame(3, 1, request_bytes(PLUGIN_SERVICE, "Configure", b"b")))
    assert plugin.receive_data(first[:5]) == []
    events = plugin.receive_data(first[5:]) + plugin.receive_data(second)
    assert [(e.stream_id, e.payload) for e in events] == [(1, b"a"), (3, b"b")]
    # A mux frame whose ttrpc frame is still incomplete is not taken for a whole one.
    part = mux_frame(1, ttrpc_frame(5, 1, request_bytes(PLUGIN_SERVICE, "Configure", b"c")))
    assert plugin.receive_data(part[:20]) == []
    assert [e.payload for e in plugin.receive_data(part[20:])] == [b"c"]
