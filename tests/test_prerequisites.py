"""The one skip-or-fail rule (tests/prerequisites.py): skipped outside CI, failed under it."""

from __future__ import annotations

import pytest

from tests.prerequisites import missing


def test_outside_ci_a_missing_prerequisite_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"^no helm \(bash x\.sh\)$"):
        missing("the chart's tests", "no helm (bash x.sh)")


def test_under_ci_a_missing_prerequisite_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception,
                       match=r"^CI is set, the chart's tests must not be skipped: no helm"):
        missing("the chart's tests", "no helm (bash x.sh)")
