"""The product carries only the product: the wheel holds no test bed, and the command's
start-up imports none of it (``doctor --e2e`` imports it when asked, from a checkout; an
installed one says so in one line)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``pip wheel CHECKOUT`` builds, from a copy of what pip sees of the checkout
    (tracked files and new ones git does not ignore): setuptools writes build/ and
    *.egg-info into the source folder."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs the git checkout to list its files")
    work = tmp_path_factory.mktemp("wheel")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (work / "src" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, work / "src" / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(work / "dist"),
                    str(work / "src")], check=True, capture_output=True, cwd=work, timeout=300)
    (built,) = (work / "dist").glob("nri_cdi-*.whl")
    return built


def test_the_wheel_carries_no_test_bed(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "nri_plugin/ops/cli.py" in names and "cdi/nvidia/cli.py" in names  # the control
    assert [n for n in names if n.startswith("nri_cdi_testbed") or n.endswith(".c")] == []


def test_an_installed_doctor_e2e_says_in_one_line_where_the_test_bed_is(
        wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--no-compile", "--target", str(site), str(wheel)], check=True,
                   capture_output=True, timeout=300)
    assert (site / "nri_plugin" / "ops" / "doctor.py").is_file()  # the control
    done = subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "doctor", "--e2e"],
                          capture_output=True, text=True, check=False, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(site)}, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "nri-cdi doctor --e2e: needs the test bed (nri_cdi_testbed), which the installed "
        "package does not carry: run `python3 -m nri_plugin.ops.cli doctor --e2e` in a "
        "checkout of the nri-cdi repository"]
    # Plain doctor (the quick start's `kubectl exec ds/nri-cdi -c plugin -- nri-cdi
    # doctor`) runs its checks: it once died importing the test bed the image lacks.
    checks = subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "doctor", "--json",
                             "--no-generate"], capture_output=True, text=True, check=False,
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)},
                            timeout=120)
    assert "Error" not in checks.stderr and "Traceback" not in checks.stderr, checks.stderr
    assert isinstance(json.loads(checks.stdout), (dict, list)), checks.stdout


def _imported_by(argv: list[str]) -> set[str]:
    """The modules loaded by ``nri-cdi ARGV`` (its entry, run as the console script runs)."""
    code = ("import sys\nsys.argv = ['nri-cdi', *sys.argv[1:]]\n"
            "from nri_plugin.ops.cli import entry\n"
            "try:\n    entry()\nexcept SystemExit:\n    pass\n"
            "print('\\n'.join(sys.modules), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    return set(done.stderr.split())


def test_the_command_and_its_help_import_no_test_bed() -> None:
    for argv in (["--help"], ["doctor", "--help"]):
        modules = _imported_by(argv)
        assert "nri_plugin.ops.doctor" in modules  # the control: doctor's parser was built
        assert sorted(m for m in modules if m.startswith("nri_cdi_testbed")) == []

