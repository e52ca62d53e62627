"""``Stub`` against the test-only runtime peer, over real sockets."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.stub import RegistrationError, Stub, StubOptions, _Session, plugin_identity
from nri_plugin.nri.wire import Code
from tests.nri_runtime_peer import RecordingTransport, RuntimePeer, plugin_call_frame
from tests.virtual_clock import run_virtual

ENV = {"NRI_PLUGIN_NAME": "cdi", "NRI_PLUGIN_IDX": "42"}


class Injector(Plugin):
    def __init__(self) -> None:
        self.synced: list[tuple[list[str], list[str]]] = []
        self.removed: list[str] = []

    def synchronize(self, pods, containers):  # type: ignore[no-untyped-def]
        self.synced.append(([p.id for p in pods], [c.id for c in containers]))
        return None

    def create_container(self, pod, container):  # type: ignore[no-untyped-def]
        if container.name == "boom":
            raise RuntimeError("cannot resolve")
        adj = nri_pb2.ContainerAdjustment()
        adj.linux.devices.add(path="/dev/nvidia0", type="c", major=195, minor=0)
        adj.env.add(key="BIG", value="x" * int(container.annotations.get("size", "0")))
        return adj

    def remove_container(self, pod, container):  # type: ignore[no-untyped-def]
        self.removed.append(container.id)


def run(coro: Awaitable[Any], timeout: float = 60.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


async def with_pair(
    test: Callable[[Stub, RuntimePeer], Awaitable[None]], plugin: Plugin | None = None, **kw: Any
) -> list[BaseException | None]:
    """Run ``test`` with a Stub on one end of a socketpair and the peer on the other."""
    ours, theirs = socket.socketpair()
    closes: list[BaseException | None] = []
    stub = Stub(plugin or Injector(), StubOptions(
        sock=ours, env=ENV, on_close=lambda s, e: closes.append(e), **kw))
    reader, writer = await asyncio.open_unix_connection(sock=theirs)
    peer = RuntimePeer(reader, writer)
    runner = asyncio.create_task(stub.run())
    try:
        await test(stub, peer)
    finally:
        peer.close()
        await asyncio.wait_for(runner, 60)  # a one-shot stub returns on disconnect
    assert peer.parser.violations == []  # every frame obeyed the Go 4096 rule
    return closes


def create_request(name: str = "c", **annotations: str) -> nri_pb2.CreateContainerRequest:
    return nri_pb2.CreateContainerRequest(
        pod=nri_pb2.PodSandbox(id="p"),
        container=nri_pb2.Container(id=name, name=name, annotations=annotations),
    )


def test_full_lifecycle_with_configure_race_and_paging() -> None:
    plugin = Injector()

    async def test(stub: Stub, peer: RuntimePeer) -> None:
        pages = [
            nri_pb2.SynchronizeRequest(pods=[nri_pb2.PodSandbox(id="p1")], more=True),
            nri_pb2.SynchronizeRequest(containers=[nri_pb2.Container(id="c1")], more=True),
            nri_pb2.SynchronizeRequest(containers=[nri_pb2.Container(id="c2")]),
        ]
        reg, conf = await peer.handshake(configure_first=True, pages=pages, request_timeout_ms=900)
        assert (reg.plugin_name, reg.plugin_idx) == ("cdi", "42")
        assert conf.events == 0x408  # CREATE_CONTAINER | REMOVE_CONTAINER
        assert stub.configuration is not None
        assert stub.configuration.request_timeout == 0.9
        assert plugin.synced == [(["p1"], ["c1", "c2"])]

        resp = await peer.call("CreateContainer", create_request(), nri_pb2.CreateContainerResponse)
        assert [d.path for d in resp.adjust.linux.devices] == ["/dev/nvidia0"]

        removal = nri_pb2.ContainerEventRequest(container=nri_pb2.Container(id="gone"))
        assert await peer.call("RemoveContainer", removal, nri_pb2.Empty) == nri_pb2.Empty()
        legacy = nri_pb2.StateChangeEvent(event=11, container=nri_pb2.Container(id="old"))
        assert await peer.call("StateChange", legacy, nri_pb2.Empty) == nri_pb2.Empty()
        assert plugin.removed == ["gone", "old"]

    assert run(with_pair(test, plugin)) == [None]


class Echo(Plugin):
    """Answers each container with its annotations' sizes and digests, so that a byte
    changed on the way in shows in the reply."""

    def create_container(self, pod, container):  # type: ignore[no-untyped-def]
        adj = nri_pb2.ContainerAdjustment()
        for key, value in sorted(container.annotations.items()):
            digest = hashlib.sha256(value.encode()).hexdigest()
            adj.env.add(key=key.upper(), value=f"{len(value)}:{digest}")
        return adj


READ_SIZE = 256 << 10  # the most asyncio's socket transport reads at once


def test_requests_over_one_read_and_back_to_back_arrive_whole() -> None:
    """A request several times what one socket read takes, and requests sent together in
    one write, reach the handler byte for byte."""
    pads = {"big": "".join(chr(0x61 + i % 26) for i in range(3 * READ_SIZE + 7)),
            "small": "tiny", "next": "z" * 1000}

    async def test(stub: Stub, peer: RuntimePeer) -> None:
        await peer.handshake()
        streams = [peer.send_request("CreateContainer", create_request(name, pad=pad))
                   for name, pad in pads.items()]  # written at once: one read holds several
        for stream, pad in zip(streams, pads.values(), strict=True):
            reply = await peer.response_to(stream)
            adjust = nri_pb2.CreateContainerResponse.FromString(reply.payload).adjust
            assert [(e.key, e.value) for e in adjust.env] == [
                ("PAD", f"{len(pad)}:{hashlib.sha256(pad.encode()).hexdigest()}")]

    assert run(with_pair(test, Echo())) == [None]


def test_configure_after_register_reply_also_works() -> None:
    async def test(stub: Stub, peer: RuntimePeer) -> None:
        _, conf = await peer.handshake(configure_first=False, nri_version="v0.12.0")
        assert conf.events == 0x408

    run(with_pair(test))


def test_errors_fail_single_requests_and_unknown_methods_are_unimplemented() -> None:
    async def test(stub: Stub, peer: RuntimePeer) -> None:
        await peer.handshake()
        boom = peer.send_request("CreateContainer", create_request("boom"))
        unknown = peer.send_request("ValidateContainerAdjustment", b"")
        fine = peer.send_request("CreateContainer", create_request("fine"), split=3)
        r_boom = await peer.response_to(boom)
        r_fine = await peer.response_to(fine)  # answers are matched by stream id
        r_unknown = await peer.response_to(unknown)
        assert r_boom.status.code == Code.UNKNOWN
        assert "cannot resolve" in r_boom.status.message
        assert r_unknown.status.code == Code.UNIMPLEMENTED
        assert r_fine.status.code == 0
        assert nri_pb2.CreateContainerResponse.FromString(r_fine.payload).adjust.linux.devices

    run(with_pair(test))


def test_large_replies_obey_the_frame_rule() -> None:
    async def test(stub: Stub, peer: RuntimePeer) -> None:
        await peer.handshake()
        resp = await peer.call(
            "CreateContainer", create_request(size="200000"), nri_pb2.CreateContainerResponse
        )
        assert len(resp.adjust.env[0].value) == 200_000
        assert max(size for _, size in peer.parser.mux_frames) > 4096  # the split happened

    run(with_pair(test))


def test_oversize_reply_becomes_resource_exhausted() -> None:
    async def test(stub: Stub, peer: RuntimePeer) -> None:
        await peer.handshake()
        stream = peer.send_request("CreateContainer", create_request(size=str(5 << 20)))
        reply = await peer.response_to(stream)
        assert reply.status.code == Code.RESOURCE_EXHAUSTED

    run(with_pair(test))


def test_refused_registration_ends_a_one_shot_stub() -> None:
    async def test(stub: Stub, peer: RuntimePeer) -> None:
        stream, _ = await peer.expect_register()
        peer.reply(stream, code=Code.INVALID_ARGUMENT, text="bad name")
        assert await peer.at_eof()

    [error] = run(with_pair(test))
    assert isinstance(error, RegistrationError)


def test_protocol_error_drops_the_connection() -> None:
    async def test(stub: Stub, peer: RuntimePeer) -> None:
        await peer.handshake()
        peer.write(b"\x00\x00\x00\x07\x00\x00\x00\x00")  # conn id 7 does not exist
        assert await peer.at_eof()

    [error] = run(with_pair(test))
    assert "conn id 7" in str(error)


def test_runtime_launched_fd_and_name_quirk() -> None:
    ours, theirs = socket.socketpair()
    env = {
        "NRI_PLUGIN_SOCKET": str(ours.detach()),
        "NRI_PLUGIN_NAME": "10-cdi",
        "NRI_PLUGIN_IDX": "10",
    }

    async def main() -> None:
        stub = Stub(Injector(), StubOptions(env=env))
        assert stub.launched
        assert (stub.name, stub.idx) == ("cdi", "10")
        reader, writer = await asyncio.open_unix_connection(sock=theirs)
        peer = RuntimePeer(reader, writer)
        runner = asyncio.create_task(stub.run())
        reg, _ = await peer.handshake()
        assert (reg.plugin_name, reg.plugin_idx) == ("cdi", "10")
        peer.close()
        await asyncio.wait_for(runner, 60)  # launched: exit, never reconnect

    run(main())


def test_external_plugin_reconnects_and_stops_on_shutdown(tmp_path: Path) -> None:
    path = str(tmp_path / "nri.sock")
    registrations: list[str] = []
    connected: list[Stub] = []

    async def main() -> None:
        sessions: asyncio.Queue[RuntimePeer] = asyncio.Queue()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await sessions.put(RuntimePeer(reader, writer))

        server = await asyncio.start_unix_server(accept, path=path)
        stub = Stub(
            Injector(),
            StubOptions(socket_path=path,
            env=ENV,
            poll_interval=0.01,
            on_connected=connected.append)
        )
        runner = asyncio.create_task(stub.run())
        first = await sessions.get()
        reg, _ = await first.handshake()
        registrations.append(reg.plugin_name)
        first.close()  # the runtime goes away: the stub must come back
        second = await sessions.get()
        reg, _ = await second.handshake()
        registrations.append(reg.plugin_name)
        assert await second.call("Shutdown", nri_pb2.Empty(), nri_pb2.Empty) == nri_pb2.Empty()
        await asyncio.wait_for(runner, 60)  # Shutdown: no reconnect
        server.close()

    run(main())
    assert registrations == ["cdi", "cdi"]
    assert len(connected) == 2 and connected[0] is connected[1]  # once registered, each time


def test_external_plugin_keeps_retrying_until_stopped(tmp_path: Path) -> None:
    closes: list[object] = []
    attempts: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stub = Stub(
            Injector(),
            StubOptions(socket_path=str(tmp_path / "missing.sock"),
            env=ENV,
            poll_interval=0.5,
            on_close=lambda s, e: closes.append(e),
            before_connect=lambda s: attempts.append(loop.time()))
        )
        runner = asyncio.create_task(stub.run())
        await asyncio.sleep(600)  # ten minutes on the stub's clock without a runtime
        assert not runner.done()
        stub.stop()
        await runner

    run_virtual(main())
    assert closes == []  # never connected, so never closed
    # Every poll interval all along: no attempt limit, no growing back-off.
    assert len(attempts) == pytest.approx(600 / 0.5, abs=1)
    assert max(b - a for a, b in itertools.pairwise(attempts)) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("name", "idx", "env", "argv0", "expected"),
    [
        (None, None, {"NRI_PLUGIN_NAME": "cdi", "NRI_PLUGIN_IDX": "05"}, "x", ("cdi", "05")),
        (None, None, {"NRI_PLUGIN_NAME": "05-cdi", "NRI_PLUGIN_IDX": "05"}, "x", ("cdi", "05")),
        (None, None, {}, "/opt/nri/plugins/20-nri-cdi", ("nri-cdi", "20")),
        ("mine", "99", {"NRI_PLUGIN_NAME": "cdi", "NRI_PLUGIN_IDX": "05"}, "x", ("mine", "99")),
        ("30-given", None, {}, "x", ("given", "30")),
    ],
    ids=["env", "v0.3-quirk", "argv0", "arguments-win", "name-with-index"],
)
def test_plugin_identity(
    name: str | None, idx: str | None, env: dict[str, str], argv0: str, expected: tuple[str, str]
) -> None:
    assert plugin_identity(name, idx, env, argv0) == expected


@pytest.mark.parametrize(("name", "idx"), [("", "10"), ("cdi", "1"), ("cdi", "abc")])
def test_plugin_identity_rejects_bad_values(name: str, idx: str) -> None:
    with pytest.raises(ValueError):
        plugin_identity(name, idx, {}, "")


def test_the_reply_is_written_before_the_sessions_own_bookkeeping() -> None:
    """The runtime waits on the reply: it leaves before the session's latency check (and
    anything else after the handler), not at the end of the read that brought it."""
    async def serve() -> tuple[list[int], list[bytes]]:
        session = _Session(Injector(), logging.getLogger("test"))
        sink = RecordingTransport()
        session.transport = sink  # type: ignore[assignment]
        at_check: list[int] = []
        session._check_latency = (  # type: ignore[method-assign]
            lambda event, elapsed: at_check.append(len(sink.written)))
        frames = b"".join(plugin_call_frame(stream, "CreateContainer",
                                            create_request(f"c{stream}").SerializeToString())
                          for stream in (1, 3))
        session.data_received(frames)  # two requests in one read
        return at_check, sink.written

    at_check, written = run(serve())
    assert at_check == [1, 2]  # each reply written before its request's check
    assert len(written) == 2
