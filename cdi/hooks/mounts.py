"""Which mount a folder the hook reached lies on, and whether the hook may write there: only
the container's own filesystems (its root filesystem, a tmpfs made for it alone), told
apart by the mount the kernel reports for the descriptor held, never by names
(docs/developer/hook-safety.md §3).
"""

from __future__ import annotations

import os

from cdi.linux.namedtuple import NamedTuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cdi.hooks.state import ContainerRoot

# Before pivot_root the container's table holds the host's mounts too; 64 MiB is hundreds
# of thousands of them.  It is read only when a write meets a mount other than the root's.
_MAX_MOUNTINFO = 64 << 20
_BIND_OPTIONS = frozenset(("bind", "rbind"))


def mount_id(fd: int) -> int | None:
    """The id of the mount the object open at ``fd`` lies on (None where the kernel does
    not say: Linux < 3.15)."""
    # os.open/os.read rather than a file object: this runs for each folder written
    info = os.open(f"/proc/self/fdinfo/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(info, 4096)
    finally:
        os.close(info)
    at = data.find(b"mnt_id:")
    if at < 0:
        return None
    end = data.find(b"\n", at)
    return int(data[at + 7:end if end >= 0 else len(data)])


class MountInfo(NamedTuple):
    """One line of a ``mountinfo`` table: where a mount is and what it is."""

    mount_point: str
    root: str
    fstype: str
    source: str
    device: bytes = b""  # "major:minor" of its filesystem, as the table writes it
    raw_point: bytes = b""  # the mount point as the table writes it (escaped)


def _unescape(field: bytes) -> str:
    """mountinfo writes space, tab, newline and backslash as ``\\ooo``."""
    head, *escaped = field.split(b"\\")
    out = bytearray(head)
    for part in escaped:  # each followed a backslash
        if part[:3].isdigit():
            out += bytes([int(part[:3], 8) & 0xFF]) + part[3:]
        else:
            out += b"\\" + part
    return os.fsdecode(bytes(out))


def find_mount(data: bytes, mnt: int) -> MountInfo | None:
    """The line of mount ``mnt`` in a mountinfo table, without parsing the others."""
    key = b"%d " % mnt
    at = 0 if data.startswith(key) else data.find(b"\n" + key) + 1
    if at <= 0 and not data.startswith(key):
        return None
    end = data.find(b"\n", at)
    fields = data[at:end if end >= 0 else len(data)].split(b" ")
    try:
        sep = fields.index(b"-", 6)
        return MountInfo(_unescape(fields[4]), _unescape(fields[3]), _unescape(fields[sep + 1]),
                         _unescape(fields[sep + 2]), device=fields[2], raw_point=fields[4])
    except (ValueError, IndexError):
        return None  # not a line of the format: the kernel writes none such


class MountTable:
    """The container's mounts, read once when first asked about a mount."""

    def __init__(self, root_path: str, container: ContainerRoot | None, *,
                 proc: str = "/proc") -> None:
        self._root = root_path.rstrip("/")
        self._container = container
        self._proc = proc  # where the tables are read (a test gives a folder of its own)
        self._tables: list[bytes] | None = None  # raw tables, read once
        self._private: dict[int, bool] = {}

    def _lookup(self, mnt: int) -> tuple[MountInfo, bytes] | None:
        """Mount ``mnt``'s line and the whole table it was found in."""
        if self._tables is None:
            self._tables = []
            pid = self._container.pid if self._container is not None else 0
            # Mount ids are unique across namespaces: the container's init process's table
            # first, then ours (the same one, for a createContainer hook).
            for who in ([str(pid)] if pid > 0 else []) + ["self"]:
                try:
                    with open(f"{self._proc}/{who}/mountinfo", "rb") as f:
                        self._tables.append(f.read(_MAX_MOUNTINFO))
                except OSError:
                    continue
        for data in self._tables:
            found = find_mount(data, mnt)
            if found is not None:
                return found, data
        return None

    def destination(self, info: MountInfo) -> str:
        """The mount's path as the container sees it (or the host path when outside)."""
        point = info.mount_point
        if f"{point}/".startswith(f"{self._root}/"):
            return point[len(self._root):] or "/"
        return point

    def _spec_mount(self, destination: str) -> tuple[str, str, tuple[str, ...]] | None:
        """The last ``config.json`` mount at ``destination`` (type, source, options)."""
        found = None
        for dest, kind, source, options in (self._container.mounts if self._container
                                            else ()):
            if os.path.normpath("/" + dest.lstrip("/")) == destination:
                found = (kind, source, options)
        return found

    def is_private(self, mnt: int) -> bool:
        """Whether mount ``mnt`` is a new tmpfs made for this container alone (the rules:
        docs/developer/hook-safety.md §3); a table too large to read whole says no."""
        if mnt not in self._private:
            self._private[mnt] = self._fresh_tmpfs(mnt)
        return self._private[mnt]

    def _fresh_tmpfs(self, mnt: int) -> bool:
        found = self._lookup(mnt)
        if found is None:
            return False
        info, data = found
        if (info.fstype != "tmpfs" or info.root != "/" or len(data) >= _MAX_MOUNTINFO
                or data.count(b" %s " % info.device) != 1
                or data.count(b" %s " % info.raw_point) != 1):
            return False
        spec = self._spec_mount(self.destination(info))
        return (spec is not None and spec[0] == "tmpfs"
                and not _BIND_OPTIONS.intersection(spec[2]))

    def describe(self, mnt: int) -> str:
        """``a bind mount of /host/dir (config.json mounts, at /data)``, for messages."""
        found = self._lookup(mnt)
        if found is None:
            return f"mount {mnt}, not the container's root filesystem"
        info = found[0]
        where = self.destination(info)
        spec = self._spec_mount(where)
        table = f"{info.fstype} {info.source}:{info.root}"
        if spec is not None:
            kind = "bind mount" if spec[0] == "bind" or _BIND_OPTIONS.intersection(spec[2]) \
                else f"{spec[0]} mount"
            return (f"a {kind} of {spec[1] or info.source} at {where} (config.json mounts; "
                    f"mount table: {table}), not the container's root filesystem")
        return f"a mount of {table} at {where}, not the container's root filesystem"
