"""bench/trace_containerd.py's reading of a real perf record (tests/data/perf-trace-*)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.trace_containerd import create_timings, events

RECORD = Path(__file__).parent / "data" / "perf-trace-containerd-1.7" / "perf-script.txt"
PYTHON_PLUGINS = (20855, 20864)
GO_PLUGIN = 20868


@pytest.fixture(scope="module")
def script() -> str:
    return RECORD.read_text()


def _replies(script: str, pid: int) -> list[tuple[float, float]]:
    """(request read, reply write) of each adjusted CreateContainer of a Python plugin,
    read straight off the lines: a recvfrom returning over 1000 bytes, then a sendto of
    190 (0xbe) bytes."""
    read_at: float | None = None
    found = []
    for line in script.splitlines():
        if f" {pid}/{pid} " not in line:
            continue
        at = float(re.search(r"\]\s+([\d.]+):", line).group(1))  # type: ignore[union-attr]
        if (m := re.search(r"sys_exit: NR 45 = (\d+)", line)) and int(m.group(1)) > 1000:
            read_at = at
        elif re.search(r"sys_enter: NR 44 \(\w+, \w+, be,", line) and read_at is not None:
            found.append((read_at, at))
            read_at = None
    return found


@pytest.mark.parametrize("pid", PYTHON_PLUGINS)
def test_each_adjusted_create_of_a_python_plugin_is_found_with_its_times(
        script: str, pid: int) -> None:
    timings = create_timings(events(script, pid))
    expected = _replies(script, pid)
    assert len(expected) >= 5
    assert [round(t.read_to_reply, 1) for t in timings] == [
        round((reply - read) * 1e6, 1) for read, reply in expected]
    # RemoveContainer requests are as large, and are answered with 18 bytes: left out.
    removes = len(re.findall(rf" {pid}/{pid} .*sys_enter: NR 44 \(\w+, \w+, 12,", script))
    assert removes >= 5


def test_the_go_plugin_reads_a_header_first_and_answers_in_two_writes(script: str) -> None:
    timings = create_timings(events(script, GO_PLUGIN))
    payload_reads = [int(size) for size in re.findall(
        rf" {GO_PLUGIN}/\d+ .*sys_exit: NR 0 = (\d+)$", script, re.MULTILINE)
        if int(size) > 1000]
    assert len(timings) == len(payload_reads) == 6


@pytest.mark.parametrize("pid", (*PYTHON_PLUGINS, GO_PLUGIN))
def test_the_wake_comes_before_the_read_and_the_read_before_the_reply(
        script: str, pid: int) -> None:
    for timing in create_timings(events(script, pid)):
        assert 0 <= timing.wake_to_read < 2000
        assert 0 < timing.read_to_reply < 5000
        assert timing.wake_to_reply == pytest.approx(timing.wake_to_read + timing.read_to_reply)
