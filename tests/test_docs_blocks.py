"""The documentation's command blocks are all accounted for: every shell block of the tested
pages is marked (run on the simulated node, or skipped with a reason), and every command of
the README's quick starts is one a tested page runs or marks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.doc_blocks import KINDS, ROOT, TESTED_PAGES, blocks, commands, expected_pattern

PROBE = "probe" + ".md"  # a page of the test's own, in a temporary folder


@pytest.mark.parametrize("page", TESTED_PAGES)
def test_every_shell_block_is_marked(page: str) -> None:
    shell = [b for b in blocks(page) if b.language == "sh"]
    assert shell, f"{page}: no shell block"
    assert [b.where for b in shell if b.kind not in KINDS] == []
    assert [b.where for b in shell if b.kind in ("real-node", "skip") and not b.reason] == []
    assert [b.where for b in shell if b.kind == "nvidia-smi"] == []


def test_the_quick_starts_end_with_an_expected_nvidia_smi_output() -> None:
    for page in ("docs/get-started/systemd.md", "docs/get-started/kubernetes.md"):
        expected = [b for b in blocks(page) if b.kind == "nvidia-smi"]
        assert len(expected) == 1 and expected[0].language == "text", page
        assert expected_pattern(expected[0].text).match(
            "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-970392d6-a829-4d12-b74d-94ad7449a639)")


def test_the_readme_runs_only_commands_the_tested_pages_have() -> None:
    # The README's quick starts are a digest of the pages': each of its commands is one of
    # theirs, so running the pages runs (or names the reason for not running) the README's.
    documented = {c for page in TESTED_PAGES for b in blocks(page) if b.language == "sh"
                  for c in commands(b.text)}
    readme = [c for b in blocks("README.md") if b.language == "sh"
              for c in commands(b.text)]
    assert readme and [c for c in readme if c not in documented
                       and c != "bash scripts/test.sh"] == []
    assert "bash scripts/test.sh" in (ROOT / "docs/developer/index.md").read_text()


def test_an_unmarked_block_is_found(tmp_path: Path) -> None:
    (tmp_path / PROBE).write_text(
        "# probe\n\n```sh\nnri-cdi list\n```\n\n<!-- doc-test: sim -->\n```sh\nx\n```\n")
    found = blocks(PROBE, root=tmp_path)
    assert [(b.kind, b.text) for b in found] == [(None, "nri-cdi list\n"), ("sim", "x\n")]
