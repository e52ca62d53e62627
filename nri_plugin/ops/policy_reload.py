"""Reload the plugin's policy when its file changes (inotify) or on SIGHUP
(docs/usage/policy.md).

The folder is watched, not the file: editors and ConfigMap volumes replace files by
rename. Every event only schedules a check; the file's bytes decide whether anything
changed, and a short settle time lets a writer finish.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import signal
from collections.abc import Callable
from typing import Any

from inotify_simple import INotify, flags

from nri_plugin.ops.settings import SettingsError
from nri_plugin.plugins.cdi_injector.policy import PolicyError

log = logging.getLogger("nri_cdi.policy")
SETTLE_SECONDS = 0.2


class PolicyReloader:
    """``load()`` returns a new Policy or raises PolicyError/SettingsError; ``apply`` swaps
    it in. ``path`` is the file to watch (None: SIGHUP only)."""

    def __init__(self, path: str | None, load: Callable[[], Any],
                 apply: Callable[[Any], None]) -> None:
        self.path = path
        self._load = load
        self._apply = apply
        self._digest = _digest(path)
        self._inotify: Any = None
        self._timer: asyncio.TimerHandle | None = None
        self._running: asyncio.Task[bool] | None = None
        self._again = False
        self.reloads = 0  # policies swapped in
        self.rejected = 0  # new policies refused

    def start(self, loop: asyncio.AbstractEventLoop) -> PolicyReloader:
        loop.add_signal_handler(signal.SIGHUP, self.schedule, loop, True)
        if self.path is not None:
            self._watch(loop)
        return self

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        folder = os.path.dirname(os.path.abspath(self.path or ""))
        mask = (flags.CLOSE_WRITE | flags.MOVED_TO | flags.CREATE | flags.DELETE
                | flags.MOVED_FROM | flags.ATTRIB)
        inotify = INotify()
        try:
            inotify.add_watch(folder, mask)
        except OSError as exc:
            inotify.close()
            log.warning("cannot watch %s for policy changes (%s); reload with SIGHUP", folder,
                        exc.strerror)
            return
        self._inotify = inotify
        loop.add_reader(inotify.fileno(), self._on_events, loop)

    def _on_events(self, loop: asyncio.AbstractEventLoop) -> None:
        self._inotify.read(timeout=0)  # drained; what changed is decided by the bytes
        self.schedule(loop, False)

    def schedule(self, loop: asyncio.AbstractEventLoop, forced: bool) -> None:
        """Check after the settle time; ``forced`` (SIGHUP) reloads even if unchanged."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_later(0 if forced else SETTLE_SECONDS, self._start, loop,
                                      forced)

    def _start(self, loop: asyncio.AbstractEventLoop, forced: bool) -> None:
        self._timer = None
        if self._running is not None and not self._running.done():
            self._again = True  # one more check when this one ends
            return
        self._running = loop.create_task(self.reload(forced))

    async def reload(self, forced: bool = True) -> bool:
        """Read, validate, swap; True when a new policy is in force."""
        loop = asyncio.get_running_loop()
        try:
            digest = await loop.run_in_executor(None, _digest, self.path)
            if not forced and digest == self._digest:
                return False
            policy, problems = await loop.run_in_executor(None, self._try_load)
            if policy is None:
                self.rejected += 1
                log.error("policy %s: new version refused, the previous policy stays in force",
                          self.path or "(config)")
                for problem in problems:
                    log.error("policy %s: %s", self.path or "(config)", problem)
                self._digest = digest  # said once; the next change is checked again
                return False
            self._digest = digest
            self._apply(policy)
            self.reloads += 1
            log.info("policy reloaded from %s", getattr(policy, "origin", self.path))
            return True
        finally:
            if self._again:
                self._again = False
                self.schedule(loop, False)

    def _try_load(self) -> tuple[Any, list[str]]:
        try:
            return self._load(), []
        except PolicyError as exc:
            return None, list(exc.problems)
        except SettingsError as exc:
            return None, exc.lines()

    def stop(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.remove_signal_handler(signal.SIGHUP)
        if self._timer is not None:
            self._timer.cancel()
        if self._inotify is not None:
            loop.remove_reader(self._inotify.fileno())
            self._inotify.close()
            self._inotify = None


def _digest(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read(16 << 20)).hexdigest()
    except OSError:
        return None
