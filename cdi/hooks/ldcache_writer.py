"""Encode glibc's ``ld.so.cache`` (pure: entries in, bytes out).

Why write the cache ourselves instead of running ``ldconfig``: running the image's ldconfig
executes image code with host privileges, and running the host's (even with ``-r ROOT``,
which chroots) makes a general-purpose tool read every folder, config and symlink of an
image that may be hostile (CVE-2025-23267 was ldconfig following such links).  The cache is
a small, documented format; writing it from Python executes nothing from the image and
follows no path but the ones :mod:`cdi.hooks.rootfs` resolved inside the root.

Format facts used here (the reader in :mod:`cdi.linux.ldcache` documents them in full):
only the "new" format is written, which every glibc loader since 2.2 reads; it is
a 48-byte header, 24-byte entries, then the NUL-terminated strings; string offsets count
from the header.  The loader finds a name by binary search over entries sorted in
*descending* order of glibc's version-aware name comparison (digit runs compare as
numbers), and among entries with an equal name it takes the first whose flags and hwcaps
fit, so entries that should win are placed first.
"""

from __future__ import annotations

import os
import struct

from cdi.linux.ldcache import NEW_MAGIC, LdCacheEntry

TYPE_CHECKING = False  # collections costs a hook process ~2 ms at start-up
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = ["encode", "libcmp", "merge", "uses_hwcaps_extension"]

_HEADER = struct.Struct("<20sIIB3xI12x")  # magic+version, nlibs, strings, endian, ext offset
_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion, hwcap
_ENDIAN_LITTLE = 2  # glibc >= 2.33 checks this byte; older loaders ignore it
# An hwcap value with these upper bits indexes the glibc-hwcaps extension section, which we
# do not write; such entries only name optimised copies of libraries listed anyway.
_HWCAP_EXTENSION = 1 << 62

assert _HEADER.size == 48 and _ENTRY.size == 24


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


def uses_hwcaps_extension(entry: LdCacheEntry) -> bool:
    return bool(entry.hwcap & _HWCAP_EXTENSION)


def merge(first: Iterable[LdCacheEntry], then: Iterable[LdCacheEntry]) -> list[LdCacheEntry]:
    """Entries in loader order: ``first`` wins over ``then`` for an equal name.

    Exact repeats (name, path, flags) are dropped, and so are entries that refer to the
    hwcaps extension (see ``_HWCAP_EXTENSION``).
    """
    seen: set[tuple[str, str, int]] = set()
    out: list[LdCacheEntry] = []
    for entry in (*first, *then):
        ident = (entry.key, entry.path, entry.flags)
        if ident in seen or uses_hwcaps_extension(entry):
            continue
        seen.add(ident)
        out.append(entry)
    # sort() is stable, also with reverse=True, so equal names keep the order above.
    out.sort(key=lambda e: _NameKey(os.fsencode(e.key)), reverse=True)
    return out


class _NameKey:
    """Sort key in :func:`libcmp` order (``functools.cmp_to_key`` without importing
    functools, which costs a hook process about 3 ms at start-up)."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def __lt__(self, other: _NameKey) -> bool:
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
