"""Receive buffers: a ``bytearray`` fed at the end and consumed from the front, which
CPython does in O(bytes consumed) (it moves the array's start instead of its content)."""

from __future__ import annotations


def take(buffer: bytearray, n: int) -> bytes | None:
    """Consume exactly ``n`` bytes from the front, or return ``None`` (need more data)."""
    if len(buffer) < n:
        return None
    chunk = bytes(buffer[:n])
    del buffer[:n]
    return chunk
