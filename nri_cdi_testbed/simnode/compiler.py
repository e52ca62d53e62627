"""gcc with a content-addressed cache of built objects."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from nri_cdi_testbed.simnode.driverfiles import TRIPLETS
from nri_cdi_testbed.simnode.layout import SimNodeError, host_machine


@dataclass(frozen=True, slots=True)
class Job:
    source: str
    soname: str
    bits: int
    dest: Path
    needs: tuple[str, ...] = ()  # library files to link (-l:NAME), kept as NEEDED entries


class Compiler:
    """gcc with a content-addressed cache of built objects; for a ``machine`` other than
    this one, its cross compiler (Debian's gcc-<triplet>, e.g. aarch64-linux-gnu-gcc)."""

    def __init__(self, cache_dir: Path, machine: str | None = None):
        self.cache_dir = cache_dir
        self.cross = machine is not None and host_machine() not in (None, machine)
        self.wanted = f"{TRIPLETS[machine]}-gcc" if self.cross and machine else "gcc"
        self.gcc = shutil.which(self.wanted) if self.cross else (
            shutil.which("gcc") or shutil.which("cc"))

    def build_all(self, jobs: Sequence[Job]) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        workers = min(len(jobs), os.cpu_count() or 2) or 1
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(self._build, jobs))

    def _args(self, job: Job, out: str, src: str) -> list[str]:
        args = [self.gcc or self.wanted, "-shared", "-fPIC", "-O1", "-Wl,--build-id=none"]
        if job.soname:
            args.append(f"-Wl,-soname,{job.soname}")
        if job.bits == 32:
            args += ["-m32", "-nostdlib"]
        libs = ["-Wl,--no-as-needed", *(f"-l:{n}" for n in job.needs)] if job.needs else []
        return [*args, "-o", out, src, *libs]

    def _build(self, job: Job) -> None:
        key = hashlib.sha256(
            json.dumps([job.source, job.soname, job.bits, self._args(job, "", "")]).encode()
        ).hexdigest()[:32]
        cached = self.cache_dir / f"{key}.so"
        if not cached.exists():
            self._compile(job, cached)
        shutil.copyfile(cached, job.dest)
        os.chmod(job.dest, 0o755)

    def _compile(self, job: Job, cached: Path) -> None:
        if self.gcc is None:
            hint = f" (Debian: gcc-{self.wanted.removesuffix('-gcc')})" if self.cross else ""
            raise SimNodeError(f"building a simulated node needs {self.wanted} on PATH{hint}")
        with tempfile.TemporaryDirectory(dir=self.cache_dir) as tmp:
            src, out = os.path.join(tmp, "lib.c"), os.path.join(tmp, "lib.so")
            Path(src).write_text(job.source)
            proc = subprocess.run(self._args(job, out, src), capture_output=True, text=True)
            if proc.returncode != 0:
                hint = " (32-bit build: is gcc multilib installed?)" if job.bits == 32 else ""
                raise SimNodeError(
                    f"gcc failed for {job.soname or job.dest.name}{hint}:\n{proc.stderr.strip()}"
                )
            os.replace(out, cached)  # atomic: parallel builders may race on the same key


def default_cache_dir() -> Path:
    env = os.environ.get("SIMNODE_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "nri-cdi" / "simnode"


