"""Tegra's CSV mount specs: the files that say what a Jetson container gets.

Each line is ``KIND, PATH`` (``dev``, ``lib``, ``sym``, ``dir``; docs/usage/jetson.md).
A line that is not one is an error naming the file and the line (NVIDIA's parser skips
it silently, and the container then lacks files with no word said). This module only
reads and filters the lists; :mod:`cdi.nvidia.tegra` finds the entries on the node.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Sequence
from typing import NamedTuple

DEFAULT_FOLDER = "/etc/nvidia-container-runtime/host-files-for-container.d"
# The base files of the board support package; other *.csv files in the folder (a
# package's own list) are only read when named.
DEFAULT_NAMES = ("devices.csv", "drivers.csv", "l4t.csv")
KINDS = ("dev", "lib", "sym", "dir")


class MountSpecError(Exception):
    """A CSV file that cannot be read or has a bad line; the message names both."""


class MountSpec(NamedTuple):
    """One line of a CSV file (made by :func:`parse_mount_specs`, which checks it)."""

    kind: str  # one of KINDS
    path: str  # as written: absolute, or a name searched for (may hold wildcards)
    source: str  # "FILE:LINE", for messages


def parse_mount_specs(data: bytes, source: str) -> tuple[MountSpec, ...]:
    """The entries of one CSV file's bytes; ``source`` names the file in errors."""
    entries = []
    for number, raw in enumerate(data.splitlines(), start=1):
        where = f"{source}:{number}"
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise MountSpecError(f"{where}: not UTF-8 text") from None
        if not line or line.startswith("#"):
            continue
        kind, comma, path = line.partition(",")
        if not comma:
            raise MountSpecError(f"{where}: want 'KIND, PATH' (KIND one of "
                                 f"{', '.join(KINDS)}), got {line[:80]!r}")
        kind, path = kind.strip(), path.strip()
        if kind not in KINDS:
            raise MountSpecError(f"{where}: unknown kind {kind!r} (want one of "
                                 f"{', '.join(KINDS)})")
        if not path:
            raise MountSpecError(f"{where}: {kind} line without a path")
        if "\0" in path:
            raise MountSpecError(f"{where}: the path holds a NUL byte")
        entries.append(MountSpec(kind=kind, path=path, source=where))
    return tuple(entries)


def read_mount_specs(paths: Iterable[str]) -> tuple[MountSpec, ...]:
    """Every entry of the files ``paths``, in order."""
    entries: list[MountSpec] = []
    for path in paths:
        try:
            with open(path, "rb") as file:
                data = file.read()
        except OSError as exc:
            raise MountSpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
        entries += parse_mount_specs(data, path)
    return tuple(entries)


def default_files(folder: str) -> list[str]:
    """The base CSV files present in ``folder`` (a board has some of them, not always all)."""
    return [p for p in (os.path.join(folder, n) for n in DEFAULT_NAMES) if os.path.isfile(p)]


def _matches(pattern: str, path: str) -> bool:
    """``--csv.ignore-pattern``: ``**/NAME`` matches the file name anywhere; any other
    pattern matches the whole path, a ``*`` never across a ``/`` (as Go's filepath.Match,
    which NVIDIA's tools use, while fnmatch's ``*`` crosses folders)."""
    if pattern.startswith("**/"):
        return fnmatch.fnmatchcase(os.path.basename(path), pattern[3:])
    want, have = pattern.split("/"), path.split("/")
    return len(want) == len(have) and all(map(fnmatch.fnmatchcase, have, want))


def ignored(entry: MountSpec, patterns: Sequence[str]) -> bool:
    """Whether ``--csv.ignore-pattern`` drops ``entry``: only ``sym`` lines can be dropped,
    as with nvidia-ctk (libraries, folders and device nodes are always taken)."""
    return entry.kind == "sym" and any(_matches(p, entry.path) for p in patterns)
