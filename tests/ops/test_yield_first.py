"""The daemon's deferred per-container work gives up the CPU once before it runs: the
runtime's thread that the reply woke may be queued on this CPU behind it."""

from __future__ import annotations

import os

import pytest

from nri_plugin.ops.daemon import _yield_first


def test_the_deferred_work_runs_after_one_yield(monkeypatch: pytest.MonkeyPatch) -> None:
    steps: list[str] = []
    real_yield = os.sched_yield

    def recorded_yield() -> None:
        steps.append("yield")
        real_yield()

    monkeypatch.setattr(os, "sched_yield", recorded_yield)
    _yield_first(lambda: steps.append("log line"))
    assert steps == ["yield", "log line"]
