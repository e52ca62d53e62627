"""Our createContainer hooks run by runc under a real containerd (native CDI).

A glibc image gets a library by bind mount plus the two hooks and finds it by SONAME (as two
entries, and as the one entry the generator writes, which also makes a device's by-path
link only in the container that has the device); a
Nix-like image finds it hook-free (links as mounts + LD_LIBRARY_PATH); a hostile image
whose /etc points at a host folder is refused with our message, the host folder untouched.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from cdi.hooks import entry
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.images import DEFAULT_PATH, ImageConfig, image_from_tree
from tests.hooks.conftest import (
    FAKE_C,
    NIX_GLIBC,
    NIX_PROG_FLAGS,
    PROG_C,
    _cc,
    copy_glibc,
    host_loader,
    tree_digest,
)

pytestmark = pytest.mark.e2e

KIND = "example.com/fake"
LIB = "/opt/fake/lib"
SLEEP = ("sleep", "600")


def _mount(host: Path, path: str) -> dict[str, Any]:
    return {"hostPath": str(host), "containerPath": path,
            "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]}


def _hook(name: str, args: list[str]) -> dict[str, Any]:
    h = entry.isolated_python(name, args)
    return {"hookName": "createContainer", "path": h.path, "args": list(h.args),
            "env": list(h.env)}


@pytest.fixture(scope="module")
def world(e2e_ready: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("hooks-e2e")
    fake, prog, nix_prog = out / "libfake.so.1.2.3", out / "prog", out / "nix-prog"
    _cc(["-shared", "-fPIC", "-Wl,-soname,libfake.so.1", "-o", str(fake)], FAKE_C)
    _cc(["-o", str(prog)], PROG_C)
    _cc(["-o", str(nix_prog), *NIX_PROG_FLAGS], PROG_C)
    bait = out / "bait"
    bait.mkdir()
    (bait / "ld.so.cache").write_text("host")
    spec = {"cdiVersion": "0.5.0", "kind": KIND, "devices": [
        {"name": "hooks", "containerEdits": {
            "mounts": [_mount(fake, f"{LIB}/libfake.so.1.2.3")],
            "hooks": [_hook("create-symlinks", ["--link", f"libfake.so.1.2.3::{LIB}/libfake.so.1"]),
                      _hook("update-ldcache", ["--folder", LIB])]}},
        {"name": "one", "containerEdits": {
            "mounts": [_mount(fake, f"{LIB}/libfake.so.1.2.3")],
            "deviceNodes": [{"path": "/dev/fake0", "hostPath": "/dev/null", "type": "c",
                             "major": 1, "minor": 3}],
            "hooks": [_hook("create-symlinks", [
                "--link", f"libfake.so.1.2.3::{LIB}/libfake.so.1",
                "--device-link", "/dev/fake0::../fake0::/dev/by-path/fake-0",
                "--device-link", "/dev/fake1::../fake1::/dev/by-path/fake-1",
                "update-ldcache", "--folder", LIB])]}},
        {"name": "mounts", "containerEdits": {
            "mounts": [_mount(fake, "/usr/lib64/libfake.so.1.2.3"),
                       _mount(fake, "/usr/lib64/libfake.so.1")],
            "env": ["LD_LIBRARY_PATH=/usr/lib64"]}},
    ]}
    specs = out / "specs"
    specs.mkdir()
    (specs / "fake.json").write_text(json.dumps(spec))
    return {"out": out, "prog": prog, "nix_prog": nix_prog, "specs": specs, "bait": bait}


@pytest.fixture(scope="module")
def ctrd(containerd: ContainerdFactory, world: dict[str, Path]) -> Containerd:
    c = containerd(enable_cdi=True, cdi_spec_dirs=[world["specs"]])
    ld, _ = host_loader()
    # One set of image trees per containerd version (this fixture runs once per version).
    trees = world["out"] / f"images-{c.version}"
    glibc, nix, hostile = (trees / n for n in ("glibc", "nix", "hostile"))
    for tree, loader_dir, prog in ((glibc, "lib64", world["prog"]),
                                   (hostile, "lib64", world["prog"]),
                                   (nix, NIX_GLIBC.lstrip("/"), world["nix_prog"])):
        (tree / loader_dir).mkdir(parents=True, exist_ok=True)
        shutil.copy2(ld, tree / loader_dir / "ld-linux-x86-64.so.2")
        libc_dir = tree / ("lib/x86_64-linux-gnu" if loader_dir == "lib64" else loader_dir)
        copy_glibc(libc_dir)
        shutil.copy2(prog, tree / "prog")
    # The hostile image's /etc/ld.so.cache is a link to a host file by absolute path.
    (hostile / "etc").mkdir()
    os.symlink(str(world["bait"] / "ld.so.cache"), hostile / "etc/ld.so.cache")
    (hostile / "opt").mkdir()
    os.symlink("/", hostile / "opt/fake")  # /opt/fake/lib is the root's /lib
    config = ImageConfig(cmd=SLEEP, env=(DEFAULT_PATH,))
    for name, tree in (("glibc", glibc), ("nix", nix), ("hostile", hostile)):
        c.import_images(image_from_tree(f"localhost/hooks/{name}:e2e", tree,
                                        trees / f"{name}.tar", config=config))
    return c


def _run(c: Containerd, image: str, device: str, command: tuple[str, ...] = ("/prog",)) -> str:
    with c.cri() as cri, cri.pod(f"p-{image}-{device}") as pod:
        cid = cri.run_container(pod, "c", f"localhost/hooks/{image}:e2e",
                                annotations={"cdi.k8s.io/fake": f"{KIND}={device}"})
        result = cri.exec_sync(cid, list(command))
        return str(result.stdout)


def test_glibc_image_with_hooks(ctrd: Containerd) -> None:
    assert _run(ctrd, "glibc", "hooks") == "answer=42\n"


def test_one_entry_does_everything(ctrd: Containerd) -> None:
    assert _run(ctrd, "glibc", "one", ("sh", "-c", "/prog; ls /dev/by-path; "
                                       "readlink /dev/by-path/fake-0")) == (
        "answer=42\nfake-0\n../fake0\n")


def test_nix_like_image_hook_free(ctrd: Containerd) -> None:
    assert _run(ctrd, "nix", "mounts") == "answer=42\n"


def test_hostile_image_stays_inside(ctrd: Containerd, world: dict[str, Path]) -> None:
    before = tree_digest(world["bait"])
    # /opt/fake -> / : runc and our hooks both resolve it inside the root, so the library
    # lands in the image's /lib, and the cache replaces the link, not the host file.
    assert _run(ctrd, "hostile", "hooks") == "answer=42\n"
    assert tree_digest(world["bait"]) == before
    assert (world["bait"] / "ld.so.cache").read_text() == "host"
