"""Every document the repository cites is in it, and no file points outside it.

A reader must be able to follow each reference: ``docs/X.md §N`` names a file of this
repository and a section it has; ``README, "Section"`` names one of the README's headings
and ``docs/X.md, "Section"`` one of that page's;
a ``*.md`` named anywhere exists (from the repository root or the citing file's folder);
and no file names a path outside the checkout (the team's folders, someone's home).
"""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".sh", ".yaml", ".yml", ".conf", ".service", ".path",
                 ".txt", ".c", ".cfg", ".ini", ""}
# docs/X.md followed by one or more section numbers: "docs/x.md §1.2, §3"
SECTION_CITE = re.compile(r"(docs/[\w./-]+\.md)((?:,?\s+(?:and\s+)?§[\d.]*\d)+)")
SECTION = re.compile(r"§([\d.]*\d)")
README_CITE = re.compile(r"README(?:,|'s)\s+\"([^\"]+)\"")
# a page of the documentation site and one of its headings: docs/usage/policy.md, "Requirements"
DOC_CITE = re.compile(r"(docs/[\w./-]+\.md),\s+\"([^\"]+)\"")
MARKDOWN_NAME = re.compile(r"(?<![\w.-])((?:\.\.?/)?[\w./-]*[\w-]\.md)\b")
OUTSIDE = re.compile(r"/work/|\.\./shared|[\"']shared[\"']\s*/|/home/|shared/(?:docs|peers)")


@functools.cache
def files() -> tuple[Path, ...]:
    """The repository's text files (tracked, or new and not ignored)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return tuple(ROOT / name for name in listed
                 if Path(name).suffix in TEXT_SUFFIXES and (ROOT / name).is_file())


def text(path: Path) -> str:
    try:
        return path.read_text()
    except UnicodeDecodeError:
        return ""


def sections(doc: Path) -> set[str]:
    """The numbers of a document's numbered headings: "## 3. X" → 3, "### 3.4 Y" → 3.4."""
    return {m.group(1) for m in re.finditer(r"^#+ (\d+(?:\.\d+)*)\.? ", text(doc), re.M)}


def headings(doc: Path) -> list[str]:
    body = text(doc)
    return [*re.findall(r"^#+ (.+)$", body, re.M), *re.findall(r"\*\*([^*]+?)\.?\*\*", body)]


def section_problems(path: Path, body: str) -> list[str]:
    problems = []
    cited = 0
    for match in SECTION_CITE.finditer(body):
        doc = ROOT / match.group(1)
        numbers = SECTION.findall(match.group(2))
        cited += len(numbers)
        if not doc.is_file():
            problems.append(f"{match.group(0)}: no {match.group(1)} in the repository")
            continue
        problems += [f"{match.group(1)} has no §{n}" for n in numbers if n not in sections(doc)]
    if ROOT / "docs" in path.parents:  # a document's bare "§N" is one of its own sections
        own = SECTION.findall(SECTION_CITE.sub("", body))
        cited += len(own)
        problems += [f"no §{n} in this document" for n in own if n not in sections(path)]
    if body.count("§") != cited:
        problems.append(f"{body.count('§') - cited} '§' not after a docs/*.md path")
    return problems


def readme_problems(body: str) -> list[str]:
    known = headings(ROOT / "README.md")
    cited = (" ".join(name.split()) for name in README_CITE.findall(body))
    return [f'README has no section "{name}"' for name in cited
            if not any(h.startswith(name) for h in known)]


def doc_heading_problems(body: str) -> list[str]:
    problems = []
    for page, name in DOC_CITE.findall(body):
        name = " ".join(re.sub(r"\n\s*#", " ", name).split())  # a name may span comment lines
        if not (ROOT / page).is_file():
            problems.append(f'{page}: no such page (cited for "{name}")')
        elif not any(h.startswith(name) for h in headings(ROOT / page)):
            problems.append(f'{page} has no section "{name}"')
    return problems


def markdown_problems(path: Path, body: str) -> list[str]:
    names = {m.group(1) for m in MARKDOWN_NAME.finditer(body)}
    # a page of the documentation site may be named from the site's folder or a section's
    # (mkdocs.yml's nav, one page's link to another, the pages' generator)
    folders = [ROOT, path.parent, ROOT / "docs", *(d for d in (ROOT / "docs").iterdir()
                                                   if d.is_dir())]
    return [f"{name}: no such document in the repository" for name in sorted(names)
            if not any((folder / name).is_file() for folder in folders)]


def problems_of(path: Path) -> list[str]:
    body = text(path)
    if path == Path(__file__):  # this file names what it looks for
        return []
    found = [*section_problems(path, body), *readme_problems(body),
             *doc_heading_problems(body), *markdown_problems(path, body)]
    found += [f"line {body.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r} is outside "
              "the repository" for m in OUTSIDE.finditer(body)]
    return [f"{path.relative_to(ROOT)}: {p}" for p in found]


def test_every_citation_resolves_inside_the_repository() -> None:
    assert [p for path in files() for p in problems_of(path)] == []


@pytest.mark.parametrize(("snippet", "expected"), [
    ("see style.md §2", "not after a docs/*.md path"),
    ("(§3.4)", "not after a docs/*.md path"),
    ("docs/developer/nri-protocol.md §9.9", "has no §9.9"),
    ("docs/absent.md §1", "no docs/absent.md"),
    ('README, "No such section"', "README has no section"),
    ('docs/usage/policy.md, "No such section"', "has no section"),
    ('docs/absent.md, "Anything"', "no such page"),
    ("facts: /work/shared/docs/e2e-containerd.md", "outside the repository"),
    ('PEERS = REPO.parent / "shared" / "peers"', "outside the repository"),
    ("see anchors.md", "anchors.md: no such document"),
])
def test_the_check_catches_each_kind(tmp_path: Path, snippet: str, expected: str) -> None:
    # A check that cannot fail is no check: each kind of bad reference is reported.
    path = ROOT / "tests" / "_citation_probe.py"
    path.write_text(f"# {snippet}\n")
    try:
        assert any(expected in p for p in problems_of(path)), problems_of(path)
    finally:
        path.unlink()


def test_the_docs_the_code_relies_on_are_here() -> None:
    for name in ("architecture.md", "nri-protocol.md", "hook-safety.md"):
        assert (ROOT / "docs" / "developer" / name).is_file(), name
    assert {"1.1", "2.4", "3.4", "3.5", "5.1", "6"} <= sections(
        ROOT / "docs/developer/nri-protocol.md")
