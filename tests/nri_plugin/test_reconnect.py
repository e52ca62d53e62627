"""The reconnect loop against the test runtime peer on a real socket: back as soon as the
socket is (polling while it is absent or refuses), and a refusing runtime is not hammered."""

from __future__ import annotations

import asyncio
import itertools
import socket
from pathlib import Path

from nri_plugin.nri.stub import Stub
from tests.nri_plugin.test_stub import ENV, Injector, run
from tests.nri_runtime_peer import RuntimePeer


def test_connects_as_soon_as_the_socket_appears(tmp_path: Path) -> None:
    path = str(tmp_path / "nri.sock")
    waits: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        sessions: asyncio.Queue[tuple[float, RuntimePeer]] = asyncio.Queue()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await sessions.put((loop.time(), RuntimePeer(reader, writer)))

        stub = Stub(Injector(), socket_path=path, env=ENV, poll_interval=0.02)
        runner = asyncio.create_task(stub.run())
        for _ in range(3):
            await asyncio.sleep(0.2)  # the socket is absent meanwhile
            # A stale socket file first (ECONNREFUSED), as a killed runtime leaves behind.
            stale = socket.socket(socket.AF_UNIX)
            stale.bind(path)
            await asyncio.sleep(0.1)
            stale.close()
            Path(path).unlink()
            server = await asyncio.start_unix_server(accept, path=path)
            listening = loop.time()
            accepted, peer = await asyncio.wait_for(sessions.get(), 5)
            waits.append(accepted - listening)
            await peer.handshake()
            peer.close()
            server.close()
            await server.wait_closed()
            Path(path).unlink(missing_ok=True)
        stub.stop()
        await asyncio.wait_for(runner, 2)

    run(main())
    # Within a poll interval or so; generous for a loaded machine, far below the old
    # back-off's 0.5 s floor.
    assert max(waits) < 0.5, waits


def test_refused_registration_backs_off(tmp_path: Path) -> None:
    path = str(tmp_path / "nri.sock")
    attempts: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            attempts.append(loop.time())
            peer = RuntimePeer(reader, writer)
            stream, _ = await peer.expect_register()
            peer.reply(stream, code=3, text="invalid plugin index")
            await asyncio.sleep(0.05)
            peer.close()

        server = await asyncio.start_unix_server(refuse, path=path)
        stub = Stub(Injector(), socket_path=path, env=ENV, retry_initial=0.05, retry_max=0.4)
        runner = asyncio.create_task(stub.run())
        await asyncio.sleep(2.0)
        stub.stop()
        await asyncio.wait_for(runner, 2)
        server.close()

    run(main())
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    # 0.05, 0.1, 0.2, 0.4, 0.4, ...: a handful of attempts in 2 s, not hundreds.
    assert 4 <= len(attempts) <= 12, attempts
    assert gaps[-1] > 3 * gaps[0], gaps
