"""The pynvml test double answers from a simulated node's manifest like nvidia-ml-py would."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from nri_cdi_testbed.simnode import BuiltNode

FAKE_DIR = Path(__file__).resolve().parents[1] / "fake_pynvml"


@pytest.fixture
def nvml(fake_pynvml: ModuleType, node8: BuiltNode, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("FAKE_PYNVML_MANIFEST", str(node8.manifest_path))
    fake_pynvml.nvmlInit()
    return fake_pynvml


def test_system_queries(nvml: ModuleType, node8: BuiltNode) -> None:
    assert nvml.nvmlSystemGetDriverVersion() == node8.driver_version
    assert nvml.nvmlSystemGetCudaDriverVersion() == 13000
    assert nvml.nvmlSystemGetCudaDriverVersion_v2() == 13000
    assert nvml.nvmlDeviceGetCount() == 8


def test_gpu_queries(nvml: ModuleType, node8: BuiltNode) -> None:
    for g in node8.manifest["gpus"]:
        h = nvml.nvmlDeviceGetHandleByIndex(g["index"])
        assert nvml.nvmlDeviceGetUUID(h) == g["uuid"]
        assert nvml.nvmlDeviceGetName(h) == g["name"]
        assert nvml.nvmlDeviceGetIndex(h) == g["index"]
        assert nvml.nvmlDeviceGetMinorNumber(h) == g["minor"]
        assert nvml.nvmlDeviceGetBrand(h) == nvml.NVML_BRAND_NVIDIA
        assert nvml.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
        assert nvml.nvmlDeviceGetArchitecture(h) == nvml.NVML_DEVICE_ARCH_HOPPER
        assert nvml.nvmlDeviceGetHandleByUUID(g["uuid"]) == h
        assert nvml.nvmlDeviceGetHandleByPciBusId(g["nvml_bus_id"]) == h


def test_pci_info_is_bytes_in_nvml_spelling(nvml: ModuleType, node8: BuiltNode) -> None:
    g = node8.manifest["gpus"][1]  # 0000:2a:00.0
    info = nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(1))
    assert info.busId == b"00000000:2A:00.0"
    assert info.busIdLegacy == b"0000:2A:00.0"
    assert (info.domain, info.bus, info.device) == (0, 0x2A, 0)
    assert info.busId.decode().lower()[4:] == g["bus_id"]


def test_mig_enumeration(nvml: ModuleType, node8: BuiltNode) -> None:
    found = []
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        current, pending = nvml.nvmlDeviceGetMigMode(h)
        assert current == pending
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            continue
        for j in range(nvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except nvml.NVMLError_NotFound:
                continue
            assert nvml.nvmlDeviceIsMigDeviceHandle(mig)
            parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
            assert parent == h
            found.append(
                (
                    i,
                    j,
                    nvml.nvmlDeviceGetUUID(mig),
                    nvml.nvmlDeviceGetGpuInstanceId(mig),
                    nvml.nvmlDeviceGetComputeInstanceId(mig),
                )
            )
    expected = [
        (g["index"], d["index"], d["uuid"], d["gi"], d["ci"])
        for g in node8.manifest["gpus"]
        for d in g["mig_devices"]
    ]
    assert found == expected and len(found) == 9


def test_mig_profile_via_gpu_instance(nvml: ModuleType) -> None:
    gpu3 = nvml.nvmlDeviceGetHandleByIndex(3)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu3, 1)
    gi = nvml.nvmlDeviceGetGpuInstanceById(gpu3, nvml.nvmlDeviceGetGpuInstanceId(mig))
    info = nvml.nvmlGpuInstanceGetInfo(gi)
    assert info.profileId == nvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetGpuInstanceById(gpu3, 14)


def test_is_mig_handle_returns_ctypes_value_like_the_real_module(nvml: ModuleType) -> None:
    result = nvml.nvmlDeviceIsMigDeviceHandle(nvml.nvmlDeviceGetHandleByIndex(0))
    assert isinstance(result, ctypes.c_uint) and not result and result.value == 0


def test_errors(nvml: ModuleType) -> None:
    gpu1 = nvml.nvmlDeviceGetHandleByIndex(1)  # MIG disabled
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu1, 0)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(8)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetGpuInstanceId(gpu1)
    gpu3 = nvml.nvmlDeviceGetHandleByIndex(3)
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu3, 2)  # empty slot
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu3, 7)  # beyond the maximum
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")


def test_error_classes(fake_pynvml: ModuleType) -> None:
    nvml = fake_pynvml
    err = nvml.NVMLError(nvml.NVML_ERROR_NOT_FOUND)
    assert type(err) is nvml.NVMLError_NotFound and isinstance(err, nvml.NVMLError)
    assert err.value == nvml.NVML_ERROR_NOT_FOUND and str(err) == "Not Found"
    assert (
        nvml.nvmlExceptionClass(nvml.NVML_ERROR_DRIVER_NOT_LOADED) is nvml.NVMLError_DriverNotLoaded
    )
    assert nvml.NVMLError_AlreadyInitialized().value == nvml.NVML_ERROR_ALREADY_INITIALIZED
    assert nvml.NVMLError_LibRmVersionMismatch().value == 18


def test_uninitialized_and_shutdown(fake_pynvml: ModuleType, node8: BuiltNode) -> None:
    nvml = fake_pynvml
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.fake_configure(node8.manifest_path)
    nvml.nvmlInit()
    nvml.nvmlShutdown()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlSystemGetDriverVersion()


def test_init_failures(fake_pynvml: ModuleType, node8: BuiltNode) -> None:
    nvml = fake_pynvml
    with pytest.raises(nvml.NVMLError_DriverNotLoaded):
        nvml.nvmlInit()  # no manifest configured
    nvml.fake_configure(node8.manifest_path, init_error=nvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(nvml.NVMLError_DriverNotLoaded):
        nvml.nvmlInit()


def test_mig_mode_not_supported(fake_pynvml: ModuleType, node_factory) -> None:  # type: ignore[no-untyped-def]
    from nri_cdi_testbed.simnode import GpuSpec, NodeLayout

    gpu = GpuSpec(
        name="NVIDIA GeForce RTX 4090", brand=5, compute_capability=(8, 9), mig_capable=False
    )
    node = node_factory("geforce", NodeLayout(gpus=(gpu,), seed="geforce"))
    nvml = fake_pynvml
    nvml.fake_configure(node.root)  # a node folder works as well as the manifest path
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigMode(h)
    assert nvml.nvmlDeviceGetArchitecture(h) == nvml.NVML_DEVICE_ARCH_ADA
    assert not (node.proc_root / "proc/driver/nvidia-caps").exists()


def _run_with_double(code: str, node: BuiltNode, **env: str) -> str:
    """Run ``code`` in a fresh interpreter where ``import pynvml`` finds the double."""
    full_env = {"PYTHONPATH": str(FAKE_DIR), "FAKE_PYNVML_MANIFEST": str(node.manifest_path), **env}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, check=True
    ).stdout.strip()


def test_records_preloaded_driver_root_library(node8: BuiltNode) -> None:
    lib = node8.lib_dir / "libnvidia-ml.so.1"
    code = (
        "import ctypes, pynvml\n"
        f"ctypes.CDLL({str(lib)!r})\n"
        "pynvml.nvmlInit()\n"
        "print(pynvml.fake_state().mapped_libraries)\n"
    )
    out = _run_with_double(code, node8)
    assert str(lib.resolve()) in out


def test_records_library_set_by_caller(node8: BuiltNode) -> None:
    lib = node8.lib_dir / "libnvidia-ml.so.1"
    code = (
        "import ctypes, pynvml\n"
        f"pynvml.nvmlLib = ctypes.CDLL({str(lib)!r})\n"
        "pynvml.nvmlInit()\n"
        "print(pynvml.fake_state().library_path)\n"
    )
    assert _run_with_double(code, node8) == str(lib)


def test_load_library_mode_needs_a_findable_library(node8: BuiltNode) -> None:
    code = (
        "import pynvml\n"
        "try:\n"
        "    pynvml.nvmlInit()\n"
        "    print('loaded', pynvml.fake_state().mapped_libraries)\n"
        "except pynvml.NVMLError_LibraryNotFound:\n"
        "    print('not found')\n"
    )
    assert _run_with_double(code, node8, FAKE_PYNVML_LOAD_LIBRARY="1") == "not found"
    out = _run_with_double(
        code, node8, FAKE_PYNVML_LOAD_LIBRARY="1", LD_LIBRARY_PATH=str(node8.lib_dir)
    )
    assert out.startswith("loaded") and str(node8.lib_dir) in out
