"""arm64 nodes end to end on this amd64 machine: arm64 containers on the private containerd
1.7 and 2.1, run by qemu-aarch64 through binfmt_misc (tests/e2e/binfmt.py: registered for
the module, undone after), with NVIDIA's real arm64 driver 550.163.01 as Debian ships it
and its kernel side simulated (tests/arm64.py says where each part comes from).

Through native CDI and through our plugin, in both link modes, an arm64 glibc image
(Debian's arm64 loader and libraries, busybox) runs

* nri_cdi_testbed/node_check/cuda_probe.c built with aarch64-linux-gnu-gcc: dlopen() of the
  real arm64 libcuda.so.1 succeeds, every dependency resolved, and cuInit(0) answers the
  driver's own CUDA_ERROR_NO_DEVICE (100): there is no kernel module;
* the real arm64 nvidia-smi, to its own "couldn't communicate with the NVIDIA driver";
* a check that every path the spec makes exists in the container, no link dangling.

In hooks mode the spec's hook program is our hook entry run by Debian's arm64 python3 (the
arm64 root's loader starts it, the emulator runs it): the createContainer hooks execute
aarch64 syscalls, which the emulator's strace log shows (openat2 for every path they
resolve inside the root), and the ld.so.cache they write names libcuda.so.1 as an aarch64
library. Through the plugin, NVIDIA_DRIVER_CAPABILITIES=utility trims the driver to
nvidia-smi's part: libnvidia-ml, no libcuda.

The simulated node built for aarch64 (nri_cdi_testbed/simnode, its C cross-compiled): the
same probe in the same image passes every CUDA call it makes on its fake libcuda (one GPU,
its name, a context, an allocation), and its nvidia-smi lists that GPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdi.hooks.entry import HOOK_ENV
from cdi.linux.ldcache import read_ldcache
from cdi.nvidia.sidecar import SUFFIX as SIDECAR_SUFFIX
from nri_cdi_testbed.node_check.images import add_busybox, base_rootfs
from nri_cdi_testbed.simnode import NodeLayout, build_node
from tests import arm64
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient
from tests.e2e.images import DEFAULT_PATH, ImageConfig, LayerWriter, write_archive
from tests.e2e.plugin import PluginProcess
from tests.helpers import generate_link_modes
from tests.nvidia_debian import VERSION, kernel_side

REPO = Path(__file__).resolve().parents[2]
PROBE_SOURCE = REPO / "nri_cdi_testbed" / "node_check" / "cuda_probe.c"
IMAGE = "localhost/gpu/debian-arm64:e2e"
SMI_MESSAGE = "couldn't communicate with the NVIDIA driver"
CUDA_ERROR_NO_DEVICE = 100
LIBS = f"/usr/lib/{arm64.TRIPLET}"


@pytest.fixture(scope="module")
def parts(arm64_containers: arm64.Arm64) -> arm64.Arm64:
    return arm64_containers


def _arm64_hooks(spec_file: Path, parts: arm64.Arm64, strace_log: Path) -> None:
    """The spec's hook entries run by the arm64 python3 instead of ours, the emulator told to
    log every syscall (``%d``: one file per process). The generator's sidecar is told the
    new spec's digest, as the plugin uses it only for the spec it was written with."""
    text = spec_file.read_text()
    head, sep, body = text.partition("---\n")
    spec = yaml.safe_load(body)
    for hook in spec["containerEdits"].get("hooks", []):
        python, isolated, nosite, script, *operations = hook["args"]
        assert (isolated, nosite) == ("-I", "-S") and python == hook["path"], hook
        argv = parts.python_argv()
        hook["path"] = argv[0]
        hook["args"] = [*argv, "-I", "-S", script, *operations]
        hook["env"] = [*HOOK_ENV, "QEMU_LOG=strace", f"QEMU_LOG_FILENAME={strace_log}-%d"]
    data = (head + sep + yaml.safe_dump(spec, sort_keys=False)).encode()
    spec_file.write_bytes(data)
    sidecar = spec_file.with_name(spec_file.name + SIDECAR_SUFFIX)
    meta = json.loads(sidecar.read_text())
    meta["spec"]["sha256"] = hashlib.sha256(data).hexdigest()
    sidecar.write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def world(parts: arm64.Arm64, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = arm64.driver_root()
    out = tmp_path_factory.mktemp("arm64")
    kernel = kernel_side(out / "kernel")
    # 0.6.0: no additionalGids (as test_real_driver_e2e.py)
    generate_link_modes(out, root, kernel.dev_root, cdi_version="0.6.0")
    (out / "strace").mkdir()
    _arm64_hooks(out / "hooks" / "nvidia.yaml", parts, out / "strace" / "hook")
    parts.compile(out / "cuda_probe", PROBE_SOURCE, "-ldl")
    return {"out": out, "root": root}


def _image(ctrd: Containerd, parts: arm64.Arm64, world: dict[str, Path]) -> None:
    out = world["out"]
    archive = out / "image.tar"
    if not archive.exists():
        layer = LayerWriter()
        base_rootfs(layer)
        add_busybox(layer, parts.busybox, runner=[str(parts.qemu)])
        layer.file("lib/ld-linux-aarch64.so.1", parts.loader.read_bytes(), 0o755)
        for name in ("libc.so.6", *arm64.LIBCUDA_GLIBC_NEEDS):
            source = os.path.realpath(parts.root / "lib" / arm64.TRIPLET / name)
            layer.file(f"lib/{arm64.TRIPLET}/{name}", Path(source).read_bytes(), 0o755)
        layer.file("cuda_probe", (out / "cuda_probe").read_bytes(), 0o755)
        config = ImageConfig(cmd=("sleep", "600"), architecture="arm64",
                             env=(DEFAULT_PATH, "NVIDIA_DRIVER_CAPABILITIES=all"))
        write_archive(IMAGE, layer.tar(), archive, config)
    ctrd.import_images(archive)


def _paths_the_spec_makes(spec_file: Path) -> list[str]:
    spec = yaml.safe_load(spec_file.read_text().split("---", 1)[1])
    edits = spec["containerEdits"]
    (gpu0,) = [d["containerEdits"] for d in spec["devices"] if d["name"] == "0"]
    paths = [m["containerPath"] for m in edits.get("mounts", [])]
    paths += [n["path"] for n in (*edits.get("deviceNodes", []), *gpu0.get("deviceNodes", []))]
    for hook in edits.get("hooks", []):
        args = hook["args"]
        paths += [args[i + 1].split("::")[-1] for i, w in enumerate(args)
                  if w in ("--link", "--device-link")]
    assert any(p.startswith(f"{LIBS}/nvidia/current/libcuda.so") for p in paths)
    return sorted(set(paths))


def _cuda_probe(cri: CriClient, cid: str) -> None:
    probe = cri.exec_sync(cid, ["/cuda_probe"], timeout=60)
    lines = probe.stdout.splitlines()
    assert lines[:2] == ["dlopen 0", f"cuInit {CUDA_ERROR_NO_DEVICE}"], probe
    assert probe.exit_code == 1, probe


def _check(ctrd: Containerd, parts: arm64.Arm64, world: dict[str, Path], mode: str, *,
           pod_annotations: dict[str, str] | None = None,
           cdi_devices: list[str] | None = None) -> None:
    spec_file = world["out"] / mode / "nvidia.yaml"
    paths = _paths_the_spec_makes(spec_file)
    with ctrd.cri() as cri, cri.cleanup():
        pod = cri.run_pod(f"p-arm64-{mode}", annotations=pod_annotations or {})
        kwargs = {"cdi_devices": cdi_devices} if cdi_devices else {}
        cid = cri.run_container(pod, "c", IMAGE, command=["sleep", "600"], **kwargs)
        machine = cri.exec_sync(cid, ["uname", "-m"])
        assert machine.stdout.strip() == "aarch64", machine
        _cuda_probe(cri, cid)
        smi = cri.exec_sync(cid, ["/usr/bin/nvidia-smi"], timeout=60)
        assert smi.exit_code == 9 and SMI_MESSAGE in smi.stdout + smi.stderr, smi
        script = ('for p in "$@"; do [ -e "$p" ] && continue; '
                  '[ -L "$p" ] && echo "dangling: $p -> $(readlink "$p")" || echo "missing: $p"; '
                  'done')
        missing = cri.exec_sync(cid, ["sh", "-c", script, "sh", *paths], timeout=60)
        assert missing.exit_code == 0 and missing.stdout == "", missing.stdout
        if mode == "hooks":
            _hooks_ran_as_aarch64(cri, cid, world)


def _hooks_ran_as_aarch64(cri: CriClient, cid: str, world: dict[str, Path]) -> None:
    rootfs = Path(f"/proc/{cri.container_info(cid)['pid']}/root")
    cuda = [e for e in read_ldcache(rootfs / "etc/ld.so.cache") if e.key == "libcuda.so.1"]
    assert cuda and {e.arch_flag for e in cuda} == {0x0A00}, cuda  # FLAG_AARCH64_LIB64
    logs = sorted((world["out"] / "strace").glob("hook-*"))
    assert logs, "the emulator logged no hook process"
    text = "\n".join(log.read_text() for log in logs)
    # Every path inside the container root is resolved by an aarch64 openat2: it answers a
    # descriptor, or ENOENT for what the hook then makes (never ENOSYS: no fallback walk).
    calls = re.findall(r'openat2\(\d+,"([^"]*)",\{[^}]*RESOLVE_IN_ROOT[^}]*\},24\) = '
                       r'(-?\d+)(?: errno=(\d+))?', text)
    if not calls and "Unknown syscall 437" in text:
        # A system's emulator (binfmt.registered uses one that is there) whose strace has
        # no name for openat2: the call is seen by its aarch64 number only; what it did
        # shows in the links and the cache checked above.
        return
    assert any(path.endswith("nvidia/current/libcuda.so.1") and int(fd) >= 0
               for path, fd, _ in calls), calls[:20]
    assert {errno for _, fd, errno in calls if int(fd) < 0} <= {"2"}, calls


@pytest.mark.parametrize("mode", ["hooks", "mounts"])
def test_native_cdi(containerd: ContainerdFactory, parts: arm64.Arm64,
                    world: dict[str, Path], mode: str) -> None:
    ctrd = containerd(enable_cdi=True, cdi_spec_dirs=[world["out"] / mode])
    _image(ctrd, parts, world)
    _check(ctrd, parts, world, mode, cdi_devices=["nvidia.com/gpu=0"])


@pytest.mark.parametrize("mode", ["hooks", "mounts"])
def test_our_plugin(containerd: ContainerdFactory, parts: arm64.Arm64,
                    world: dict[str, Path], mode: str) -> None:
    ctrd = containerd()
    _image(ctrd, parts, world)
    plugin = PluginProcess(ctrd.nri_socket, [world["out"] / mode],
                           world["out"] / f"plugin-{mode}.log").start()
    try:
        _check(ctrd, parts, world, mode,
               pod_annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
    finally:
        plugin.kill()

@pytest.mark.parametrize("mode", ["hooks", "mounts"])
def test_our_plugin_trims_to_the_capabilities_asked(containerd: ContainerdFactory,
                                                    parts: arm64.Arm64, world: dict[str, Path],
                                                    mode: str) -> None:
    """NVIDIA_DRIVER_CAPABILITIES=utility: nvidia-smi and libnvidia-ml, and no libcuda."""
    ctrd = containerd()
    _image(ctrd, parts, world)
    plugin = PluginProcess(ctrd.nri_socket, [world["out"] / mode],
                           world["out"] / f"plugin-trim-{mode}.log").start()
    try:
        with ctrd.cri() as cri, cri.cleanup():
            pod = cri.run_pod(f"p-arm64-utility-{mode}",
                              annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
            cid = cri.run_container(pod, "c", IMAGE, command=["sleep", "600"],
                                    env={"NVIDIA_DRIVER_CAPABILITIES": "utility"})
            smi = cri.exec_sync(cid, ["/usr/bin/nvidia-smi"], timeout=60)
            assert smi.exit_code == 9 and SMI_MESSAGE in smi.stdout + smi.stderr, smi
            present = cri.exec_sync(cid, ["ls", f"{LIBS}/nvidia/current"])
            names = present.stdout.split()
            assert f"libnvidia-ml.so.{VERSION}" in names, present
            # No libcuda file under any of its names (in hooks mode the hook's links to it
            # are made all the same, and dangle).
            cuda = [f"{LIBS}/nvidia/current/{n}" for n in names if n.startswith("libcuda.so")]
            cuda.append(f"{LIBS}/libcuda.so.1")
            files = cri.exec_sync(cid, ["sh", "-c", 'for p; do [ ! -e "$p" ] || echo "$p"; done',
                                        "sh", *cuda])
            assert files.exit_code == 0 and files.stdout == "", files
            probe = cri.exec_sync(cid, ["/cuda_probe"], timeout=60)
            assert probe.exit_code == 2 and "libcuda.so.1" in probe.stdout, probe
    finally:
        plugin.kill()


@pytest.fixture(scope="module")
def simulated(parts: arm64.Arm64, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("arm64-simnode")
    node = build_node(out / "node", NodeLayout.uniform(2, machine="aarch64", seed="arm64-e2e"),
                      cache_dir=out / "cache", ldconfig=[str(parts.qemu), str(parts.ldconfig)])
    generate_link_modes(out, node.driver_root, cdi_version="0.6.0")
    _arm64_hooks(out / "hooks" / "nvidia.yaml", parts, out / "strace")
    return {"out": out, "node": node}


@pytest.mark.parametrize("mode", ["hooks", "mounts"])
def test_simulated_aarch64_node_through_our_plugin(containerd: ContainerdFactory,
                                                   parts: arm64.Arm64, world: dict[str, Path],
                                                   simulated: dict[str, Any],
                                                   mode: str) -> None:
    ctrd = containerd()
    _image(ctrd, parts, world)
    out = simulated["out"]
    plugin = PluginProcess(ctrd.nri_socket, [out / mode], out / f"plugin-{mode}.log").start()
    gpu = simulated["node"].manifest["gpus"][1]
    try:
        with ctrd.cri() as cri, cri.cleanup():
            pod = cri.run_pod(f"p-arm64-sim-{mode}",
                              annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=1"})
            cid = cri.run_container(pod, "c", IMAGE, command=["sleep", "600"])
            probe = cri.exec_sync(cid, ["/cuda_probe"], timeout=60)
            assert probe.exit_code == 0, probe
            assert f"cuDeviceGetName 0 {gpu['name']}" in probe.stdout.splitlines(), probe
            assert "cuDeviceGetCount 0 1" in probe.stdout.splitlines(), probe
            smi = cri.exec_sync(cid, ["nvidia-smi", "-L"], timeout=60)
            assert smi.exit_code == 0 and f"(UUID: {gpu['uuid']})" in smi.stdout, smi
    finally:
        plugin.kill()
