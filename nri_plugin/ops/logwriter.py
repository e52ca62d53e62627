"""``NonBlockingHandler``: the daemon's log output, written at once and never waited on.

The plugin logs one line per container it serves, from the event loop, while the runtime
is still creating that container. A handler that writes to stderr as it is (a pipe to the
runtime or the container's shim, journald's socket) can block the loop whenever the reader
is slow, and a queue with a writer thread, which cannot, costs a thread hand-off per line:
waking the thread, passing the GIL back and forth: 0.74-0.94 of that CPU per line is
left written this way (bench/bench_plugin.py (h)), on the cores the runtime is creating
the container with (in containerd 2.1, 46 us less CPU per container).

So each line is written by the thread that logged it, with a write that cannot block: on a
socket a ``send`` with ``MSG_DONTWAIT`` (a per-call flag: the descriptor the service
manager or runtime handed us, shared with them, keeps its flags), on a pipe, FIFO or
terminal a descriptor of our own opened on the same file with ``O_NONBLOCK``
(``/proc/self/fd/N``), on a regular file a plain write (a file is never "full"). What does
not fit at once, and everything after it until that is written, goes to a writer thread
that waits for the reader. That backlog is bounded; lines beyond it are dropped and
counted, and the count is logged once the output takes lines again.

Lines logged on a thread running an asyncio loop are written in a callback of their own
(``call_soon``), after the one that logged them: the CreateContainer handler does no I/O,
its reply leaves first. Records with a traceback go to the writer thread whole: formatting
a traceback reads source files.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import select
import socket
import stat
import threading
from collections.abc import Callable

# Bytes the writer thread may hold for a reader that takes nothing; beyond, lines are
# dropped (and counted). 1 MiB is some 5,000 per-container lines.
MAX_BACKLOG = 1 << 20
# What a record waiting to be formatted counts as, in that bound.
RECORD_SIZE = 1024
# How long ``close`` waits for the backlog to be written (the daemon is exiting).
CLOSE_WAIT = 2.0

# Writes some leading part of the bytes without blocking; returns how many (0: none fit).
TryWrite = Callable[[bytes], int]
# Closes what a TryWrite opened.
Release = Callable[[], None]


class NonBlockingHandler(logging.Handler):
    """Writes formatted lines to ``fd`` (stderr by default) without ever blocking."""

    def __init__(self, fd: int = 2, max_backlog: int = MAX_BACKLOG) -> None:
        super().__init__()
        self.max_backlog = max_backlog
        self.dropped = 0  # lines dropped since the last report of them
        self._try_write, self._release = _non_blocking_writer(fd)
        # The writer thread's own descriptor, closed by it as it ends: whoever closes
        # ``fd`` meanwhile (a test), its number taken by another file, cannot redirect it.
        self._thread_fd = os.dup(fd)
        self._closed = False
        # Logged on the loop's thread, for its callback (a record: one with a traceback).
        self._pending: list[bytes | logging.LogRecord] = []
        self._flush_scheduled = False
        # The writer thread's part: what waits for the reader, in order.
        self._cond = threading.Condition(threading.Lock())
        self._backlog: collections.deque[bytes | logging.LogRecord] = collections.deque()
        self._backlog_bytes = 0
        self._busy = False  # the backlog is not empty or the thread is writing from it
        self._closing = False
        self._thread = threading.Thread(target=self._write_backlog, name="log-writer",
                                        daemon=True)
        self._thread.start()

    # -- logging's side ------------------------------------------------------------------

    def emit(self, record: logging.LogRecord) -> None:
        if self._closed:
            return
        item: bytes | logging.LogRecord = record
        if not record.exc_info or record.exc_text:
            try:
                item = (self.format(record) + "\n").encode("utf-8", "backslashreplace")
            except Exception:  # a bad record must not take the daemon down
                self.handleError(record)
                return
        loop = _running_loop()
        if loop is None:
            self._write(item)
            return
        self._pending.append(item)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush_pending)

    def flush(self) -> None:
        self._flush_pending()

    def close(self) -> None:
        """Writes what is pending, waits a bounded time for the backlog, stops the thread."""
        with self.lock:  # type: ignore[union-attr]  # logging's, made in __init__
            if self._closed:
                return
            self._flush_pending()
            self._closed = True
            self._release()
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(CLOSE_WAIT)
        super().close()

    # -- writing ---------------------------------------------------------------------------

    def _flush_pending(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # logging's, made in __init__
            self._flush_scheduled = False
            pending, self._pending = self._pending, []
            for item in pending:
                self._write(item)

    def _write(self, item: bytes | logging.LogRecord) -> None:
        # Called under the handler's lock. Only here does the backlog become non-empty; the
        # thread only empties it: a line finding it idle may go straight out, and none
        # overtakes one still in the backlog.
        if isinstance(item, logging.LogRecord):
            self._queue(item, RECORD_SIZE)
            return
        with self._cond:
            busy = self._busy
        if not busy:
            item = item[self._attempt(item):]
            if not item:
                return
        self._queue(item, len(item))

    def _attempt(self, data: bytes) -> int:
        try:
            return self._try_write(data)
        except BlockingIOError:
            return 0
        except OSError:
            return len(data)  # the output is gone (EPIPE, ...): nowhere to say so

    def _queue(self, item: bytes | logging.LogRecord, size: int) -> None:
        with self._cond:
            if self._backlog_bytes + size > self.max_backlog:
                self.dropped += 1
                return
            self._backlog.append(item)
            self._backlog_bytes += size
            self._busy = True
            self._cond.notify()

    def _write_backlog(self) -> None:
        """The writer thread: blocking writes of the backlog, in order."""
        while True:
            with self._cond:
                while not self._backlog and not self._closing:
                    self._busy = False
                    self._cond.wait()
                if not self._backlog:
                    self._busy = False
                    os.close(self._thread_fd)
                    return
                item = self._backlog.popleft()
                self._backlog_bytes -= len(item) if isinstance(item, bytes) else RECORD_SIZE
            data = item if isinstance(item, bytes) else self._formatted(item)
            self._write_all(data)
            with self._cond:
                if self._backlog or not self.dropped:
                    continue
                dropped, self.dropped = self.dropped, 0
            self._write_all(self._formatted(_dropped_record(dropped, self.max_backlog)))

    def _formatted(self, record: logging.LogRecord) -> bytes:
        try:
            text = self.format(record)
        except Exception:  # as logging's own handlers: say so, go on
            self.handleError(record)
            return b""
        return (text + "\n").encode("utf-8", "backslashreplace")

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._thread_fd, view):]
            except BlockingIOError:  # a descriptor someone else set non-blocking
                select.select([], [self._thread_fd], [], 1.0)
            except InterruptedError:
                continue
            except OSError:
                return


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _dropped_record(count: int, limit: int) -> logging.LogRecord:
    return logging.makeLogRecord({
        "name": "nri_cdi.log", "levelno": logging.WARNING, "levelname": "WARNING",
        "msg": f"{count} log line(s) dropped: the log output took nothing while "
               f"{limit // 1024} KiB waited for it"})


def _non_blocking_writer(fd: int) -> tuple[TryWrite, Release]:
    """How to write to ``fd`` without blocking, and how to close what that opened. Falls
    back to "nothing fits at once" (every line by the thread) where no way is found:
    slower, never blocking."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return _nothing_fits, _nothing
    if stat.S_ISREG(mode):
        return functools.partial(os.write, fd), _nothing
    if stat.S_ISSOCK(mode):
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            return _nothing_fits, _nothing
        return functools.partial(_send_now, sock), sock.close
    try:
        # A new open file description of the same pipe, FIFO or terminal: O_NONBLOCK on it
        # is ours alone.
        own = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return _nothing_fits, _nothing
    return functools.partial(os.write, own), functools.partial(os.close, own)


def _send_now(sock: socket.socket, data: bytes) -> int:
    return sock.send(data, socket.MSG_DONTWAIT)


def _nothing_fits(data: bytes) -> int:
    return 0


def _nothing() -> None:
    pass
