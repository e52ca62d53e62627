"""Refreshing a SpecCache when its directories change (inotify), in a background thread.

Only events that mean a spec file is complete trigger a refresh: close-after-write,
rename into place, removal. A writer that renames a finished file into place (as
``write_spec`` does) is therefore never seen half-written. A directory that does not
exist yet is noticed when it is created (its nearest existing parent is watched), and a
periodic rescan backs everything up (device nodes that appear later, missed events).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from collections.abc import Callable, Sequence

from inotify_simple import INotify, flags

from cdi.cache import Snapshot, SpecCache
from cdi.dirs import is_spec_name

log = logging.getLogger(__name__)

_DIR_MASK = (
    flags.CLOSE_WRITE
    | flags.MOVED_TO
    | flags.MOVED_FROM
    | flags.DELETE
    | flags.DELETE_SELF
    | flags.MOVE_SELF
    | flags.CREATE
    | flags.ONLYDIR
)
_PARENT_MASK = flags.CREATE | flags.MOVED_TO | flags.ONLYDIR
_FILE_EVENTS = flags.CLOSE_WRITE | flags.MOVED_TO | flags.MOVED_FROM | flags.DELETE
_SELF_EVENTS = flags.DELETE_SELF | flags.MOVE_SELF | flags.IGNORED | flags.Q_OVERFLOW


class SpecDirWatcher:
    """inotify watches on the spec directories (or the parents of missing ones)."""

    def __init__(self, dirs: Sequence[str]) -> None:
        self._dirs = tuple(os.path.abspath(d) for d in dirs)
        self._inotify = INotify()
        self._watches: dict[str, tuple[int, int]] = {}  # path -> (wd, mask)
        self._paths: dict[int, str] = {}
        self.update_watches()

    def fileno(self) -> int:
        return int(self._inotify.fileno())

    def close(self) -> None:
        self._inotify.close()

    def update_watches(self) -> None:
        wanted: dict[str, int] = {}
        for folder in self._dirs:
            if os.path.isdir(folder):
                wanted[folder] = wanted.get(folder, 0) | _DIR_MASK
            else:
                parent = _nearest_existing_parent(folder)
                wanted[parent] = wanted.get(parent, 0) | _PARENT_MASK
        for path in list(self._watches):
            if path not in wanted or self._watches[path][1] != wanted[path]:
                self._remove(path)
        for path, mask in wanted.items():
            if path not in self._watches:
                try:
                    wd = self._inotify.add_watch(path, mask)
                except OSError as exc:
                    log.warning("cannot watch %s: %s", path, exc.strerror)
                    continue
                self._watches[path] = (wd, mask)
                self._paths[wd] = path

    def _remove(self, path: str) -> None:
        wd, _ = self._watches.pop(path)
        self._paths.pop(wd, None)
        with contextlib.suppress(OSError):  # already gone with its directory
            self._inotify.rm_watch(wd)

    def read_changes(self) -> bool:
        """Drain pending events (non-blocking); True when the specs may have changed."""
        changed = False
        rewatch = False
        for event in self._inotify.read(timeout=0):
            path = self._paths.get(event.wd)
            is_spec_dir = path in self._dirs
            if event.mask & _SELF_EVENTS or event.mask & flags.ISDIR or not is_spec_dir:
                changed = rewatch = True
            elif event.mask & _FILE_EVENTS and is_spec_name(event.name):
                changed = True
        if rewatch:
            self.update_watches()
        return changed


def _nearest_existing_parent(folder: str) -> str:
    parent = os.path.dirname(folder)
    while parent != "/" and not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    return parent


class AutoRefresh:
    """A daemon thread that refreshes ``cache`` on directory changes and every
    ``rescan_interval`` seconds. ``on_refresh`` is called with each new Snapshot."""

    def __init__(
        self,
        cache: SpecCache,
        *,
        rescan_interval: float = 60.0,
        on_refresh: Callable[[Snapshot], None] | None = None,
    ) -> None:
        self.cache = cache
        self.rescan_interval = rescan_interval
        self.on_refresh = on_refresh
        self._watcher = SpecDirWatcher(cache.spec_dirs)
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="cdi-refresh", daemon=True)

    def start(self) -> AutoRefresh:
        self._refresh()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping = True
        os.write(self._wake_w, b"x")
        self._thread.join()
        self._watcher.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> AutoRefresh:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stopping:
            ready, _, _ = select.select([self._watcher.fileno(), self._wake_r], [], [],
                                        self.rescan_interval)
            if self._stopping:
                return
            if not ready or self._watcher.read_changes():
                self._refresh()

    def _refresh(self) -> None:
        try:
            snapshot = self.cache.refresh()
        except Exception:  # a refresh bug must not kill the thread; keep the old snapshot
            log.exception("refreshing CDI specs failed")
            return
        if self.on_refresh:
            self.on_refresh(snapshot)
