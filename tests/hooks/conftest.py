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
    _cc(["-o", str(nix_prog), f"-Wl,--dynamic-linker={NIX_GLIBC}/ld-linux-x86-64.so.2",
         f"-Wl,-rpath,{NIX_GLIBC}"], PROG_C)
    _cc(["-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(preload)], PRELOAD_C)
    return Artifacts(fake=fake, prog=prog, nix_prog=nix_prog, preload=preload, marker=marker)


def host_loader() -> tuple[Path, Path]:
    return (Path(os.path.realpath("/lib64/ld-linux-x86-64.so.2")),
            Path(os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")))


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
