"""A library of another architecture: one line naming the file, its architecture and the
machine's, where the generator would dlopen it (NVML mode; dlopen itself says only "cannot
open shared object file: No such file or directory"), from real ELF objects: the host's
own, an aarch64 one built by the cross compiler, and NVIDIA's real arm64 libnvidia-ml as
Debian ships it (tests/arm64.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdi.linux import elf
from tests import arm64
from tests.nvidia_debian import kernel_side

REPO = Path(__file__).resolve().parents[2]
MACHINE = os.uname().machine


def _generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "generate", *args],
                          cwd=REPO, capture_output=True, text=True, check=False)


def test_headers_of_real_objects(tmp_path: Path) -> None:
    own = elf.read_header(os.path.realpath(sys.executable))
    assert own.architecture == elf.this_process() == MACHINE
    assert elf.foreign_to_this_process(os.path.realpath(sys.executable)) is None
    lib = arm64.aarch64_library(tmp_path / "libarm.so.1", "libarm.so.1")
    header = elf.read_header(lib)
    assert (header.architecture, header.bits, header.machine) == ("aarch64", 64, 183)
    assert elf.read_dynamic(lib).header == header
    if MACHINE != "aarch64":
        assert elf.foreign_to_this_process(lib) == (
            f"{lib} is built for aarch64, and this machine is {MACHINE}")
        assert elf.foreign_to_this_machine(str(lib), header) is not None


def test_architecture_names() -> None:
    assert elf.architecture_name(62, 64) == "x86_64"
    assert elf.architecture_name(3, 32) == "i386"
    assert elf.architecture_name(21, 64, big_endian=False) == "ppc64le"
    assert elf.architecture_name(21, 64, big_endian=True) == "ppc64"
    assert elf.architecture_name(9999, 64) == "e_machine 9999 (64-bit)"


def test_a_32_bit_companion_runs_on_the_machine_but_not_in_this_process() -> None:
    i386 = elf.ElfHeader(bits=32, big_endian=False, machine=3, elf_type=3)
    if MACHINE != "x86_64":
        pytest.skip("the i386 companion is x86_64's")
    assert elf.foreign_to_this_machine("/l/libcuda.so.1", i386) is None


def test_not_an_elf_file(tmp_path: Path) -> None:
    script = tmp_path / "libc.so"
    script.write_text("/* GNU ld script */\n")
    with pytest.raises(elf.NotElfError, match=r"libc\.so"):
        elf.read_header(script)


@pytest.mark.skipif(MACHINE == "aarch64", reason="an aarch64 library is this machine's")
def test_nvml_mode_names_the_architecture_before_dlopen(tmp_path: Path) -> None:
    root = tmp_path / "driver"
    lib = arm64.aarch64_library(root / f"usr/lib/{arm64.TRIPLET}/libnvidia-ml.so.550.1",
                                "libnvidia-ml.so.1")
    (lib.parent / "libnvidia-ml.so.1").symlink_to(lib.name)
    done = _generate("--mode", "nvml", "--driver-root", str(root))
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"nri-cdi generate: error: NVML unavailable: {lib} is built "
        f"for aarch64, and this machine is {MACHINE}"]


@pytest.mark.skipif(MACHINE == "aarch64", reason="an aarch64 library is this machine's")
def test_debians_arm64_driver_in_nvml_and_auto_modes(tmp_path: Path) -> None:
    """The issue's case: generate --mode nvml against NVIDIA's real arm64 libnvidia-ml."""
    root = arm64.driver_root()
    lib = root / f"usr/lib/{arm64.TRIPLET}/nvidia/current/libnvidia-ml.so.550.163.01"
    said = f"NVML unavailable: {lib} is built for aarch64, and this machine is {MACHINE}"
    done = _generate("--mode", "nvml", "--driver-root", str(root))
    assert (done.returncode, done.stderr.splitlines()) == (
        1, [f"nri-cdi generate: error: {said}"]), done.stderr
    kernel = kernel_side(tmp_path / "kernel")
    done = _generate("--mode", "auto", "--driver-root", str(root), "--dev-root",
                     str(kernel.dev_root), "--cdi-version", "0.6.0", "--output",
                     str(tmp_path / "nvidia.yaml"))
    assert done.returncode == 0, done.stderr
    assert f"nri-cdi generate: mode auto: using procfs ({said})" in done.stderr.splitlines()
