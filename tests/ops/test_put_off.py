"""The daemon's put-off per-container work (``PutOff``): run once the replies are written,
after giving up the CPU once (the runtime's thread that the reply woke may be queued on
this CPU behind it); one failing call does not lose the others."""

from __future__ import annotations

import logging
import os

import pytest

from nri_plugin.ops.daemon import PutOff


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    recorded: list[str] = []
    real_yield = os.sched_yield

    def recorded_yield() -> None:
        recorded.append("yield")
        real_yield()

    monkeypatch.setattr(os, "sched_yield", recorded_yield)
    return recorded


def test_the_put_off_work_runs_after_one_yield_in_order(steps: list[str]) -> None:
    put_off = PutOff()
    put_off.later(lambda: steps.append("line 1"))
    put_off.later(lambda: steps.append("line 2"))
    assert steps == []  # nothing runs before the replies are out
    put_off.run()
    assert steps == ["yield", "line 1", "line 2"]
    put_off.run()  # each call once; nothing left, so no yield either
    assert steps == ["yield", "line 1", "line 2"]


def test_a_failing_call_is_logged_and_the_others_run(
        steps: list[str], caplog: pytest.LogCaptureFixture) -> None:
    put_off = PutOff()

    def broken() -> None:
        raise ValueError("formatting bug")

    put_off.later(broken)
    put_off.later(lambda: steps.append("next line"))
    with caplog.at_level(logging.ERROR):
        put_off.run()
    assert steps == ["yield", "next line"]
    assert "work put off past a reply failed" in caplog.text
    assert "formatting bug" in caplog.text
