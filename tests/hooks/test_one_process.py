"""One hook process for every operation (issue 16): the command line, device links, the
start-up path's imports, and the light stand-ins it uses (JSON decoding, NamedTuple)."""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from cdi.hooks import cli
from cdi.hooks.entry import ENTRY_SCRIPT, HOOK_ENV
from cdi.hooks.state import loads, read_state
from cdi.linux.ldcache import LdCacheEntry
from cdi.linux.namedtuple import NamedTuple as LightNamedTuple
from tests.hooks.conftest import Artifacts, make_bundle, tree_digest
from tests.hooks.test_ldcache import FAKE_DIR, _chroot, _glibc_root
from tests.hooks.test_symlinks import run_hook

CARD = "/dev/dri/card1"


def test_one_process_does_every_operation(need_root: None, tmp_path: Path,
                                          artifacts: Artifacts) -> None:
    """As the generator writes it: links, the devices' links and the cache, in one entry."""
    root = _glibc_root(tmp_path, artifacts)
    state = make_bundle(tmp_path, root, devices=[CARD, "/dev/nvidia1"])
    proc = run_hook(state, "create-symlinks",
                    "--link", f"libfake.so.1.2.3::{FAKE_DIR}/libfake.so.1",
                    "--device-link", f"{CARD}::../card1::/dev/dri/by-path/pci-0000:01:00.0-card",
                    "--device-link", "/dev/dri/card0::../card0::/dev/dri/by-path/pci-0:00.0-card",
                    "update-ldcache", f"--folder={FAKE_DIR}")
    assert proc.returncode == 0, proc.stderr
    assert _chroot(root).stdout == "answer=42\n"
    by_path = root / "dev/dri/by-path"
    # Only the link of the device this container has; the other GPU's is not made.
    assert os.listdir(by_path) == ["pci-0000:01:00.0-card"]
    assert os.readlink(by_path / "pci-0000:01:00.0-card") == "../card1"


@pytest.mark.parametrize(("argv", "message"), [
    (["nope"], "'nope': not an operation (want one of: create-symlinks, update-ldcache"),
    (["create-symlinks", "--nope", "x"], "create-symlinks: unknown option --nope"),
    (["create-symlinks", "--link"], "create-symlinks --link: needs a value"),
    (["update-ldcache", "--folder", "/x", "stray"], "'stray': not an operation"),
])
def test_bad_command_line_touches_nothing(tmp_path: Path, argv: list[str],
                                          message: str) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    before = tree_digest(rootfs)
    proc = run_hook(make_bundle(tmp_path, rootfs), *argv)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert proc.stderr.startswith("nri-cdi hook usage: error: ")
    assert tree_digest(rootfs) == before


def test_failure_names_the_operation(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    proc = run_hook(make_bundle(tmp_path, rootfs), "create-symlinks", "--link", "t::/a",
                    "update-ldcache", "--folder", "relative/dir")
    assert proc.returncode == 1
    assert proc.stderr.startswith("nri-cdi hook update-ldcache: error: 'relative/dir'")
    assert os.readlink(rootfs / "a") == "t"  # operations run in order until one fails


def test_bad_device_link_is_refused(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    proc = run_hook(make_bundle(tmp_path, rootfs, devices=["/dev/x"]), "create-symlinks",
                    "--device-link", "/dev/x::/y")
    assert proc.returncode == 1 and "want DEVICE::TARGET::LINK" in proc.stderr
    assert os.listdir(rootfs) == []


# What the hook's start-up must not import: each costs it milliseconds of CPU (typing ~11,
# dataclasses ~19, json ~9, re ~7, platform ~9, secrets ~13, argparse, collections ~2).
HEAVY = {"typing", "dataclasses", "argparse", "json", "re", "enum", "collections",
         "functools", "contextlib", "platform", "secrets", "inspect", "importlib", "warnings",
         "shutil", "pathlib", "cdi.hooks.entry", "cdi.nvidia.generate", "cdi.nvidia.driver",
         "cdi.model"}


def test_start_up_imports_only_what_the_operations_use(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "lib").mkdir(parents=True)
    env = dict(e.split("=", 1) for e in HOOK_ENV)
    proc = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", ENTRY_SCRIPT,
                           "create-symlinks", "--link", "t::/x", "--device-link", "/d::t::/y",
                           "enable-cuda-compat", "--host-driver-version=580.82.07",
                           "update-ldcache", "--folder", "/lib",
                           "disable-device-node-modification",
                           "--host-params", str(tmp_path / "no-params")],
                          input=make_bundle(tmp_path, rootfs), env=env, capture_output=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.decode().splitlines()
                if line.startswith("import time:") and "|" in line}
    assert {"cdi.hooks.symlinks", "cdi.hooks.ldconfig", "cdi.nvidia.hooks.cuda_compat",
            "cdi.nvidia.hooks.device_params", "ctypes"} <= imported  # the control
    assert imported & HEAVY == set()


# --- the stand-ins ----------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    '{"a": [1, 2.5, -3e2, true, false, null, "x\\u00e9\\n"], "b": {"c": {}}}', "  [ ] \n",
    '"s"', "12", "NaN", '{"a": 1} x', "", "   ", '{"a":', '{"a": 1,}', "\ufeff{}", "[1, 2",
    "nul", '{"a": "\\ud800"}', '{"a" 1}', "[1]]",
])
def test_state_decoder_agrees_with_json(text: str) -> None:
    def outcome(decode: typing.Callable[[str], object]) -> object:
        try:
            return ("ok", json.dumps(decode(text)))
        except ValueError:
            return ("error",)

    assert outcome(loads) == outcome(json.loads)


def test_state_lists_the_device_nodes(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    state = make_bundle(tmp_path, rootfs, devices=["/dev/nvidia0", "/dev/dri/card0"])
    container = read_state(io.BytesIO(state))
    assert container.devices == {"/dev/nvidia0", "/dev/dri/card0"}
    assert container.path == str(rootfs) and not container.readonly


class _Typed(typing.NamedTuple):
    """doc"""

    key: str
    flags: int
    extra: tuple[int, ...] = ()
    name: str | None = None

    @property
    def double(self) -> int:
        return self.flags * 2


class _Light(LightNamedTuple):
    """doc"""

    key: str
    flags: int
    extra: tuple[int, ...] = ()
    name: str | None = None

    @property
    def double(self) -> int:
        return self.flags * 2


def test_light_namedtuple_behaves_like_typing() -> None:
    for cls in (_Typed, _Light):
        a = cls("k", 3)
        assert a == ("k", 3, (), None) and hash(a) == hash(("k", 3, (), None))
        assert cls(key="k", flags=3) == a and a.double == 6 and a[1] == 3
        assert a._replace(flags=4).flags == 4 and a._asdict() == {
            "key": "k", "flags": 3, "extra": (), "name": None}
        assert cls._fields == ("key", "flags", "extra", "name")
        assert cls._field_defaults == {"extra": (), "name": None}
        assert cls._make(["k", 3, (1,), "n"]).extra == (1,) and cls.__doc__ == "doc"
        assert repr(a) == f"{cls.__name__}(key='k', flags=3, extra=(), name=None)"
        for bad in ((), ("k",), ("k", 3, (), None, 5)):
            with pytest.raises(TypeError):
                cls(*bad)
        with pytest.raises(TypeError):
            cls("k", 3, flags=4)
        with pytest.raises(AttributeError):
            a.key = "x"  # type: ignore[misc]
    entry = LdCacheEntry(key="libc.so.6", path="/lib/libc.so.6", flags=0x303)
    assert pickle.loads(pickle.dumps(entry)) == entry and entry.is_64bit


def test_parse_operations_table() -> None:
    steps = cli.parse_operations(["create-symlinks", "--link", "--odd::/x", "--link=a::/b",
                                  "update-ldcache", "--ldconfig-path", "/sbin/ldconfig"])
    assert [(op.name, vars(args)) for op, args in steps] == [
        ("create-symlinks", {"link": ["--odd::/x", "a::/b"], "device_link": []}),
        ("update-ldcache", {"folder": [], "ldconfig_path": "/sbin/ldconfig"})]


def test_launcher_as_hook_path_runs_the_nri_cdi_argv(need_root: None, tmp_path: Path) -> None:
    """``generate --hook-path LAUNCHER`` writes ``[nri-cdi, hook, OPERATION, ...]``; the static
    launcher hands ``hook OPERATION ...`` to the isolated entry, which accepts it."""
    from cdi.hooks import entry
    from cdi.hooks.launcher import LauncherError, build_launcher

    launcher = tmp_path / "nri-cdi-hook"
    try:
        build_launcher(str(launcher))
    except LauncherError as exc:
        pytest.skip(str(exc))
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    hook = entry.nri_cdi(str(launcher), "create-symlinks", ["--link", "t::/x"])
    proc = subprocess.run(list(hook.args), executable=hook.path,
                          input=make_bundle(tmp_path, rootfs), env={}, capture_output=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(rootfs / "x") == "t"


def test_neutral_operations_alone_import_no_vendor(tmp_path: Path) -> None:
    """The neutral entry finds a vendor's operations only when the command line names one."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "lib").mkdir(parents=True)
    env = dict(e.split("=", 1) for e in HOOK_ENV)
    proc = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", ENTRY_SCRIPT,
                           "create-symlinks", "--link", "t::/x", "update-ldcache", "--folder",
                           "/lib"], input=make_bundle(tmp_path, rootfs), env=env,
                          capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.decode().splitlines()
                if line.startswith("import time:") and "|" in line}
    assert "cdi.hooks.ldconfig" in imported  # the control
    assert not any(m.startswith("cdi.nvidia") for m in imported), imported


def test_vendor_operations_come_from_their_own_table() -> None:
    from cdi.nvidia.hooks import operations as nvidia_operations

    assert set(cli.OPERATIONS) == {"create-symlinks", "update-ldcache"}
    assert cli.operations() == {**cli.OPERATIONS, **nvidia_operations.OPERATIONS}
    steps = cli.parse_operations(["create-symlinks", "mask-proc", "--gpu", "0000:01:00.0"])
    assert [op.name for op, _ in steps] == ["create-symlinks", "mask-proc"]


def test_build_static_launcher_command(tmp_path: Path) -> None:
    """``nri-cdi hook build-static-launcher PATH``: the command that builds the hook's
    static launcher (not the plugin's launcher, ``nri-cdi install-plugin-launcher``)."""
    from cdi.hooks.launcher import LauncherError, build_launcher

    try:
        build_launcher(str(tmp_path / "probe"))
    except LauncherError as exc:
        pytest.skip(str(exc))
    target = tmp_path / "nri-cdi-hook"
    assert cli.main(["build-static-launcher", str(target)]) == 0
    assert os.access(target, os.X_OK) and target.read_bytes()[:4] == b"\x7fELF"
    assert "build-static-launcher PATH" in cli.build_parser().format_help()
