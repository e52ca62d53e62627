"""Spec directories: defaults, priorities and the directory scan (CDI spec, spec directories)."""

from __future__ import annotations

import os
import stat
from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass

SPEC_EXTENSIONS = (".json", ".yaml")  # only these are specs (".yml" is not, as upstream)

# Static specs first, dynamic (generated at boot) second: a later directory has the
# higher priority, so a fresh /var/run/cdi spec shadows a leftover in /etc/cdi.
DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")


@dataclass(frozen=True, slots=True)
class SpecFile:
    path: str
    priority: int
    signature: tuple[int, int, int, int, int] | None
    error: str | None = None
    mode: int = 0  # st_mode and st_uid of what the name points to, for the permission check
    uid: int = 0


def is_spec_name(name: str) -> bool:
    """Only ``.json`` and ``.yaml`` count (``.yml`` does not, as in the reference)."""
    return name.endswith(SPEC_EXTENSIONS)


def scan(dirs: Sequence[str], skip: Container[str] = ()) -> Iterator[SpecFile]:
    """Every spec file in ``dirs`` (no recursion) but those in ``skip`` (not even stat'ed),
    with its priority (= directory index).

    Missing directories are skipped. Files are listed in name order so that results are
    stable. A name that is not a regular file (a folder, a FIFO) is reported, not opened.
    """
    for priority, folder in enumerate(dirs):
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            continue
        except OSError as exc:
            yield SpecFile(folder, priority, None, f"cannot list directory: {exc.strerror}")
            continue
        except ValueError as exc:  # a NUL in a configured name
            yield SpecFile(folder, priority, None, f"cannot list directory: {exc}")
            continue
        for name in names:
            path = os.path.join(folder, name)
            if is_spec_name(name) and path not in skip:
                yield stat_file(path, priority)


def stat_file(path: str, priority: int) -> SpecFile:
    """One spec file's SpecFile (its identity, or why it cannot be read)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        return SpecFile(path, priority, None, f"cannot read: {exc.strerror}")
    if not stat.S_ISREG(info.st_mode):
        return SpecFile(path, priority, None, "not a regular file")
    return SpecFile(path, priority, identity(info), mode=info.st_mode, uid=info.st_uid)


def identity(info: os.stat_result) -> tuple[int, int, int, int, int]:
    """(device, inode, size, mtime_ns, ctime_ns): equal identities mean unchanged content."""
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def permission_problem(mode: int, uid: int, what: str = "file") -> str | None:
    """Why a spec file or folder could be changed by someone other than its trusted
    owner: world-writable, or owned by neither root nor the user reading it. A spec
    decides what every container that asks for its devices gets."""
    problems = []
    if mode & stat.S_IWOTH:
        problems.append("world-writable")
    if uid not in (0, os.geteuid()):
        problems.append(f"owned by uid {uid}, not root")
    return f"{what} is {' and '.join(problems)}" if problems else None
