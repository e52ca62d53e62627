"""Reader for glibc's ``ld.so.cache`` and in-root library lookup.

The generator finds driver libraries the way the dynamic loader would: through the cache
that ``ldconfig`` wrote under the driver root.  Two layouts exist in the wild:

* new format only (glibc >= 2.32 writes this by default): a 48-byte header
  ``glibc-ld.so.cache1.1`` + nlibs + string-table size + flags + extension offset, then
  nlibs 24-byte entries ``{flags i32, key u32, value u32, osversion u32, hwcap u64}``,
  then the string table;
* "compat" format: an old ``ld.so-1.7.0`` header with 12-byte entries, padded to 8 bytes,
  followed by a complete new-format section.  Only the new section is read.

String offsets in new entries count from the start of the new header.  ``parse_ldcache``
is pure (bytes in, values out); ``read_ldcache`` adds only the file read and its name in
errors.
Every malformed input raises :class:`LdCacheError` naming the source and the offset.

The writer (``merge`` then ``encode``) is pure as well; the ``update-ldcache`` hook uses it.
"""

from __future__ import annotations

import errno
import os
import struct

from cdi.linux.elf import BinaryFormatError
from cdi.linux.namedtuple import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # pathlib, collections: milliseconds of the OCI hooks' start-up
    from collections.abc import Iterable, Sequence
    from pathlib import Path

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
_OLD_HEADER_SIZE = 16  # 11-byte magic, padded, + u32 nlibs
_OLD_ENTRY_SIZE = 12
_NEW_HEADER_SIZE = 48
_NEW_ENTRY_SIZE = 24
_EXTENSION_MAGIC = 0xEAA42174

# Byte 28 of the new header records the writer's byte order (glibc >= 2.33; older loaders
# ignore it). We write little-endian caches only.
_ENDIAN_UNSET, _ENDIAN_INVALID, _ENDIAN_LITTLE, _ENDIAN_BIG = 0, 1, 2, 3

FLAG_ARCH_MASK = 0xFF00

# The 64-bit arch bits ldconfig records: x86-64, ppc64, aarch64 (0x0000 is the platform's
# default 32-bit ABI, i386 on x86; 0x0800 x32, 0x0900 armhf).
ARCH_64BIT = frozenset({0x0300, 0x0500, 0x0A00})

_MAX_SYMLINK_HOPS = 40  # same bound as Linux's path walk


class LdCacheError(BinaryFormatError):
    """The cache is malformed; ``source`` and ``offset`` say where."""


class LdCacheEntry(NamedTuple):
    """One library in the cache: ``key`` is the name the loader looks up (the SONAME)."""

    key: str
    path: str
    flags: int
    osversion: int = 0
    hwcap: int = 0

    @property
    def arch_flag(self) -> int:
        return self.flags & FLAG_ARCH_MASK

    @property
    def is_64bit(self) -> bool:
        return self.arch_flag in ARCH_64BIT


def parse_ldcache(data: bytes, *, source: str = "<bytes>") -> list[LdCacheEntry]:
    """The entries of a whole cache file's bytes, in file order (the loader's preference
    order)."""
    base = _find_new_header(data, source)
    order, nlibs, strings_len, ext_offset = _read_new_header(data, base, source)
    entries_end = base + _NEW_HEADER_SIZE + nlibs * _NEW_ENTRY_SIZE
    strings_end = entries_end + strings_len
    for end, what in ((entries_end, f"{nlibs} entries"), (strings_end, "the string table")):
        if end > len(data):
            raise LdCacheError(f"truncated: {what} end at byte {end}, the file has {len(data)}",
                               source=source, offset=len(data))

    def string(rel: int, field_offset: int) -> str:
        """A NUL-terminated string at an offset from the new header, in the string table."""
        pos = base + rel
        if not entries_end <= pos < strings_end:
            raise LdCacheError(f"string offset {rel} outside the string table", source=source,
                               offset=field_offset)
        nul = data.find(b"\0", pos, strings_end)
        if nul < 0:
            raise LdCacheError("unterminated string", source=source, offset=pos)
        return os.fsdecode(data[pos:nul])

    entries = []
    for off in range(base + _NEW_HEADER_SIZE, entries_end, _NEW_ENTRY_SIZE):
        flags, key, value, osversion, hwcap = struct.unpack_from(order + "iIIIQ", data, off)
        entries.append(LdCacheEntry(key=string(key, off + 4), path=string(value, off + 8),
                                    flags=flags, osversion=osversion, hwcap=hwcap))
    if ext_offset:
        _check_extension(data, ext_offset, order, source)
    return entries


def read_ldcache(path: str | os.PathLike[str]) -> list[LdCacheEntry]:
    """Read and parse a cache file; I/O errors propagate as ``OSError``."""
    with open(path, "rb") as f:
        data = f.read()
    return parse_ldcache(data, source=os.fspath(path))


def _find_new_header(data: bytes, source: str) -> int:
    if data.startswith(NEW_MAGIC):
        return 0
    if not data.startswith(OLD_MAGIC):
        raise LdCacheError("bad magic: not an ld.so.cache", source=source, offset=0)
    if len(data) < _OLD_HEADER_SIZE:
        raise LdCacheError("truncated old-format header", source=source, offset=len(data))
    (old_nlibs,) = struct.unpack_from("<I", data, 12)
    # The new section is aligned like its header struct (which holds a u64): to 8 bytes.
    base: int = (_OLD_HEADER_SIZE + old_nlibs * _OLD_ENTRY_SIZE + 7) // 8 * 8
    if not data.startswith(NEW_MAGIC, base):
        raise LdCacheError(
            "old-format cache without a new-format section is not supported",
            source=source,
            offset=min(base, len(data)),
        )
    return base


def _read_new_header(data: bytes, base: int, source: str) -> tuple[str, int, int, int]:
    if len(data) < base + _NEW_HEADER_SIZE:
        raise LdCacheError("truncated new-format header", source=source, offset=len(data))
    endian = data[base + 28] & 3
    if endian == _ENDIAN_INVALID:
        raise LdCacheError("header marks the byte order invalid", source=source, offset=base + 28)
    # "unset" caches come from glibc < 2.33, which wrote host order; we assume little-endian.
    order = ">" if endian == _ENDIAN_BIG else "<"
    nlibs, strings_len = struct.unpack_from(order + "II", data, base + 20)
    (ext_offset,) = struct.unpack_from(order + "I", data, base + 32)
    return order, nlibs, strings_len, ext_offset


def _check_extension(data: bytes, pos: int, order: str, source: str) -> None:
    """Validate the extension directory (glibc >= 2.33; nothing of it is read).

    Unlike string offsets, extension offsets count from the start of the file (this is
    visible in compat-format caches, where the new header does not start at 0).
    """
    if pos + 8 > len(data):
        raise LdCacheError("truncated extension directory", source=source, offset=len(data))
    magic, count = struct.unpack_from(order + "II", data, pos)
    if magic != _EXTENSION_MAGIC:
        raise LdCacheError("bad extension magic", source=source, offset=pos)
    if pos + 8 + count * 16 > len(data):
        raise LdCacheError("truncated extension sections", source=source, offset=len(data))
    for i in range(count):
        sec = pos + 8 + i * 16
        _tag, _flags, offset, size = struct.unpack_from(order + "IIII", data, sec)
        if offset + size > len(data):
            raise LdCacheError(f"extension section {i} runs past the end", source=source,
                               offset=sec)


# --- lookup -------------------------------------------------------------------------------


def resolve_from(root: str, done: Sequence[str], rest: str,
                 hops: int = 0) -> tuple[list[str], int]:
    """Resolve ``rest`` as seen from inside ``root`` (a pathlib-normal string, as
    ``str(Path(...))``), like a chroot: absolute symlink targets restart at ``root`` and
    ``..`` never climbs above it, so a hostile driver root cannot make us read host files.
    Missing components are kept as they are (like ``realpath -m``); symlink loops raise
    ``OSError(ELOOP)``.

    ``done`` are the components resolved so far (none of them a link), ``rest`` the path
    still to walk and ``hops`` the links followed so far.  Returns the components of the
    result and the new hop count, so that a resolved folder can be remembered and a walk
    continued from it, giving what a walk from the top gives.
    """
    prefix = root if root.endswith("/") else root + "/"  # only "/" and "//" end in "/"
    resolved = list(done)
    todo = [p for p in reversed(rest.split("/")) if p]
    while todo:
        part = todo.pop()
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        resolved.append(part)
        candidate = prefix + "/".join(resolved)
        try:
            target = os.readlink(candidate)
        except OSError:  # not a link, or does not exist
            continue
        resolved.pop()
        hops += 1
        if hops > _MAX_SYMLINK_HOPS:
            raise OSError(errno.ELOOP, "too many levels of symbolic links", candidate)
        if target.startswith("/"):
            resolved.clear()
        todo.extend(p for p in reversed(target.split("/")) if p)
    return resolved, hops


def find_libraries(
    entries: Iterable[LdCacheEntry],
    patterns: str | Sequence[str],
    *,
    root: str | os.PathLike[str] = "/",
) -> list[Path]:
    """Host paths of the regular files that 64-bit cache entries matching ``patterns``
    point to.

    A pattern (``fnmatch`` glob) may match either the entry's own name (``libfoo.so.1``)
    or the basename at the end of its symlink chain (``libfoo.so.1.2.3``).  Results
    keep cache order and are de-duplicated; dangling entries are skipped.
    """
    import fnmatch  # lazy: it imports re, off the hook's start
    from pathlib import Path  # lazy: off the update-ldcache hook's start

    pats = (patterns,) if isinstance(patterns, str) else tuple(patterns)
    top = os.fspath(Path(root))
    # A cache lists a few folders many times: each is walked once, and a walk of
    # folder-then-name is the same walk as one over the whole path. On a node whose driver
    # is found only through the cache, walking every entry whole costs more than the rest
    # of ``nri-cdi generate``; pathlib is used only for the names that match.
    folders: dict[str, tuple[list[str], int]] = {}
    found: list[Path] = []
    for entry in entries:
        if not entry.is_64bit:
            continue
        folder, _, name = entry.path.rpartition("/")
        try:
            if folder not in folders:
                folders[folder] = resolve_from(top, (), folder)
            done, hops = folders[folder]
            parts, _ = resolve_from(top, done, name, hops)
        except OSError:
            continue
        names = (os.path.basename(entry.path), parts[-1] if parts else Path(top).name)
        if not any(fnmatch.fnmatchcase(n, p) for n in names for p in pats):
            continue
        resolved = Path(top).joinpath(*parts)
        if resolved not in found and resolved.is_file():  # EACCES propagates (pathlib's)
            found.append(resolved)
    return found


# --- writer -------------------------------------------------------------------------------
# Pure too: entries in, bytes out (the ``update-ldcache`` hook writes the result).
# Why write the cache ourselves instead of running ``ldconfig``: running the image's ldconfig
# executes image code with host privileges, and running the host's (even with ``-r ROOT``,
# which chroots) makes a general-purpose tool read every folder, config and symlink of an
# image that may be hostile (CVE-2025-23267 was ldconfig following such links).  The cache is
# a small, documented format; writing it from Python executes nothing from the image and
# follows no path but the ones :mod:`cdi.hooks.rootfs` resolved inside the root.
#
# Only the new format is written, which every glibc loader since 2.2 reads (layout above).
# The loader finds a name by binary search over entries sorted in *descending* order of
# glibc's version-aware name comparison (digit runs compare as numbers), and among entries
# with an equal name it takes the first whose flags and hwcaps fit, so entries that should
# win are placed first.

_HEADER = struct.Struct("<20sIIB3xI12x")  # magic+version, nlibs, strings, endian, ext offset
_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion, hwcap
# An hwcap value with these upper bits indexes the glibc-hwcaps extension section, which we
# do not write; such entries only name optimised copies of libraries listed anyway.
_HWCAP_EXTENSION = 1 << 62

assert _HEADER.size == _NEW_HEADER_SIZE and _ENTRY.size == _NEW_ENTRY_SIZE


def libcmp(a: bytes, b: bytes) -> int:
    """glibc's name order: byte-wise, except that runs of digits compare as numbers and a
    digit sorts after any other byte.  Returns <0, 0 or >0 like ``strcmp``."""
    i = j = 0
    while i < len(a):
        if 0x30 <= a[i] <= 0x39:
            if j >= len(b) or not 0x30 <= b[j] <= 0x39:
                return 1
            i2, j2 = _digits_end(a, i), _digits_end(b, j)
            diff = int(a[i:i2]) - int(b[j:j2])
            if diff:
                return diff
            i, j = i2, j2
        elif j < len(b) and 0x30 <= b[j] <= 0x39:
            return -1
        elif j >= len(b) or a[i] != b[j]:
            return a[i] - (b[j] if j < len(b) else 0)
        else:
            i, j = i + 1, j + 1
    return -(b[j] if j < len(b) else 0)


def _digits_end(s: bytes, i: int) -> int:
    while i < len(s) and 0x30 <= s[i] <= 0x39:
        i += 1
    return i


def merge(first: Iterable[LdCacheEntry], then: Iterable[LdCacheEntry]) -> list[LdCacheEntry]:
    """Entries in loader order: ``first`` wins over ``then`` for an equal name.

    Exact repeats (name, path, flags) are dropped, and so are entries that refer to the
    hwcaps extension (see ``_HWCAP_EXTENSION``).
    """
    seen: set[tuple[str, str, int]] = set()
    out: list[LdCacheEntry] = []
    for entry in (*first, *then):
        ident = (entry.key, entry.path, entry.flags)
        if ident in seen or entry.hwcap & _HWCAP_EXTENSION:
            continue
        seen.add(ident)
        out.append(entry)
    # sort() is stable, also with reverse=True, so equal names keep the order above.
    out.sort(key=lambda e: NameOrder(e.key), reverse=True)
    return out


class NameOrder:
    """Sort key of a library name in :func:`libcmp` order (``functools.cmp_to_key``
    without importing functools on the hook's start-up path)."""

    __slots__ = ("raw",)

    def __init__(self, name: str) -> None:
        self.raw = os.fsencode(name)

    def __lt__(self, other: NameOrder) -> bool:
        return libcmp(self.raw, other.raw) < 0


def encode(entries: Sequence[LdCacheEntry]) -> bytes:
    """A new-format cache holding ``entries`` in the order given (use :func:`merge`)."""
    strings = bytearray()
    offsets: dict[bytes, int] = {}
    base = _HEADER.size + len(entries) * _ENTRY.size

    def offset(s: str) -> int:
        raw = os.fsencode(s)
        if raw not in offsets:
            offsets[raw] = base + len(strings)
            strings.extend(raw + b"\0")
        return offsets[raw]

    table = b"".join(
        _ENTRY.pack(e.flags, offset(e.key), offset(e.path), e.osversion, e.hwcap)
        for e in entries
    )
    header = _HEADER.pack(NEW_MAGIC, len(entries), len(strings), _ENDIAN_LITTLE, 0)
    return header + table + bytes(strings)
