"""The error base of the binary-format readers (ld.so.cache, ELF)."""

from __future__ import annotations


class BinaryFormatError(Exception):
    """A malformed binary file; ``source`` and ``offset`` say where."""

    def __init__(self, message: str, *, source: str = "<bytes>", offset: int | None = None):
        self.source = source
        self.offset = offset
        where = source if offset is None else f"{source}: offset {offset}"
        super().__init__(f"{where}: {message}")
