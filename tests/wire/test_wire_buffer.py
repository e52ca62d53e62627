from __future__ import annotations

from nri_plugin.nri.wire._buffer import ReceiveBuffer


def test_take_returns_none_until_enough_bytes() -> None:
    buf = ReceiveBuffer()
    buf.feed(b"ab")
    assert buf.take(3) is None
    assert len(buf) == 2  # nothing consumed by a failed take
    buf.feed(b"c")
    assert buf.take(3) == b"abc"
    assert len(buf) == 0
    assert not buf


def test_take_at_most_and_trailing_bytes_survive() -> None:
    buf = ReceiveBuffer()
    buf.feed(b"0123456789")
    assert buf.take_at_most(4) == b"0123"
    assert buf.take_at_most(0) == b""
    assert buf.take(3) == b"456"
    assert buf.take_at_most(100) == b"789"
    assert buf.take_at_most(1) == b""


def test_compaction_keeps_content_correct() -> None:
    buf = ReceiveBuffer()
    expected = bytes(range(256)) * 40
    for i in range(0, len(expected), 7):
        buf.feed(expected[i : i + 7])
    out = bytearray()
    while chunk := buf.take_at_most(13):
        out += chunk
    assert bytes(out) == expected
    # the dead prefix was dropped instead of growing with the input
    assert len(buf._data) < 13
