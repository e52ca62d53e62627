"""Refreshing a SpecCache when its directories change (inotify), in a background thread.

When a file's new content is taken: docs/developer/cdi-library.md ("No torn specs"). A
directory that does not exist yet is noticed when it is created (its nearest existing
parent is watched), and a periodic rescan backs everything up (device nodes that appear
later, missed events).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from inotify_simple import INotify, flags

from cdi.cache import Snapshot, SpecCache, file_clock_ns
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
    | flags.ATTRIB
    | flags.MODIFY
    | flags.ONLYDIR
)
_PARENT_MASK = flags.CREATE | flags.MOVED_TO | flags.ONLYDIR
# Events after which a file's content is complete: take it without waiting for quiet.
_DONE_EVENTS = flags.CLOSE_WRITE | flags.MOVED_TO
_SELF_EVENTS = flags.DELETE_SELF | flags.MOVE_SELF | flags.IGNORED | flags.Q_OVERFLOW


class SpecDirWatcher:
    """inotify watches on the spec directories (or the parents of missing ones)."""

    def __init__(self, dirs: Sequence[str]) -> None:
        self._dirs = tuple(os.path.abspath(d) for d in dirs)
        self._inotify = INotify()
        self._watches: dict[str, tuple[int, int]] = {}  # path -> (wd, mask)
        # File -> complete? by its latest event: a close after writing says yes, a later
        # write says no again (a writer that truncates and rewrites in place).
        self.state: dict[str, bool] = {}
        # A spec file was removed or renamed away since the last take_done(): removals are
        # taken at once, without the settle a burst of writes gets (a deleted DRA claim
        # must be gone before the next container can name it).
        self.removed = False
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
                wd, _ = self._watches.pop(path)
                self._paths.pop(wd, None)
                with contextlib.suppress(OSError):  # already gone with its directory
                    self._inotify.rm_watch(wd)
        for path, mask in wanted.items():
            if path not in self._watches:
                try:
                    wd = self._inotify.add_watch(path, mask)
                except OSError as exc:
                    log.warning("cannot watch %s: %s", path, exc.strerror)
                    continue
                self._watches[path] = (wd, mask)
                self._paths[wd] = path

    def read_changes(self) -> bool:
        """Drain pending events (non-blocking) into ``self.state``; True when the specs
        may have changed. ``take_done()`` then gives the files complete now."""
        changed = False
        rewatch = False
        for event in self._inotify.read(timeout=0):
            path = self._paths.get(event.wd)
            is_spec_dir = path in self._dirs
            if event.mask & _SELF_EVENTS or event.mask & flags.ISDIR or not is_spec_dir:
                changed = rewatch = True
                continue
            if not is_spec_name(event.name):
                continue
            name = os.path.join(str(path), event.name)
            changed = True
            if event.mask & (flags.DELETE | flags.MOVED_FROM):
                self.removed = True
            if event.mask & _DONE_EVENTS:
                self.state[name] = True  # closed after writing, or renamed into place
            elif event.mask & flags.MODIFY:
                self.state[name] = False  # written to again: not complete until closed
            elif event.mask & flags.CREATE and _is_special(name):
                self.state[name] = True  # a symlink or FIFO: created whole, never closed
        if rewatch:
            self.update_watches()
        return changed

    def take_done(self) -> set[str]:
        """The files whose last event says they are complete; forgets them all."""
        done = {name for name, complete in self.state.items() if complete}
        self.state.clear()
        self.removed = False
        return done


def _is_special(path: str) -> bool:
    """A symlink or anything but a regular file: created whole, never written."""
    try:
        return not stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return True  # already gone: a refresh will notice

def _nearest_existing_parent(folder: str) -> str:
    parent = os.path.dirname(folder)
    while parent != "/" and not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    return parent


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """``AutoRefresh``'s times, in seconds: a rescan every ``rescan_interval``; after an
    event, a wait until the folder has been quiet for ``settle`` (at most ``max_delay``);
    a file changed without a completion event is taken once still for ``quiet``."""

    rescan_interval: float = 60.0
    settle: float = 0.05
    quiet: float = 1.0
    max_delay: float = 1.0


class AutoRefresh:
    """A daemon thread that refreshes ``cache`` on directory changes and every
    ``timing.rescan_interval`` seconds. ``on_refresh`` is called with each new Snapshot.

    After an event it waits until the folder has been quiet (``timing``), so a burst of
    writes is read once, complete.
    """

    def __init__(
        self,
        cache: SpecCache,
        timing: Timing | None = None,
        *,
        on_refresh: Callable[[Snapshot], None] | None = None,
    ) -> None:
        self.cache = cache
        self.timing = timing or Timing()
        self.on_refresh = on_refresh
        self._watcher = SpecDirWatcher(cache.spec_dirs)
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="cdi-refresh", daemon=True)
        # A removal read from inotify but not yet in a published snapshot; readers that
        # must not use a removed spec's devices wait on ``_changed`` for it to clear.
        self._removal_unapplied = False
        # The condition's lock, taken directly where nothing waits (removals_pending, on
        # every CreateContainer that names devices: C code, no Python frame).
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        # Polled only under that lock: a poll object must not be polled by two threads.
        self._queued = select.poll()
        self._queued.register(self._watcher.fileno(), select.POLLIN)

    def start(self) -> AutoRefresh:
        self._publish(self.cache.refresh)
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
        dirty_since: float | None = None  # first unprocessed event
        while not self._stopping:
            timeout = self._timeout(dirty_since)
            ready, _, _ = select.select([self._watcher.fileno(), self._wake_r], [], [], timeout)
            if self._stopping:
                return
            now = time.monotonic()
            if ready:
                changed = self._read_changes()
                if changed and dirty_since is None:
                    dirty_since = now
                if dirty_since is None or (now - dirty_since < self.timing.max_delay
                                           and not self._watcher.removed):
                    continue  # wait for the burst to end (removals: at once)
            # Whatever a file's completion event said, a write that began since makes it
            # incomplete again: note the time first, then drain what is queued (a MODIFY
            # queued before that time cancels the close); the registry checks each file's
            # own change time against it for writes that come later still.
            taken_ns = file_clock_ns()
            self._read_changes()
            removal = self._removal_unapplied
            self._publish(partial(self.cache.refresh, self._watcher.take_done(),
                                  quiet_ns=int(self.timing.quiet * 1e9), events_ns=taken_ns))
            with self._changed:
                if removal:
                    self._removal_unapplied = False
                self._changed.notify_all()
            dirty_since = None

    def _read_changes(self) -> bool:
        # Under the condition's lock: a reader never sees the events drained from the
        # descriptor without the removal flag that they set.
        with self._changed:
            try:
                changed = self._watcher.read_changes()
            except OSError:
                log.exception("reading spec folder events failed")
                changed = True
            if self._watcher.removed:
                self._removal_unapplied = True
            self._changed.notify_all()
        return changed

    def removals_pending(self) -> bool:
        """Whether a spec file may have been removed without the snapshot showing it yet
        (events queued, or a removal read and not yet applied). Cheap: one poll."""
        # Under the lock the thread drains events and sets the flag in: read between the
        # two, the queue is empty and the flag not yet set, and a removal just made would
        # look applied (a deleted claim served once more). The kernel queues a removal's
        # event within unlink()/rename(), so a removal done before this call shows in the
        # poll until the thread has read it.
        with self._lock:
            return self._removal_unapplied or bool(self._queued.poll(0))

    def wait_removals(self, timeout: float) -> bool:
        """Wait (at most ``timeout``) until every removal queued before this call is in the
        published snapshot; False when the time ran out."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.removals_pending():
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._changed.wait(min(left, 0.01))
        return True

    def refresh_now(self, timeout: float) -> Snapshot | None:
        """Read the spec files new since the last refresh now, on the caller's thread (see
        ``SpecCache.add_new_files``); waits at most ``timeout`` for a refresh under way
        (None: not in time). For a container naming a device the registry does not know
        yet."""
        return self._publish(partial(self.cache.add_new_files, timeout))

    def _timeout(self, dirty_since: float | None) -> float:
        if dirty_since is not None:
            return self.timing.settle
        if self.cache.pending:
            return min(self.timing.quiet, self.timing.rescan_interval)
        return self.timing.rescan_interval

    def _publish(self, refresh: Callable[[], Snapshot | None]) -> Snapshot | None:
        """Run ``refresh`` and hand its snapshot to ``on_refresh``; None if it failed."""
        try:
            snapshot = refresh()
        except Exception:  # a refresh bug must not kill the thread; keep the old snapshot
            log.exception("refreshing CDI specs failed")
            return None
        if snapshot is not None and self.on_refresh:
            self.on_refresh(snapshot)
        return snapshot
