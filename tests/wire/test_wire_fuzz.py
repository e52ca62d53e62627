"""Property tests: arbitrary input gives events or a clean ProtocolError, never a crash."""

from __future__ import annotations

import itertools
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nri_plugin.nri.api import PLUGIN_SERVICE, RUNTIME_SERVICE
from nri_plugin.nri.wire import (
    Code,
    Connection,
    ConnectionClosed,
    ConnectionState,
    FrameTooLargeError,
    ProtocolError,
    RemoteProtocolError,
    Role,
)
from nri_plugin.nri.wire._mux import MAX_PAYLOAD, MuxReader
from nri_plugin.nri.wire._ttrpc import MAX_DATA, FrameReader
from tests.nri_runtime_peer import mux_frame, request_bytes, response_bytes, ttrpc_frame

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SERVICES = {PLUGIN_SERVICE: {"Configure", "CreateContainer"}}
# At most one incomplete mux header plus one incomplete ttrpc frame per conn.
BOUND = 8 + 2 * (10 + MAX_DATA)


def feed_all(conn: Connection, pieces: list[bytes]) -> list[object]:
    events: list[object] = []
    for piece in pieces:
        if not piece:
            continue  # b"" is EOF, not "nothing"
        events.extend(conn.receive_data(piece))
        assert conn.buffered <= BOUND
    return events


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@FAST
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_random_bytes_never_crash(pieces: list[bytes]) -> None:
    conn = Connection(services=SERVICES)
    try:
        feed_all(conn, pieces)
        conn.receive_data(b"")
    except ProtocolError:
        assert conn.state is ConnectionState.ERROR


# Random streams that are at least framed plausibly, so the fuzzer gets past the
# mux header into the ttrpc and protobuf layers.
frames = st.builds(
    lambda conn, stream, mtype, flags, data: mux_frame(
        conn, ttrpc_frame(stream, mtype, data, flags)
    ),
    st.sampled_from([1, 2]),
    st.integers(0, 12),
    st.integers(0, 4),
    st.integers(0, 3),
    st.one_of(
        st.binary(max_size=40),
        st.builds(request_bytes, st.sampled_from([PLUGIN_SERVICE, "x"]), st.text(max_size=20)),
        st.builds(response_bytes, st.binary(max_size=10), st.integers(0, 20), st.text(max_size=5)),
    ),
)


@FAST
@given(st.lists(frames, max_size=6), st.lists(st.integers(0, 10_000), max_size=6))
def test_plausible_frames_never_crash(stream: list[bytes], cuts: list[int]) -> None:
    conn = Connection(services=SERVICES)
    conn.send_request(RUNTIME_SERVICE, "RegisterPlugin", b"")  # so some responses match
    try:
        feed_all(conn, split(b"".join(stream), cuts))
    except ProtocolError:
        assert conn.state is ConnectionState.ERROR
    conn.data_to_send()


def valid_stream(methods: list[str]) -> bytes:
    return b"".join(
        mux_frame(1, ttrpc_frame(2 * i + 1, 1, request_bytes(PLUGIN_SERVICE, m, b"p" * i)))
        for i, m in enumerate(methods)
    )


@FAST
@given(
    st.lists(st.sampled_from(["Configure", "CreateContainer", "Nope"]), min_size=1, max_size=6),
    st.lists(st.integers(0, 10_000), max_size=10),
)
def test_any_split_gives_the_same_events(methods: list[str], cuts: list[int]) -> None:
    data = valid_stream(methods)
    expected = Connection(services=SERVICES).receive_data(data)
    got = feed_all(Connection(services=SERVICES), split(data, cuts))
    assert got == expected
    assert len(got) == len(methods)


@FAST
@given(
    st.lists(st.sampled_from(["Configure", "CreateContainer"]), min_size=1, max_size=4), st.data()
)
def test_truncation_then_eof_is_clean(methods: list[str], data: st.DataObject) -> None:
    stream = valid_stream(methods)
    cut = data.draw(st.integers(0, len(stream)))
    conn = Connection(services=SERVICES)
    if cut:
        conn.receive_data(stream[:cut])
    boundaries = {0, len(stream)} | {len(valid_stream(methods[:k])) for k in range(len(methods))}
    if cut in boundaries:
        assert conn.receive_data(b"") == [ConnectionClosed()]
    else:
        try:
            conn.receive_data(b"")
        except RemoteProtocolError as exc:
            assert "middle of a frame" in str(exc)
        else:
            raise AssertionError("EOF mid-frame was accepted")


@FAST
@given(st.integers(MAX_PAYLOAD + 1, 0xFFFFFFFF), st.sampled_from([1, 2]))
def test_oversize_mux_header_fails_before_any_payload(length: int, conn_id: int) -> None:
    reader = MuxReader()
    try:
        reader.feed(struct.pack(">II", conn_id, length))
    except FrameTooLargeError:
        return
    raise AssertionError("oversize mux frame accepted")


@FAST
@given(st.integers(MAX_DATA + 1, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFF))
def test_oversize_ttrpc_header_fails_before_any_data(length: int, stream_id: int) -> None:
    reader = FrameReader()
    try:
        reader.feed(struct.pack(">IIBB", length, stream_id, 1, 0))
    except FrameTooLargeError:
        return
    raise AssertionError("oversize ttrpc frame accepted")


def test_memory_stays_bounded_while_a_big_frame_trickles_in() -> None:
    conn = Connection(role=Role.PLUGIN, services=SERVICES)
    header = struct.pack(">IIBB", MAX_DATA, 1, 1, 0)
    conn.receive_data(struct.pack(">II", 1, MAX_PAYLOAD) + header)
    chunk = bytes(1 << 20)
    events = []
    for _ in range(4):
        assert events == []
        events = conn.receive_data(chunk)
        assert conn.buffered <= 10 + MAX_DATA
    # The ttrpc frame is complete after 4 MiB (zeros: an undecodable request) and
    # the same mux frame goes on with an empty request on stream 3.
    events += conn.receive_data(struct.pack(">IIBB", 0, 3, 1, 0))
    first, second = events
    assert (first.stream_id, first.code) == (1, Code.INVALID_ARGUMENT)
    assert (second.stream_id, second.code) == (3, Code.UNIMPLEMENTED)
    assert conn.buffered == 0
