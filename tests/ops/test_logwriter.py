"""The daemon's log handler: never blocking the thread that logs, every line in order,
bounded when nobody reads (the drop counted and reported), written out at close."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nri_plugin.ops.logformat import log_formatter
from nri_plugin.ops.logwriter import NonBlockingHandler

WAIT = 60.0  # the bound on every wait here; none is a timing assertion


@contextlib.contextmanager
def handler_on(fd: int, **kwargs: int) -> Iterator[tuple[NonBlockingHandler, logging.Logger]]:
    handler = NonBlockingHandler(fd, **kwargs)
    handler.setFormatter(log_formatter("text"))
    logger = logging.getLogger(f"test.logwriter.{fd}")
    logger.propagate = False
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    try:
        yield handler, logger
    finally:
        logger.handlers[:] = []
        assert in_thread(handler.close), "close blocked"


def fill(fd: int) -> None:
    """Writes to ``fd`` until it takes nothing more (through a non-blocking copy of our
    own: the descriptor under test keeps its flags)."""
    own = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK)
    try:
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(own, b"x" * 4096)
    finally:
        os.close(own)


def fill_socket(sock: socket.socket) -> None:
    with contextlib.suppress(BlockingIOError):
        while True:
            sock.send(b"x" * 4096, socket.MSG_DONTWAIT)


def in_thread(work: Callable[[], None]) -> bool:
    """Whether ``work`` finished within WAIT in a thread of its own (False: it blocked)."""
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(WAIT)
    return not thread.is_alive()


def read_until(receive: Callable[[], bytes], wanted: bytes) -> bytes:
    """What ``receive`` gives until it holds ``wanted`` (bounded)."""
    got = b""
    deadline = time.monotonic() + WAIT
    while wanted not in got:
        assert time.monotonic() < deadline, f"{wanted!r} never came; got {got[-300:]!r}"
        got += receive()
    return got


def log_lines(log: logging.Logger, count: int, form: str = "line %d") -> None:
    for i in range(count):
        log.info(form, i)


def lines_of(data: bytes) -> list[str]:
    return [line.split(": ", 1)[1] for line in data.decode().splitlines() if ": " in line]


def test_a_regular_file_gets_every_line_in_order(tmp_path: Path) -> None:
    path = tmp_path / "log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        with handler_on(fd) as (_, log):
            for i in range(50):
                log.info("line %d", i)
    finally:
        os.close(fd)
    assert lines_of(path.read_bytes()) == [f"line {i}" for i in range(50)]


def test_a_full_pipe_never_blocks_and_loses_nothing() -> None:
    read_end, write_end = os.pipe()
    flags = fcntl.fcntl(write_end, fcntl.F_GETFL)
    try:
        with handler_on(write_end) as (handler, log):
            fill(write_end)
            assert in_thread(lambda: log_lines(log, 200)), "logging blocked on a full pipe"
            # The runtime's end of stderr keeps its flags: O_NONBLOCK is on our own copy.
            assert fcntl.fcntl(write_end, fcntl.F_GETFL) == flags
            got = read_until(lambda: os.read(read_end, 1 << 16), b"line 199\n")
            assert handler.dropped == 0
    finally:
        os.close(read_end)
        os.close(write_end)
    assert lines_of(got.lstrip(b"x")) == [f"line {i}" for i in range(200)]


def test_a_full_socket_never_blocks_and_loses_nothing() -> None:
    ours, theirs = socket.socketpair()  # journald's stream socket, as systemd hands it
    with ours, theirs, handler_on(ours.fileno()) as (_, log):
        fill_socket(ours)
        assert in_thread(lambda: log_lines(log, 200)), "logging blocked on a full socket"
        assert ours.getblocking()  # the shared socket is left blocking
        got = read_until(lambda: theirs.recv(1 << 16), b"line 199\n")
    assert lines_of(got.lstrip(b"x")) == [f"line {i}" for i in range(200)]


def test_the_queue_is_bounded_and_the_drop_is_reported() -> None:
    read_end, write_end = os.pipe()
    try:
        with handler_on(write_end, max_queued=30) as (handler, log):
            fill(write_end)
            assert in_thread(lambda: log_lines(log, 400, "line %d " + "y" * 100))
            assert handler.records.qsize() <= 30
            dropped = handler.dropped
            assert dropped >= 400 - 32  # 30 queued, one or two taken by the writer thread
            got = read_until(lambda: os.read(read_end, 1 << 16), b"waited for it\n")
    finally:
        os.close(read_end)
        os.close(write_end)
    kept = [line for line in lines_of(got.lstrip(b"x")) if line.startswith("line ")]
    numbers = [int(line.split()[1]) for line in kept]
    # The first ones, in order (more may have found room as the thread took one).
    assert numbers[:30] == list(range(30)) and numbers == sorted(set(numbers))
    assert kept == [f"line {i} {'y' * 100}" for i in numbers]
    assert len(kept) + dropped == 400
    assert f"{dropped} log line(s) dropped: the log output took nothing while 30 lines" in (
        got.decode())


def test_a_traceback_is_formatted_by_the_thread_and_keeps_its_place() -> None:
    read_end, write_end = os.pipe()
    formatting_threads: list[str] = []

    class Spy(logging.Formatter):
        def formatException(self, ei: object) -> str:
            formatting_threads.append(threading.current_thread().name)
            return super().formatException(ei)  # type: ignore[arg-type]

    async def log_three() -> None:
        log.info("before")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
        log.info("after")

    try:
        with handler_on(write_end) as (handler, log):
            handler.setFormatter(Spy("%(levelname)s x: %(message)s"))
            asyncio.run(log_three())
            got = read_until(lambda: os.read(read_end, 1 << 16), b"after\n")
    finally:
        os.close(read_end)
        os.close(write_end)
    text = got.decode()
    assert len(formatting_threads) == 1
    assert formatting_threads != [threading.current_thread().name]
    assert text.index("before") < text.index("ValueError: boom") < text.index("after")


def test_close_is_bounded_when_nobody_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("nri_plugin.ops.logwriter.CLOSE_WAIT", 0.2)
    read_end, write_end = os.pipe()
    handler = NonBlockingHandler(write_end)
    handler.setFormatter(log_formatter("text"))
    try:
        fill(write_end)
        record = logging.makeLogRecord({"msg": "stuck", "levelno": logging.INFO,
                                        "levelname": "INFO"})
        handler.handle(record)
        assert in_thread(handler.close), "close waited on a reader that reads nothing"
    finally:
        os.close(read_end)  # the thread's blocked write now fails: it ends
        os.close(write_end)


def test_a_closed_reader_is_no_error() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        with handler_on(write_end) as (handler, log):
            errors: list[BaseException] = []
            with _collect_handle_errors(errors):
                assert in_thread(lambda: log_lines(log, 10))
                assert in_thread(handler.records.join), "the writer thread did not go on"
            assert errors == []
    finally:
        os.close(write_end)


@contextlib.contextmanager
def _collect_handle_errors(errors: list[BaseException]) -> Iterator[None]:
    saved = logging.Handler.handleError

    def collect(self: logging.Handler, record: logging.LogRecord) -> None:
        errors.append(RuntimeError(record.getMessage()))

    logging.Handler.handleError = collect  # type: ignore[method-assign]
    try:
        yield
    finally:
        logging.Handler.handleError = saved  # type: ignore[method-assign]
