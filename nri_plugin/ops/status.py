"""The plugin's status file, ``<plugin.status_dir>/<NN>-<name>.json``, for ``nri-cdi doctor``.

Written atomically at each change of the connection's state, never on a container's path.
Whether the writer still runs is told by a lock, not by the pid: the daemon holds an
``flock`` on ``<NN>-<name>.lock`` for its whole life, which the kernel drops however it
ends, whatever pid namespace the reader runs in. The lock also says which of two plugins
of one name and index (an upgrade's overlap) the file and the metrics address belong to:
docs/developer/upgrades.md.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdi.spec import atomic_write

if TYPE_CHECKING:
    from nri_plugin.nri.dispatch import Configuration

log = logging.getLogger("nri_cdi.status")

STATUS_FORMAT = 1
# The states the file can say, in the order a plugin goes through them.
STARTING, CONNECTED, DISCONNECTED, STOPPED = "starting", "connected", "disconnected", "stopped"
LAUNCHED_SOCKET = "NRI_PLUGIN_SOCKET (launched by the runtime)"
# A reader's probe holds the lock for an instant: the daemon tries this long to take it.
LOCK_WAIT = 1.0


def status_path(folder: str | Path, name: str, index: str) -> Path:
    """The status file; its lock is the same name with ``.lock`` for ``.json``."""
    return Path(folder) / f"{index}-{name}.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginStatus:
    """What the file holds. Times are seconds since the epoch."""

    format: int = STATUS_FORMAT
    state: str = STARTING
    pid: int = 0
    name: str = ""
    index: str = ""
    socket: str = ""  # the NRI socket it connects to, or LAUNCHED_SOCKET
    runtime: str = ""  # "containerd 2.1.9", once connected
    nri_version: str = ""  # "" before NRI 0.12
    started: float = 0.0  # the process
    since: float = 0.0  # the state
    error: str = ""  # why the last connection ended

    @classmethod
    def from_json(cls, text: str) -> PluginStatus:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        known = {f.name for f in fields(cls)}
        status = cls(**{k: v for k, v in data.items() if k in known})
        if status.state not in (STARTING, CONNECTED, DISCONNECTED, STOPPED):
            raise ValueError(f"unknown state {status.state!r}")
        return status


class StatusFile:
    """The daemon's side: holds the lock and rewrites the file on each change."""

    def __init__(self, folder: str, *, name: str, index: str, socket: str) -> None:
        self.path = status_path(folder, name, index) if folder else None
        self._lock_fd: int | None = None  # the lock, once ours: the file is ours to write
        self._write_lock = threading.Lock()  # the loop's writes, the hand-over thread's
        now = time.time()
        self.status = PluginStatus(pid=os.getpid(), name=name, index=index, socket=socket,
                                   started=now, since=now)

    def start(self, on_owner: Callable[[], None] = lambda: None) -> StatusFile:
        """Take the lock and write the first state, then call ``on_owner``. Where another
        plugin of the same name and index holds the lock, wait for it in a thread and do
        both when it is ours. With no folder (or one we cannot use: logged) there is
        nothing to own and ``on_owner`` is called at once."""
        if self.path is None:
            on_owner()
            return self
        lock = self.path.with_suffix(".lock")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)  # readers probe it
        except OSError as exc:
            log.warning("no status file for nri-cdi doctor: %s", _why(exc))
            self.path = None
            on_owner()
            return self
        if _lock_within(fd, LOCK_WAIT):
            self._own(fd, on_owner)
            return self
        log.info("another nri-cdi plugin named %s-%s serves this node (pid %s in %s): both "
                 "serve while it lasts, and this one takes over the status file and the "
                 "metrics address when it ends", self.status.index, self.status.name,
                 _pid_in(self.path), self.path)

        def wait_for_lock() -> None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # the other plugin's exit releases it
            except OSError as exc:
                log.warning("no status file for nri-cdi doctor: %s", _why(exc))
                return
            log.info("the other plugin ended: the status file %s and the metrics address "
                     "are this one's now", self.path)
            self._own(fd, on_owner)

        threading.Thread(target=wait_for_lock, name="nri-cdi-status-lock", daemon=True).start()
        return self

    def _own(self, fd: int, on_owner: Callable[[], None]) -> None:
        with self._write_lock:
            self._lock_fd = fd
            self._write()
        on_owner()

    def connected(self, conf: Configuration | None) -> None:
        """The connection synchronized; ``conf``: what the runtime said in Configure."""
        runtime = f"{conf.runtime_name} {conf.runtime_version}".strip() if conf else ""
        self._set(state=CONNECTED, runtime=runtime,
                  nri_version=conf.nri_version if conf else "", error="")

    def disconnected(self, error: BaseException | None) -> None:
        self._set(state=DISCONNECTED, error=str(error or ""))

    def stopped(self) -> None:
        """Says so in the file, if it is ours, and lets the lock go (to the plugin
        waiting for it, if any)."""
        self._set(state=STOPPED)
        with self._write_lock:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def _set(self, **changes: Any) -> None:
        with self._write_lock:
            self.status = replace(self.status, since=time.time(), **changes)
            self._write()

    def _write(self) -> None:
        if self.path is None or self._lock_fd is None:  # another plugin's file, for now
            return
        try:
            atomic_write(self.path, json.dumps(asdict(self.status), indent=1).encode() + b"\n")
        except OSError as exc:
            log.warning("cannot write the status file %s: %s", self.path, _why(exc))


def set_ready(path: str, ready: bool) -> None:
    """``plugin.ready_file`` ("": none): present while this process's connection is
    synchronized. A readiness probe that asks the process itself: the metrics address is the
    node's, held by the older plugin while two run during an upgrade."""
    if not path:
        return
    try:
        if ready:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).touch()
        else:
            Path(path).unlink(missing_ok=True)
    except OSError as exc:
        log.warning("cannot %s the ready file %s: %s", "create" if ready else "remove", path,
                    _why(exc))


def _pid_in(path: Path) -> str:
    """The pid another plugin's status file names (in its pid namespace), for a log line."""
    try:
        return str(PluginStatus.from_json(path.read_text()).pid)
    except (OSError, ValueError, TypeError):
        return "unknown"


def _lock_within(fd: int, seconds: float) -> bool:
    """Whether the exclusive lock on ``fd`` was taken within ``seconds``: a reader's probe
    holds it for an instant, a plugin for its life."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def _why(exc: OSError) -> str:
    return exc.strerror if exc.filename is None and exc.strerror else str(exc)


# --- the reader's side (nri-cdi doctor) -----------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    """The status file as a reader finds it: ``status`` (None: no readable file, ``problem``
    says why) and ``alive`` (whether its writer still holds the lock; None: unknown)."""

    path: Path
    status: PluginStatus | None
    alive: bool | None
    problem: str = ""


def read_status(folder: str, name: str, index: str) -> Reading:
    path = status_path(folder, name, index)
    try:
        status = PluginStatus.from_json(path.read_text())
    except FileNotFoundError:
        return Reading(path=path, status=None, alive=None, problem="no such file")
    except OSError as exc:
        return Reading(path=path, status=None, alive=None, problem=_why(exc))
    except (ValueError, TypeError) as exc:
        return Reading(path=path, status=None, alive=None, problem=f"unreadable: {exc}")
    return Reading(path=path, status=status, alive=writer_alive(path.with_suffix(".lock")))


def writer_alive(path: Path) -> bool | None:
    """True while a process holds ``path``'s lock, False when none does; None: cannot tell."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # also drops our shared lock at once
    return False
