"""The simulated node's libnvidia-ml answers NVML from the node's description, through the
real nvidia-ml-py binding (ctypes), and agrees with the pynvml test double."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cdi.nvidia.discover import discover_nvml, load_nvml
from nri_cdi_testbed.simnode import NVML_DESCRIPTION, BuiltNode, in_node_namespace

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py (pynvml) is not installed")


def _library(node: BuiltNode) -> Path:
    return node.lib_dir / f"libnvidia-ml.so.{node.driver_version}"


def _discover(node: BuiltNode) -> object:
    nvml = load_nvml(_library(node))
    try:
        return discover_nvml(nvml)
    finally:
        nvml.nvmlShutdown()


def test_library_and_double_agree(node8: BuiltNode, fake_pynvml: ModuleType,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The double is what tests that need injected faults use: it must say what the
    # simulated library says, MIG devices (UUIDs, GI/CI ids, profiles, gfx) included.
    monkeypatch.setenv("FAKE_PYNVML_MANIFEST", str(node8.manifest_path))
    from_double = discover_nvml(load_nvml(None))
    fake_pynvml.nvmlShutdown()
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    from_library = _discover(node8)
    assert from_library == from_double
    assert from_library.gpus[3].mig_devices[1].gfx  # type: ignore[attr-defined]


def test_queries_through_the_real_binding(node8: BuiltNode) -> None:
    nvml = load_nvml(_library(node8))
    try:
        manifest = node8.manifest
        assert nvml.nvmlSystemGetDriverVersion() == node8.driver_version
        assert nvml.nvmlSystemGetCudaDriverVersion_v2() == 13000
        assert nvml.nvmlDeviceGetCount() == 8
        gpu4 = manifest["gpus"][4]
        handle = nvml.nvmlDeviceGetHandleByUUID(gpu4["uuid"])
        assert nvml.nvmlDeviceGetMinorNumber(handle) == gpu4["minor"] == 7
        pci = nvml.nvmlDeviceGetPciInfo(handle)
        # bytes in older nvidia-ml-py, str since 13.x: compare the text
        bus_id = pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId
        assert bus_id == gpu4["nvml_bus_id"]
        assert pci.pciDeviceId == gpu4["pci_device_id"]
        by_bus = nvml.nvmlDeviceGetHandleByPciBusId(gpu4["nvml_bus_id"])
        assert nvml.nvmlDeviceGetUUID(by_bus) == gpu4["uuid"]
        assert nvml.nvmlDeviceGetArchitecture(handle) == nvml.NVML_DEVICE_ARCH_HOPPER
        # MIG: a handle by index, its parent, GI/CI ids, and the GPU instance's profile.
        gpu3 = nvml.nvmlDeviceGetHandleByIndex(3)
        assert nvml.nvmlDeviceGetMigMode(gpu3) == [1, 1]
        mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu3, 1)
        want = manifest["gpus"][3]["mig_devices"][1]
        assert nvml.nvmlDeviceIsMigDeviceHandle(mig)
        assert nvml.nvmlDeviceGetUUID(mig) == want["uuid"]
        gi = nvml.nvmlDeviceGetGpuInstanceById(gpu3, nvml.nvmlDeviceGetGpuInstanceId(mig))
        assert nvml.nvmlGpuInstanceGetInfo(gi).profileId == want["profile_id"]
        parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        assert nvml.nvmlDeviceGetUUID(parent) == manifest["gpus"][3]["uuid"]
        with pytest.raises(nvml.NVMLError_NotFound):
            nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu3, 2)  # an empty slot
        with pytest.raises(nvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetMinorNumber(mig)
    finally:
        nvml.nvmlShutdown()


def test_no_description_is_no_driver(node8: BuiltNode, tmp_path: Path) -> None:
    code = ("import ctypes, sys, pynvml\n"
            "pynvml.nvmlLib = ctypes.CDLL(sys.argv[1])\n"
            "try:\n    pynvml.nvmlInit()\n"
            "except pynvml.NVMLError_DriverNotLoaded:\n    print('not loaded')\n")
    env = {"SIMNODE_NVML_NODE": str(tmp_path / "missing.txt"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code, str(_library(node8))], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "not loaded"


def test_description_is_read_afresh_on_each_init(node_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from nri_cdi_testbed.simnode import NodeLayout

    node = node_factory("reinit", NodeLayout.uniform(2, seed="reinit"))
    assert len(_discover(node).gpus) == 2  # type: ignore[attr-defined]
    description = node.root / NVML_DESCRIPTION
    lines = description.read_text().splitlines()
    description.write_text("\n".join(line for line in lines
                                      if not line.startswith("gpu 1 ")) + "\n")
    assert len(_discover(node).gpus) == 1  # type: ignore[attr-defined]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a private mount namespace needs root and unshare")
def test_node_namespace_shows_the_node_and_leaves_the_host_alone(node8: BuiltNode) -> None:
    before = sorted(os.listdir("/proc/driver")), sorted(os.listdir("/sys/bus/pci/devices"))
    bus = node8.manifest["gpus"][5]["bus_id"]
    out = subprocess.run(
        in_node_namespace(node8, ["sh", "-c", "cat /proc/driver/nvidia/version; "
                                  f"ls /sys/bus/pci/devices/{bus}/drm; "
                                  "head -1 /proc/driver/nvidia-caps/mig-minors"]),
        capture_output=True, text=True, check=True).stdout
    assert node8.driver_version in out and "renderD133" in out and "config 1" in out
    assert (sorted(os.listdir("/proc/driver")), sorted(os.listdir("/sys/bus/pci/devices"))) \
        == before
