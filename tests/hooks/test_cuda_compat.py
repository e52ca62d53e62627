"""``enable-cuda-compat``: the decision (NVIDIA's rules, table), the ELF note read from a real
gcc-built library, and end to end in a chroot: the program's ``dlopen("libcuda.so.1")``
gets the image's compat library only when it is newer than the host driver."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cdi.hooks.rootfs import RootFS
from cdi.nvidia.hooks.cuda_compat import (
    CONF_PATH,
    CompatNote,
    enable_cuda_compat,
    parse_dotted_version,
    parse_note,
    read_compat_note,
    use_compat,
)
from tests.hooks.conftest import _cc, host_loader, make_bundle
from tests.hooks.test_symlinks import run_hook

CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
DRIVER_DIR = "/usr/lib/x86_64-linux-gnu"
COMPAT_DIR = "/usr/local/cuda/compat"
HOST = "580.82.07"

LIB_C = "int fake_answer(void) { return ANSWER; }\n"
NOTE_ASM = r"""
__asm__(".section .note.cuda.fwd_compatibility,\"a\",@note\n"
        ".p2align 2\n.long 19\n.long %d\n.long 1\n.asciz \"NVIDIA Corporation\"\n"
        ".p2align 2\n.asciz \"%s\"\n.p2align 2\n.text\n");
"""
PROG_C = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("dlopen failed: %s\n", dlerror()); return 1; }
    int (*answer)(void) = (int (*)(void))dlsym(h, "fake_answer");
    printf("answer=%d\n", answer());
    return 0;
}
"""


@pytest.mark.parametrize(("compat", "driver", "cuda", "note", "expected"), [
    ("590.10.01", "580.82.07", "", None, True),  # no note: newer major wins
    ("580.95.05", "580.82.07", "", None, False),  # same major: not used
    ("575.57.08", "580.82.07", "", None, False),  # older
    ("590.10.01", "", "12.8", None, False),  # a CUDA version alone needs the note
    ("590.10.01", "580.82.07", "", CompatNote("13.0", (580, 575)), True),  # listed, newer
    ("590.10.01", "570.10.01", "", CompatNote("13.0", (580, 575)), False),  # not listed
    ("575.57.08", "575.60.01", "", CompatNote("12.9", (575,)), False),  # listed, not newer
    ("bogus", "580.82.07", "12.8", CompatNote("13.0", (580,)), True),  # falls back to CUDA
    ("bogus", "580.82.07", "13.0", CompatNote("13.0", (580,)), False),
    ("590.10.01", "", "", None, False),
])
def test_decision(compat: str, driver: str, cuda: str, note: CompatNote | None,
                  expected: bool) -> None:
    assert use_compat(compat, driver, cuda, note) is expected


def test_versions_and_note_bytes() -> None:
    assert parse_dotted_version("575.57.08") == (575, 57, 8)
    assert parse_dotted_version("v12.9") == (12, 9, 0)
    assert parse_dotted_version("12.x") is None and parse_dotted_version("") is None
    desc = json.dumps({"CUDA Version": "13.0", "Driver": [580, "x"]}).encode() + b"\0"
    data = (len(b"NVIDIA Corporation\0").to_bytes(4, "little") + len(desc).to_bytes(4, "little")
            + (1).to_bytes(4, "little") + b"NVIDIA Corporation\0\0" + desc)
    assert parse_note(data, little=True, align=4) == CompatNote("13.0", (580,))
    assert parse_note(data.replace(b"NVIDIA", b"NVIDIO"), little=True, align=4) is None
    assert parse_note(data[:10], little=True, align=4) is None
    assert parse_note(data[:30] + b"{not json" + data[39:], little=True, align=4) is None


def _lib(out: Path, answer: int, note: dict[str, object] | None = None) -> Path:
    source = LIB_C.replace("ANSWER", str(answer))
    if note is not None:
        desc = json.dumps(note).replace('"', r'\\\"')
        source += NOTE_ASM % (len(json.dumps(note)) + 1, desc)
    _cc(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(out)], source)
    return out


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the test libraries")
    out = tmp_path_factory.mktemp("compat")
    prog = out / "prog"
    _cc(["-o", str(prog)], PROG_C)
    return {"host": _lib(out / "host.so", 1), "plain": _lib(out / "plain.so", 2),
            "noted": _lib(out / "noted.so", 2, {"Format": 1, "CUDA Version": "13.0",
                                                 "Driver": [580, 575], "Device": []}),
            "prog": prog}


def test_note_read_from_a_real_library(libs: dict[str, Path]) -> None:
    fd = os.open(libs["noted"], os.O_RDONLY)
    try:
        assert read_compat_note(fd) == CompatNote("13.0", (580, 575))
    finally:
        os.close(fd)
    fd = os.open(libs["plain"], os.O_RDONLY)
    try:
        assert read_compat_note(fd) is None
    finally:
        os.close(fd)


def _root(tmp: Path, libs: dict[str, Path], compat: str | None, version: str) -> Path:
    root = tmp / "rootfs"
    ld, libc = host_loader()
    files = [(ld, "lib64/ld-linux-x86-64.so.2"), (libc, "lib/x86_64-linux-gnu/libc.so.6"),
             (libs["prog"], "prog"), (libs["host"], f"{DRIVER_DIR}/libcuda.so.{HOST}")]
    if compat:
        files.append((libs[compat], f"{COMPAT_DIR}/libcuda.so.{version}"))
    for src, dest in files:
        (root / dest.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, root / dest.lstrip("/"))
    if compat:
        os.symlink(f"libcuda.so.{version}", root / COMPAT_DIR.lstrip("/") / "libcuda.so.1")
    return root


@pytest.mark.parametrize(("compat", "version", "answer"), [
    ("plain", "590.10.01", 2),  # newer major, no note: the image's library
    ("plain", "580.95.05", 1),  # same major: the host driver's
    ("noted", "590.10.01", 2),  # the note lists 580
    ("noted", "575.10.01", 1),  # listed, but older than the host
    (None, "", 1),  # no compat folder
])
@pytest.mark.parametrize("one_entry", [True, False], ids=["one-entry", "one-per-hook"])
def test_hooks_in_order_pick_the_right_libcuda(tmp_path: Path, libs: dict[str, Path],
                                               compat: str | None, version: str,
                                               answer: int, one_entry: bool) -> None:
    """As the generator writes it (one process, the operations in order) and as
    nvidia-ctk lays it out (one process per hook)."""
    if os.geteuid() != 0:
        pytest.skip("chroot needs root")
    root = _root(tmp_path, libs, compat, version)
    state = make_bundle(tmp_path, root)
    steps = [("create-symlinks", "--link", f"libcuda.so.{HOST}::{DRIVER_DIR}/libcuda.so.1"),
             ("enable-cuda-compat", f"--host-driver-version={HOST}"),
             ("update-ldcache", "--folder", DRIVER_DIR)]
    for args in [tuple(w for step in steps for w in step)] if one_entry else steps:
        proc = run_hook(state, *args)
        assert proc.returncode == 0 and not proc.stderr, (args, proc.stderr)
    run = subprocess.run([CHROOT, str(root), "/prog"], capture_output=True, text=True,
                         env={}, check=False)
    assert run.stdout == f"answer={answer}\n", run.stdout + run.stderr
    conf = root / CONF_PATH.lstrip("/")
    assert conf.exists() is (answer == 2)
    if conf.exists():
        assert conf.read_text() == f"{COMPAT_DIR}\n" and conf.stat().st_mode & 0o777 == 0o644


def test_two_candidates_or_no_version_do_nothing(tmp_path: Path, libs: dict[str, Path]) -> None:
    root = _root(tmp_path, libs, "plain", "590.10.01")
    shutil.copy2(libs["plain"], root / COMPAT_DIR.lstrip("/") / "libcuda.so.591.1.1")
    with RootFS(str(root)) as fs:
        result = enable_cuda_compat(fs, host_driver=HOST)
        assert result.folder is None and "want one libcuda.so.*.*" in result.reason
        result = enable_cuda_compat(fs)
        assert result.folder is None and "no host driver" in result.reason
    assert not (root / CONF_PATH.lstrip("/")).exists()


def test_compat_folder_link_escaping_the_root_stays_inside(tmp_path: Path,
                                                           libs: dict[str, Path]) -> None:
    """/usr/local/cuda -> / (absolute) resolves to the container's own root, never the host."""
    root = _root(tmp_path, libs, None, "")
    (root / "usr/local").mkdir(parents=True, exist_ok=True)
    os.symlink("/", root / "usr/local/cuda")
    with RootFS(str(root)) as fs:
        result = enable_cuda_compat(fs, host_driver=HOST)
    assert result.folder is None  # "/compat" inside the root does not exist
