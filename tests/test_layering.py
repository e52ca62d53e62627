"""The protocol core and dispatch must not pull in asyncio or socket (style.md §6)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("asyncio", "socket")


@pytest.mark.parametrize(
    "module", ["nri_plugin.wire", "nri_plugin.dispatch", "nri_plugin.api", "nri_plugin"]
)
def test_pure_modules_import_no_io_machinery(module: str) -> None:
    code = (
        f"import sys, json, {module}; "
        f"print(json.dumps([m for m in {list(FORBIDDEN)!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


def test_wire_sources_do_not_import_os_socket_or_asyncio() -> None:
    for path in (ROOT / "nri_plugin" / "wire").glob("*.py"):
        text = path.read_text()
        for name in (*FORBIDDEN, "os"):
            assert f"import {name}\n" not in text, f"{path.name} imports {name}"
            assert f"from {name} " not in text, f"{path.name} imports from {name}"
