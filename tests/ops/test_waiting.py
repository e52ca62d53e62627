"""The test bed's bounded waits: what they return, what they retry, and what a timeout says;
and the CRI client's readiness wait against a real gRPC server on a Unix socket."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def _sandbox_server(address: str, answers: list[bool]) -> Any:
    """A gRPC server whose RunPodSandbox records each request; a call whose turn in
    ``answers`` is False ends in DEADLINE_EXCEEDED at once, the status a caller whose
    deadline passed gets (so no test here waits for a deadline, nor depends on one)."""
    grpc = pytest.importorskip("grpc")
    from concurrent.futures import ThreadPoolExecutor

    from nri_cdi_testbed.node_check.cri import load_messages

    pb = load_messages()
    seen: list[Any] = []

    def run_pod_sandbox(request: Any, context: Any) -> Any:
        seen.append(request)
        if not answers[len(seen) - 1]:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer before the deadline")
        return pb.RunPodSandboxResponse(pod_sandbox_id=f"pod-{len(seen)}")

    service = pb.DESCRIPTOR.services_by_name["RuntimeService"].full_name
    handler = grpc.unary_unary_rpc_method_handler(
        run_pod_sandbox, request_deserializer=pb.RunPodSandboxRequest.FromString,
        response_serializer=pb.RunPodSandboxResponse.SerializeToString)
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(service, {"RunPodSandbox": handler})])
    server.add_insecure_port(f"unix://{address}")
    server.start()
    server.seen = seen
    return server


def test_a_sandbox_without_answer_is_asked_for_again_as_the_next_attempt(
        tmp_path: Path) -> None:
    require_prerequisites()  # the CRI client: grpcio and the CRI messages
    from nri_cdi_testbed.node_check.cri import CriClient

    address = str(tmp_path / "cri.sock")
    server = _sandbox_server(address, [False, True])
    try:
        with CriClient(address) as client, pytest.warns(RuntimeWarning) as warned:
            pod_id = client.run_pod("gpu-pod", namespace="team")
    finally:
        server.stop(None)
    assert pod_id == "pod-2"  # the second attempt's sandbox
    first, second = (request.config.metadata for request in server.seen)
    assert (first.name, first.uid, first.attempt) == ("gpu-pod", second.uid, 0)
    assert (second.name, second.attempt) == ("gpu-pod", 1)
    assert [str(w.message) for w in warned] == [
        f"CRI at {address}: RunPodSandbox for pod team/gpu-pod had no answer within 30 s; "
        "asking again as attempt 1, as the kubelet does"]


def test_a_second_sandbox_deadline_is_the_callers(tmp_path: Path) -> None:
    require_prerequisites()
    from nri_cdi_testbed.node_check.cri import CriClient

    address = str(tmp_path / "cri.sock")
    server = _sandbox_server(address, [False, False, True])
    try:
        with CriClient(address) as client, pytest.warns(RuntimeWarning), \
                pytest.raises(client.grpc.RpcError) as raised:
            client.run_pod("gpu-pod")
    finally:
        server.stop(None)
    assert raised.value.code() == client.grpc.StatusCode.DEADLINE_EXCEEDED
    assert [r.config.metadata.attempt for r in server.seen] == [0, 1]  # asked once more only
