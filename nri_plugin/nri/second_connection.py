"""A plugin's second NRI connection, open only while needed: the main connection runs as
always, and a second one (its own plugin, the same index, the name with a suffix) is
opened ahead of the main one at every (re)connection, then closed a linger after its
owner says it is no longer needed. The shipped plugin's start guard rides on one
(docs/developer/fail-closed.md); this module knows nothing of what the second connection
is for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.stub import Callback, CloseCallback, Stub

# Builds a Stub for one of the plugin's connections: (plugin, name, on_close, before_connect).
StubFactory = Callable[[Plugin, str | None, CloseCallback | None, Callback | None], Stub]


class Cancellable(Protocol):
    def cancel(self) -> None: ...


# Runs a callback so many seconds from now, as the event loop's ``call_later`` (a test gives
# a clock of its own, so the linger and the owner's timed work need no real waiting).
CallLater = Callable[[float, Callable[[], None]], Cancellable]


class Need(Protocol):
    """The second connection's owner: whether it must be open now (``needed``; it calls
    the ``on_need_changed`` listener, inside a handler, whenever that may have changed),
    what runs on its clock (``due``, ``next_due`` seconds from now; None: nothing timed),
    what is told when the main connection ends; and the connection: its plugin (built with
    the call that says its Synchronize was answered), its name (the main one's and
    ``suffix``), how the log names it (``label``, on ``logger``), how long the main one
    waits for it at a (re)connection and how long it stays once not needed; ``call_later``
    times the linger and the owner's work (None: the running event loop's)."""

    suffix: str
    label: str
    logger: logging.Logger
    ready_timeout: float
    linger: float
    call_later: CallLater | None

    @property
    def needed(self) -> bool: ...
    def on_need_changed(self, listener: Callable[[], None]) -> None: ...
    def next_due(self) -> float | None: ...
    def due(self) -> None: ...
    def main_connection_lost(self) -> None: ...
    def second_plugin(self, synchronized: Callable[[], None]) -> Plugin: ...


class SecondConnection:
    """Runs ``main``'s connection, and ``need``'s around it: on every (re)connection the
    second goes first (bounded by ``need.ready_timeout``), and it is closed ``need.linger``
    after ``need.needed`` turns false."""

    def __init__(self, need: Need, main: Plugin, make_stub: StubFactory,
                 name: str | None, on_close: CloseCallback | None = None) -> None:
        self.need = need
        self._make_stub = make_stub
        self._on_close = on_close
        self._closing: Cancellable | None = None  # the close after the linger
        self._timer: Cancellable | None = None  # the owner's next due work
        self._ready = asyncio.Event()
        self._second_stub: Stub | None = None
        self._second_task: asyncio.Task[None] | None = None
        self._stopping = False
        # Opened only from the main connection's before-connect on: after its connection is
        # lost, the Stub waits for the runtime's new socket first, and a second connection
        # opened at once would register with the dying runtime and hold the main one back.
        self._may_open = False
        self.need.on_need_changed(self._need_changed)
        self.main = make_stub(main, name, self._main_closed, self._second_first)
        self._second_name = self.main.name + need.suffix  # same index, so next to it

    @property
    def second_open(self) -> bool:
        """Whether the second connection is running (connecting or connected)."""
        return self._second_task is not None

    async def run(self) -> None:
        """Serve until ``stop()``: the main connection, the second while needed."""
        try:
            await self.main.run()
        finally:
            self._stopping = True
            self._cancel_close()
            if self._timer is not None:
                self._timer.cancel()
            if self._second_stub is not None:
                self._second_stub.stop()
            if self._second_task is not None:
                await asyncio.gather(self._second_task, return_exceptions=True)

    def stop(self) -> None:
        self._stopping = True
        self.main.stop()
        if self._second_stub is not None:
            self._second_stub.stop()

    async def _second_first(self, _main: Stub) -> None:
        """Before the main connection connects: the second in place (bounded)."""
        self._may_open = True
        self._update()
        if self._second_task is None or self._ready.is_set():
            return
        try:
            await asyncio.wait_for(self._ready.wait(), self.need.ready_timeout)
        except asyncio.TimeoutError:
            self.need.logger.warning("the %s's connection is not in place after %.0f s; "
                                     "connecting the main one all the same", self.need.label,
                                     self.need.ready_timeout)

    def _main_closed(self, stub: Stub, error: BaseException | None) -> Awaitable[None] | None:
        self._may_open = False
        self.need.main_connection_lost()
        return self._on_close(stub, error) if self._on_close is not None else None

    def _need_changed(self) -> None:
        # Called from inside a handler: open or close only after its reply has left.
        if not self._stopping:
            asyncio.get_running_loop().call_soon(self._update)

    def _update(self) -> None:
        if self._stopping:
            return
        later = self.need.call_later or asyncio.get_running_loop().call_later
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.need.needed:
            self._cancel_close()
            if self._second_task is None and self._may_open:
                self._open_second()
            wait = self.need.next_due()
            if wait is not None:  # the owner's timed work may change ``needed``
                self._timer = later(wait, self._run_due)
        elif self._second_task is not None and self._closing is None:
            self._closing = later(self.need.linger, self._close_if_idle)

    def _run_due(self) -> None:
        self._timer = None
        if not self._stopping:
            self.need.due()
            self._update()

    def _cancel_close(self) -> None:
        if self._closing is not None:
            self._closing.cancel()
            self._closing = None

    def _close_if_idle(self) -> None:
        self._closing = None
        if self._stopping or self.need.needed or self._second_task is None:
            return
        self.need.logger.info("nothing in doubt: closing the %s's connection", self.need.label)
        if self._second_stub is not None:
            self._second_stub.stop()

    def _open_second(self) -> None:
        self._ready.clear()
        stub = self._make_stub(self.need.second_plugin(self._second_synchronized),
                               self._second_name,
                               lambda _stub, _error: self._ready.clear(), None)
        self._second_stub = stub
        task = asyncio.get_running_loop().create_task(stub.run())
        self._second_task = task
        task.add_done_callback(self._second_ended)
        self.need.logger.info("%s connection opening", self.need.label)

    def _second_synchronized(self) -> None:
        # The runtime adds the plugin to those it asks right after our reply.
        loop = asyncio.get_running_loop()
        loop.call_soon(self._ready.set)
        loop.call_soon(self._update)

    def _second_ended(self, task: asyncio.Task[None]) -> None:
        if task is self._second_task:
            self._second_task = None
            self._second_stub = None
            self._ready.clear()
        if not task.cancelled() and task.exception() is not None:
            self.need.logger.error("the %s's connection failed: %s", self.need.label,
                                   task.exception())
        if not self._stopping:  # needed again while it was closing: open a new one
            asyncio.get_running_loop().call_soon(self._update)
