"""The spec registry: loads every spec directory ahead of use into an immutable Snapshot.

``SpecCache.refresh()`` does all the I/O (listing, reading, parsing, stat'ing host device
nodes) and swaps a new Snapshot in with one assignment, so a reader sees either the old
registry or the new one, never a mix. ``Snapshot.resolve()`` is pure: no file I/O.

Rules (CDI spec, spec directories): a later directory has higher priority; a device
defined in two files of equal (highest) priority is dropped and both files are reported;
a bad file is reported and never hides the good ones.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from cdi.device import Device
from cdi.dirs import DEFAULT_SPEC_DIRS, SpecFile, scan
from cdi.edits import merge
from cdi.errors import DeviceNodeError, FieldError, SpecError, UnresolvedDevicesError
from cdi.hostdev import fill_edits
from cdi.model import ContainerEdits
from cdi.parser import split_device
from cdi.spec import MAX_SPEC_BYTES, Spec, parse_spec

Signature = tuple[int, int, int, int, int, int]  # dev, ino, size, mtime, ctime, priority


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
    # Device names dropped because two files of equal priority define them.
    conflicts: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _frozen({}))
    generation: int = 0

    def device_names(self) -> list[str]:
        return sorted(self.devices)

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
        parts: list[ContainerEdits] = []
        seen_specs: set[str] = set()
        for device in self.lookup(names):
            if device.spec.path not in seen_specs:
                seen_specs.add(device.spec.path)
                parts.append(self.specs[device.spec.path].edits)
            parts.append(device.edits)
        return merge(parts)

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


class SpecCache:
    """Owns the spec directories and the current Snapshot (``.snapshot``)."""

    def __init__(self, spec_dirs: Sequence[str] | None = None) -> None:
        # None means the default folders; an empty list means none (an empty registry).
        self.spec_dirs: tuple[str, ...] = (DEFAULT_SPEC_DIRS if spec_dirs is None
                                           else tuple(spec_dirs))
        self.snapshot = Snapshot(spec_dirs=self.spec_dirs)
        self._parsed: dict[str, tuple[Signature, Spec | SpecError]] = {}
        self._lock = threading.Lock()

    def refresh(self) -> Snapshot:
        """Rescan every directory and swap in a new Snapshot. Unchanged files are not
        parsed again. Safe to call from several threads."""
        with self._lock:
            files = list(scan(self.spec_dirs))
            results = {f.path: self._load(f) for f in files}
            self._parsed = {path: r for path, r in results.items() if r is not None}
            snapshot = _build_snapshot(
                self.spec_dirs,
                [
                    (f, r[1] if r else SpecError([FieldError("", f.error or "unreadable")]))
                    for f, r in ((f, results[f.path]) for f in files)
                ],
                self.snapshot.generation + 1,
            )
            self.snapshot = snapshot
            return snapshot

    def _load(self, spec_file: SpecFile) -> tuple[Signature, Spec | SpecError] | None:
        if spec_file.error:
            return None
        try:
            # O_NONBLOCK: a FIFO named *.yaml must not hang the refresh.
            fd = os.open(spec_file.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            return (0, 0, 0, 0, 0, -1), SpecError(
                [FieldError("", f"cannot read: {exc.strerror}")], file=spec_file.path
            )
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(fd)
            signature = (
                info.st_dev,
                info.st_ino,
                info.st_size,
                info.st_mtime_ns,
                info.st_ctime_ns,
                spec_file.priority,
            )
            if not stat.S_ISREG(info.st_mode):
                return signature, SpecError(
                    [FieldError("", "not a regular file")], file=spec_file.path
                )
            previous = self._parsed.get(spec_file.path)
            if previous and previous[0] == signature:
                return previous
            data = handle.read(MAX_SPEC_BYTES + 1)
        try:
            return signature, parse_spec(data, spec_file.path, spec_file.priority)
        except SpecError as exc:
            return signature, exc


def _fill(edits: ContainerEdits) -> tuple[ContainerEdits, str | None]:
    try:
        return fill_edits(edits), None
    except DeviceNodeError as exc:
        return edits, str(exc)


def _build_snapshot(
    spec_dirs: tuple[str, ...], loaded: list[tuple[SpecFile, Spec | SpecError]], generation: int
) -> Snapshot:
    errors: dict[str, list[str]] = {}
    specs: dict[str, LoadedSpec] = {}
    candidates: dict[str, list[Device]] = {}
    for spec_file, result in loaded:
        if isinstance(result, SpecError):
            errors.setdefault(spec_file.path, []).extend(str(e) for e in result.errors)
            continue
        edits, error = _fill(result.data.container_edits)
        specs[spec_file.path] = LoadedSpec(spec=result, edits=edits, error=error)
        vendor_class = result.kind
        for data in result.devices:
            device_edits, device_error = _fill(data.container_edits)
            name = f"{vendor_class}={data.name}"
            candidates.setdefault(name, []).append(
                Device(
                    qualified_name=name,
                    spec=result,
                    data=data,
                    edits=device_edits,
                    error=device_error,
                )
            )
    devices, conflicts = _resolve_conflicts(candidates, errors)
    return Snapshot(
        spec_dirs=spec_dirs,
        specs=_frozen(specs),
        devices=_frozen(devices),
        errors=_frozen({path: tuple(msgs) for path, msgs in errors.items()}),
        conflicts=_frozen(conflicts),
        generation=generation,
    )


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
