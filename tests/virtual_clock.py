"""An asyncio event loop on a virtual clock, for tests of code whose clock is its event loop
(the stub's poll interval, back-off and registration timeout).

The clock stands still while anything can run: callbacks that are ready, and I/O that the
kernel has already made ready (a Unix socket's peer on the same loop writes, connects and
closes at once). Only when nothing can run does it move, straight to the next timer. So a
test asserts how long the code under test waited as the code sees it, exactly, whatever the
load on the machine, and a sleep of seconds costs none.

Only for tests whose every party runs on this loop: a thread or a process outside it would
see the loop's time rush past while it works. ``looptime`` (PyPI) does the same but needs
pytest-asyncio (its pytest plugin fails every fixture without it) and Python 3.11.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")

# A bound on the whole test in virtual seconds: only a test that waits on nothing at all
# (a hang) gets there, and it gets there at once.
VIRTUAL_HANG = 3600.0


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0


class _VirtualTimeSelector(selectors.DefaultSelector):
    """Polls without waiting; where the loop would wait for its next timer, moves the
    clock there instead."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if ready or (timeout is not None and timeout <= 0):
            return ready
        if timeout is None:  # no timer at all: only I/O from outside can wake the loop
            return list(super().select(None))
        self.clock.now += timeout
        return ready


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._clock = _Clock()
        super().__init__(_VirtualTimeSelector(self._clock))

    def time(self) -> float:
        return self._clock.now


def run_virtual(coro: Coroutine[Any, Any, _T], timeout: float = VIRTUAL_HANG) -> _T:
    """Run ``coro`` to completion on a fresh ``VirtualClockLoop``."""
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(asyncio.wait_for(coro, timeout))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
