"""tests/e2e/binfmt.py against the real kernel: qemu-aarch64 registered for the time of the
``with`` and gone after, its registration line the package's own; and the reason a
machine refuses, which is what the arm64 tests skip with."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests import arm64
from tests.e2e import binfmt


def test_the_package_line_selects_aarch64_programs() -> None:
    parts = arm64.parts()
    magic, mask = binfmt.parse_line(parts.binfmt_line.read_text())
    # ELF, 64-bit, little-endian, e_machine 183 (0xb7): the aarch64 header's bytes.
    assert magic.startswith("7f454c460201") and magic.endswith("b700")
    assert len(magic) == len(mask) == 40
    with pytest.raises(ValueError, match="not a magic-type"):
        binfmt.parse_line(":x:E::py::/usr/bin/python3:")


def test_a_handler_of_the_system_comes_before_ours() -> None:
    def handler(name: str, flags: str = "F", enabled: bool = True) -> binfmt.Handler:
        return binfmt.Handler(name, enabled, f"/usr/bin/{name}", flags, "ab", "ff")

    ours = handler(f"{binfmt.OUR_PREFIX}1")
    assert binfmt.aarch64_handler([ours, handler("qemu-aarch64")], "ab", "ff") == handler(
        "qemu-aarch64")
    assert binfmt.aarch64_handler([ours, handler("x", enabled=False)], "ab", "ff") == ours
    assert binfmt.aarch64_handler([handler("y")], "cd", "ff") is None


def test_registered_for_the_with_and_gone_after(e2e_ready: None) -> None:
    parts = arm64.parts()
    try:
        with binfmt.registered(parts.qemu, parts.binfmt_line) as handler:
            ran = subprocess.run([str(parts.busybox), "uname", "-m"], capture_output=True,
                                 text=True, check=False)
            assert ran.stdout.strip() == "aarch64", ran
            assert "F" in handler.flags
            mine = handler.name if handler.name.startswith(binfmt.OUR_PREFIX) else None
    except binfmt.BinfmtUnavailable as exc:
        pytest.skip(f"this machine refuses binfmt_misc: {exc}")
    _, after = binfmt.handlers()
    assert mine is None or mine not in {h.name for h in after}


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv(1) (util-linux)")
def test_an_unprivileged_caller_is_told_why(e2e_ready: None) -> None:
    code = ("import binfmt\n"
            "try:\n    binfmt.handlers()\n"
            "except binfmt.BinfmtUnavailable as exc:\n    print(exc)\n")
    # The caller runs as nobody, who may not read this checkout (a clone in a 0700 folder
    # such as mktemp -d makes): it imports a copy of the module (standard library only)
    # from a folder of its own. tmp_path is under root's 0700 pytest folder, so not there.
    shared = Path(tempfile.mkdtemp(prefix="nri-cdi-binfmt-"))
    try:
        shared.chmod(0o755)
        shutil.copyfile(binfmt.__file__, shared / "binfmt.py")
        (shared / "binfmt.py").chmod(0o644)
        done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               sys.executable, "-c", code],
                              cwd=shared, env={**os.environ, "PYTHONPATH": str(shared)},
                              capture_output=True, text=True, check=False)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    assert done.stdout.strip() == "binfmt_misc needs root (mount, register)", done
