"""Move nri-cdi to a new version, in every place that names it (docs/developer/releasing.md).

    python3 scripts/release.py 0.2.0 [--date 2026-12-01]

The version's one source is pyproject.toml's ``version``: ``nri-cdi --version`` reads the
installed package's metadata. The copies that cannot read it are moved with it, and tests
check each equals it: the chart's ``version`` and ``appVersion`` (the default image tag,
and the pod template's labels, so an upgrade to the new chart rolls the pods), the
generator's ``GENERATOR_VERSION`` (read without importlib.metadata, for its start-up), and
the image and wheel names in the README's and the docs' commands. CHANGELOG.md's
``[Unreleased]`` entries become the new version's, under a fresh, empty ``[Unreleased]``.

Nothing is committed or tagged: the page says what to run after.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEMVER = re.compile(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?")
# The version's copies, each (file, pattern with the version as {v}), all relative to the
# repository; the docs' commands are found by their own patterns below.
COPIES = (
    ("pyproject.toml", r'^version = "{v}"$'),
    ("deploy/helm/nri-cdi/Chart.yaml", r"^version: {v}$"),
    ("deploy/helm/nri-cdi/Chart.yaml", r'^appVersion: "{v}"$'),
    ("cdi/nvidia/generate.py", r'^GENERATOR_VERSION = "{v}"$'),
)
# The image tag and the wheel's name in commands the docs show.
NAMES = (r"nri-cdi:{v}\b", r"nri_cdi-{v}-py3")
DOC_FILES = ("README.md", "deploy/kubernetes/README.md", "docs/**/*.md")
UNRELEASED = "## [Unreleased]"


class ReleaseError(Exception):
    pass


def current_version(root: Path) -> str:
    text = (root / "pyproject.toml").read_text()
    match = re.search(r'^version = "([^"]+)"$', text, re.M)
    if match is None:
        raise ReleaseError("pyproject.toml: no version line")
    return match[1]


def doc_files(root: Path) -> list[Path]:
    return sorted({p for pattern in DOC_FILES for p in root.glob(pattern) if p.is_file()})


def _replace(path: Path, pattern: str, old: str, new: str, *, count: int = 0) -> int:
    text = path.read_text()
    regex = re.compile(pattern.format(v=re.escape(old)), re.M)
    found = len(regex.findall(text))
    if found:
        path.write_text(regex.sub(lambda m: m[0].replace(old, new), text, count=count))
    return found


def release(root: Path, version: str, date: str) -> list[str]:
    """Move every copy to ``version``; what was changed, one line each."""
    if not SEMVER.fullmatch(version):
        raise ReleaseError(f"{version!r} is not a version (MAJOR.MINOR.PATCH)")
    old = current_version(root)
    if version == old:
        raise ReleaseError(f"the version is {old} already")
    changelog = root / "CHANGELOG.md"
    text = changelog.read_text()
    head, sep, rest = text.partition(UNRELEASED + "\n")
    if not sep:
        raise ReleaseError(f"CHANGELOG.md has no '{UNRELEASED}' heading")
    entries = rest.split("\n## [", 1)[0]
    if not entries.strip():
        raise ReleaseError(f"CHANGELOG.md: nothing under '{UNRELEASED}' to release")
    for name, pattern in COPIES:  # all found before anything is written
        regex = re.compile(pattern.format(v=re.escape(old)), re.M)
        if len(regex.findall((root / name).read_text())) != 1:
            raise ReleaseError(f"{name}: not one line {pattern.format(v=old)!r}")
    done = []
    for name, pattern in COPIES:
        _replace(root / name, pattern, old, version, count=1)
        done.append(f"{name}: {old} -> {version}")
    for path in doc_files(root):
        found = sum(_replace(path, pattern, old, version) for pattern in NAMES)
        if found:
            done.append(f"{path.relative_to(root)}: {found} command(s)")
    changelog.write_text(f"{head}{UNRELEASED}\n\n## [{version}] - {date}\n{rest}")
    done.append(f"CHANGELOG.md: the [Unreleased] entries are [{version}] - {date}")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", help="the new version, MAJOR.MINOR.PATCH")
    parser.add_argument("--date", default=datetime.date.today().isoformat(),
                        help="the release date in CHANGELOG.md (default: today)")
    parser.add_argument("--root", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        done = release(args.root, args.version, args.date)
    except (ReleaseError, OSError) as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    print("\n".join(done))
    print("next: python3 -m tests.helm (deploy/kubernetes), the tests, one commit, "
          f"git tag v{args.version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
