"""The documentation site: it builds with ``mkdocs build --strict`` (every link and anchor
resolves, every page is in the nav), its generated reference pages are what the code gives
today, the README stays short, and user pages carry no dates or history."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.prerequisites import missing

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# Pages for the operator: the developer guide and the changelog may speak of history.
USER_PAGES = sorted(p for p in DOCS.rglob("*.md") if "developer" not in p.parts)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
HISTORY = re.compile(r"before this change|this session|(first|second|third) session|"
                     r"(this|last) (morning|evening|night)", re.I)


def _mkdocs_or_skip() -> None:
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
    except ImportError as exc:
        missing("the docs build", f"the docs extra is not installed: {exc} "
                "(pip install -e '.[docs]')")


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    _mkdocs_or_skip()
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, check=False)
    warnings = [line for line in done.stderr.splitlines() if not line.startswith("INFO")]
    assert done.returncode == 0, "\n".join(warnings)
    # the snippets a page includes from deploy/ arrive verbatim
    page = (tmp_path / "site" / "install" / "containerd" / "index.html").read_text()
    assert "disable_connections" in page


def test_the_reference_pages_are_what_the_code_gives() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "docs_reference.py"),
                           "--check"], cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr


def test_the_cli_reference_has_every_command() -> None:
    from nri_plugin.ops.cli import COMMANDS

    page = (DOCS / "reference" / "cli.md").read_text()
    assert [c for c in COMMANDS if f"## `nri-cdi {c}`" not in page] == []


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert 100 <= lines <= 150, f"README.md has {lines} lines (100-150)"


@pytest.mark.parametrize("page", [ROOT / "README.md", *USER_PAGES],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_user_pages_carry_no_dates_or_history(page: Path) -> None:
    text = page.read_text()
    assert DATE.findall(text) == [] and HISTORY.findall(text) == []


def test_the_history_check_can_fail() -> None:
    assert DATE.search("measured on 2026-11-26") and HISTORY.search("Before this change the")
