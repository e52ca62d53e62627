"""``NonBlockingHandler``: the daemon's log output, never waited on by the thread that logs.

The plugin logs from the event loop while the runtime waits for its reply, and stderr (a
pipe to the runtime, journald's socket) blocks whenever its reader is slow. So a record is
only put on a bounded queue (the standard library's ``QueueHandler``), and a writer thread
(``QueueListener``) formats and writes it. When the queue is full a record is dropped and
counted; the count is logged once the output takes lines again.
"""

from __future__ import annotations

import copy
import logging
import os
import queue
import select
import threading
from logging.handlers import QueueHandler, QueueListener

# Records that may wait for a reader that takes nothing; beyond, they are dropped (and
# counted). Some 5,000 per-container lines.
MAX_QUEUED = 5000
# How long ``close`` waits for the queue to be written (the daemon is exiting).
CLOSE_WAIT = 2.0


class NonBlockingHandler(QueueHandler):
    """Queues records for a writer thread that writes them to ``fd`` (stderr by default)."""

    def __init__(self, fd: int = 2, max_queued: int = MAX_QUEUED) -> None:
        self.records: queue.Queue[logging.LogRecord | None] = queue.Queue(max_queued)
        super().__init__(self.records)
        self.max_queued = max_queued
        self.dropped = 0  # records dropped since the last report of them
        self._dropped_lock = threading.Lock()
        self._closed = False
        self.output = FdHandler(fd)
        self._listener = _Listener(self)
        self._listener.start()

    def setFormatter(self, fmt: logging.Formatter | None) -> None:
        # The writer thread formats: formatting a traceback reads source files.
        self.output.setFormatter(fmt)

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # The message is merged now, as its arguments may change once the call returns.
        record = copy.copy(record)
        record.msg, record.args = record.getMessage(), None
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.records.put_nowait(record)
        except queue.Full:
            with self._dropped_lock:
                self.dropped += 1

    def take_dropped(self) -> int:
        """How many records were dropped since the last call."""
        with self._dropped_lock:
            dropped, self.dropped = self.dropped, 0
        return dropped

    def close(self) -> None:
        """Writes what is queued, waiting for the output a bounded time (``CLOSE_WAIT``)."""
        with self._dropped_lock:
            if self._closed:
                return
            self._closed = True
        # In a thread of its own: an output that takes nothing cannot hold the exit up.
        stopping = threading.Thread(target=self._stop, daemon=True)
        stopping.start()
        stopping.join(CLOSE_WAIT)
        super().close()

    def _stop(self) -> None:
        self._listener.stop()
        os.close(self.output.fd)


class _Listener(QueueListener):
    """The writer thread; once it has written all that waited, it reports what was dropped."""

    def __init__(self, handler: NonBlockingHandler) -> None:
        super().__init__(handler.queue, handler.output)
        self.handler = handler

    def handle(self, record: logging.LogRecord) -> None:
        super().handle(record)
        dropped = self.handler.take_dropped() if self.handler.records.empty() else 0
        if dropped:
            super().handle(logging.makeLogRecord({
                "name": "nri_cdi.log", "levelno": logging.WARNING, "levelname": "WARNING",
                "msg": f"{dropped} log line(s) dropped: the log output took nothing while "
                       f"{self.handler.max_queued} lines waited for it"}))

    def enqueue_sentinel(self) -> None:
        # None, QueueListener's sentinel, once there is room (the base class's does not
        # wait): ``close`` bounds that wait.
        self.handler.records.put(None)


class FdHandler(logging.Handler):
    """Writes formatted lines to a copy of ``fd``, waiting for the reader. The copy is its
    own: whoever closes ``fd`` meanwhile (its number taken by another file) cannot redirect
    it."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = os.dup(fd)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = (self.format(record) + "\n").encode("utf-8", "backslashreplace")
        except Exception:  # as logging's own handlers: say so, go on
            self.handleError(record)
            return
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view):]
            except BlockingIOError:  # a descriptor its other users set non-blocking
                select.select([], [self.fd], [], 1.0)
            except OSError:
                return  # the output is gone (EPIPE, ...): nowhere to say so
