"""Shared pieces for the hook tests: a root check, C artifacts built once, OCI bundles."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from cdi.hooks.rootfs import RootFS, _probe_openat2

RESOLVERS = ["openat2", "walk"] if _probe_openat2() is not None else ["walk"]

FAKE_C = 'int fake_answer(void) { return 42; }\n'
PROG_C = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libfake.so.1", RTLD_NOW);
    if (!h) { printf("dlopen failed: %s\n", dlerror()); return 1; }
    int (*answer)(void) = (int (*)(void))dlsym(h, "fake_answer");
    printf("answer=%d\n", answer());
    return 0;
}
"""
PRELOAD_C = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { write(fd, "loaded\n", 7); close(fd); }
}
"""
NIX_GLIBC = "/nix/store/0000000000000000000000000000000a-glibc-2.36/lib"
# A Nix program: its glibc's own loader, and that glibc's folder searched first. Nix's
# loader has the folder built in, so it also finds what a dlopen()ed library needs (the
# real libcuda's libm); the host's loader standing in for it gets the folder as DT_RPATH,
# which, unlike DT_RUNPATH, applies to every library loaded after the program too.
NIX_PROG_FLAGS = (f"-Wl,--dynamic-linker={NIX_GLIBC}/ld-linux-x86-64.so.2",
                  f"-Wl,-rpath,{NIX_GLIBC}", "-Wl,--disable-new-dtags")


@pytest.fixture
def need_root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the hook tests chroot and mount, so they must run as root in CI")
        pytest.skip("the hook tests chroot and mount: run as root")


@pytest.fixture(params=RESOLVERS)
def resolver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@dataclass(frozen=True)
class Artifacts:
    fake: Path  # libfake.so.1.2.3 with SONAME libfake.so.1
    prog: Path  # dlopen()s libfake.so.1, prints answer=42
    nix_prog: Path  # same, with its loader and libc under NIX_GLIBC
    preload: Path  # writes a line to marker when loaded
    marker: Path


def _cc(args: list[str], source: str) -> None:
    subprocess.run(["gcc", "-x", "c", "-", *args], input=source.encode(), check=True,
                   capture_output=True)


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the test libraries")
    out = tmp_path_factory.mktemp("artifacts")
    marker = out / "preload-marker"
    fake, prog, nix_prog, preload = (out / n for n in (
        "libfake.so.1.2.3", "prog", "nix-prog", "preload.so"))
    _cc(["-shared", "-fPIC", "-Wl,-soname,libfake.so.1", "-o", str(fake)], FAKE_C)
    _cc(["-o", str(prog)], PROG_C)
    _cc(["-o", str(nix_prog), *NIX_PROG_FLAGS], PROG_C)
    _cc(["-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(preload)], PRELOAD_C)
    return Artifacts(fake=fake, prog=prog, nix_prog=nix_prog, preload=preload, marker=marker)


def host_loader() -> tuple[Path, Path]:
    return (Path(os.path.realpath("/lib64/ld-linux-x86-64.so.2")),
            Path(os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")))


# What a glibc image has besides libc for a real libcuda.so.1 (readelf -d NEEDED: libm,
# libdl, libpthread, librt); the simulated libcuda needs the same.
LIBCUDA_GLIBC_NEEDS = ("libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")


def copy_glibc(folder: Path) -> None:
    """The host's libc and the libraries ``LIBCUDA_GLIBC_NEEDS`` names, into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("libc.so.6", *LIBCUDA_GLIBC_NEEDS):
        shutil.copy2(os.path.realpath(f"/lib/x86_64-linux-gnu/{name}"), folder / name)


def make_bundle(tmp: Path, rootfs: Path, *, relative: bool = True,
                readonly: bool = False, devices: Sequence[str] = (),
                mounts: Sequence[dict[str, object]] = ()) -> bytes:
    """An OCI bundle around ``rootfs``; returns the state document a runtime would send.
    ``devices``: container paths listed in the config's ``linux.devices``; ``mounts``: the
    config's ``mounts`` (the caller mounts them under ``rootfs`` as a runtime would)."""
    bundle = tmp / "bundle"
    bundle.mkdir(exist_ok=True)
    path = os.path.relpath(rootfs, bundle) if relative else str(rootfs)
    config: dict[str, object] = {"ociVersion": "1.1.0",
                                 "root": {"path": path, "readonly": readonly}}
    if mounts:
        config["mounts"] = list(mounts)
    if devices:
        config["linux"] = {"devices": [{"path": d, "type": "c", "major": 1, "minor": 3}
                                       for d in devices]}
    (bundle / "config.json").write_text(json.dumps(config))
    return json.dumps({"ociVersion": "1.1.0", "id": "c1", "status": "creating", "pid": 1,
                       "bundle": str(bundle)}).encode()


def tree_digest(path: Path) -> str:
    """A digest of names, types, link targets and contents under ``path`` (no following)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(path)):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = Path(dirpath, name)
            h.update(str(p.relative_to(path)).encode() + b"\0")
            if p.is_symlink():
                h.update(b"L" + os.readlink(p).encode())
            elif p.is_file():
                h.update(b"F" + p.read_bytes())
    return h.hexdigest()


def host_snapshot(path: Path) -> dict[str, tuple[object, ...]]:
    """What a hook must never change in a host folder: every name under ``path`` with its
    type, mode, owner, link target and contents (links not followed)."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames + ["."]:
            p = Path(dirpath, name)
            st = p.lstat()
            body: object = os.readlink(p) if p.is_symlink() else (
                hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None)
            out[str(p.relative_to(path))] = (st.st_mode, st.st_uid, st.st_gid, body)
    return out


@pytest.fixture
def open_root(resolver: str) -> Iterator[object]:
    opened: list[RootFS] = []

    def _open(path: Path) -> RootFS:
        root = RootFS(str(path), resolver=resolver)
        opened.append(root)
        return root

    yield _open
    for root in opened:
        root.close()
