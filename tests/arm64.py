"""arm64 on this amd64 machine: the parts the arm64 tests use, and why they skip.

* ``qemu-aarch64`` (Debian sid's qemu-user) and an arm64 root (bookworm's libc6, libc-bin,
  busybox-static and python3 with their dependencies, unpacked): scripts/install-arm64.sh,
  in ``.cache/arm64`` (``$NRI_CDI_ARM64_CACHE``);
* NVIDIA's arm64 driver 550.163.01 as Debian ships it: scripts/install-nvidia-debian.sh
  --arch arm64, in ``.cache/nvidia-debian-arm64`` (``$NRI_CDI_NVIDIA_ARM64_CACHE``);
* the aarch64 cross compiler ``aarch64-linux-gnu-gcc`` (gcc-aarch64-linux-gnu,
  scripts/setup.sh).

A missing part skips the test naming the script that makes it; under ``CI`` (where
scripts/test.sh ran them) it fails. Programs of the arm64 root run under the emulator
either way: started by it explicitly (:func:`under_qemu`, no system change), or, for
containers, through binfmt_misc (tests/e2e/binfmt.py), which a machine may refuse; that
alone skips even under CI, with the reason.

The host has no ``/lib/ld-linux-aarch64.so.1``, so an arm64 dynamic program is started
through the root's own loader (:func:`python_argv`): the loader is static, and
``--library-path`` points it at the root's libraries.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.prerequisites import missing

REPO = Path(__file__).resolve().parents[1]
TRIPLET = "aarch64-linux-gnu"
CROSS_CC = f"{TRIPLET}-gcc"
EM_AARCH64 = 183
LIB_DIRS = (f"lib/{TRIPLET}", f"usr/lib/{TRIPLET}")
# The driver's libcuda.so.1 needs these besides libc (readelf -d NEEDED), as on amd64.
LIBCUDA_GLIBC_NEEDS = ("libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")


def cache_dir() -> Path:
    env = os.environ.get("NRI_CDI_ARM64_CACHE")
    return Path(env) if env else REPO / ".cache" / "arm64"


def nvidia_cache_dir() -> Path:
    env = os.environ.get("NRI_CDI_NVIDIA_ARM64_CACHE")
    return Path(env) if env else REPO / ".cache" / "nvidia-debian-arm64"


@dataclass(frozen=True)
class Arm64:
    qemu: Path  # qemu-aarch64, static
    binfmt_line: Path  # the package's usr/share/qemu/binfmt.d/qemu-aarch64.conf
    root: Path  # the arm64 root (loader, glibc, busybox, python3, ldconfig)
    cc: str  # the cross compiler

    @property
    def loader(self) -> Path:
        return Path(os.path.realpath(self.root / "lib/ld-linux-aarch64.so.1"))

    @property
    def python(self) -> Path:
        return Path(os.path.realpath(self.root / "usr/bin/python3"))

    @property
    def busybox(self) -> Path:
        return self.root / "bin/busybox"

    @property
    def ldconfig(self) -> Path:
        return self.root / "sbin/ldconfig"

    def library_path(self) -> str:
        return ":".join(str(self.root / d) for d in LIB_DIRS)

    def python_argv(self) -> list[str]:
        """The arm64 python3 started through the root's own loader (see the module's doc);
        ``sys.prefix`` is the root's ``usr``, from ``--argv0``."""
        return [str(self.loader), "--library-path", self.library_path(), "--argv0",
                str(self.python), str(self.python)]

    def under_qemu(self, argv: Sequence[str], *, strace: bool = False) -> list[str]:
        """``argv`` (an aarch64 program first) run by the emulator itself: no binfmt_misc."""
        return [str(self.qemu), *(["-strace"] if strace else []), *argv]

    def compile(self, out: Path, source: str | Path, *args: str) -> Path:
        """Cross-compile C ``source`` (text, or a file) for aarch64 to ``out``."""
        if isinstance(source, Path):
            subprocess.run([self.cc, *args, "-o", str(out), str(source)], check=True,
                           capture_output=True)
        else:
            subprocess.run([self.cc, "-x", "c", "-", *args, "-o", str(out)],
                           input=source.encode(), check=True, capture_output=True)
        return out


def _missing(why: str) -> None:
    missing("the arm64 tests", why)


def parts() -> Arm64:
    """The arm64 parts, or skip (fail under CI) naming what makes the missing one."""
    cache = cache_dir()
    found = Arm64(qemu=cache / "qemu/usr/bin/qemu-aarch64",
                  binfmt_line=cache / "qemu/usr/share/qemu/binfmt.d/qemu-aarch64.conf",
                  root=cache / "root", cc=shutil.which(CROSS_CC) or "")
    for path in (found.qemu, found.binfmt_line, found.root / "usr/bin/python3",
                 found.busybox, found.ldconfig):
        if not path.exists():
            _missing(f"no {path}: run scripts/install-arm64.sh")
    if not found.cc:
        _missing(f"no {CROSS_CC} on PATH: run scripts/setup.sh (gcc-aarch64-linux-gnu)")
    return found


def emulator() -> Path:
    """qemu-aarch64 alone, or skip (fail under CI)."""
    qemu = cache_dir() / "qemu/usr/bin/qemu-aarch64"
    if not qemu.exists():
        _missing(f"no {qemu}: run scripts/install-arm64.sh")
    return qemu


def cross_cc() -> str:
    """The aarch64 cross compiler alone, or skip (fail under CI)."""
    cc = shutil.which(CROSS_CC)
    if cc is None:
        _missing(f"no {CROSS_CC} on PATH: run scripts/setup.sh (gcc-aarch64-linux-gnu)")
    return str(cc)


def aarch64_library(out: Path, soname: str) -> Path:
    """A real aarch64 shared object named ``soname`` (one function), built at ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([cross_cc(), "-x", "c", "-", "-shared", "-fPIC", f"-Wl,-soname,{soname}",
                    "-o", str(out)], input=b"int nri_cdi_arm64(void) { return 64; }\n",
                   check=True, capture_output=True)
    return out


def driver_root() -> Path:
    """NVIDIA's arm64 driver root, or skip (fail under CI)."""
    root = nvidia_cache_dir() / "root"
    if not (root / f"usr/lib/{TRIPLET}/nvidia/current").is_dir():
        _missing(f"no Debian arm64 NVIDIA driver root at {root}: run "
                 "scripts/install-nvidia-debian.sh --arch arm64")
    return root
