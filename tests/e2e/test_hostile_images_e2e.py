"""Hostile images against our createContainer hook under a real containerd (1.7 and 2.1),
through native CDI and through our NRI plugin.

Every image asks for one device of a spec whose single hook entry does what a generated
spec's does (create-symlinks with a device link, enable-cuda-compat, update-ldcache); the
image attacks it.  Each case asserts that the host is untouched (every host folder the
image points at or that is mounted into it: names, types, modes, owners, link targets and
contents, snapshot before and after) and then either a working GPU (the device node is
there and ``/prog``'s ``dlopen("libfake.so.1")`` resolves through the cache the hook wrote)
or, where the image cannot be served safely, a one-line refusal naming the file and rule.

The classes: a conf folder that is a read-write or read-only volume (container user 1000:
no root-owned link may appear in the host folder), an ``/etc/ld.so.conf.d`` that is a
read-only volume, a host file bind-mounted over ``/etc/ld.so.cache`` (refused), a conf
folder looping through ``/proc/1/root``, malformed ELF objects (absurd header offsets, an
absurd section table in the compat libcuda), library folders that are symlinks (inside the
root and to a host path), ``/run`` and ``/proc/self/root`` symlinks, FIFOs where the hook
reads, ``ld.so.conf.d`` symlinks to host paths, an image ``ldconfig`` that must never run,
and a folder swapped for a symlink while containers are made.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from cdi.hooks import entry
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.images import DEFAULT_PATH, ImageConfig, image_from_tree
from tests.e2e.plugin import PluginProcess
from tests.hooks.conftest import FAKE_C, PROG_C, _cc, copy_glibc, host_loader, host_snapshot
from tests.hooks.test_hostile_images import BAD_ELF, BAD_SECTIONS, _patched

pytestmark = pytest.mark.e2e

KIND = "example.com/hostile"
LIB = "/opt/gpu/lib"
DEVICE = "/dev/fakegpu0"
ANNOTATION = {"cdi.k8s.io/hostile": f"{KIND}=gpu"}
WORKS = "device\n../fakegpu0\nanswer=42\n"
CHECK = ("sh", "-c", f"test -c {DEVICE} && echo device; readlink /dev/by-path/fake-0; /prog")


@dataclass(frozen=True)
class Case:
    build: Callable[[Path, World], None]  # lays the hostile content into the image tree
    watch: tuple[str, ...]  # names of World host folders that must stay untouched
    user: str = ""
    mounts: dict[str, str] = field(default_factory=dict)  # container path -> World name
    ro_mounts: dict[str, str] = field(default_factory=dict)
    refusal: str = ""  # the one line expected instead of a working GPU


@dataclass(frozen=True)
class World:
    out: Path
    libs: dict[str, Path]
    host: dict[str, Path]  # host folders the images point at or get mounted

    def path(self, name: str) -> Path:
        return self.host[name]


def _hook_entry() -> dict[str, Any]:
    h = entry.isolated_python("create-symlinks", [
        "--link", f"libfake.so.1.2.3::{LIB}/libfake.so.1",
        "--device-link", f"{DEVICE}::../fakegpu0::/dev/by-path/fake-0",
        "enable-cuda-compat", "--host-driver-version", "550.54.15",
        "update-ldcache", "--folder", LIB])
    return {"hookName": "createContainer", "path": h.path, "args": list(h.args),
            "env": list(h.env)}


# --- the hostile images -----------------------------------------------------------------------


def _conf(tree: Path, folders: str) -> None:
    (tree / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
    (tree / "etc/ld.so.conf").write_text(folders + "include /etc/ld.so.conf.d/*.conf\n")
    (tree / "etc/ld.so.conf.d/00-compat-evil.conf").write_text(folders)


def _volume_conf(tree: Path, world: World) -> None:
    _conf(tree, "/vol\n")
    (tree / "vol").mkdir()


def _ro_confd(tree: Path, world: World) -> None:
    (tree / "etc/ld.so.conf.d").mkdir(parents=True)


def _cache_mount(tree: Path, world: World) -> None:
    (tree / "etc").mkdir()
    (tree / "etc/ld.so.cache").write_text("image\n")


def _proc_loop(tree: Path, world: World) -> None:
    _conf(tree, "/loop\n/plain-a\n")
    os.symlink("/proc/1/root/loop", tree / "loop")
    os.symlink("/plain-b", tree / "plain-a")
    os.symlink("/plain-a", tree / "plain-b")


def _bad_elf(tree: Path, world: World) -> None:
    folder = tree / LIB.lstrip("/")
    folder.mkdir(parents=True)
    for name, fields in BAD_ELF.items():
        _patched(world.libs["libsecx.so.1.0"], folder / f"libbad-{name}.so.1", *fields)
    compat = tree / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    _patched(world.libs["libcuda.so.999.1"], compat / "libcuda.so.999.1",
             *BAD_SECTIONS["shoff"])


def _lib_link_inside(tree: Path, world: World) -> None:
    (tree / "opt").mkdir()
    os.symlink("/", tree / "opt/gpu")  # /opt/gpu/lib is the image's /lib
    (tree / "etc").mkdir()
    os.symlink(str(world.path("bait") / "ld.so.cache"), tree / "etc/ld.so.cache")


def _lib_link_host(tree: Path, world: World) -> None:
    (tree / "opt").mkdir()
    os.symlink(str(world.path("bait")), tree / "opt/gpu")  # a host path, by name
    os.symlink(f"/proc/self/root{world.path('bait')}", tree / "opt/gpu2")


def _run_link(tree: Path, world: World) -> None:
    os.symlink(str(world.path("bait")), tree / "run")
    (tree / "var").mkdir()
    os.symlink("/run", tree / "var/run")


def _proc_links(tree: Path, world: World) -> None:
    (tree / "usr/local/cuda").mkdir(parents=True)
    os.symlink(f"/proc/self/root{world.path('compat')}", tree / "usr/local/cuda/compat")
    (tree / "etc").mkdir()
    os.symlink(f"/proc/1/root{world.path('confd')}", tree / "etc/ld.so.conf.d")


def _fifos(tree: Path, world: World) -> None:
    (tree / "etc/ld.so.conf.d").mkdir(parents=True)
    (tree / LIB.lstrip("/")).mkdir(parents=True)
    (tree / "usr/local/cuda/compat").mkdir(parents=True)
    for name in ("etc/ld.so.cache", "etc/ld.so.conf.d/00-compat-fifo.conf",
                 f"{LIB.lstrip('/')}/libfifo.so.1", "usr/local/cuda/compat/libcuda.so.999.1"):
        os.mkfifo(tree / name)


def _confd_links(tree: Path, world: World) -> None:
    (tree / "etc").mkdir()
    os.symlink(str(world.path("confd")), tree / "etc/ld.so.conf.d")
    (tree / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")


def _confd_file_links(tree: Path, world: World) -> None:
    (tree / "etc/ld.so.conf.d").mkdir(parents=True)
    os.symlink(str(world.path("confd") / "00-compat-host.conf"),
               tree / "etc/ld.so.conf.d/00-compat-host.conf")
    os.symlink(f"/proc/self/root{world.path('confd')}/00-compat-host.conf",
               tree / "etc/ld.so.conf.d/00-compat-proc.conf")


def _ldconfig(tree: Path, world: World) -> None:
    script = (f"#!/bin/sh\ntouch {world.path('bait')}/ldconfig-ran /ldconfig-ran\n"
              f"echo ran >> {world.path('bait')}/ldconfig-log\n")
    for name in ("sbin/ldconfig", "sbin/ldconfig.real", "usr/sbin/ldconfig", "usr/bin/ldconfig"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(script)
        (tree / name).chmod(0o755)
    _conf(tree, "/usr/local/lib\n")


def _race(tree: Path, world: World) -> None:
    _conf(tree, "/vol/lib\n")
    (tree / "vol").mkdir()


CASES: dict[str, Case] = {
    "volume-rw": Case(_volume_conf, ("volume",), user="1000", mounts={"/vol": "volume"}),
    "volume-ro": Case(_volume_conf, ("volume",), user="1000", ro_mounts={"/vol": "volume"}),
    "confd-ro-volume": Case(_ro_confd, ("confd",), ro_mounts={"/etc/ld.so.conf.d": "confd"}),
    "cache-host-file": Case(_cache_mount, ("bait",), mounts={"/etc/ld.so.cache": "bait-cache"},
                            refusal="nri-cdi hook update-ldcache: error: /etc/ld.so.cache: on "
                                    "a bind mount of "),
    "proc-loop": Case(_proc_loop, ()),
    "malformed-elf": Case(_bad_elf, ()),
    "lib-folder-link-inside": Case(_lib_link_inside, ("bait",)),
    "lib-folder-link-host": Case(_lib_link_host, ("bait",)),
    "run-link": Case(_run_link, ("bait",)),
    "proc-self-root-links": Case(_proc_links, ("compat", "confd")),
    "fifos": Case(_fifos, ()),
    "confd-folder-link": Case(_confd_links, ("confd",)),
    "confd-file-links": Case(_confd_file_links, ("confd", "bait")),
    "image-ldconfig": Case(_ldconfig, ("bait",)),
    "race-on-volume-folder": Case(_race, ("volume", "bait"), mounts={"/vol": "volume"}),
}


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(e2e_ready: None, tmp_path_factory: pytest.TempPathFactory) -> World:
    out = tmp_path_factory.mktemp("hostile-e2e")
    libs = {}
    for name, soname in (("libfake.so.1.2.3", "libfake.so.1"),
                         ("libsecx.so.1.0", "libsecx.so.1"),
                         ("libcuda.so.999.1", "libcuda.so.1")):
        _cc(["-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(out / name)], FAKE_C)
        libs[name] = out / name
    _cc(["-o", str(out / "prog")], PROG_C)
    libs["prog"] = out / "prog"
    host = {n: out / "host" / n for n in ("volume", "bait", "confd", "compat")}
    for folder in host.values():
        folder.mkdir(parents=True)
    shutil.copy2(libs["libsecx.so.1.0"], host["volume"] / "libsecx.so.1.0")
    (host["volume"] / "lib").mkdir()
    shutil.copy2(libs["libsecx.so.1.0"], host["volume"] / "lib/libsecx.so.1.0")
    for path in (host["volume"], host["volume"] / "lib"):
        os.chown(path, 1000, 1000)  # the container's user owns its volume
    (host["bait"] / "ld.so.cache").write_text("host\n")
    (host["bait"] / "lib").mkdir()
    host["bait-cache"] = host["bait"] / "ld.so.cache"
    (host["confd"] / "00-compat-host.conf").write_text(f"{host['volume']}\n")
    shutil.copy2(libs["libcuda.so.999.1"], host["compat"] / "libcuda.so.999.1")
    specs = out / "specs"
    specs.mkdir()
    (specs / "hostile.json").write_text(json.dumps({
        "cdiVersion": "0.5.0", "kind": KIND, "devices": [{"name": "gpu", "containerEdits": {
            "deviceNodes": [{"path": DEVICE, "hostPath": "/dev/null", "type": "c",
                             "major": 1, "minor": 3}],
            "mounts": [{"hostPath": str(libs["libfake.so.1.2.3"]),
                        "containerPath": f"{LIB}/libfake.so.1.2.3",
                        "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]}],
            "hooks": [_hook_entry()]}}]}))
    world = World(out=out, libs=libs, host=host)
    ld, _ = host_loader()
    config = ImageConfig(cmd=("sleep", "600"), env=(DEFAULT_PATH,))
    for name, case in CASES.items():
        tree = out / "trees" / name
        (tree / "lib64").mkdir(parents=True)
        shutil.copy2(ld, tree / "lib64/ld-linux-x86-64.so.2")
        copy_glibc(tree / "lib/x86_64-linux-gnu")
        shutil.copy2(libs["prog"], tree / "prog")
        case.build(tree, world)
        image_from_tree(_image(name), tree, out / f"{name}.tar",
                        config=ImageConfig(cmd=config.cmd, env=config.env, user=case.user))
    return world


def _image(case: str) -> str:
    return f"localhost/hostile/{case}:e2e"


@dataclass
class Stack:
    ctrd: Containerd
    pod_annotations: dict[str, str]
    annotations: dict[str, str]


@pytest.fixture(scope="module")
def stacks(containerd: ContainerdFactory, world: World) -> Iterator[dict[str, Stack]]:
    native = containerd(enable_cdi=True, cdi_spec_dirs=[world.out / "specs"])
    plain = containerd()
    archives = [world.out / f"{name}.tar" for name in CASES]
    native.import_images(*archives)
    plain.import_images(*archives)
    plugin = PluginProcess(plain.nri_socket, [world.out / "specs"],
                           world.out / f"plugin-{plain.version}.log").start()
    try:
        yield {"native": Stack(native, {}, ANNOTATION), "plugin": Stack(plain, ANNOTATION, {})}
    finally:
        plugin.kill()


class _Racer:
    """Swaps the volume's ``lib`` folder with a symlink to a host folder, over and over,
    as another container sharing the volume could."""

    def __init__(self, volume: Path, bait: Path) -> None:
        self.volume, self.bait = volume, bait
        self.stop = threading.Event()
        self.swaps = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        lib, aside = self.volume / "lib", self.volume / "lib.aside"
        while not self.stop.is_set():
            os.rename(lib, aside)
            os.symlink(str(self.bait / "lib"), lib)
            os.rename(aside, self.volume / "lib.tmp")  # a name change too, as renames race
            os.unlink(lib)
            os.rename(self.volume / "lib.tmp", lib)
            self.swaps += 1

    def __enter__(self) -> _Racer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def _run(stack: Stack, world: World, name: str, case: Case) -> str:
    """The container's check output, or the CRI error's text when it was refused."""
    with stack.ctrd.cri() as cri, cri.pod(f"p-{name}", annotations=stack.pod_annotations) as pod:
        try:
            cid = cri.run_container(
                pod, "c", _image(name), annotations=stack.annotations,
                mounts={k: str(world.path(v)) for k, v in case.mounts.items()},
                ro_mounts={k: str(world.path(v)) for k, v in case.ro_mounts.items()})
        except grpc.RpcError as exc:
            return f"refused: {exc.details()}"
        out = str(cri.exec_sync(cid, list(CHECK)).stdout)
        if name == "image-ldconfig":
            out += str(cri.exec_sync(cid, ["sh", "-c", "test -e /ldconfig-ran && echo ran; "
                                           "true"]).stdout)
        return out


@pytest.mark.parametrize("path", ["native", "plugin"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_image(stacks: dict[str, Stack], world: World, name: str, path: str) -> None:
    case = CASES[name]
    watched = {w: world.path(w) for w in (*case.watch, "bait")}
    before = {w: host_snapshot(p) for w, p in watched.items()}
    if name == "race-on-volume-folder":
        with _Racer(world.path("volume"), world.path("bait")) as racer:
            outs = [_run(stacks[path], world, name, case) for _ in range(3)]
        assert racer.swaps > 0
        assert all(out == WORKS for out in outs), outs
    else:
        out = _run(stacks[path], world, name, case)
        if case.refusal:
            assert out.startswith("refused: ") and "Traceback" not in out, out
            (line,) = [x for x in out.splitlines() if case.refusal in x]  # one line, whole
            assert "the hook writes only into the container's own filesystems" in line, out
        else:
            assert out == WORKS, out
    assert {w: host_snapshot(p) for w, p in watched.items()} == before
