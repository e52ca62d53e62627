"""Feed bytes three ways: whole, byte by byte, with trailing bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Feeder = Callable[[bytes], list[Any]]


def whole(feed: Feeder, data: bytes) -> list[Any]:
    return list(feed(data))


def bytewise(feed: Feeder, data: bytes) -> list[Any]:
    """Every byte but the last must produce nothing new for a single item."""
    out: list[Any] = []
    for i in range(len(data)):
        out.extend(feed(data[i : i + 1]))
    return out


def chunked(feed: Feeder, data: bytes, size: int) -> list[Any]:
    out: list[Any] = []
    for i in range(0, len(data), size):
        out.extend(feed(data[i : i + size]))
    return out
