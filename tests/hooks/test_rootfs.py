"""Hostile images: whatever symlinks the image plants, the hooks act inside the root only.

Each case builds a root whose links point at the host (``/``, ``../../..``, absolute host
paths, magic links, loops), runs both hooks through both resolvers, and checks that a
"bait" tree outside the root and the host's own loader files are byte-for-byte unchanged,
and that the hook either refused with a clear message or wrote inside the root.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cdi.hooks.ldconfig import update_ldcache
from cdi.hooks.rootfs import RootFS, RootFSError, split_container_path
from cdi.hooks.symlinks import Link, create_symlinks
from tests.hooks.conftest import tree_digest

HOST_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf")


def _host_digest() -> str:
    h = hashlib.sha256()
    for path in HOST_FILES:
        if os.path.exists(path):
            h.update(Path(path).read_bytes())
    h.update("\0".join(sorted(os.listdir("/etc/ld.so.conf.d"))).encode())
    h.update(b"1" if os.path.lexists("/libcuda.so.1") else b"0")
    return h.hexdigest()


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, Path]:
    """(root, bait): an empty container root and a host tree next to it."""
    bait = tmp_path / "bait"
    for d in ("etc/ld.so.conf.d", "usr/lib"):
        (bait / d).mkdir(parents=True)
    (bait / "etc/ld.so.cache").write_bytes(b"host cache")
    (bait / "etc/ld.so.conf.d/host.conf").write_text("/host\n")
    (bait / "usr/lib/libcuda.so.1").write_text("host lib")
    root = tmp_path / "root"
    root.mkdir()
    return root, bait


def _link(root: Path, path: str, target: str) -> None:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, p)


Setup = Callable[[Path, Path], None]

# name -> (plant links in root given (root, bait), link path the hook is asked to make)
CASES: dict[str, tuple[Setup, str]] = {
    "lib-to-slash": (lambda r, b: _link(r, "usr/lib", "/"), "/usr/lib/libcuda.so.1"),
    "lib-to-dotdots": (lambda r, b: _link(r, "usr/lib", "../../../../../../../.."),
                       "/usr/lib/libcuda.so.1"),
    "lib-to-host-abs": (lambda r, b: _link(r, "usr/lib", str(b / "usr/lib")),
                        "/usr/lib/libcuda.so.1"),
    "lib-to-host-rel": (lambda r, b: _link(r, "usr/lib", os.path.relpath(b / "usr/lib",
                                                                         r / "usr")),
                        "/usr/lib/libcuda.so.1"),
    "parent-of-parent": (lambda r, b: _link(r, "usr", str(b / "usr")),
                         "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
    "link-itself-to-host": (lambda r, b: _link(r, "usr/lib/libcuda.so.1",
                                               str(b / "usr/lib/libcuda.so.1")),
                            "/usr/lib/libcuda.so.1"),
    "loop": (lambda r, b: (_link(r, "a", "b"), _link(r, "b", "a")), "/a/libcuda.so.1"),
    "self-loop": (lambda r, b: _link(r, "usr", "/usr"), "/usr/lib/libcuda.so.1"),
    "etc-to-host-abs": (lambda r, b: _link(r, "etc", str(b / "etc")), "/usr/lib/libx.so.1"),
    "etc-to-slash-etc-dotdot": (lambda r, b: _link(r, "etc", "../../../../etc"),
                                "/usr/lib/libx.so.1"),
    "confd-to-host": (lambda r, b: ((r / "etc").mkdir(),
                                    _link(r, "etc/ld.so.conf.d", str(b / "etc/ld.so.conf.d"))),
                      "/usr/lib/libx.so.1"),
    "cache-to-host": (lambda r, b: ((r / "etc").mkdir(),
                                    _link(r, "etc/ld.so.cache", str(b / "etc/ld.so.cache"))),
                      "/usr/lib/libx.so.1"),
}


def _run_hooks(root: RootFS, link_path: str) -> list[str]:
    """Both hooks; returns the refusals (messages) instead of raising."""
    refused: list[str] = []
    folder = os.path.dirname(link_path)
    for action in (lambda: create_symlinks(root, [Link(target="libcuda.so.580", path=link_path)]),
                   lambda: update_ldcache(root, [folder])):
        try:
            action()
        except (RootFSError, OSError) as exc:
            refused.append(str(exc))
    return refused


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_tree_stays_inside(need_root: None, world: tuple[Path, Path], case: str,
                                   open_root: Callable[[Path], RootFS]) -> None:
    root_dir, bait = world
    plant, link_path = CASES[case]
    plant(root_dir, bait)
    before_bait, before_host = tree_digest(bait), _host_digest()
    refused = _run_hooks(open_root(root_dir), link_path)
    assert tree_digest(bait) == before_bait
    assert _host_digest() == before_host
    for message in refused:
        assert "Too many levels" in message or "dangling" in message or "ELOOP" in message \
            or "not a" in message, message


def test_slash_link_lands_at_root(world: tuple[Path, Path],
                                  open_root: Callable[[Path], RootFS]) -> None:
    root_dir, _bait = world
    _link(root_dir, "usr/lib", "/")
    create_symlinks(open_root(root_dir), [Link(target="libcuda.so.580",
                                               path="/usr/lib/libcuda.so.1")])
    assert os.readlink(root_dir / "libcuda.so.1") == "libcuda.so.580"


def test_absolute_host_link_is_reinterpreted_in_root(world: tuple[Path, Path],
                                                     open_root: Callable[[Path], RootFS]) -> None:
    root_dir, bait = world
    _link(root_dir, "usr/lib", str(bait / "usr/lib"))
    link = Link(target="libcuda.so.580", path="/usr/lib/libcuda.so.1")
    # Inside the root the link dangles: no folder is made through it.
    with pytest.raises(RootFSError, match="dangling symlink"):
        create_symlinks(open_root(root_dir), [link])
    # Once the same path exists inside the root, that is where the link goes.
    inside = root_dir / str(bait / "usr/lib").lstrip("/")
    inside.mkdir(parents=True)
    create_symlinks(open_root(root_dir), [link])
    assert os.readlink(inside / "libcuda.so.1") == "libcuda.so.580"
    assert (bait / "usr/lib/libcuda.so.1").read_text() == "host lib"


def test_loop_is_refused(world: tuple[Path, Path], open_root: Callable[[Path], RootFS]) -> None:
    root_dir, _bait = world
    _link(root_dir, "a", "b")
    _link(root_dir, "b", "a")
    with pytest.raises(OSError) as info:
        create_symlinks(open_root(root_dir), [Link(target="t", path="/a/x")])
    assert info.value.errno == 40  # ELOOP


@pytest.mark.parametrize("path", ["/usr/../../etc/passwd", "usr/lib/x", "/a/./../b", "/"])
def test_dotdot_and_relative_link_names_are_refused(path: str) -> None:
    with pytest.raises(RootFSError):
        Link(target="t", path=path)
    if path != "/":
        with pytest.raises(RootFSError):
            split_container_path(path)


def test_magic_link_is_not_followed(need_root: None, world: tuple[Path, Path],
                                    open_root: Callable[[Path], RootFS]) -> None:
    """With a real procfs inside the root, /proc/self/root would be the host's root."""
    root_dir, bait = world
    (root_dir / "proc").mkdir()
    if subprocess.run(["mount", "-t", "proc", "proc", str(root_dir / "proc")]).returncode:
        pytest.skip("cannot mount proc here")
    try:
        _link(root_dir, "usr/lib", f"/proc/self/root{bait}/usr/lib")
        before = tree_digest(bait)
        # openat2 refuses magic links (ELOOP); the walk reads "/" from the link, stays
        # inside, and finds that the in-root path does not exist.
        with pytest.raises((OSError, RootFSError)):
            create_symlinks(open_root(root_dir), [Link(target="libcuda.so.580",
                                                       path="/usr/lib/libcuda.so.1")])
        assert tree_digest(bait) == before
    finally:
        subprocess.run(["umount", str(root_dir / "proc")], check=True)
