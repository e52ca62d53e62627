"""The reconnect loop against the test runtime peer on a real socket: back as soon as the
socket is (polling while it is absent or refuses), and a refusing runtime is not hammered.

On the virtual clock (tests/virtual_clock.py): the stub's clock is its event loop's, so the
waits below are the ones the stub itself measured out, exact on any machine."""

from __future__ import annotations

import asyncio
import itertools
import socket
from pathlib import Path

import pytest

from nri_plugin.nri.stub import POLL_INTERVAL, RETRY_INITIAL, RETRY_MAX, Stub, StubOptions
from tests.nri_plugin.test_stub import ENV, Injector
from tests.nri_runtime_peer import RuntimePeer
from tests.virtual_clock import run_virtual

POLL = POLL_INTERVAL  # the default: docs/operations/limits.md, "Limits" (reconnecting)


def test_connects_as_soon_as_the_socket_appears(tmp_path: Path) -> None:
    path = str(tmp_path / "nri.sock")
    waits: list[float] = []
    attempts = 0

    def count_attempt(stub: Stub) -> None:
        nonlocal attempts
        attempts += 1

    async def main() -> None:
        loop = asyncio.get_running_loop()
        sessions: asyncio.Queue[tuple[float, RuntimePeer]] = asyncio.Queue()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await sessions.put((loop.time(), RuntimePeer(reader, writer)))

        stub = Stub(Injector(), StubOptions(socket_path=path, env=ENV,
                                            before_connect=count_attempt))
        runner = asyncio.create_task(stub.run())
        for _ in range(3):
            before = attempts
            await asyncio.sleep(1.0)  # the socket is absent meanwhile
            # A stale socket file first (ECONNREFUSED), as a killed runtime leaves behind.
            stale = socket.socket(socket.AF_UNIX)
            stale.bind(path)
            await asyncio.sleep(0.5)
            stale.close()
            Path(path).unlink()
            # Polled all along, every poll interval: neither given up nor backed off.
            assert attempts - before >= 1.5 / POLL - 1, (attempts, before)
            server = await asyncio.start_unix_server(accept, path=path)
            listening = loop.time()
            accepted, peer = await sessions.get()
            waits.append(accepted - listening)
            await peer.handshake()
            peer.close()
            server.close()
            await server.wait_closed()
            Path(path).unlink(missing_ok=True)
        stub.stop()
        await runner

    run_virtual(main())
    # Within one poll interval of the runtime listening, every time (the old back-off
    # waited at least 0.5 s).
    assert max(waits) <= POLL + 1e-9, waits


def test_refused_registration_backs_off(tmp_path: Path) -> None:
    path = str(tmp_path / "nri.sock")
    attempts: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ten = asyncio.Event()

        async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            attempts.append(loop.time())
            if len(attempts) == 10:
                ten.set()
            peer = RuntimePeer(reader, writer)
            stream, _ = await peer.expect_register()
            peer.reply(stream, code=3, text="invalid plugin index")
            await asyncio.sleep(0.01)
            peer.close()

        server = await asyncio.start_unix_server(refuse, path=path)
        stub = Stub(Injector(), StubOptions(socket_path=path, env=ENV))
        runner = asyncio.create_task(stub.run())
        await ten.wait()
        stub.stop()
        await runner
        server.close()

    run_virtual(main())
    gaps = [b - a for a, b in itertools.pairwise(attempts[:10])]
    # From RETRY_INITIAL, doubling, up to RETRY_MAX, and staying there: a refusing
    # runtime sees a handful of attempts a second, not hundreds.
    assert gaps == pytest.approx([min(RETRY_INITIAL * 2 ** i, RETRY_MAX) for i in range(9)])
    assert gaps[-3:] == pytest.approx([RETRY_MAX] * 3), gaps
