"""create-symlinks semantics, the OCI state, and refusing read-only roots."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cdi.hooks.entry import ENTRY_SCRIPT, HOOK_ENV
from cdi.hooks.rootfs import RootFS, RootFSError
from cdi.hooks.state import StateError, read_state
from cdi.hooks.symlinks import Link, create_symlinks, parse_link
from tests.hooks.conftest import make_bundle, tree_digest


def run_hook(state: bytes, *args: str) -> subprocess.CompletedProcess[str]:
    """The hook exactly as a spec from cdi.hooks.entry.isolated_python starts it."""
    env = dict(e.split("=", 1) for e in HOOK_ENV)
    return subprocess.run([sys.executable, "-I", "-S", ENTRY_SCRIPT, *args],
                          input=state.decode(), env=env, capture_output=True, text=True,
                          cwd="/", check=False)


def test_created_with_parents(tmp_path: Path, open_root: Callable[[Path], RootFS]) -> None:
    results = create_symlinks(open_root(tmp_path), [
        Link(target="libcuda.so.1", path="/usr/lib/x86_64-linux-gnu/libcuda.so"),
        Link(target="../libnvidia-allocator.so.1",
             path="/usr/lib/x86_64-linux-gnu/gbm/nvidia-drm_gbm.so")])
    assert [r.action for r in results] == ["created", "created"]
    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    assert os.readlink(lib / "libcuda.so") == "libcuda.so.1"
    assert os.readlink(lib / "gbm/nvidia-drm_gbm.so") == "../libnvidia-allocator.so.1"
    assert oct((lib / "gbm").stat().st_mode & 0o777) == "0o755"


def test_same_target_is_kept(tmp_path: Path, open_root: Callable[[Path], RootFS]) -> None:
    os.symlink("libcuda.so.580", tmp_path / "libcuda.so.1")
    ino = os.lstat(tmp_path / "libcuda.so.1").st_ino
    (result,) = create_symlinks(open_root(tmp_path), [parse_link("libcuda.so.580::/libcuda.so.1")])
    assert result.action == "kept"
    assert os.lstat(tmp_path / "libcuda.so.1").st_ino == ino


def test_other_target_and_file_are_replaced(tmp_path: Path,
                                            open_root: Callable[[Path], RootFS]) -> None:
    os.symlink("libGLX_mesa.so.0", tmp_path / "libGLX_indirect.so.0")
    (tmp_path / "libcuda.so.1").write_text("stub")
    results = create_symlinks(open_root(tmp_path), [
        Link(target="libGLX_nvidia.so.580", path="/libGLX_indirect.so.0"),
        Link(target="libcuda.so.580", path="/libcuda.so.1")])
    assert [(r.action, r.previous) for r in results] == [
        ("replaced", "libGLX_mesa.so.0"), ("replaced", "<file>")]
    assert os.readlink(tmp_path / "libGLX_indirect.so.0") == "libGLX_nvidia.so.580"
    assert sorted(os.listdir(tmp_path)) == ["libGLX_indirect.so.0", "libcuda.so.1"]


def test_folder_is_not_replaced(tmp_path: Path, open_root: Callable[[Path], RootFS]) -> None:
    (tmp_path / "libcuda.so.1").mkdir()
    with pytest.raises(RootFSError, match="not a file or a link"):
        create_symlinks(open_root(tmp_path), [Link(target="x", path="/libcuda.so.1")])


def test_replacement_is_atomic(tmp_path: Path, open_root: Callable[[Path], RootFS]) -> None:
    """A reader never sees the name missing while it is replaced again and again."""
    os.symlink("a", tmp_path / "l")
    root = open_root(tmp_path)
    stop, missing = threading.Event(), []

    def read() -> None:
        while not stop.is_set():
            try:
                os.readlink(tmp_path / "l")
            except FileNotFoundError:
                missing.append(1)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(300):
            create_symlinks(root, [Link(target=f"t{i}", path="/l")])
    finally:
        stop.set()
        reader.join()
    assert not missing
    assert os.listdir(tmp_path) == ["l"]


@pytest.mark.parametrize("spec", ["no-separator", "::/x", "t::", "t::relative"])
def test_bad_link_arguments(spec: str) -> None:
    with pytest.raises(RootFSError):
        parse_link(spec)


# --- OCI state ------------------------------------------------------------------------------


def test_state_relative_and_absolute_root(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    for relative in (True, False):
        state = make_bundle(tmp_path, rootfs, relative=relative, readonly=True)
        container = read_state(_Stream(state))
        assert container.path == str(rootfs)
        assert container.readonly and container.container_id == "c1"


@pytest.mark.parametrize("text", ["", "[]", "{}", '{"bundle": "relative"}', "{bad"])
def test_bad_state(text: str) -> None:
    with pytest.raises(StateError):
        read_state(_Stream(text.encode()))


def test_missing_config_is_reported(tmp_path: Path) -> None:
    with pytest.raises(StateError, match=r"config\.json"):
        read_state(_Stream(b'{"bundle": "%s"}' % str(tmp_path).encode()))


class _Stream:
    def __init__(self, data: bytes):
        self._data = data

    def read(self, n: int = -1) -> bytes:
        return self._data


# --- the command line, as the runtime runs it ------------------------------------------------


def test_cli_create_symlinks(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    state = make_bundle(tmp_path, rootfs)
    args = ["create-symlinks", "--link", "libcuda.so.1::/usr/lib64/libcuda.so",
            "--link", "libcuda.so.580::/usr/lib64/libcuda.so.1"]
    for _ in range(2):  # a second run changes nothing
        proc = run_hook(state, *args)
        assert proc.returncode == 0, proc.stderr
    assert os.readlink(rootfs / "usr/lib64/libcuda.so.1") == "libcuda.so.580"


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    proc = run_hook(make_bundle(tmp_path, rootfs), "create-symlinks", "--link", "t::/a/../b")
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0
    assert "'..' is not allowed" in proc.stderr


@pytest.fixture
def read_only_root(need_root: None, tmp_path: Path) -> Iterator[Path]:
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr/lib").mkdir(parents=True)
    (rootfs / "etc").mkdir()
    if subprocess.run(["mount", "--bind", str(rootfs), str(rootfs)]).returncode:
        pytest.skip("cannot bind-mount here")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(rootfs)], check=True)
        yield rootfs
    finally:
        subprocess.run(["umount", str(rootfs)], check=True)


@pytest.mark.parametrize("args", [
    ["create-symlinks", "--link", "libcuda.so.580::/usr/lib/libcuda.so.1"],
    ["create-symlinks", "--link", "libcuda.so.580::/usr/lib/new/libcuda.so.1"],
    ["update-ldcache", "--folder", "/usr/lib"],
])
def test_read_only_root_is_refused_clearly(read_only_root: Path, tmp_path: Path,
                                           args: list[str]) -> None:
    before = tree_digest(read_only_root)
    proc = run_hook(make_bundle(tmp_path, read_only_root), *args)
    assert proc.returncode == 1
    assert "read-only" in proc.stderr and "--link-mode mounts" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert tree_digest(read_only_root) == before
