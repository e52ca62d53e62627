"""The spec registry: loads every spec directory ahead of use into an immutable Snapshot.

``SpecCache.refresh()`` does all the I/O and swaps a new Snapshot in with one assignment;
``Snapshot.resolve()`` is pure. Rules and guarantees: docs/developer/cdi-library.md.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from cdi.dirs import (
    DEFAULT_SPEC_DIRS,
    SpecFile,
    identity,
    permission_problem,
    scan,
)
from cdi.edits import merge
from cdi.errors import DeviceNodeError, FieldError, SpecError, UnresolvedDevicesError
from cdi.hostdev import fill_edits
from cdi.model import ContainerEdits, DeviceData
from cdi.parser import split_device
from cdi.spec import MAX_SPEC_BYTES, Spec, parse_spec
from cdi.validate import interop_warnings

Signature = tuple[int, int, int, int, int, int]  # dev, ino, size, mtime, ctime, priority
# (a priority of -2 marks a result that came from no read: never reused)


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    qualified_name: str
    spec: Spec
    data: DeviceData
    # The device's own edits with device nodes filled in from the host at load time.
    edits: ContainerEdits
    # Why the device cannot be used (e.g. its host device node is missing); raised when
    # the device is requested, so that one broken node does not hide its neighbours.
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedSpec:
    spec: Spec
    # Spec-level edits, device nodes filled in from the host.
    edits: ContainerEdits
    error: str | None = None


def _frozen(mapping: Mapping) -> Mapping:  # type: ignore[type-arg]
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """The registry at one moment. Immutable; every method is pure."""

    spec_dirs: tuple[str, ...] = ()
    specs: Mapping[str, LoadedSpec] = field(default_factory=lambda: _frozen({}))
    devices: Mapping[str, Device] = field(default_factory=lambda: _frozen({}))
    # Problems by file path: parse and validation errors, conflicts.
    errors: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _frozen({}))
    # Warnings by path (file or folder): loaded, but worth a look (permissions, interop).
    warnings: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _frozen({}))
    # Device names dropped because two files of equal priority define them.
    conflicts: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _frozen({}))
    generation: int = 0
    # Device node path -> the devices that carry it, in name order: derived from
    # ``devices`` when the snapshot is built (off the CreateContainer path), for matching
    # a container's nodes to devices when their names are not shown.
    by_device_node: Mapping[str, tuple[str, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        index: dict[str, list[str]] = {}
        for name in sorted(self.devices):
            for node in self.devices[name].edits.device_nodes:
                index.setdefault(node.path, []).append(name)
        object.__setattr__(self, "by_device_node",
                           _frozen({path: tuple(names) for path, names in index.items()}))

    def lookup(self, names: Iterable[str]) -> list[Device]:
        """The devices for ``names`` in request order, each once; one error naming every
        device that cannot be used."""
        found: dict[str, Device] = {}
        problems: dict[str, str] = {}
        for name in names:
            if name in found or name in problems:
                continue
            device = self.devices.get(name)
            why = self._why_unusable(name, device)
            if why:
                problems[name] = why
            else:
                found[name] = device  # type: ignore[assignment]
        if problems:
            raise UnresolvedDevicesError(problems)
        return list(found.values())

    def resolve(self, names: Iterable[str]) -> ContainerEdits:
        """Merged edits for ``names``: per device in request order, its spec's edits first
        (once per spec file), then its own."""
        return self.merged_edits(self.lookup(names))

    def merged_edits(self, devices: Iterable[Device]) -> ContainerEdits:
        """``resolve`` for devices already looked up (in request order, each once)."""
        return merge(self.edits_in_order(devices))

    def edits_in_order(self, devices: Iterable[Device], *,
                       as_written: bool = False) -> list[ContainerEdits]:
        """The edits of ``devices`` (looked up, in request order, each once) in the order
        CDI applies them: per device, its spec's edits first (once per spec file), then its
        own. ``as_written``: as the spec files wrote them (device nodes not filled in from
        the host)."""
        parts: list[ContainerEdits] = []
        seen_specs: set[str] = set()
        for device in devices:
            if device.spec.path not in seen_specs:
                seen_specs.add(device.spec.path)
                parts.append(device.spec.data.container_edits if as_written
                             else self.specs[device.spec.path].edits)
            parts.append(device.data.container_edits if as_written else device.edits)
        return parts

    def _why_unusable(self, name: str, device: Device | None) -> str | None:
        if device is None:
            if name in self.conflicts:
                return (
                    f"defined in more than one spec of equal priority: "
                    f"{', '.join(self.conflicts[name])}"
                )
            if not split_device(name)[0]:
                return "not a qualified CDI device name (vendor/class=name)"
            return "no such device in the spec directories"
        if device.error:
            return device.error
        return self.specs[device.spec.path].error


PERMISSION_POLICIES = ("warn", "refuse", "ignore")


class SpecCache:
    """Owns the spec directories and the current Snapshot (``.snapshot``).

    ``permissions`` says what to do with world-writable or foreign-owned spec files and
    folders: ``warn`` (load them, with a warning), ``refuse`` (report, do not load) or
    ``ignore``.
    """

    def __init__(self, spec_dirs: Sequence[str] | None = None, *,
                 permissions: str = "warn") -> None:
        if permissions not in PERMISSION_POLICIES:
            raise ValueError(f"permissions must be one of {', '.join(PERMISSION_POLICIES)}")
        # None means the default folders; an empty list means none (an empty registry).
        self.spec_dirs: tuple[str, ...] = (DEFAULT_SPEC_DIRS if spec_dirs is None
                                           else tuple(spec_dirs))
        self.permissions = permissions
        self.snapshot = Snapshot(spec_dirs=self.spec_dirs)
        self._parsed: dict[str, tuple[Signature, Spec | SpecError]] = {}
        # Files whose new content was not taken yet (still changing); the watcher comes
        # back for them.
        self.pending: frozenset[str] = frozenset()
        # Re-entrant: ``add_new_files`` holds it when it falls back to ``refresh``.
        self._lock = threading.RLock()

    def refresh(self, changed: Iterable[str] | None = None, *, quiet_ns: int = 0,
                events_ns: int | None = None) -> Snapshot:
        """Rescan every directory and swap in a new Snapshot. Safe from several threads.

        ``changed``: the watcher's files closed after writing or renamed into place, taken
        at ``events_ns`` (``file_clock_ns``); a changed file outside it, or changed after
        ``events_ns``, is taken only once still for ``quiet_ns`` and serves its last good
        version meanwhile. Without ``changed`` (a direct call) every change is taken at once.
        """
        with self._lock:
            events = None if changed is None else set(changed)
            now = time.time_ns()
            files = list(scan(self.spec_dirs))
            loaded: list[tuple[SpecFile, Spec | SpecError]] = []
            parsed: dict[str, tuple[Signature, Spec | SpecError]] = {}
            pending = set()
            for spec_file in files:
                result = self._load(spec_file, events, quiet_ns, now, events_ns)
                if result is None:
                    pending.add(spec_file.path)
                    previous = self._parsed.get(spec_file.path)
                    if previous is None:
                        continue  # a new file not complete yet: not listed at all
                    result = previous
                if result[0][-1] != -2:  # keep what came from a real read
                    parsed[spec_file.path] = result
                loaded.append((spec_file, result[1]))
            self._parsed = parsed
            self.pending = frozenset(pending)
            snapshot = _build_snapshot(
                self.spec_dirs, loaded, self.snapshot.generation + 1,
                warnings=self._permission_warnings(files),
            )
            self.snapshot = snapshot
            return snapshot

    def add_new_files(self, timeout: float) -> Snapshot | None:
        """Read only the spec files whose names the registry has not seen and publish it
        with them added: a listing of each folder plus the new files, whatever the number
        of files already known (a DRA claim spec written a moment ago, among thousands).
        Changed or removed files are left to ``refresh()``, and so is a new file whose
        device another file defines too (priorities and conflicts need the whole picture).
        Waits at most ``timeout`` for a refresh under way (None: not in time)."""
        if not self._lock.acquire(timeout=max(timeout, 0.0)):
            return None
        try:
            new = self._new_files()
            if not new:
                return self.snapshot
            now = time.time_ns()
            loaded = [(f, r) for f in new
                      if (r := self._load(f, None, 0, now)) is not None]
            added = _build_snapshot(self.spec_dirs, [(f, r[1]) for f, r in loaded], 0,
                                    warnings=self._permission_warnings([f for f, _ in loaded]))
            old = self.snapshot
            if added.conflicts or not added.devices.keys().isdisjoint(old.devices):
                return self.refresh()
            for spec_file, result in loaded:
                if result[0][-1] != -2:
                    self._parsed[spec_file.path] = result
            self.snapshot = _added(old, added)
            return self.snapshot
        finally:
            self._lock.release()

    def _new_files(self) -> list[SpecFile]:
        known = set(self._parsed) | set(self.snapshot.specs) | set(self.snapshot.errors)
        # A folder that cannot be listed is left to refresh(), which reports it.
        return [f for f in scan(self.spec_dirs, known) if f.path not in self.spec_dirs]

    def _permission_warnings(self, files: list[SpecFile]) -> dict[str, list[str]]:
        if self.permissions == "ignore":
            return {}
        problems = {folder: _folder_problem(folder, "spec directory") for folder in self.spec_dirs}
        problems.update((f.path, permission_problem(f.mode, f.uid))
                        for f in files if f.signature is not None)
        return {path: [problem] for path, problem in problems.items() if problem}

    def _refused(self, spec_file: SpecFile) -> str | None:
        if self.permissions != "refuse":
            return None
        problem = permission_problem(spec_file.mode, spec_file.uid) or _folder_problem(
            os.path.dirname(spec_file.path) or ".", "its directory")
        return f"refused: {problem} (spec permissions: refuse)" if problem else None

    def _load(
        self, spec_file: SpecFile, events: set[str] | None, quiet_ns: int, now: int,
        events_ns: int | None = None,
    ) -> tuple[Signature, Spec | SpecError] | None:
        """One file, with every failure turned into that file's error: nothing one file
        does can stop a refresh or hide another file's devices. None: not complete yet."""
        path = spec_file.path
        try:
            if spec_file.error or spec_file.signature is None:
                problem = spec_file.error or "unreadable"
                return _UNREAD, SpecError([FieldError("", problem)], file=path)
            refused = self._refused(spec_file)
            if refused:
                return _UNREAD, SpecError([FieldError("", refused)], file=path)
            signature = (*spec_file.signature, spec_file.priority)
            previous = self._parsed.get(path)
            if previous and previous[0] == signature:
                return previous
            quiet_since = now - quiet_ns
            if _must_wait(path, spec_file.signature, events, events_ns, quiet_since):
                return None
            return _read_changed(spec_file, previous, events, events_ns, quiet_since)
        except Exception as exc:  # a bug or an odd file: report it against that file only
            error = FieldError("", f"cannot load: {type(exc).__name__}: {exc}")
            return _UNREAD, SpecError([error], file=path)


def _read_changed(spec_file: SpecFile, previous: tuple[Signature, Spec | SpecError] | None,
                  events: set[str] | None, events_ns: int | None,
                  quiet_since: int) -> tuple[Signature, Spec | SpecError] | None:
    """``_load``'s read and parse of a changed file that need not wait."""
    path = spec_file.path
    try:
        read = _read_stable(path)
    except OSError as exc:
        return _UNREAD, SpecError([FieldError("", f"cannot read: {exc.strerror}")], file=path)
    if read is None:
        return None  # changed while it was read
    info, data = read
    if identity(info) != (spec_file.signature or ())[:5] and _must_wait(
            path, identity(info), events, events_ns, quiet_since):
        # Changed between the folder scan and the read (a writer that truncated it
        # meanwhile): judged again by what was read, not by the scan's older look.
        return None
    try:
        result: Spec | SpecError = parse_spec(data, path, spec_file.priority)
    except SpecError as exc:
        result = exc
    now_info = os.stat(path)
    if now_info.st_ino == info.st_ino and identity(now_info) != identity(info):
        return None  # written to in place meanwhile: what was read may be partial
    if (isinstance(result, SpecError) and previous is not None
            and not isinstance(previous[1], SpecError)
            and _must_wait(path, identity(info), set(), None, quiet_since)):
        # A good spec now unreadable, changed after ``quiet_since``: most likely
        # caught between a truncation and the write after it, whose own change time and
        # event the kernel makes visible only after the new size. It keeps serving its
        # last good version until it is complete again, or still for that long.
        return None
    # (a file renamed over it meanwhile leaves what was read whole: its own event follows)
    return (*identity(info), spec_file.priority), result


_UNREAD: Signature = (0, 0, 0, 0, 0, -2)
# Linux's CLOCK_REALTIME_COARSE (the time module has no name for it): the clock the kernel
# stamps file changes with, up to one of its ticks behind time.time_ns() on an idle machine.
_REALTIME_COARSE = 5
_CLOCK_SLACK_NS = max(5_000_000, 2 * int(time.clock_getres(_REALTIME_COARSE) * 1e9))


def file_clock_ns() -> int:
    """Now, on the clock the kernel stamps file changes with: a change made after this
    call has a change time no earlier (``refresh``'s ``events_ns`` should come from here).
    time.time_ns() runs ahead of that clock by up to a tick, and by more when the machine
    is busy and its ticks come late, so a file written just after a time.time_ns() stamp
    can look older than it."""
    return time.clock_gettime_ns(_REALTIME_COARSE)


def _must_wait(path: str, identity: Sequence[int], events: set[str] | None,
               events_ns: int | None, quiet_since: int) -> bool:
    """Whether a changed file must wait before it is taken: it changed without a
    completion event, or was written to again after it (its change time is later than
    when the events were taken), and has not been still since ``quiet_since`` (now less
    the quiet time)."""
    if events is None:
        return False  # a direct refresh takes every changed file at once
    last_change = max(identity[3], identity[4])
    rewritten = events_ns is not None and last_change > events_ns - _CLOCK_SLACK_NS
    return (path not in events or rewritten) and last_change > quiet_since


def _folder_problem(folder: str, what: str) -> str | None:
    try:
        info = os.stat(folder)
    except (OSError, ValueError):
        return None
    return permission_problem(info.st_mode, info.st_uid, what)


def _read_stable(path: str) -> tuple[os.stat_result, bytes] | None:
    """The file's bytes with its identity, or None when it changed while being read."""
    # O_NONBLOCK: a FIFO swapped in under the name must not hang the refresh.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = handle.read(MAX_SPEC_BYTES + 1)
        after = os.fstat(fd)
    if identity(before) != identity(after) or len(data) != before.st_size:
        return None
    return before, data


def _fill(edits: ContainerEdits) -> tuple[ContainerEdits, str | None]:
    try:
        return fill_edits(edits), None
    except DeviceNodeError as exc:
        return edits, str(exc)
    except (OSError, ValueError) as exc:  # a host path stat() cannot take
        return edits, f"cannot use a device node: {exc}"


def _added(old: Snapshot, added: Snapshot) -> Snapshot:
    """``old`` with the specs of ``added`` (disjoint devices, no conflicts) added."""
    return replace(
        old,
        specs=_frozen({**old.specs, **added.specs}),
        devices=_frozen({**old.devices, **added.devices}),
        errors=_frozen({**old.errors, **added.errors}),
        warnings=_frozen({**old.warnings, **added.warnings}),
        generation=old.generation + 1,
    )


def _build_snapshot(spec_dirs: tuple[str, ...], loaded: list[tuple[SpecFile, Spec | SpecError]],
                    generation: int, *, warnings: Mapping[str, list[str]]) -> Snapshot:
    errors: dict[str, list[str]] = {}
    notes: dict[str, list[str]] = {path: list(w) for path, w in warnings.items()}
    specs: dict[str, LoadedSpec] = {}
    candidates: dict[str, list[Device]] = {}
    for spec_file, result in loaded:
        if isinstance(result, SpecError):
            errors.setdefault(spec_file.path, []).extend(str(e) for e in result.errors)
            continue
        try:
            loaded_spec, devices = _spec_devices(result)
        except Exception as exc:  # one file's surprise stays that file's error
            errors.setdefault(spec_file.path, []).append(
                f"cannot load: {type(exc).__name__}: {exc}"
            )
            continue
        specs[spec_file.path] = loaded_spec
        for device in devices:
            candidates.setdefault(device.qualified_name, []).append(device)
        for problem in interop_warnings(result.data):
            notes.setdefault(spec_file.path, []).append(str(problem))
    resolved, conflicts = _resolve_conflicts(candidates, errors)
    return Snapshot(
        spec_dirs=spec_dirs,
        specs=_frozen(specs),
        devices=_frozen(resolved),
        errors=_frozen({path: tuple(msgs) for path, msgs in errors.items()}),
        warnings=_frozen({path: tuple(msgs) for path, msgs in notes.items()}),
        conflicts=_frozen(conflicts),
        generation=generation,
    )


def _spec_devices(spec: Spec) -> tuple[LoadedSpec, list[Device]]:
    edits, error = _fill(spec.data.container_edits)
    devices = []
    for data in spec.devices:
        device_edits, device_error = _fill(data.container_edits)
        devices.append(
            Device(
                qualified_name=f"{spec.kind}={data.name}",
                spec=spec,
                data=data,
                edits=device_edits,
                error=device_error,
            )
        )
    return LoadedSpec(spec=spec, edits=edits, error=error), devices


def _resolve_conflicts(
    candidates: dict[str, list[Device]], errors: dict[str, list[str]]
) -> tuple[dict[str, Device], dict[str, tuple[str, ...]]]:
    """The highest priority definition wins; two or more at that priority drop the device.

    Unlike the reference, a conflict among lower-priority files does not drop a device that
    a higher-priority file defines once: the higher file wins, as priorities promise.
    """
    devices: dict[str, Device] = {}
    conflicts: dict[str, tuple[str, ...]] = {}
    for name, defined in candidates.items():
        top = max(d.spec.priority for d in defined)
        winners = [d for d in defined if d.spec.priority == top]
        if len(winners) == 1:
            devices[name] = winners[0]
            continue
        paths = tuple(d.spec.path for d in winners)
        conflicts[name] = paths
        for path in paths:
            others = ", ".join(p for p in paths if p != path)
            errors.setdefault(path, []).append(
                f"conflicting device {name!r}: also defined in {others} (same priority); "
                "device dropped"
            )
    return devices, conflicts
