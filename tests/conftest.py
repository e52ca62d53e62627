from __future__ import annotations

import os

import pytest


@pytest.fixture
def need_root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("these tests make device nodes and must run as root in CI")
        pytest.skip("making device nodes needs root")
