"""A CRI recording read while the recorder still writes it (tests/e2e/cri_recorder.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.cri_recorder import read_recording


def test_a_line_not_yet_complete_is_left_for_the_next_read(tmp_path: Path) -> None:
    whole = json.dumps({"seq": 1, "method": "#mark", "code": "OK"})
    second = json.dumps({"seq": 2, "method": "#mark", "code": "OK", "message": "x" * 50})
    path = tmp_path / "cri.jsonl"
    path.write_text(whole + "\n" + second[:30])  # the buffer flushed half the second line
    assert [c.seq for c in read_recording(path)] == [1]
    path.write_text(whole + "\n" + second + "\n")
    assert [c.seq for c in read_recording(path)] == [1, 2]


def test_a_complete_line_that_is_not_a_call_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "cri.jsonl"
    path.write_text('{"seq": 1}\n')
    with pytest.raises(ValueError, match=r"cri.jsonl:1: not a CRI recording line"):
        read_recording(path)
