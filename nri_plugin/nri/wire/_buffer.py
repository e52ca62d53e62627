"""A receive buffer that consumes in O(bytes consumed) (h11's idea)."""

from __future__ import annotations


class ReceiveBuffer:
    """Bytes received but not yet parsed: a ``bytearray`` plus a read offset."""

    __slots__ = ("_data", "_start")

    def __init__(self) -> None:
        self._data = bytearray()
        self._start = 0

    def __len__(self) -> int:
        return len(self._data) - self._start

    def __bool__(self) -> bool:
        return len(self._data) > self._start

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._data += data

    def take(self, n: int) -> bytes | None:
        """Consume exactly ``n`` bytes, or return ``None`` (need more data)."""
        return self.take_at_most(n) if len(self) >= n else None

    def take_at_most(self, n: int) -> bytes:
        """Consume up to ``n`` bytes (possibly none)."""
        n = min(n, len(self))
        chunk = bytes(self._data[self._start : self._start + n])
        self._consume(n)
        return chunk

    def _consume(self, n: int) -> None:
        self._start += n
        # Compact once the dead prefix dominates, so each byte is moved O(1) times
        # on average instead of on every take.
        if self._start > len(self._data) // 2:
            del self._data[: self._start]
            self._start = 0
