"""The daemon's deferred per-container work (its log lines): run a moment later, in
batches, in order, each line stamped with its container's time, bounded, and none lost at
shutdown or to a failing neighbour."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nri_plugin.nri.api import nri_pb2
from nri_plugin.ops.deferred import LaterBatch
from nri_plugin.ops.logformat import Backdated, log_formatter
from nri_plugin.plugins.cdi_injector.injector import NAME_CHARS, CdiInjector, Injection
from nri_plugin.vendors.nvidia.rules import NvidiaRules
from tests.nri_plugin.test_nvidia_drop_in import nvidia_registry

WAIT = 10.0  # the bound on every wait here; none is a timing assertion


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.addFilter(Backdated())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[Kept]:
    handler = Kept()
    logger = logging.getLogger("test.deferred")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield handler
    logger.handlers[:] = []


def line(text: str) -> Callable[[], None]:
    return lambda: logging.getLogger("test.deferred").info("%s", text)


def test_lines_wait_for_the_batch_and_keep_their_containers_time(kept: Kept) -> None:
    async def main() -> None:
        clock = iter([1000.25, 1001.5])
        batch = LaterBatch(asyncio.get_running_loop(), delay=3600, clock=lambda: next(clock))
        batch(line("first"))
        batch(line("second"))
        for _ in range(3):
            await asyncio.sleep(0)  # turns of the loop: nothing is due yet
        assert kept.records == [] and len(batch) == 2
        batch.run()  # as at shutdown
        assert len(batch) == 0
    asyncio.run(main())
    assert [r.getMessage() for r in kept.records] == ["first", "second"]
    assert [r.created for r in kept.records] == [1000.25, 1001.5]
    assert kept.records[0].msecs == 250.0
    text = log_formatter("text").format(kept.records[1])
    assert ",500 INFO test.deferred: second" in text
    # Outside a batch, records keep the time they were made at.
    logging.getLogger("test.deferred").info("now")
    assert kept.records[-1].created > 1e9 and kept.records[-1].created != 1001.5


def test_the_batch_runs_by_itself_after_its_delay(kept: Kept) -> None:
    async def main() -> None:
        done = asyncio.Event()
        batch = LaterBatch(asyncio.get_running_loop(), delay=0.01)
        batch(line("a"))
        batch(line("b"))
        batch(done.set)
        await asyncio.wait_for(done.wait(), WAIT)
        assert len(batch) == 0
    asyncio.run(main())
    assert [r.getMessage() for r in kept.records] == ["a", "b"]


def test_a_full_batch_runs_at_the_next_turn(kept: Kept) -> None:
    async def main() -> None:
        batch = LaterBatch(asyncio.get_running_loop(), delay=3600, max_pending=3)
        for text in "abcd":
            batch(line(text))
        assert len(batch) == 4  # never inline: the handler that deferred it is running
        await asyncio.sleep(0)
        assert len(batch) == 0
    asyncio.run(main())
    assert [r.getMessage() for r in kept.records] == ["a", "b", "c", "d"]


def test_a_failing_call_costs_the_others_nothing(kept: Kept,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise ValueError("bad line")

    async def main() -> None:
        batch = LaterBatch(asyncio.get_running_loop(), delay=3600)
        batch(line("before"))
        batch(broken)
        batch(line("after"))
        batch.run()
    with caplog.at_level(logging.ERROR, logger="nri_cdi.daemon"):
        asyncio.run(main())
    assert [r.getMessage() for r in kept.records] == ["before", "after"]
    assert "deferred work failed" in caplog.text and "bad line" in caplog.text


def test_a_deferred_line_holds_bounded_names_not_the_request(tmp_path: Path,
                                                             kept: Kept) -> None:
    """What waits for the batch is the names, cut to NAME_CHARS, never the request's
    messages (up to 4 MiB each); the line still names the container."""
    registry = nvidia_registry(tmp_path / "cdi")
    injector = CdiInjector(lambda: registry, vendors=[NvidiaRules()])
    injector.configure("", "containerd", "2.1.9")
    waiting: list[Callable[[], object]] = []
    injector.defer = waiting.append
    long_name = "n" * (1 << 20)
    pod = nri_pb2.PodSandbox(id="p", name="pod", namespace="default",
                             annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
    container = nri_pb2.Container(id="c", name=long_name)
    assert injector.create_container(pod, container) is not None
    (call,) = waiting
    assert isinstance(call, functools.partial)
    held = [a for a in call.args if not isinstance(a, Injection | int)]
    assert held == [("n" * NAME_CHARS, "default", "pod")]
    logger = logging.getLogger("nri_cdi.injector")
    logger.handlers[:], level = [kept], logger.level
    logger.setLevel(logging.INFO)
    try:
        call()
    finally:
        logger.handlers[:] = []
        logger.setLevel(level)
    assert kept.records[0].getMessage().startswith(
        f"injected container={'n' * NAME_CHARS} pod=default/pod devices=nvidia.com/gpu=0")
