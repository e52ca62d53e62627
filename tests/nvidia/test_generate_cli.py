"""``nri-cdi generate`` as a command: flags, environment variables, errors, atomic output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cdi.hooks.cli import operations
from cdi.nvidia import cli
from cdi.spec import parse_spec
from nri_cdi_testbed.simnode import BuiltNode, NodeLayout
from tests.helpers import run_generate as generate

REPO = Path(__file__).resolve().parents[2]
HOOK = "/usr/local/bin/nri-cdi"
needs_nodes = pytest.mark.skipif(os.geteuid() != 0, reason="needs real device nodes (root)")


@pytest.fixture(scope="module")
def node(node_factory: Callable[[str, NodeLayout], BuiltNode]) -> BuiltNode:
    return node_factory("cli-node", NodeLayout.uniform(
        2, mig={1: "3g.40gb,3g.40gb"}, seed="cli-node"))


@pytest.fixture
def root_args(node: BuiltNode) -> list[str]:
    return ["--driver-root", str(node.driver_root), "--mode", "procfs", "--hook-path", HOOK]


def names(text: str, json_format: bool = False) -> list[str]:
    return [d.name for d in parse_spec(text, "x.json" if json_format else "x.yaml").data.devices]


# --- flags and environment ------------------------------------------------------------------


@needs_nodes
def test_environment_variables(node: BuiltNode, tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    env = {
        "NVIDIA_CTK_DRIVER_ROOT": str(node.driver_root),
        "NVIDIA_CTK_CDI_GENERATE_MODE": "nvml",
        "NVIDIA_CTK_CDI_OUTPUT_FILE_PATH": str(target),
        "NVIDIA_CTK_CDI_GENERATE_DEVICE_NAME_STRATEGIES": "type-index,uuid",
        "NVIDIA_CTK_CDI_GENERATE_VENDOR": "example.com",
        "NVIDIA_CTK_CDI_GENERATE_CLASS": "accel",
        "NVIDIA_CTK_CDI_GENERATE_NO_ALL_DEVICE": "true",
        "NVIDIA_CTK_CDI_HOOK_PATH": "/opt/nri-cdi",
        "NVIDIA_CTK_CDI_GENERATE_DISABLED_HOOKS": "update-ldcache",
    }
    rc, _, err = generate([], env)
    assert rc == 0, err
    spec = parse_spec(target.read_text(), str(target)).data  # JSON, inferred from .json
    json.loads(target.read_text())
    assert spec.kind == "example.com/accel"
    device_names = {d.name for d in spec.devices}
    assert {"gpu0", "mig1:0", "mig1:1", node.manifest["gpus"][0]["uuid"]} <= device_names
    assert "all" not in device_names and "0" not in device_names
    (hook,) = spec.container_edits.hooks  # our hook program: one entry, every operation
    assert [a for a in hook.args if a in operations()] == [
        "create-symlinks", "enable-cuda-compat", "disable-device-node-modification"]
    assert hook.path == "/opt/nri-cdi"
    # A flag wins over its variable.
    env["NVIDIA_CTK_CDI_OUTPUT_FILE_PATH"] = ""
    rc, out, _ = generate(["--vendor", "nvidia.com"], env)
    assert rc == 0 and parse_spec(out).data.kind == "nvidia.com/accel"


@needs_nodes
def test_format_and_extension(root_args: list[str], tmp_path: Path) -> None:
    rc, out, _ = generate([*root_args, "--format", "json"])
    assert rc == 0 and json.loads(out)["kind"] == "nvidia.com/gpu"
    rc, _, err = generate([*root_args, "--format", "json", "--output", str(tmp_path / "a.yaml")])
    assert rc == 1 and "does not match" in err
    rc, _, err = generate([*root_args, "--output", str(tmp_path / "b.yml")])
    assert rc == 0 and (tmp_path / "b.yml.yaml").is_file()  # as nvidia-ctk; and says so
    assert "# metadata: b.yml.yaml.meta\n" in (tmp_path / "b.yml.yaml").read_text()
    assert "only read .json and .yaml" in err
    rc, _, _ = generate([*root_args, "--output", str(tmp_path / "c"), "--format", "json"])
    assert rc == 0 and json.loads((tmp_path / "c.json").read_text())


@needs_nodes
def test_device_ids(node: BuiltNode, root_args: list[str]) -> None:
    uuid0 = node.manifest["gpus"][0]["uuid"]
    nvml = [*root_args, "--mode", "nvml"]
    rc, out, _ = generate([*nvml, "--device-id", "1:1", "--device-id", uuid0.lower()])
    mig11 = node.manifest["gpus"][1]["mig_devices"][1]["uuid"]
    assert rc == 0 and sorted(names(out)) == sorted(["0", "1:1", uuid0, mig11, "all"])
    # procfs cannot tell which slice NVML calls 1:1: it refuses the name, and offers its own.
    rc, _, err = generate([*root_args, "--device-id", "1:1"])
    assert rc == 1 and "--device-id '1:1'" in err
    rc, out, _ = generate([*root_args, "--device-id", "1:gi2-ci0"])
    assert rc == 0 and sorted(names(out)) == ["1:gi2-ci0", "all"]
    rc, out, _ = generate([*root_args, "--device-id", "none"])
    spec = parse_spec(out).data
    assert [d.name for d in spec.devices] == ["none"]
    assert spec.devices[0].container_edits.env == ("NVCT_EMPTY_DEVICE=",)
    assert spec.container_edits.mounts  # the driver is still there
    rc, _, err = generate([*root_args, "--device-id", "7"])
    assert rc == 1 and "--device-id '7'" in err


@needs_nodes
def test_hooks_options(root_args: list[str]) -> None:
    rc, out, _ = generate([*root_args, "--disable-hook", "all"])
    spec = parse_spec(out).data
    assert not spec.container_edits.hooks
    assert not any(d.container_edits.hooks for d in spec.devices)
    rc, out, _ = generate([*root_args, "--disable-hooks", "all", "--enable-hook", "update-ldcache",
                           "--ldconfig-path", "/sbin/ldconfig.real"])
    hooks = parse_spec(out).data.container_edits.hooks
    assert [h.args[2:5] for h in hooks] == [("update-ldcache", "--ldconfig-path",
                                             "/sbin/ldconfig.real")]
    assert generate([*root_args, "--enable-hook", "all"])[0] == 1
    rc, _, err = generate([*root_args, "--disable-hook", "bogus"])
    assert rc == 1 and "unknown --disable-hook 'bogus'" in err
    # nvidia-ctk's hooks that we lack: disabling them is true already, enabling is refused.
    assert generate([*root_args, "--disable-hook", "chmod"])[0] == 0
    for name in ("chmod", "update-application-profile"):
        rc, _, err = generate([*root_args, "--enable-hook", name])
        assert rc == 1 and f"--enable-hook {name}: not supported" in err


@needs_nodes
def test_management_mode(node: BuiltNode) -> None:
    rc, out, err = generate(["--driver-root", str(node.driver_root), "--mode", "management",
                             "--hook-path", HOOK])
    assert rc == 0, err
    spec = parse_spec(out).data
    assert spec.kind == "management.nvidia.com/gpu"
    assert [d.name for d in spec.devices] == ["all"]
    paths = {n.path for n in spec.devices[0].container_edits.device_nodes}
    assert {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap1"} <= paths


@needs_nodes
def test_library_search_path(node: BuiltNode, root_args: list[str]) -> None:
    rc, out, err = generate([*root_args, "--library-search-path", "/nonexistent"])
    assert rc == 0 and "no *.so." in err
    mounts = parse_spec(out).data.container_edits.mounts
    assert not any("libcuda" in m.container_path for m in mounts)
    rc, out, _ = generate([*root_args, "--library-search-path", node.manifest["lib_dir"]])
    mounts = parse_spec(out).data.container_edits.mounts
    assert any("libcuda" in m.container_path for m in mounts)


def test_bad_options(tmp_path: Path) -> None:
    for argv, message in [
        (["--mode", "wsl"], "unknown --mode 'wsl'"),
        (["--device-name-strategy", "serial"], "unknown --device-name-strategy"),
        (["--hook-path", "relative/nri-cdi"], "must be absolute"),
        (["--driver-root", str(tmp_path / "missing")], "is not a folder"),
    ]:
        rc, _, err = generate(argv)
        assert rc == 1 and message in err, (argv, err)


def test_no_driver_says_what_was_looked_for(tmp_path: Path) -> None:
    rc, out, err = generate(["--driver-root", str(tmp_path), "--mode", "procfs"])
    assert rc == 1 and not out
    assert "no NVIDIA driver found" in err
    assert str(tmp_path / "proc/driver/nvidia/version") in err
    assert "libcuda.so" in err and str(tmp_path) in err
    rc, _, err = generate(["--driver-root", str(tmp_path), "--mode", "auto"])
    assert rc == 1 and "mode auto: using procfs" in err and "no NVIDIA driver found" in err


def test_wired_into_nri_cdi() -> None:
    from nri_plugin.ops.cli import build_parser

    args = build_parser().parse_args(["generate", "--mode", "procfs"])
    assert args.func is cli.cmd_generate


# --- atomic output --------------------------------------------------------------------------

_STALL = """
import os, sys, time
flag = sys.argv[1]
def stalled_replace(src, dst):
    open(flag, "w").close()
    time.sleep(60)
os.replace = stalled_replace
from cdi.nvidia.cli import main
sys.exit(main(sys.argv[2:]))
"""


@needs_nodes
def test_killed_before_rename_keeps_previous_spec(root_args: list[str], tmp_path: Path) -> None:
    target = tmp_path / "nvidia.yaml"
    assert generate([*root_args, "--output", str(target)])[0] == 0
    previous = target.read_bytes()
    flag = tmp_path / "stalled"
    proc = subprocess.Popen(
        [sys.executable, "-c", _STALL, str(flag), *root_args, "--output", str(target),
         "--device-name-strategy", "uuid"],
        cwd=REPO, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.02)
        # The new spec is complete in its temporary file; die right before the rename.
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert target.read_bytes() == previous
    parse_spec(previous, str(target))
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert all(n.startswith(".nvidia.yaml.") for n in leftovers)  # ignored by spec watchers


@needs_nodes
def test_failed_write_keeps_previous_spec(root_args: list[str], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "nvidia.yaml"
    assert generate([*root_args, "--output", str(target)])[0] == 0
    previous = target.read_bytes()

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    rc, _, err = generate([*root_args, "--output", str(target), "--device-name-strategy", "uuid"])
    assert rc == 1 and f"error: cannot write {target}: No space left on device" in err
    assert target.read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nvidia.yaml", "nvidia.yaml.meta"]


@needs_nodes
def test_missing_output_folder_is_a_write_error(root_args: list[str], tmp_path: Path) -> None:
    target = tmp_path / "absent" / "nvidia.yaml"
    rc, _, err = generate([*root_args, "--output", str(target)])
    assert rc == 1 and f"error: cannot write {target}: No such file or directory" in err


@needs_nodes
def test_unreadable_node_is_a_read_error(root_args: list[str], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    real_stat = os.stat

    def denied(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if str(path).endswith("x86_64-linux-gnu"):  # the library folder
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", denied)
    rc, _, err = generate([*root_args, "--output", str(tmp_path / "nvidia.yaml")])
    assert "cannot write" not in err
    assert rc == 1 and "error: cannot read " in err and "Permission denied" in err


@needs_nodes
def test_output_mode_is_0644(root_args: list[str], tmp_path: Path) -> None:
    target = tmp_path / "nvidia.yaml"
    old = os.umask(0o077)
    try:
        assert generate([*root_args, "--output", str(target)])[0] == 0
    finally:
        os.umask(old)
    assert target.stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "nvidia.yaml.meta").stat().st_mode & 0o777 == 0o644


@needs_nodes
def test_as_a_process(root_args: list[str], tmp_path: Path) -> None:
    target = tmp_path / "nvidia.yaml"
    proc = subprocess.run([sys.executable, "-m", "cdi.nvidia.cli", *root_args, "--output",
                           str(target)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    parse_spec(target.read_text(), str(target))
    # The generate path needs none of the extras: jsonschema (validate --schema), pynvml
    # (outside nvml mode), protobuf (the plugin's).
    probe = ("import sys; from cdi.nvidia.cli import main; main(sys.argv[1:]); "
             "bad = {'jsonschema', 'pynvml', 'google.protobuf'} & set(sys.modules); "
             "sys.exit(f'imported {bad}' if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", probe, *root_args, "--output", str(target)],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_options_are_declared_once_and_resolved_into_a_frozen_record() -> None:
    import argparse
    import dataclasses

    from cdi.nvidia.options import OPTIONS, GenerateOptions, add_arguments, resolve

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    env = {"NVIDIA_CTK_CDI_GENERATE_MODE": "procfs", "NVIDIA_CTK_DRIVER_ROOT": "/env",
           "NVIDIA_CTK_CDI_GENERATE_DEVICE_IDS": "0, 1,", "NVIDIA_CTK_DEBUG": "yes",
           "NVIDIA_CTK_CDI_GENERATE_CLASS": ""}
    got = resolve(parser.parse_args(["--driver-root", "/flag", "--disable-hook", "a,b",
                                     "--disable-hook", "c"]), env)
    assert got.driver_root == "/flag"  # a flag wins over its variable
    assert (got.mode, got.device_ids, got.debug) == ("procfs", ("0", "1"), True)
    assert got.disabled_hooks == ("a", "b", "c")  # comma-separated in flags too
    assert got.class_ == "gpu" and got.strategies == ("index", "uuid")  # "" is not given
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.mode = "nvml"  # type: ignore[misc]
    assert resolve(parser.parse_args([]), {}) == GenerateOptions()
    # Every option has a variable; every flag is the parser's.
    flags = {f for action in parser._actions for f in action.option_strings}
    for name, spec in OPTIONS.items():
        assert spec.env, name
        assert set(spec.flags) <= flags, name
