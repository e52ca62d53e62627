from __future__ import annotations

from nri_plugin.nri.wire._mux import take


def test_take_returns_none_until_enough_bytes() -> None:
    buf = bytearray(b"ab")
    assert take(buf, 3) is None
    assert len(buf) == 2  # nothing consumed by a failed take
    buf += b"c"
    assert take(buf, 3) == b"abc"
    assert len(buf) == 0
    assert not buf


def test_takes_and_feeds_in_any_order_keep_the_stream() -> None:
    buf = bytearray()
    expected = bytes(range(256)) * 40
    out = bytearray()
    for i in range(0, len(expected), 7):
        buf += expected[i : i + 7]
        while (chunk := take(buf, 13)) is not None:
            out += chunk
    assert take(buf, 0) == b""
    assert bytes(out + buf) == expected
