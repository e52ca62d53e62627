"""Malformed and flooding NRI traffic from the test runtime peer against a real plugin
process: it answers, or drops the connection cleanly, and its RSS stays under the bound
docs/operations/limits.md states (RSS_BOUND_MIB). Its log stays small too."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from nri_cdi_testbed.waiting import wait_until_async
from nri_plugin.nri.api import nri_pb2
from tests.nri_plugin.floodpeer import KIND, FloodedPlugin, create
from tests.nri_runtime_peer import (
    PLUGIN_CONN,
    PLUGIN_SERVICE,
    REQUEST,
    RuntimePeer,
    mux_frame,
    request_bytes,
    ttrpc_frame,
)

RSS_BOUND_MIB = 128  # docs/operations/limits.md
MAX_MESSAGE = 2048


def run(test: Callable[[FloodedPlugin, RuntimePeer], Awaitable[None]], folder: Path) -> None:
    async def main() -> None:
        flooded = FloodedPlugin(folder)
        try:
            peer = await flooded.start()
            await test(flooded, peer)
            assert flooded.alive
            assert flooded.rss_kib < RSS_BOUND_MIB * 1024
            assert flooded.log_size() < 1 << 20, "the log must stay small"
        finally:
            flooded.close()

    asyncio.run(asyncio.wait_for(main(), 600))


async def log_says(flooded: FloodedPlugin, text: str) -> bool:
    """Whether the plugin's log comes to hold ``text`` (polled, with a generous bound: the
    plugin logs from its own process, so a line may land after the reply it follows)."""
    await wait_until_async(lambda: text in flooded.log(), f"{text!r} in the plugin's log",
                           seen=lambda: flooded.log()[-2000:])
    return True


async def works(peer: RuntimePeer) -> None:
    """The connection still serves: a device request gets its adjustment."""
    reply = await peer.call("CreateContainer", create("ok", asks=f"{KIND}=0"),
                            nri_pb2.CreateContainerResponse)
    assert len(reply.adjust.env) == 40  # type: ignore[attr-defined]


def test_error_replies_are_bounded(tmp_path: Path) -> None:
    async def test(flooded: FloodedPlugin, peer: RuntimePeer) -> None:
        unknown = ",".join(f"{KIND}=u{i}" for i in range(60000))  # 1.3 MB, 60,000 names
        bad_name = f"{KIND}={'!' * 2_200_000}"  # one invalid name, quoted in the error
        some = ",".join(f"{KIND}=u{i}" for i in range(1000))  # under the 1024-name cap
        messages = []
        for asks in (unknown, bad_name, some):
            reply = await peer.response_to(peer.send_request("CreateContainer",
                                                             create("c", asks=asks)))
            assert reply.status.code != 0
            assert len(reply.status.message) <= MAX_MESSAGE
            messages.append(reply.status.message)
        assert "over 1024" in messages[0]  # refused before parsing 60,000 names
        assert "invalid CDI device name" in messages[1]
        assert messages[2].endswith("... and 995 more")  # the list summarized
        await works(peer)
        print(f"\nRSS after the oversize refusals: {flooded.rss_kib // 1024} MiB")

    run(test, tmp_path)


def test_huge_service_method_and_container_names(tmp_path: Path) -> None:
    async def test(flooded: FloodedPlugin, peer: RuntimePeer) -> None:
        stream = peer.next_stream
        peer.next_stream += 2
        data = request_bytes("s" * (4_000_000), "CreateContainer")  # a 4 MB service name
        peer.write(mux_frame(PLUGIN_CONN, ttrpc_frame(stream, REQUEST, data)))
        reply = await peer.response_to(stream)
        assert reply.status.code == 12 and len(reply.status.message) < 300  # UNIMPLEMENTED
        stream = peer.next_stream
        peer.next_stream += 2
        data = request_bytes(PLUGIN_SERVICE, "M" * 4_000_000)
        peer.write(mux_frame(PLUGIN_CONN, ttrpc_frame(stream, REQUEST, data)))
        assert (await peer.response_to(stream)).status.code == 12
        huge = "n" * 3_000_000  # a 3 MB container name asking for the device
        reply = await peer.call("CreateContainer", create(huge, asks=f"{KIND}=0"),
                                nri_pb2.CreateContainerResponse)
        assert len(reply.adjust.env) == 40  # type: ignore[attr-defined]
        await works(peer)

    run(test, tmp_path)


def test_peer_that_never_reads(tmp_path: Path) -> None:
    async def test(flooded: FloodedPlugin, peer: RuntimePeer) -> None:
        before = flooded.rss_kib
        request = create("c", asks=f"{KIND}=0")
        for _ in range(40000):  # ~2 KB of reply each: 80 MB that nobody reads
            peer.send_request("CreateContainer", request)
        # It stops reading while its replies are unread, then gives up on the peer: its RSS
        # is sampled all the while, until it is back on a new connection.
        reconnected = asyncio.create_task(flooded.connection(timeout=120))
        during = flooded.rss_kib
        while not reconnected.done():
            during = max(during, flooded.rss_kib)
            await asyncio.wait([reconnected], timeout=0.05)
        again = reconnected.result()
        after = flooded.rss_kib
        print(f"\nnever-reading peer, 40,000 CreateContainer: RSS {before // 1024} MiB before, "
              f"{during // 1024} MiB at most while stalled, {after // 1024} MiB after the drop")
        assert await log_says(flooded, "has not read our replies")
        assert during < RSS_BOUND_MIB * 1024
        await works(again)

    run(test, tmp_path)


def test_endless_more_pages(tmp_path: Path) -> None:
    async def test(flooded: FloodedPlugin, peer: RuntimePeer) -> None:
        before = flooded.rss_kib
        containers = [nri_pb2.Container(id=f"c{i}", pod_sandbox_id="p", name=f"c{i}",
                                        env=[f"E{j}={'v' * 60}" for j in range(10)])
                      for i in range(1200)]
        page = nri_pb2.SynchronizeRequest(containers=containers, more=True)  # ~1 MB
        peak = 0
        for i in range(120):
            reply = await peer.call("Synchronize", page, nri_pb2.SynchronizeResponse)
            assert reply.more  # type: ignore[attr-defined]
            if i % 20 == 0:
                peak = max(peak, flooded.rss_kib)
        last = await peer.call("Synchronize", nri_pb2.SynchronizeRequest(more=False),
                               nri_pb2.SynchronizeResponse)
        assert not last.more  # type: ignore[attr-defined]
        after = flooded.rss_kib
        print(f"\n120 more=true pages of ~1 MB: RSS {before // 1024} MiB before, peak "
              f"{peak // 1024} MiB, {after // 1024} MiB after")
        assert peak < RSS_BOUND_MIB * 1024
        assert await log_says(flooded, "over the 16 MiB cap")
        await works(peer)

    run(test, tmp_path)


@pytest.mark.parametrize("garbage", [b"\x00\x00\x00\x07\x00\x00\x00\x04junk",
                                     b"\x00\x00\x00\x01\xff\xff\xff\xff"])
def test_malformed_trunk_drops_the_connection_cleanly(tmp_path: Path, garbage: bytes) -> None:
    async def test(flooded: FloodedPlugin, peer: RuntimePeer) -> None:
        mark = len(flooded.log())
        peer.write(garbage)
        assert await peer.at_eof(60)
        again = await flooded.connection()
        # Back at once, not after a back-off: the handshake had completed.
        assert "reconnecting in" not in flooded.log()[mark:]
        await works(again)

    run(test, tmp_path)
