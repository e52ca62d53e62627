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
    it in. ``path`` is the file to watch (None: SIGHUP only). One task does every check, so
    two never overlap."""

    def __init__(self, path: str | None, load: Callable[[], Any],
                 apply: Callable[[Any], None]) -> None:
        self.path = path
        self._load = load
        self._apply = apply
        self._digest = _digest(path)
        self._inotify: Any = None
        self._wake = asyncio.Event()
        self._forced = False
        self._task: asyncio.Task[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> PolicyReloader:
        loop.add_signal_handler(signal.SIGHUP, self._wake_up, True)
        if self.path is not None:
            self._watch(loop)
        self._task = loop.create_task(self._run())
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
        loop.add_reader(inotify.fileno(), self._on_events)

    def _on_events(self) -> None:
        self._inotify.read(timeout=0)  # drained; what changed is decided by the bytes
        self._wake_up(False)

    def _wake_up(self, forced: bool) -> None:
        """A check soon; ``forced`` (SIGHUP) reloads even if unchanged."""
        self._forced = self._forced or forced
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            if not self._forced:
                await asyncio.sleep(SETTLE_SECONDS)  # let the writer finish
            self._wake.clear()  # what changes from here on is checked again
            forced, self._forced = self._forced, False
            try:
                await self.reload(forced)
            except Exception:  # logged; the next change is checked all the same
                log.exception("policy %s: reload failed", self.path or "(config)")

    async def reload(self, forced: bool = True) -> bool:
        """Read, validate, swap; True when a new policy is in force."""
        loop = asyncio.get_running_loop()
        digest = await loop.run_in_executor(None, _digest, self.path)
        if not forced and digest == self._digest:
            return False
        where = self.path or "(config)"
        try:
            policy = await loop.run_in_executor(None, self._load)
        except (PolicyError, SettingsError) as exc:
            self._digest = digest  # said once; the next change is checked again
            log.error("policy %s: new version refused, the previous policy stays in force",
                      where)
            for problem in exc.lines() if isinstance(exc, SettingsError) else exc.problems:
                log.error("policy %s: %s", where, problem)
            return False
        self._digest = digest
        self._apply(policy)
        log.info("policy reloaded from %s", getattr(policy, "origin", self.path))
        return True

    def stop(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.remove_signal_handler(signal.SIGHUP)
        if self._task is not None:
            self._task.cancel()
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
