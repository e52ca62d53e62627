"""The daemon's NRI connections: the injector's, always; the start guard's, only while
a container may be in doubt (``StartGuard.needed``).

On every (re)connection the guard's connection goes first: the injector's waits until the
guard has synchronized (bounded), so from the moment we are back no container created
while we were away starts unchecked. Once the injector's connection has synchronized and
no container created without us is still waiting to start, the guard's connection is
closed (after ``GUARD_LINGER``: see there), and the runtime asks the plugin nothing at a
container's start. NRI takes a plugin connection that closes while it asks it something as
gone, not as a failed request (``isFatalError`` in ``pkg/adaptation/plugin.go``, every
version): closing it never fails a container.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.stub import Callback, CloseCallback, Stub
from nri_plugin.plugins.cdi_injector.guard import GuardConnection, StartGuard

log = logging.getLogger("nri_cdi.guard")

# How long the injector's connection waits for the guard's to be in place. Longer than the
# runtime's registration timeout (5 s) would only delay us; past it the injector connects
# all the same, and its own Synchronize still finds what was created meanwhile.
GUARD_READY_TIMEOUT = 5.0
# How long the guard's connection stays once nothing is in doubt. A creation that began
# before the injector registered may be past NRI but not yet in the runtime's store when
# the injector synchronizes, so no Synchronize lists it; it shows itself by its
# PostCreateContainer, which the guard's connection subscribes to, as soon as the runtime
# has stored it (milliseconds: seen at once in tests/e2e/test_faults_e2e.py's straddling
# creation). A creation still in the runtime's hands this long after is not caught at its
# start; Synchronize at the next reconnection still finds it.
GUARD_LINGER = 10.0
GUARD_SUFFIX = "-guard"

# Builds a Stub for one of our plugins: (plugin, name, on_close, before_connect).
StubFactory = Callable[[Plugin, str | None, CloseCallback | None, Callback | None], Stub]


class GuardedConnections:
    """Runs the injector's connection and opens and closes the guard's around it."""

    def __init__(self, guard: StartGuard, make_stub: StubFactory, name: str | None, *,
                 on_close: CloseCallback | None = None,
                 ready_timeout: float = GUARD_READY_TIMEOUT,
                 linger: float = GUARD_LINGER) -> None:
        self.guard = guard
        self._make_stub = make_stub
        self._on_close = on_close
        self._ready_timeout = ready_timeout
        self._linger = linger
        self._closing: asyncio.TimerHandle | None = None  # the close after the linger
        self._ready = asyncio.Event()
        self._guard_stub: Stub | None = None
        self._guard_task: asyncio.Task[None] | None = None
        self._stopping = False
        # Opened only from the injector's before-connect on: after its connection is lost,
        # the Stub waits for the runtime's new socket first, and a guard opened at once
        # would register with the dying runtime and hold the injector back.
        self._may_open = False
        guard.on_need_changed = self._need_changed
        self.main = make_stub(guard, name, self._main_closed, self._guard_first)
        self._guard_name = self.main.name + GUARD_SUFFIX  # same index, so next to it

    @property
    def guard_open(self) -> bool:
        """Whether the guard's connection is running (connecting or connected)."""
        return self._guard_task is not None

    async def run(self) -> None:
        """Serve until ``stop()``: the injector's connection, the guard's while needed."""
        try:
            await self.main.run()
        finally:
            self._stopping = True
            await self._close_guard()

    def stop(self) -> None:
        self._stopping = True
        self.main.stop()
        if self._guard_stub is not None:
            self._guard_stub.stop()

    # --- the injector's connection ---

    async def _guard_first(self, _main: Stub) -> None:
        """Before the injector connects: the guard's connection in place (bounded)."""
        self._may_open = True
        self._update()
        if self._guard_task is None or self._ready.is_set():
            return
        try:
            await asyncio.wait_for(self._ready.wait(), self._ready_timeout)
        except asyncio.TimeoutError:
            log.warning("the start guard's connection is not in place after %.0f s; "
                        "connecting the injector all the same (its Synchronize still "
                        "finds what was created meanwhile)", self._ready_timeout)

    async def _main_closed(self, stub: Stub, error: BaseException | None) -> None:
        self._may_open = False
        self.guard.injector_connection_lost()
        if self._on_close is not None:
            result = self._on_close(stub, error)
            if asyncio.iscoroutine(result):
                await result

    # --- the guard's connection ---

    def _need_changed(self, needed: bool) -> None:
        # Called from inside a handler: open or close only after its reply has left.
        if not self._stopping:
            asyncio.get_running_loop().call_soon(self._update)

    def _update(self) -> None:
        if self._stopping:
            return
        if self.guard.needed:
            self._cancel_close()
            if self._guard_task is None and self._may_open:
                self._open_guard()
        elif self._guard_task is not None and self._closing is None:
            self._closing = asyncio.get_running_loop().call_later(self._linger,
                                                                  self._close_if_idle)

    def _cancel_close(self) -> None:
        if self._closing is not None:
            self._closing.cancel()
            self._closing = None

    def _close_if_idle(self) -> None:
        self._closing = None
        if self._stopping or self.guard.needed or self._guard_task is None:
            return
        log.info("nothing in doubt: closing the start guard's connection (the runtime "
                 "asks nothing at container start from now on)")
        self._stop_guard()

    def _open_guard(self) -> None:
        self._ready.clear()
        plugin = GuardConnection(self.guard, on_synchronized=self._guard_synchronized)
        stub = self._make_stub(plugin, self._guard_name, self._guard_closed, None)
        self._guard_stub = stub
        task = asyncio.get_running_loop().create_task(stub.run())
        self._guard_task = task
        task.add_done_callback(self._guard_ended)
        log.info("start guard connection opening (containers may be in doubt)")

    def _guard_synchronized(self) -> None:
        # The runtime adds the plugin to those it asks right after our reply.
        asyncio.get_running_loop().call_soon(self._ready.set)
        asyncio.get_running_loop().call_soon(self._update)

    def _guard_closed(self, _stub: Stub, _error: BaseException | None) -> None:
        self._ready.clear()

    def _guard_ended(self, task: asyncio.Task[None]) -> None:
        if task is self._guard_task:
            self._guard_task = None
            self._guard_stub = None
            self._ready.clear()
        if not task.cancelled() and task.exception() is not None:
            log.error("the start guard's connection failed: %s", task.exception())
        if not self._stopping:  # needed again while it was closing: open a new one
            asyncio.get_running_loop().call_soon(self._update)

    def _stop_guard(self) -> None:
        if self._guard_stub is not None:
            self._guard_stub.stop()

    async def _close_guard(self) -> None:
        self._cancel_close()
        self._stop_guard()
        task = self._guard_task
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
