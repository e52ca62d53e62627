"""update-ldcache against glibc's real loader, the hook-free LD_LIBRARY_PATH mode, and
the hook process's immunity to the container's environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cdi.hooks import entry
from cdi.hooks.launcher import LauncherError, build_launcher, launcher_source
from cdi.libpath import EXTRA_LIBRARY_PATH_ENV, merge_library_path
from cdi.linux.ldcache import LdCacheEntry, encode, libcmp, merge, parse_ldcache, read_ldcache
from tests import arm64
from tests.hooks.conftest import NIX_GLIBC, Artifacts, host_loader, make_bundle
from tests.hooks.test_symlinks import run_hook

pytestmark = pytest.mark.skipif(not os.path.exists("/lib64/ld-linux-x86-64.so.2"),
                                reason="needs an x86_64 glibc host")

CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
FAKE_DIR = "/opt/fake/lib"  # not one of the loader's default folders: only the cache finds it


# --- the pure writer ------------------------------------------------------------------------


@pytest.mark.parametrize(("a", "b", "sign"), [
    (b"libc.so.6", b"libc.so.6", 0), (b"libz.so.10", b"libz.so.9", 1),
    (b"libz.so.1", b"libz.so", 1), (b"liba.so", b"libb.so", -1), (b"lib1", b"liba", 1),
    (b"libfoo.so.01", b"libfoo.so.1", 0),
])
def test_libcmp(a: bytes, b: bytes, sign: int) -> None:
    assert (libcmp(a, b) > 0) - (libcmp(a, b) < 0) == sign
    assert (libcmp(b, a) > 0) - (libcmp(b, a) < 0) == -sign


def test_host_cache_round_trips_in_ldconfig_order() -> None:
    host = read_ldcache("/etc/ld.so.cache")
    ours = merge([], host)
    assert [e.key for e in ours] == [e.key for e in host]
    assert parse_ldcache(encode(ours)) == ours


def test_first_wins_for_equal_names() -> None:
    image = LdCacheEntry(key="libcuda.so.1", path="/usr/local/cuda/compat/libcuda.so.1",
                         flags=0x303)
    injected = LdCacheEntry(key="libcuda.so.1", path="/usr/lib64/libcuda.so.1", flags=0x303)
    extension = LdCacheEntry(key="libm.so.6", path="/x", flags=0x303, hwcap=1 << 62)
    assert merge([injected], [image, image, extension]) == [injected, image]


# --- a tiny root and glibc's own loader ------------------------------------------------------


def _glibc_root(tmp: Path, a: Artifacts) -> Path:
    root = tmp / "rootfs"
    ld, libc = host_loader()
    for src, dest in ((ld, "lib64/ld-linux-x86-64.so.2"),
                      (libc, "lib/x86_64-linux-gnu/libc.so.6"), (a.prog, "prog"),
                      (a.fake, f"{FAKE_DIR.lstrip('/')}/libfake.so.1.2.3")):
        (root / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, root / dest)
    return root


def _chroot(root: Path, *env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHROOT, str(root), "/prog"], env=dict(e.split("=", 1) for e in env),
                          capture_output=True, text=True, check=False)


def test_loader_finds_injected_library(need_root: None, tmp_path: Path,
                                       artifacts: Artifacts) -> None:
    root = _glibc_root(tmp_path, artifacts)
    assert "dlopen failed" in _chroot(root).stdout  # nothing finds it yet
    state = make_bundle(tmp_path, root)
    link = run_hook(state, "create-symlinks", "--link",
                    f"libfake.so.1.2.3::{FAKE_DIR}/libfake.so.1")
    cache = run_hook(state, "update-ldcache", "--folder", FAKE_DIR)
    assert link.returncode == 0 and cache.returncode == 0, link.stderr + cache.stderr
    assert _chroot(root).stdout == "answer=42\n"
    conf = root / "etc/ld.so.conf.d"
    assert not conf.exists()  # the image had none; we add no config it did not ask for


def test_soname_link_made_and_image_cache_kept(need_root: None, tmp_path: Path,
                                               artifacts: Artifacts) -> None:
    """Without create-symlinks, as ldconfig would; the image's own entries survive, and the
    host's ldconfig reads the file we wrote."""
    root = _glibc_root(tmp_path, artifacts)
    (root / "etc/ld.so.conf.d").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    subprocess.run(["ldconfig", "-r", str(root)], check=True)  # the image's own cache
    image = {e.key for e in read_ldcache(root / "etc/ld.so.cache")}
    assert "libc.so.6" in image
    proc = run_hook(make_bundle(tmp_path, root), "update-ldcache", "--folder", FAKE_DIR,
                    "--ldconfig-path", "/sbin/ldconfig")
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(root / FAKE_DIR.lstrip("/") / "libfake.so.1") == "libfake.so.1.2.3"
    keys = [e.key for e in read_ldcache(root / "etc/ld.so.cache")]
    assert image <= set(keys) and "libfake.so.1" in keys
    printed = subprocess.run(["ldconfig", "-r", str(root), "-p"], capture_output=True,
                             text=True, check=True).stdout
    assert f"libfake.so.1 (libc6,x86-64) => {FAKE_DIR}/libfake.so.1" in printed
    assert (root / "etc/ld.so.conf.d/000-nri-cdi.conf").read_text() == f"{FAKE_DIR}\n"
    assert _chroot(root).stdout == "answer=42\n"


def test_library_of_another_architecture_is_named_and_left_out(
        need_root: None, tmp_path: Path, artifacts: Artifacts) -> None:
    """An aarch64 library among the injected ones (a wrong driver): one line naming it, its
    architecture and the machine's; no cache entry, which the loader would pass over."""
    root = _glibc_root(tmp_path, artifacts)
    foreign = arm64.aarch64_library(root / FAKE_DIR.lstrip("/") / "libarm.so.1.0", "libarm.so.1")
    assert foreign.exists()
    proc = run_hook(make_bundle(tmp_path, root), "update-ldcache", "--folder", FAKE_DIR)
    assert proc.returncode == 0, proc.stderr
    machine = os.uname().machine
    assert (f"nri-cdi hook update-ldcache: {FAKE_DIR}/libarm.so.1.0 is built for aarch64, and "
            f"this machine is {machine}: left out of the cache") in proc.stderr.splitlines()
    keys = [e.key for e in read_ldcache(root / "etc/ld.so.cache")]
    assert "libfake.so.1" in keys and "libarm.so.1" not in keys
    assert _chroot(root).stdout == "answer=42\n"


def test_malformed_image_cache_is_replaced(need_root: None, tmp_path: Path,
                                           artifacts: Artifacts) -> None:
    root = _glibc_root(tmp_path, artifacts)
    (root / "etc").mkdir()
    (root / "etc/ld.so.cache").write_bytes(b"glibc-ld.so.cache1.1" + b"\xff" * 40)
    proc = run_hook(make_bundle(tmp_path, root), "update-ldcache", "--folder", FAKE_DIR)
    assert proc.returncode == 0 and "not usable" in proc.stderr
    assert _chroot(root).stdout == "answer=42\n"


def test_musl_path_file(tmp_path: Path, artifacts: Artifacts) -> None:
    root = tmp_path / "rootfs"
    (root / "lib").mkdir(parents=True)
    (root / "lib/ld-musl-x86_64.so.1").write_bytes(b"")
    proc = run_hook(make_bundle(tmp_path, root), "update-ldcache", "--folder", "/usr/lib64")
    assert proc.returncode == 0, proc.stderr
    assert (root / "etc/ld-musl-x86_64.path").read_text() == \
        "/lib\n/usr/local/lib\n/usr/lib\n/usr/lib64\n"
    assert not (root / "etc/ld.so.cache").exists()


# --- hook-free mode: a Nix-like image --------------------------------------------------------


def test_nix_like_root_with_ld_library_path(need_root: None, tmp_path: Path,
                                            artifacts: Artifacts) -> None:
    """Loader and libc under /nix/store, no /etc, no /usr/lib: the links are bind mounts of
    the versioned file (a hard link stands in here) and LD_LIBRARY_PATH finds the folder.
    /usr/lib64 is used because the Debian loader standing in for Nix's searches
    /usr/lib/x86_64-linux-gnu by default, which Nix's does not."""
    root = tmp_path / "rootfs"
    ld, libc = host_loader()
    store = root / NIX_GLIBC.lstrip("/")
    store.mkdir(parents=True)
    shutil.copy2(ld, store / "ld-linux-x86-64.so.2")
    shutil.copy2(libc, store / "libc.so.6")
    shutil.copy2(artifacts.nix_prog, root / "prog")
    lib = root / "usr/lib64"
    lib.mkdir(parents=True)
    shutil.copy2(artifacts.fake, lib / "libfake.so.1.2.3")
    os.link(lib / "libfake.so.1.2.3", lib / "libfake.so.1")
    assert "dlopen failed" in _chroot(root).stdout
    env = merge_library_path(["PATH=/bin", "LD_LIBRARY_PATH=/opt/image/lib",
                              f"{EXTRA_LIBRARY_PATH_ENV}=/usr/lib64"])
    assert env == ("PATH=/bin", "LD_LIBRARY_PATH=/opt/image/lib:/usr/lib64")
    assert _chroot(root, *env).stdout == "answer=42\n"


@pytest.mark.parametrize(("env", "want"), [
    (["A=1"], ("A=1",)),
    ([f"{EXTRA_LIBRARY_PATH_ENV}=/x:/y"], ("LD_LIBRARY_PATH=/x:/y",)),
    (["LD_LIBRARY_PATH=", f"{EXTRA_LIBRARY_PATH_ENV}=/x"], ("LD_LIBRARY_PATH=/x",)),
    (["LD_LIBRARY_PATH=/x::/a:", f"{EXTRA_LIBRARY_PATH_ENV}=/x:/b", "Z=1"],
     ("Z=1", "LD_LIBRARY_PATH=/x:/a:/b")),
])
def test_merge_library_path(env: list[str], want: tuple[str, ...]) -> None:
    assert merge_library_path(env) == want


# --- the container's environment never reaches the hook's code --------------------------------


def _hostile_env(a: Artifacts, tmp: Path) -> dict[str, str]:
    evil = tmp / "evil"
    (evil / "cdi/hooks").mkdir(parents=True)
    payload = f"open({str(a.marker)!r}, 'a').write('python\\n')\n"
    for name in ("sitecustomize.py", "usercustomize.py", "startup.py", "cdi/__init__.py",
                 "cdi/hooks/__init__.py", "cdi/hooks/cli.py"):
        (evil / name).write_text(payload)
    return {"LD_PRELOAD": str(a.preload), "PYTHONPATH": str(evil), "PYTHONHOME": str(evil),
            "PYTHONSTARTUP": str(evil / "startup.py"), "PYTHONINSPECT": "1",
            "PYTHONUSERBASE": str(evil), "HOME": str(evil), "PATH": "/usr/bin:/bin"}


def test_preload_marker_works_as_a_control(artifacts: Artifacts) -> None:
    artifacts.marker.unlink(missing_ok=True)
    subprocess.run(["/bin/true"], env={"LD_PRELOAD": str(artifacts.preload)}, check=True)
    assert artifacts.marker.read_text() == "loaded\n"
    artifacts.marker.unlink()


def test_static_launcher_ignores_hostile_environment(need_root: None, tmp_path: Path,
                                                     artifacts: Artifacts) -> None:
    launcher = tmp_path / "nri-cdi-hook"
    try:
        build_launcher(str(launcher))
    except LauncherError as exc:
        pytest.skip(str(exc))
    root = _glibc_root(tmp_path, artifacts)
    artifacts.marker.unlink(missing_ok=True)
    hook = entry.launcher(str(launcher), "update-ldcache", ["--folder", FAKE_DIR])
    proc = subprocess.run(list(hook.args), executable=hook.path, input=make_bundle(tmp_path, root),
                          env=_hostile_env(artifacts, tmp_path), cwd=tmp_path / "evil",
                          capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert not artifacts.marker.exists()
    assert _chroot(root).stdout == "answer=42\n"


def test_isolated_python_ignores_python_environment(tmp_path: Path,
                                                    artifacts: Artifacts) -> None:
    """``-I -S``: PYTHONPATH, startup files, user site and the current folder (runc may start
    hooks inside the container root) are not used, even if the env reached Python."""
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    env = _hostile_env(artifacts, tmp_path)
    del env["LD_PRELOAD"], env["PYTHONHOME"]  # those act before Python: see the launcher test
    artifacts.marker.unlink(missing_ok=True)
    hook = entry.isolated_python("create-symlinks", ["--link", "t::/x"])
    proc = subprocess.run(list(hook.args), executable=hook.path,
                          input=make_bundle(tmp_path, rootfs), env=env, cwd=tmp_path / "evil",
                          capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert not artifacts.marker.exists()
    assert os.readlink(rootfs / "x") == "t"


def test_hook_entries_carry_an_explicit_environment() -> None:
    hook = entry.isolated_python("update-ldcache", ["--folder", "/usr/lib64"])
    assert hook.path == sys.executable and hook.args[:4] == (
        sys.executable, "-I", "-S", entry.ENTRY_SCRIPT)
    assert hook.env == entry.HOOK_ENV and all(not e.startswith(("LD_", "PYTHON"))
                                              for e in hook.env)
    with pytest.raises(ValueError, match="explicit env"):
        entry.HookCommand(path="/bin/x", args=("x",), env=())
    with pytest.raises(LauncherError):
        launcher_source(python='/usr/bin/python3"; system("x")')
