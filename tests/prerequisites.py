"""The one rule for a test whose prerequisites are missing: skipped, saying what is missing
and how to get it, except under CI (``CI`` set), where nothing may be skipped silently and
the test fails with the same words."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(what: str, reason: str) -> NoReturn:
    """Skip the calling test (fail it under CI): ``what`` names the tests, ``reason`` what
    they lack and the command that installs it."""
    if os.environ.get("CI"):
        pytest.fail(f"CI is set, {what} must not be skipped: {reason}", pytrace=False)
    pytest.skip(reason)
