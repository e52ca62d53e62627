"""One version: pyproject.toml's. Every copy that cannot read it (the chart's version and
appVersion, the generator's GENERATOR_VERSION, the image and wheel names in the docs'
commands) equals it, CHANGELOG.md's newest version heading is it, with the changes since
under [Unreleased]; and scripts/release.py, the release step (docs/developer/releasing.md),
moves them all together."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


def _release() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release", REPO / "scripts" / "release.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


release = _release()


def _headings(root: Path) -> list[str]:
    return re.findall(r"^## \[([^\]]+)\]", (root / "CHANGELOG.md").read_text(), re.M)


def _named_versions(root: Path) -> dict[str, set[str]]:
    """file -> the versions its commands name (image tag, wheel)."""
    out = {}
    for path in release.doc_files(root):
        text = path.read_text()
        found = set(re.findall(r"nri-cdi:(\d+\.\d+\.\d+\S*?)\b(?![.\d])", text))
        found |= set(re.findall(r"nri_cdi-(\d+\.\d+\.\d+[^-]*)-py3", text))
        if found:
            out[str(path.relative_to(root))] = found
    return out


def _inconsistencies(root: Path) -> list[str]:
    version = release.current_version(root)
    problems = []
    for name, pattern in release.COPIES:
        if not re.search(pattern.format(v=re.escape(version)), (root / name).read_text(),
                         re.M):
            problems.append(f"{name}: not {pattern.format(v=version)}")
    for name, versions in _named_versions(root).items():
        if versions != {version}:
            problems.append(f"{name}: names {', '.join(sorted(versions))}")
    headings = _headings(root)
    if headings[:1] != ["Unreleased"]:
        problems.append("CHANGELOG.md: the first heading is not [Unreleased]")
    released = [h for h in headings if h != "Unreleased"]
    if released[:1] != [version]:
        problems.append(f"CHANGELOG.md: the newest version is {released[:1]}, not {version}")
    return problems


def test_every_copy_of_the_version_is_pyprojects() -> None:
    assert _named_versions(REPO), "the docs name no image or wheel: the pattern is stale"
    assert _inconsistencies(REPO) == []


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    names = [n for n, _ in release.COPIES] + ["CHANGELOG.md"]
    names += [str(p.relative_to(REPO)) for p in release.doc_files(REPO)]
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, root / name)
    return root


def test_the_release_step_moves_every_copy_and_the_changelog(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    old = release.current_version(root)
    unreleased = (root / "CHANGELOG.md").read_text().split("## [Unreleased]\n", 1)[1]
    assert release.main(["99.1.0", "--date", "2030-01-02", "--root", str(root)]) == 0
    assert release.current_version(root) == "99.1.0"
    assert _inconsistencies(root) == []
    assert _headings(root)[:3] == ["Unreleased", "99.1.0", old]
    text = (root / "CHANGELOG.md").read_text()
    # the entries that were unreleased are the new version's; [Unreleased] is empty
    assert text.split("## [99.1.0] - 2030-01-02\n", 1)[1] == unreleased
    assert "## [Unreleased]\n\n## [99.1.0]" in text
    assert "registry.example.com/nri-cdi:99.1.0" in (root / "README.md").read_text()


@pytest.mark.parametrize("version, words", [
    ("1.2", "is not a version"),
    (None, "already"),
])
def test_the_release_step_refuses_what_is_no_release(tmp_path: Path, version: str | None,
                                                     words: str,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    root = _copy(tmp_path)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    new = version or release.current_version(root)
    assert release.main([new, "--root", str(root)]) == 1
    assert words in capsys.readouterr().err
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_nothing_unreleased_is_no_release(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    root = _copy(tmp_path)
    assert release.main(["99.1.0", "--root", str(root)]) == 0
    assert release.main(["99.2.0", "--root", str(root)]) == 1
    assert "nothing under '## [Unreleased]'" in capsys.readouterr().err
