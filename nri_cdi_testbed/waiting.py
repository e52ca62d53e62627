"""Bounded waits for a condition, for the test bed and the tests.

A daemon that is starting, a log line from another process, a container that is stopping:
each is polled until it holds, up to a deadline generous enough for a loaded machine, never
read once after a sleep. When the deadline passes, the error names what was awaited and the
last thing seen, so a failure says why without a rerun.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")

# Long enough for a loaded machine (other work on both cores), short enough that a hang
# still ends the run with a message.
DEFAULT_TIMEOUT = 60.0
INTERVAL = 0.02


class WaitTimeout(TimeoutError):
    """A condition did not hold in time; the message says which and what was seen last."""


def _message(what: str, timeout: float, last: object) -> str:
    text = last if isinstance(last, str) else repr(last)
    if len(text) > 3000:
        text = "..." + text[-3000:]
    return f"waited {timeout:g} s for {what}; last seen: {text}"


def _last(value: object, error: BaseException | None, seen: Callable[[], object] | None,
          ) -> object:
    if seen is not None:
        try:
            return seen()
        except Exception as exc:  # what was seen cannot be read: say so, keep the timeout
            return f"(could not read: {exc})"
    return error if error is not None else value


def wait_until(condition: Callable[[], _T], what: str, *, timeout: float = DEFAULT_TIMEOUT,
               interval: float = INTERVAL, seen: Callable[[], object] | None = None,
               retry_on: tuple[type[BaseException], ...] = ()) -> _T:
    """Call ``condition`` until it returns a true value, and return that value.

    ``what`` names the condition for the error; ``seen`` gives the last thing seen for it
    (default: the condition's last value, or the last error of a ``retry_on`` type, which
    count as "not yet"). Raises ``WaitTimeout`` after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        error: BaseException | None = None
        value: _T | None = None
        try:
            value = condition()
        except retry_on as exc:
            error = exc
        if error is None and value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(_message(what, timeout, _last(value, error, seen))) from error
        time.sleep(interval)


async def wait_until_async(condition: Callable[[], _T], what: str, *,
                           timeout: float = DEFAULT_TIMEOUT, interval: float = INTERVAL,
                           seen: Callable[[], object] | None = None) -> _T:
    """``wait_until`` for a coroutine: the event loop runs between the polls."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = condition()
        if value:
            return value
        if loop.time() > deadline:
            raise WaitTimeout(_message(what, timeout, _last(value, None, seen)))
        await asyncio.sleep(interval)
