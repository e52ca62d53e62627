"""Every nvidia-ctk option and variable ``generate`` accepts has its effect, or is refused by
name: hook programs (ours, nvidia-cdi-hook, nvidia-ctk), hooks by link mode, feature flags,
CSV options, --debug/--quiet, --config, and NVIDIA_CTK_CDI_SPEC_DIRS for ``list``.  Where
NVIDIA's hook binary is at hand ($NRI_CDI_PEERS), the hooks written for it are run by it on
a container root, so "arguments it understands" is checked by the binary itself."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cdi import cli as cdi_cli
from cdi.hooks.cli import operations
from cdi.linux.ldcache import read_ldcache
from cdi.model import Hook
from cdi.nvidia.cdi_commands import SPEC_DIRS_ENV
from cdi.spec import parse_spec
from nri_cdi_testbed.simnode import BuiltNode, NodeLayout
from nri_plugin.ops.cli import build_parser
from tests.helpers import run_generate as generate
from tests.hooks.conftest import make_bundle
from tests.nvidia import hook_recording
from tests.peers import absent, peer, recording_requested

needs_nodes = pytest.mark.skipif(os.geteuid() != 0, reason="needs real device nodes (root)")


@pytest.fixture(scope="module")
def node(node_factory: Callable[[str, NodeLayout], BuiltNode]) -> BuiltNode:
    return node_factory("options-node", NodeLayout.uniform(1, seed="options"))


@pytest.fixture
def args(node: BuiltNode) -> list[str]:
    return ["--driver-root", str(node.driver_root), "--mode", "procfs"]


def hooks_of(out: str) -> list[Hook]:
    return list(parse_spec(out).data.container_edits.hooks)


# --- hook programs --------------------------------------------------------------------------


DEFAULT_OPS = ["create-symlinks", "enable-cuda-compat", "update-ldcache",
               "disable-device-node-modification"]


@needs_nodes
@pytest.mark.parametrize(("path", "prefix", "env"), [
    ("/usr/bin/nvidia-cdi-hook", ("nvidia-cdi-hook",), ("NVIDIA_CTK_DEBUG=false",)),
    ("/usr/bin/nvidia-ctk", ("nvidia-ctk", "hook"), ("NVIDIA_CTK_DEBUG=false",)),
])
def test_nvidia_hook_programs_get_their_layout(args: list[str], node: BuiltNode, path: str,
                                               prefix: tuple[str, ...],
                                               env: tuple[str, ...]) -> None:
    """NVIDIA's programs run one hook per entry: nvidia-ctk's layout and order, the
    devices' by-path links in a create-symlinks entry of each device."""
    for how in (["--nvidia-cdi-hook-path", path], ["--hook-path", path]):
        rc, out, err = generate([*args, *how])
        assert rc == 0, err
        hooks = hooks_of(out)
        assert [h.args[len(prefix)] for h in hooks] == DEFAULT_OPS
        assert all(h.path == path and h.args[:len(prefix)] == prefix and h.env == env
                   for h in hooks)
        assert hooks[1].args[len(prefix) + 1:] == (
            f"--host-driver-version={node.driver_version}",)
        assert "--device-link" not in {a for h in hooks for a in h.args}
        for device in parse_spec(out).data.devices:
            (own,) = device.container_edits.hooks
            assert own.args[len(prefix)] == "create-symlinks"
            assert "/dev/dri/by-path/" in own.args[-1]
    rc, out, _ = generate([*args], {"NVIDIA_CTK_CDI_HOOK_PATH": path})
    assert rc == 0 and hooks_of(out)[0].path == path


@needs_nodes
@pytest.mark.parametrize(("path", "prefix"), [
    ("/usr/local/bin/nri-cdi", ("nri-cdi", "hook")),
    ("/opt/nri-cdi-hook", ("/opt/nri-cdi-hook",)),
])
def test_our_hook_programs_get_one_entry(args: list[str], node: BuiltNode, path: str,
                                         prefix: tuple[str, ...]) -> None:
    """Ours run every operation in one process (issue 16), in nvidia-ctk's order."""
    for how in (["--nvidia-cdi-hook-path", path], ["--hook-path", path]):
        rc, out, err = generate([*args, *how])
        assert rc == 0, err
        (hook,) = hooks_of(out)
        assert hook.path == path and hook.args[:len(prefix)] == prefix
        assert hook.env == ("PATH=/usr/sbin:/usr/bin:/sbin:/bin",)
        assert hook.args[len(prefix)] == "create-symlinks"
        assert [a for a in hook.args if a in operations()] == DEFAULT_OPS
        compat = hook.args.index("enable-cuda-compat")
        assert hook.args[compat + 1] == f"--host-driver-version={node.driver_version}"
        assert not any(d.container_edits.hooks for d in parse_spec(out).data.devices)
    rc, out, _ = generate([*args], {"NVIDIA_CTK_CDI_HOOK_PATH": path})
    assert rc == 0 and hooks_of(out)[0].path == path


@needs_nodes
def test_debug_reaches_nvidia_hooks(args: list[str]) -> None:
    rc, out, err = generate([*args, "--hook-path", "/usr/bin/nvidia-cdi-hook", "--debug"])
    assert rc == 0 and "debug: procfs mode: driver" in err
    assert {h.env for h in hooks_of(out)} == {("NVIDIA_CTK_DEBUG=true",)}


def test_unknown_hook_program_refused(tmp_path: Path) -> None:
    rc, _, err = generate(["--hook-path", "/usr/bin/my-hook"])
    assert rc == 1 and "'my-hook' is not a hook program nri-cdi knows" in err
    rc, _, err = generate([], {"NVIDIA_CTK_CDI_HOOK_PATH": "nvidia-cdi-hook"})
    assert rc == 1 and "must be absolute" in err


# --- hooks by link mode and mode ------------------------------------------------------------


@needs_nodes
def test_hooks_by_link_mode(args: list[str]) -> None:
    hook = ["--hook-path", "/usr/local/bin/nri-cdi"]
    rc, out, _ = generate([*args, *hook, "--link-mode", "mounts"])
    assert rc == 0 and not hooks_of(out)  # mounts mode runs no hook by default
    rc, out, _ = generate([*args, *hook, "--link-mode", "mounts", "--enable-hook",
                           "disable-device-node-modification"])
    assert [h.args[2:] for h in hooks_of(out)] == [("disable-device-node-modification",)]
    for name in ("create-symlinks", "update-ldcache", "enable-cuda-compat"):
        rc, _, err = generate([*args, "--link-mode", "mounts", "--enable-hook", name])
        assert rc == 1 and f"--enable-hook {name}: --link-mode mounts runs no" in err
    rc, out, _ = generate([*args, *hook, "--disable-hook", "enable-cuda-compat",
                           "--disable-hook", "disable-device-node-modification"])
    (hook,) = hooks_of(out)
    assert [a for a in hook.args if a in operations()] == ["create-symlinks", "update-ldcache"]


@needs_nodes
def test_management_mode_has_no_params_hook(node: BuiltNode) -> None:
    base = ["--driver-root", str(node.driver_root), "--mode", "management"]
    rc, out, _ = generate(base)
    assert rc == 0
    assert "disable-device-node-modification" not in {h.args[-1] for h in hooks_of(out)}
    rc, out, _ = generate([*base, "--enable-hook", "disable-device-node-modification"])
    assert any("disable-device-node-modification" in h.args for h in hooks_of(out))


# --- feature flags, CSV, config, debug/quiet -------------------------------------------------


@needs_nodes
def test_feature_flags(args: list[str], node: BuiltNode) -> None:
    rc, with_ipc, _ = generate(args)
    assert rc == 0
    rc, out, err = generate([*args, "--feature-flag", "disable-ipc-discoverer",
                             "--feature-flags", "disable-nvsandboxutils"])
    assert rc == 0, err
    before = {m.container_path for m in parse_spec(with_ipc).data.container_edits.mounts}
    after = {m.container_path for m in parse_spec(out).data.container_edits.mounts}
    assert {p for p in before - after} and all("socket" in p or "mps" in p
                                               for p in before - after)
    rc, out, _ = generate(args, {"NVIDIA_CTK_CDI_GENERATE_FEATURE_FLAGS":
                                 "disable-ipc-discoverer,no-additional-gids-for-device-nodes"})
    assert rc == 0 and {m.container_path for m in
                        parse_spec(out).data.container_edits.mounts} == after
    for flag in ("enable-explicit-driver-libraries", "enable-coherent-annotations"):
        rc, _, err = generate([*args, "--feature-flag", flag])
        assert rc == 1 and f"--feature-flag {flag}: not supported" in err
    rc, _, err = generate(args, {"NVIDIA_CTK_CDI_GENERATE_FEATURE_FLAGS": "bogus"})
    assert rc == 1 and "unknown --feature-flag 'bogus'" in err


def test_csv_options_outside_csv_mode_refused() -> None:
    """Outside --mode csv the CSV options would do nothing: refused by name."""
    for argv, env, flag in (
            (["--csv.file", "/etc/x.csv"], {}, "--csv.file"),
            (["--csv.ignore-pattern", "*.so"], {}, "--csv.ignore-pattern"),
            (["--csv.compat-container-root", "/usr/local/cuda/compat_orin"], {},
             "--csv.compat-container-root"),
            ([], {"NVIDIA_CTK_CDI_GENERATE_CSV_FILES": "/etc/a.csv,/etc/b.csv"}, "--csv.file")):
        rc, _, err = generate(["--mode", "procfs", *argv], env)
        assert rc == 1 and f"{flag} / " in err and "only for --mode csv" in err, (argv, env)


@needs_nodes
def test_quiet_and_debug(args: list[str], tmp_path: Path) -> None:
    noisy = [*args, "--output", str(tmp_path / "x.yml")]  # warns about the extension
    rc, _, err = generate(noisy)
    assert rc == 0 and "only read .json and .yaml" in err
    rc, _, err = generate(noisy, {"NVIDIA_CTK_QUIET": "true", "NVIDIA_CTK_DEBUG": "1"})
    assert rc == 0 and err == ""
    rc, _, err = generate([*args, "--quiet", "--device-id", "9"])
    assert rc == 1 and "--device-id '9'" in err  # errors still say why
    rc, _, err = generate(args, {"NVIDIA_CTK_DEBUG": "true"})
    assert rc == 0 and "debug: driver root" in err
    rc, _, err = generate(args, {"NVIDIA_CTK_DEBUG": "false"})
    assert rc == 0 and "debug:" not in err


@needs_nodes
def test_config_file_gives_the_driver_root(node: BuiltNode, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[nvidia-container-cli]\nroot = "{node.driver_root}"\n'
                      '[nvidia-container-runtime]\nmode = "cdi"\n')
    rc, out, err = generate(["--mode", "procfs"], {"NVIDIA_CTK_CONFIG": str(config)})
    assert rc == 0, err
    assert any(str(node.driver_root) in m.host_path
               for m in parse_spec(out).data.container_edits.mounts)
    config.write_text('[nvidia-container-cli]\nroot = "relative"\n')
    rc, _, err = generate(["--config", str(config)])
    assert rc == 1 and "nvidia-container-cli.root: want an absolute path" in err
    config.write_text("not = [toml")
    rc, _, err = generate(["--config", str(config)])
    assert rc == 1 and "not TOML" in err
    rc, _, err = generate(["--config", str(tmp_path / "missing.toml")])
    assert rc == 1 and "missing.toml" in err


# --- missing control nodes ------------------------------------------------------------------


@needs_nodes
def test_missing_uvm_is_warned(node_factory: Callable[[str, NodeLayout], BuiltNode]) -> None:
    bare = node_factory("no-uvm", NodeLayout.uniform(1, seed="no-uvm"))
    for name in ("nvidia-uvm", "nvidia-uvm-tools"):
        (bare.dev_root / "dev" / name).unlink()
    rc, out, err = generate(["--driver-root", str(bare.driver_root), "--mode", "procfs"])
    assert rc == 0
    assert "control device nodes missing" in err and "/dev/nvidia-uvm-tools, /dev/nvidia-uvm" \
        in err and "nri-cdi system create-device-nodes --control-devices" in err
    nodes = {n.path for n in parse_spec(out).data.container_edits.device_nodes}
    assert "/dev/nvidia-uvm" not in nodes and "/dev/nvidiactl" in nodes


# --- nri-cdi list and NVIDIA_CTK_CDI_SPEC_DIRS -------------------------------------------------


def test_list_reads_nvidia_ctk_spec_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    for folder, name in (("a", "x"), ("b", "y")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "s.yaml").write_text(
            f"cdiVersion: 0.3.0\nkind: example.com/dev\ndevices:\n- name: {name}\n"
            "  containerEdits:\n    env: [A=1]\n")
    monkeypatch.setenv("NVIDIA_CTK_CDI_SPEC_DIRS", f"{tmp_path / 'a'},{tmp_path / 'b'}")
    assert cdi_cli.cmd_list(argparse.Namespace(spec_dirs=None, json=False, strict=False,
                                               spec_dirs_env=SPEC_DIRS_ENV)) == 0
    assert capsys.readouterr().out.split() == ["example.com/dev=x", "example.com/dev=y"]
    # --spec-dir wins over the variable
    cdi_cli.cmd_list(argparse.Namespace(spec_dirs=[str(tmp_path / "b")], json=False,
                                        strict=False, spec_dirs_env=SPEC_DIRS_ENV))
    assert capsys.readouterr().out.split() == ["example.com/dev=y"]
    # the command line nri-cdi builds passes the variable's name; the neutral default none
    parser = build_parser("list")
    assert parser.parse_args(["list"]).spec_dirs_env == SPEC_DIRS_ENV
    sub = argparse.ArgumentParser().add_subparsers()
    cdi_cli.add_commands(sub)
    assert cdi_cli.cmd_list(sub.choices["list"].parse_args([])) == 0
    assert "example.com/dev" not in capsys.readouterr().out


# --- NVIDIA's binary runs what we wrote for it ----------------------------------------------

NVIDIA_PROGRAMS = ("nvidia-cdi-hook", "nvidia-ctk")


def every_hook(out: str) -> list[Hook]:
    """The spec-wide hooks, then each device's (its /dev/dri/by-path links)."""
    data = parse_spec(out).data
    return [*data.container_edits.hooks,
            *(h for d in data.devices for h in d.container_edits.hooks)]


def _run_nvidia_hooks(program: str, binary: Path, args: list[str], node: BuiltNode,
                      tmp_path: Path) -> dict[str, Any]:
    """Each hook entry of our spec for ``binary``, run by it on a container root: what it
    did (hook_recording's form), and the root's ld.so.cache at the end."""
    # NVIDIA's update-ldcache mounts the host's /sbin/ldconfig into the root and runs it.
    rc, out, err = generate([*args, "--hook-path", str(binary)])
    assert rc == 0, err
    root = tmp_path / "rootfs"
    lib = node.manifest["lib_dir"]
    (root / lib.lstrip("/")).mkdir(parents=True)
    (root / "etc").mkdir()
    version = node.driver_version
    shutil.copy2(node.lib_dir / f"libcuda.so.{version}", root / lib.lstrip("/"))
    state = make_bundle(tmp_path, root)
    node_root = os.fspath(node.root)
    runs = []
    for hook in every_hook(out):
        before = hook_recording.tree(root)
        # As under runc: a private mount namespace whose root folder is a mount point
        # (update-ldcache pivot_roots into it).
        proc = subprocess.run(
            ["unshare", "-m", "--propagation", "private", sys.executable, "-c", _EXEC, str(root),
             hook.path, *hook.args], input=state, env=dict(e.split("=", 1) for e in hook.env),
            capture_output=True, check=False)
        runs.append({
            "args": hook_recording.arguments(program, hook.args, node_root),
            "env": list(hook.env), "exit": proc.returncode,
            "stdout": hook_recording.printed(proc.stdout, root, node_root),
            "stderr": hook_recording.printed(proc.stderr, root, node_root),
            "changed": hook_recording.changed(before, hook_recording.tree(root))})
    cache = sorted(f"{e.key} => {e.path}" for e in read_ldcache(root / "etc/ld.so.cache"))
    return {"hooks": runs, "ld.so.cache": cache}


@needs_nodes
@pytest.mark.parametrize("program", NVIDIA_PROGRAMS)
def test_nvidia_binary_understands_the_hooks(args: list[str], node: BuiltNode, tmp_path: Path,
                                             program: str) -> None:
    """The real program runs each hook we wrote for it (where $NRI_CDI_PEERS has it), and
    what it did is what hook_recording holds (or, with $NRI_CDI_RECORD_PEERS=1, becomes it)."""
    binary = peer(program)
    if not binary.is_file():
        pytest.skip(absent(program))
    did = _run_nvidia_hooks(program, binary, args, node, tmp_path)
    for run in did["hooks"]:
        assert run["exit"] == 0, run
        assert "Unsupported" not in run["stderr"] and "Incorrect Usage" not in run["stderr"]
    lib = node.manifest["lib_dir"]
    version = node.driver_version
    assert os.readlink(tmp_path / "rootfs" / lib.lstrip("/") / "libcuda.so.1") == (
        f"libcuda.so.{version}")
    assert f"libcuda.so.1 => {lib}/libcuda.so.1" in did["ld.so.cache"]
    if recording_requested():
        doc = hook_recording.load() if hook_recording.HOOKS_FILE.is_file() else {}
        doc.setdefault("programs", {})[program] = did
        doc["version"] = " ".join(subprocess.run(
            [str(peer("nvidia-ctk")), "--version"], capture_output=True, text=True,
            check=True).stdout.split())
        hook_recording.save(doc)
    assert hook_recording.load()["programs"][program] == did, (
        f"{program} no longer does what was recorded: {hook_recording.RECORD_HINT}")


def _check_recorded(program: str, hooks: list[Hook], node: BuiltNode) -> None:
    """Each of ``hooks`` is an entry the real ``program`` was recorded running, accepted."""
    recorded = hook_recording.load()["programs"][program]
    runs = {tuple(r["args"]): r for r in recorded["hooks"]}
    for hook in hooks:
        key = tuple(hook_recording.arguments(program, hook.args, os.fspath(node.root)))
        assert key in runs, (f"{program} was never recorded running {list(key)}: "
                             + hook_recording.RECORD_HINT)
        run = runs[key]
        assert run["exit"] == 0 and run["env"] == list(hook.env), run
        assert "Incorrect Usage" not in run["stderr"] and "Unsupported" not in run["stderr"]


@needs_nodes
@pytest.mark.parametrize("program", NVIDIA_PROGRAMS)
def test_hook_arguments_are_recorded(args: list[str], node: BuiltNode, program: str) -> None:
    """Without the program: every hook entry our spec writes for it today is one the real
    program was recorded running, and the recording says it accepted it and did its work."""
    rc, out, err = generate([*args, "--hook-path", f"/usr/bin/{program}"])
    assert rc == 0, err
    _check_recorded(program, every_hook(out), node)
    recorded = hook_recording.load()["programs"][program]
    lib = node.manifest["lib_dir"]
    made = {line for r in recorded["hooks"] for line in r["changed"]}
    assert f"{lib}/libcuda.so.1 l -> libcuda.so.{node.driver_version}" in made
    assert f"libcuda.so.1 => {lib}/libcuda.so.1" in recorded["ld.so.cache"]


@needs_nodes
def test_an_unrecorded_hook_argument_fails(args: list[str], node: BuiltNode) -> None:
    rc, out, err = generate([*args, "--hook-path", "/usr/bin/nvidia-cdi-hook"])
    assert rc == 0, err
    hook = every_hook(out)[0]
    changed = Hook(hook.hook_name, hook.path, (*hook.args, "--link", "a::/b"), hook.env)
    with pytest.raises(AssertionError, match="re-record with the real binary"):
        _check_recorded("nvidia-cdi-hook", [changed], node)


_EXEC = """import os, subprocess, sys
root, path, *argv = sys.argv[1:]
subprocess.run(["mount", "--bind", root, root], check=True)
os.execve(path, argv, dict(os.environ))
"""


# --- --cdi-version and the runtimes' maxima -------------------------------------------------


@needs_nodes
def test_cdi_version_by_runtime(args: list[str]) -> None:
    rc, out, err = generate([*args, "--cdi-version", "podman-4.3"])
    assert rc == 0 and parse_spec(out).data.cdi_version == "0.5.0" and "cannot read" not in err
    # A dot in the class needs 0.6.0: refused for podman 4.3, warned about without a target.
    rc, _, err = generate([*args, "--class", "gpu.all", "--cdi-version", "podman-4.3"])
    assert rc == 1 and "needs cdiVersion 0.6.0" in err and "more than --cdi-version 0.5.0" in err
    # (without the 0660 /dev/dri nodes' additionalGids, which need 0.7.0 themselves)
    rc, out, err = generate([*args, "--class", "gpu.all",
                             "--feature-flag", "no-additional-gids-for-device-nodes"])
    assert rc == 0 and parse_spec(out).data.cdi_version == "0.6.0"
    assert "podman-4.3 (up to 0.5.0) cannot read" in err and "containerd" not in err
    rc, _, err = generate([*args, "--cdi-version", "docker-27"])
    assert rc == 1 and "one of podman-4.3, containerd-1.7.24, containerd-2.1.9" in err
