"""Test double of ``pynvml`` (the nvidia-ml-py module) answering from a simulated node.

Put ``tests/fake_pynvml`` first on ``sys.path`` (or load this file as ``pynvml`` into
``sys.modules``) and point ``FAKE_PYNVML_MANIFEST`` at a ``simnode.json``; or call
:func:`fake_configure`.  The manifest is read at ``nvmlInit`` time.

Names, signatures and return shapes follow nvidia-ml-py 12.5xx/13.x, including its quirks,
so code tested against the double behaves the same against the real module:

* strings come back as ``str`` (the real wrappers decode), but the fields of
  ``nvmlDeviceGetPciInfo``'s structure (``busId``, ``busIdLegacy``) are ``bytes``, in
  NVML's spelling (8-digit upper-case domain: ``00000000:18:00.0``);
* ``nvmlDeviceGetMigMode`` returns a list ``[current, pending]``;
* ``nvmlDeviceIsMigDeviceHandle`` returns a ``ctypes.c_uint`` (compare its truth value
  or ``.value``, never ``== 1``);
* errors are ``NVMLError`` whose constructor returns the per-code subclass
  (``NVMLError(NVML_ERROR_NOT_FOUND)`` is an ``NVMLError_NotFound``);
* calls before ``nvmlInit`` raise ``NVMLError_Uninitialized``.

Library loading: the real module ``dlopen``s ``libnvidia-ml.so.1`` by name on first
``nvmlInit`` unless its global ``nvmlLib`` is already set.  The double records what a
caller arranged: ``fake_state().library_path`` is ``nvmlLib._name`` when the caller set
``nvmlLib`` (e.g. ``pynvml.nvmlLib = ctypes.CDLL(path)``), otherwise the
``libnvidia-ml.so*`` files mapped into the process at init time (a caller that pre-loads
the driver root's library by path shows up here).  With ``FAKE_PYNVML_LOAD_LIBRARY=1``
(or ``fake_configure(load_library=True)``) it also performs the real module's
``CDLL("libnvidia-ml.so.1")`` and fails with ``NVMLError_LibraryNotFound`` like it.
"""

from __future__ import annotations

import ctypes
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --- constants (values as in nvidia-ml-py) ---------------------------------------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_BRAND_UNKNOWN = 0
NVML_BRAND_QUADRO = 1
NVML_BRAND_TESLA = 2
NVML_BRAND_NVS = 3
NVML_BRAND_GRID = 4
NVML_BRAND_GEFORCE = 5
NVML_BRAND_TITAN = 6
NVML_BRAND_NVIDIA_VAPPS = 7
NVML_BRAND_NVIDIA_VPC = 8
NVML_BRAND_NVIDIA_VCS = 9
NVML_BRAND_NVIDIA_VWS = 10
NVML_BRAND_NVIDIA_CLOUD_GAMING = 11
NVML_BRAND_NVIDIA_VGAMING = NVML_BRAND_NVIDIA_CLOUD_GAMING
NVML_BRAND_QUADRO_RTX = 12
NVML_BRAND_NVIDIA_RTX = 13
NVML_BRAND_NVIDIA = 14
NVML_BRAND_GEFORCE_RTX = 15
NVML_BRAND_TITAN_RTX = 16
NVML_BRAND_COUNT = 20

NVML_DEVICE_MIG_DISABLE = 0x0
NVML_DEVICE_MIG_ENABLE = 0x1

NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_GPU_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_GPU_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_GPU_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_GPU_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_GPU_INSTANCE_PROFILE_8_SLICE = 0x5
NVML_GPU_INSTANCE_PROFILE_6_SLICE = 0x6
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7
NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 = 0x8
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = 0x9
NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX = 0xA
NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX = 0xB
NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX = 0xC
NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX = 0x11

NVML_DEVICE_ARCH_KEPLER = 2
NVML_DEVICE_ARCH_MAXWELL = 3
NVML_DEVICE_ARCH_PASCAL = 4
NVML_DEVICE_ARCH_VOLTA = 5
NVML_DEVICE_ARCH_TURING = 6
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_ADA = 8
NVML_DEVICE_ARCH_HOPPER = 9
NVML_DEVICE_ARCH_BLACKWELL = 10
NVML_DEVICE_ARCH_UNKNOWN = 0xFFFFFFFF

NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32
NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16

MANIFEST_ENV = "FAKE_PYNVML_MANIFEST"
LOAD_LIBRARY_ENV = "FAKE_PYNVML_LOAD_LIBRARY"

# The real module's global: set by callers that load the library themselves.
nvmlLib: Any = None


# --- errors ----------------------------------------------------------------------------------


class NVMLError(Exception):
    """Base NVML error; ``NVMLError(code)`` builds the subclass registered for ``code``.

    Subclasses carry their own code and, like the real ones, ignore constructor
    arguments: ``NVMLError_NotFound()`` has ``value == NVML_ERROR_NOT_FOUND``.
    """

    _by_code: dict[int, type[NVMLError]] = {}
    _code: int | None = None
    value: int

    def __new__(cls, *args: Any) -> NVMLError:
        if cls._code is not None:
            value = cls._code
        else:
            value = args[0] if args else NVML_ERROR_UNKNOWN
            cls = NVMLError._by_code.get(value, NVMLError)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, *args: Any) -> None:
        super().__init__(self.value)

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


class NVMLLibraryMismatchError(Exception):
    pass


_ERROR_TEXT = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


def _class_name(const: str) -> str:
    # NVML_ERROR_ALREADY_INITIALIZED -> NVMLError_AlreadyInitialized
    words = const[len("NVML_ERROR_") :].split("_")
    return "NVMLError_" + "".join(w.capitalize() for w in words)


def _make_error_classes() -> None:
    # One subclass per NVML_ERROR_* constant, as the real module generates them.
    namespace = globals()
    for const, code in list(namespace.items()):
        if const.startswith("NVML_ERROR_") and isinstance(code, int):
            cls = type(_class_name(const), (NVMLError,), {"__module__": __name__, "_code": code})
            namespace[cls.__name__] = cls
            NVMLError._by_code[code] = cls


_make_error_classes()


def nvmlExceptionClass(nvmlErrorCode: int) -> type[NVMLError]:
    if nvmlErrorCode not in NVMLError._by_code:
        raise ValueError(f"nvmlErrorCode {nvmlErrorCode} is not valid")
    return NVMLError._by_code[nvmlErrorCode]


def nvmlErrorString(result: int) -> str:
    return str(NVMLError(result))


# --- state -----------------------------------------------------------------------------------


@dataclass
class FakeState:
    """What the double was configured with and what callers did (inspect in tests)."""

    manifest_path: str | None = None
    manifest: dict[str, Any] | None = None
    init_error: int | None = None
    load_library: bool | None = None
    refcount: int = 0
    init_calls: int = 0
    library_path: str | None = None  # nvmlLib._name when the caller set nvmlLib
    mapped_libraries: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)


_state = FakeState()


def fake_state() -> FakeState:
    return _state


def fake_configure(
    manifest: str | os.PathLike[str] | None = None,
    *,
    init_error: int | None = None,
    load_library: bool | None = None,
) -> None:
    """Reset the double; ``init_error`` makes the next ``nvmlInit`` raise that code."""
    global _state, nvmlLib
    _state = FakeState(
        manifest_path=os.fspath(manifest) if manifest is not None else None,
        init_error=init_error,
        load_library=load_library,
    )
    nvmlLib = None


def fake_reset() -> None:
    fake_configure()


# --- handles ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Handle:
    """Opaque device handle: a GPU (``mig is None``) or one of its MIG devices."""

    gpu: int
    mig: int | None = None


@dataclass(frozen=True)
class _GpuInstance:
    gpu: int
    gi: int


class nvmlPciInfo_t(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
    ]


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


@dataclass(frozen=True)
class _GpuInstanceInfo:
    """Stand-in for ``c_nvmlGpuInstanceInfo_t`` (device, id, profileId, placement)."""

    device: _Handle
    id: int
    profileId: int
    placement: c_nvmlGpuInstancePlacement_t


# --- init / system ---------------------------------------------------------------------------


def _check(call: str) -> dict[str, Any]:
    _state.calls.append(call)
    if _state.refcount <= 0 or _state.manifest is None:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _state.manifest


def _load_manifest() -> dict[str, Any]:
    path = _state.manifest_path or os.environ.get(MANIFEST_ENV)
    if not path:
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    p = Path(path)
    if p.is_dir():
        p = p / "simnode.json"
    try:
        return json.loads(p.read_text())
    except OSError:
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED) from None


def _mapped_nvml_libraries() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if len(line.split()) >= 6}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith("libnvidia-ml.so"))


def _load_library() -> None:
    global nvmlLib
    wanted = _state.load_library
    if wanted is None:
        wanted = os.environ.get(LOAD_LIBRARY_ENV, "") in ("1", "true", "yes")
    if nvmlLib is None and wanted:
        try:
            nvmlLib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND) from None
    if nvmlLib is not None:
        _state.library_path = getattr(nvmlLib, "_name", None)
    _state.mapped_libraries = _mapped_nvml_libraries()


def nvmlInitWithFlags(flags: int) -> None:
    _state.calls.append("nvmlInitWithFlags")
    _state.init_calls += 1
    _load_library()
    if _state.init_error is not None:
        raise NVMLError(_state.init_error)
    if _state.manifest is None:
        _state.manifest = _load_manifest()
    _state.refcount += 1


def nvmlInit() -> None:
    nvmlInitWithFlags(0)


nvmlInit_v2 = nvmlInit


def nvmlShutdown() -> None:
    _check("nvmlShutdown")
    _state.refcount -= 1
    if _state.refcount == 0:
        _state.manifest = None  # re-read on the next init, like a driver reload


def nvmlSystemGetDriverVersion() -> str:
    return str(_check("nvmlSystemGetDriverVersion")["driver_version"])


def nvmlSystemGetNVMLVersion() -> str:
    m = _check("nvmlSystemGetNVMLVersion")
    return f"{m['cuda_version'].split('.')[0]}.{m['driver_version']}"


def nvmlSystemGetCudaDriverVersion() -> int:
    return int(_check("nvmlSystemGetCudaDriverVersion")["cuda_driver_version"])


def nvmlSystemGetCudaDriverVersion_v2() -> int:
    return int(_check("nvmlSystemGetCudaDriverVersion_v2")["cuda_driver_version"])


# --- devices ---------------------------------------------------------------------------------


def _gpu(m: dict[str, Any], handle: object) -> dict[str, Any]:
    if not isinstance(handle, _Handle) or not 0 <= handle.gpu < len(m["gpus"]):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return m["gpus"][handle.gpu]


def _mig(m: dict[str, Any], handle: object) -> dict[str, Any]:
    gpu = _gpu(m, handle)
    assert isinstance(handle, _Handle)
    if handle.mig is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return gpu["mig_devices"][handle.mig]


def _full_gpu(m: dict[str, Any], handle: object) -> dict[str, Any]:
    gpu = _gpu(m, handle)
    assert isinstance(handle, _Handle)
    if handle.mig is not None:  # assumption: per-GPU queries are refused on MIG handles
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return gpu


def nvmlDeviceGetCount() -> int:
    return len(_check("nvmlDeviceGetCount")["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    m = _check("nvmlDeviceGetHandleByIndex")
    if not 0 <= index < len(m["gpus"]):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(index)


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> _Handle:
    m = _check("nvmlDeviceGetHandleByUUID")
    want = uuid.decode() if isinstance(uuid, bytes) else uuid
    for g in m["gpus"]:
        if g["uuid"] == want:
            return _Handle(g["index"])
        for d in g["mig_devices"]:
            if d["uuid"] == want:
                return _Handle(g["index"], d["index"])
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetHandleByPciBusId(pciBusId: str | bytes) -> _Handle:
    m = _check("nvmlDeviceGetHandleByPciBusId")
    want = (pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId).lower()
    for g in m["gpus"]:
        if want in (g["bus_id"], g["nvml_bus_id"].lower(), g["nvml_bus_id_legacy"].lower()):
            return _Handle(g["index"])
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    m = _check("nvmlDeviceGetUUID")
    return str(_mig(m, handle)["uuid"] if handle.mig is not None else _gpu(m, handle)["uuid"])


def nvmlDeviceGetName(handle: _Handle) -> str:
    m = _check("nvmlDeviceGetName")
    return str(_mig(m, handle)["name"] if handle.mig is not None else _gpu(m, handle)["name"])


def nvmlDeviceGetIndex(handle: _Handle) -> int:
    return int(_full_gpu(_check("nvmlDeviceGetIndex"), handle)["index"])


def nvmlDeviceGetMinorNumber(handle: _Handle) -> int:
    return int(_full_gpu(_check("nvmlDeviceGetMinorNumber"), handle)["minor"])


def nvmlDeviceGetPciInfo_v3(handle: _Handle) -> nvmlPciInfo_t:
    g = _gpu(_check("nvmlDeviceGetPciInfo"), handle)
    domain, bus, devfn = g["bus_id"].split(":")
    return nvmlPciInfo_t(
        busIdLegacy=g["nvml_bus_id_legacy"].encode(),
        domain=int(domain, 16),
        bus=int(bus, 16),
        device=int(devfn.split(".")[0], 16),
        pciDeviceId=g["pci_device_id"],
        pciSubSystemId=0x16A110DE,
        busId=g["nvml_bus_id"].encode(),
    )


def nvmlDeviceGetPciInfo(handle: _Handle) -> nvmlPciInfo_t:
    return nvmlDeviceGetPciInfo_v3(handle)


def nvmlDeviceGetBrand(handle: _Handle) -> int:
    return int(_gpu(_check("nvmlDeviceGetBrand"), handle)["brand"])


def nvmlDeviceGetCudaComputeCapability(handle: _Handle) -> tuple[int, int]:
    major, minor = _gpu(_check("nvmlDeviceGetCudaComputeCapability"), handle)["compute_capability"]
    return (int(major), int(minor))


_ARCH_BY_MAJOR = {
    3: NVML_DEVICE_ARCH_KEPLER,
    5: NVML_DEVICE_ARCH_MAXWELL,
    6: NVML_DEVICE_ARCH_PASCAL,
    7: NVML_DEVICE_ARCH_VOLTA,
    8: NVML_DEVICE_ARCH_AMPERE,
    9: NVML_DEVICE_ARCH_HOPPER,
    10: NVML_DEVICE_ARCH_BLACKWELL,
    12: NVML_DEVICE_ARCH_BLACKWELL,
}


def nvmlDeviceGetArchitecture(device: _Handle) -> int:
    major, minor = _gpu(_check("nvmlDeviceGetArchitecture"), device)["compute_capability"]
    if (major, minor) == (7, 5):
        return NVML_DEVICE_ARCH_TURING
    if (major, minor) == (8, 9):
        return NVML_DEVICE_ARCH_ADA
    return _ARCH_BY_MAJOR.get(major, NVML_DEVICE_ARCH_UNKNOWN)


# --- MIG -------------------------------------------------------------------------------------


def nvmlDeviceGetMigMode(device: _Handle) -> list[int]:
    g = _full_gpu(_check("nvmlDeviceGetMigMode"), device)
    if not g["mig_capable"]:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    mode = NVML_DEVICE_MIG_ENABLE if g["mig_enabled"] else NVML_DEVICE_MIG_DISABLE
    return [mode, mode]


def nvmlDeviceGetMaxMigDeviceCount(device: _Handle) -> int:
    g = _full_gpu(_check("nvmlDeviceGetMaxMigDeviceCount"), device)
    return int(g["max_mig_devices"])


def nvmlDeviceGetMigDeviceHandleByIndex(device: _Handle, index: int) -> _Handle:
    g = _full_gpu(_check("nvmlDeviceGetMigDeviceHandleByIndex"), device)
    if not g["mig_enabled"] or not 0 <= index < max(g["max_mig_devices"], 1):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if index >= len(g["mig_devices"]):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return _Handle(device.gpu, index)


def nvmlDeviceIsMigDeviceHandle(device: _Handle) -> ctypes.c_uint:
    _gpu(_check("nvmlDeviceIsMigDeviceHandle"), device)
    # The real wrapper returns the ctypes object itself, not its value.
    return ctypes.c_uint(1 if device.mig is not None else 0)


def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migDevice: _Handle) -> _Handle:
    _mig(_check("nvmlDeviceGetDeviceHandleFromMigDeviceHandle"), migDevice)
    return _Handle(migDevice.gpu)


def nvmlDeviceGetGpuInstanceId(device: _Handle) -> int:
    return int(_mig(_check("nvmlDeviceGetGpuInstanceId"), device)["gi"])


def nvmlDeviceGetComputeInstanceId(device: _Handle) -> int:
    return int(_mig(_check("nvmlDeviceGetComputeInstanceId"), device)["ci"])


def nvmlDeviceGetGpuInstanceById(device: _Handle, gpuInstanceId: int) -> _GpuInstance:
    g = _full_gpu(_check("nvmlDeviceGetGpuInstanceById"), device)
    if not g["mig_enabled"]:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if not any(d["gi"] == gpuInstanceId for d in g["mig_devices"]):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return _GpuInstance(device.gpu, gpuInstanceId)


def nvmlGpuInstanceGetInfo(gpuInstance: _GpuInstance) -> _GpuInstanceInfo:
    m = _check("nvmlGpuInstanceGetInfo")
    if not isinstance(gpuInstance, _GpuInstance):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    dev = next(d for d in m["gpus"][gpuInstance.gpu]["mig_devices"] if d["gi"] == gpuInstance.gi)
    size = int(dev["profile"].split("g.")[0])
    return _GpuInstanceInfo(
        device=_Handle(gpuInstance.gpu),
        id=gpuInstance.gi,
        profileId=int(dev["profile_id"]),
        placement=c_nvmlGpuInstancePlacement_t(0, size),
    )
