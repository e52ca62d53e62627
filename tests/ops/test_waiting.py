"""The test bed's bounded waits: what they return, what they retry, and what a timeout says;
and the CRI client's readiness wait against a real gRPC server on a Unix socket."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_cdi_testbed.waiting import WaitTimeout, wait_until, wait_until_async
from tests.e2e.conftest import require_prerequisites


def test_the_first_true_value_is_returned() -> None:
    answers = iter([None, "", "ready"])
    assert wait_until(lambda: next(answers), "an answer", interval=0) == "ready"


def test_errors_named_for_retry_count_as_not_yet() -> None:
    calls = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("refused")
        return len(calls)

    assert wait_until(flaky, "a connection", interval=0, retry_on=(ConnectionError,)) == 3
    with pytest.raises(ValueError):  # any other error is the caller's
        wait_until(lambda: int("x"), "a number", retry_on=(ConnectionError,))


def test_a_timeout_names_what_was_awaited_and_the_last_thing_seen() -> None:
    with pytest.raises(WaitTimeout) as raised:
        wait_until(lambda: 0, "the count to grow", timeout=0, seen=lambda: "count 0 of 3")
    assert str(raised.value) == "waited 0 s for the count to grow; last seen: count 0 of 3"
    def refused() -> None:
        raise ConnectionError("refused")

    with pytest.raises(WaitTimeout, match=r"a connection; last seen: .*refused") as raised:
        wait_until(refused, "a connection", timeout=0, retry_on=(ConnectionError,))
    assert isinstance(raised.value.__cause__, ConnectionError)
    long = "x" * 10_000 + "the end"
    with pytest.raises(WaitTimeout) as raised:
        wait_until(lambda: False, "a log line", timeout=0, seen=lambda: long)
    assert str(raised.value).endswith("xthe end") and len(str(raised.value)) < 3200


def test_the_async_wait_lets_the_loop_run() -> None:
    async def main() -> str:
        event = asyncio.Event()
        asyncio.get_running_loop().call_soon(event.set)
        await wait_until_async(event.is_set, "the event")
        with pytest.raises(WaitTimeout, match="never; last seen: False"):
            await wait_until_async(lambda: False, "never", timeout=0)
        return "done"

    assert asyncio.run(main()) == "done"


@pytest.fixture
def silent_grpc_server(tmp_path: Path) -> Iterator[str]:
    """A gRPC server with no service at all on a Unix socket: a channel to it gets ready,
    every call is UNIMPLEMENTED."""
    grpc = pytest.importorskip("grpc")
    from concurrent.futures import ThreadPoolExecutor

    address = str(tmp_path / "grpc.sock")
    server = grpc.server(ThreadPoolExecutor(max_workers=1))
    server.add_insecure_port(f"unix://{address}")
    server.start()
    try:
        yield address
    finally:
        server.stop(None)


def test_cri_readiness_says_what_cri_answered(silent_grpc_server: str) -> None:
    require_prerequisites()  # the CRI client: grpcio and the CRI messages
    from nri_cdi_testbed.node_check.cri import CriClient

    # Connected, but no CRI behind the socket: Version is retried, and the timeout says
    # what it last answered.
    with CriClient(silent_grpc_server) as client, pytest.raises(WaitTimeout) as raised:
        client.wait_ready(timeout=2)
    message = str(raised.value)
    assert message.startswith(
        f"waited 2 s for CRI at {silent_grpc_server} to answer Version; last seen: ")
    assert "UNIMPLEMENTED" in message


def test_cri_readiness_names_a_socket_that_never_comes(tmp_path: Path) -> None:
    require_prerequisites()  # the CRI client: grpcio and the CRI messages
    from nri_cdi_testbed.node_check.cri import CriClient

    absent = str(tmp_path / "absent.sock")
    with CriClient(absent) as client, pytest.raises(WaitTimeout) as raised:
        client.wait_ready(timeout=0.5)
    assert str(raised.value) == (f"waited 0.5 s for a connection to CRI at {absent}; "
                                 "last seen: the channel not ready")
