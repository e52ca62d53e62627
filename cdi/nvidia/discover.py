"""What GPUs a node has: NVML or procfs discovery into plain frozen values.

Everything is read under two roots so that a simulated node is just a folder: the driver
root (libraries, among them the ``libnvidia-ml.so.1`` that NVML mode loads by path, so
that no other NVML is ever asked) and the dev root (``dev/``, ``proc/``, ``sys/``: the
host kernel's). The modes (``nvml``, ``procfs``, ``management``, ``auto``) and what
procfs cannot know (MIG UUIDs and indices, profiles, brands, compute capabilities, the
CUDA version: ``None``, and MIG devices ``indexed=False``): docs/usage/spec-generation.md.
"""

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from cdi.extras import MissingDependencyError
from cdi.linux.elf import ElfError, foreign_to_this_process

NVML_EXTRA = ("nvml", "nvidia-ml-py")  # pynvml's extra and distribution (cdi.extras)

# nvmlBrandType values -> the names NVIDIA_REQUIRE_BRAND compares against (lower-cased).
_BRANDS = {
    0: "unknown", 1: "quadro", 2: "tesla", 3: "nvs", 4: "grid", 5: "geforce", 6: "titan",
    7: "nvidiavapps", 8: "nvidiavpc", 9: "nvidiavcs", 10: "nvidiavws",
    11: "nvidiacloudgaming", 12: "quadrortx", 13: "nvidiartx", 14: "nvidia",
    15: "geforcertx", 16: "titanrtx",
}
# NVML GPU-instance profile ids with the graphics attribute (*_SLICE_GFX).
_GFX_PROFILE_IDS = frozenset({0xA, 0xB, 0xC, 0x11})


class DiscoveryError(Exception):
    """No usable driver or GPU information; the message says what was looked for where."""


class Roots(NamedTuple):
    """Where the node's files are, as host paths."""

    driver: Path = Path("/")
    dev: Path = Path("/")

    def dev_path(self, path: str) -> Path:
        return self.dev / path.lstrip("/")

    def proc_path(self, path: str) -> Path:
        return self.dev / "proc" / path.lstrip("/")


# ``index`` hides tuple.index() on these two: the field is what every caller means.
class MigDevice(NamedTuple):
    index: int  # type: ignore[assignment]  # the j of the ``i:j`` name
    gi: int
    ci: int
    uuid: str | None = None  # not published in procfs
    profile: str | None = None  # e.g. ``1g.10gb`` (NVML only)
    gfx: bool = False  # graphics-capable instance: gets the parent's DRM nodes
    # Whether ``index`` is NVML's MIG device index.  procfs cannot know it (NVML numbers
    # MIG devices in its own order, not by GPU-instance id), so there it is only a position.
    indexed: bool = True


class Gpu(NamedTuple):
    index: int  # type: ignore[assignment]
    uuid: str
    minor: int
    bus_id: str  # sysfs spelling: lower case, 4-digit domain (0000:65:00.0)
    name: str
    brand: str | None = None
    compute_capability: str | None = None  # "9.0"
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()


class NodeInfo(NamedTuple):
    mode: str  # the mode that produced it: nvml, procfs or management
    driver_version: str
    cuda_version: str | None  # "13.0"; NVML only
    gpus: tuple[Gpu, ...]


# --- procfs ---------------------------------------------------------------------------------


def driver_version_from_proc(roots: Roots) -> str | None:
    try:
        text = roots.proc_path("driver/nvidia/version").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("NVRM"):
            # the first blank-separated N.N or N.N.N
            return next((w for w in line.split()[1:] if _is_version(w)), None)
    return None


def _is_version(word: str) -> bool:
    parts = word.split(".")
    return 2 <= len(parts) <= 3 and all(p.isdecimal() for p in parts)  # \d: decimal digits


def _information(path: Path) -> dict[str, str]:
    pairs = (line.partition(":") for line in path.read_text().splitlines())
    return {key.strip(): value.strip() for key, sep, value in pairs if sep}


def normalize_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` or ``0000:18:00.0`` -> sysfs ``0000:18:00.0``."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep:
        return text
    return f"{int(domain, 16):04x}:{rest}"


def listdir(folder: str | Path) -> list[str]:
    """The names in ``folder``, sorted; none where it cannot be read."""
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def _procfs_gpus(roots: Roots) -> list[Gpu]:
    base = roots.proc_path("driver/nvidia/gpus")
    infos = []
    for entry in listdir(base):
        try:
            infos.append(_information(base / entry / "information"))
        except OSError:
            continue
    infos.sort(key=lambda f: normalize_bus_id(f.get("Bus Location", "")))
    return [Gpu(index=index, uuid=info.get("GPU UUID", ""),
                minor=int(info.get("Device Minor", "-1")),
                bus_id=normalize_bus_id(info.get("Bus Location", "")), name=info.get("Model", ""))
            for index, info in enumerate(infos)]


def _numbered(folder: Path, prefix: str) -> list[int]:
    # ``gi<N>`` / ``ci<N>`` folders; anything else there is not a MIG instance
    return sorted(int(n[2:]) for n in listdir(folder) if n.startswith(prefix) and n[2:].isdecimal())


def _procfs_migs(roots: Roots, minor: int) -> tuple[MigDevice, ...]:
    base = roots.proc_path(f"driver/nvidia/capabilities/gpu{minor}/mig")
    pairs = [(gi, ci) for gi in _numbered(base, "gi") for ci in _numbered(base / f"gi{gi}", "ci")]
    return tuple(MigDevice(index=j, gi=gi, ci=ci, indexed=False)
                 for j, (gi, ci) in enumerate(pairs))


def discover_procfs(roots: Roots, *, fallback_version: Callable[[], str | None]) -> NodeInfo:
    version = driver_version_from_proc(roots) or fallback_version()
    if not version:
        raise DiscoveryError(
            f"no NVIDIA driver found: {roots.proc_path('driver/nvidia/version')} is missing "
            f"or has no version, and no libcuda.so.*.* or libnvidia-ml.so.*.* was found "
            f"under the driver root {roots.driver}"
        )
    gpus = []
    for gpu in _procfs_gpus(roots):
        migs = _procfs_migs(roots, gpu.minor)
        gpus.append(gpu._replace(mig_enabled=True, mig_devices=migs) if migs else gpu)
    return NodeInfo(mode="procfs", driver_version=version, cuda_version=None, gpus=tuple(gpus))


# --- NVML -----------------------------------------------------------------------------------


def nvml_text(value: Any) -> str:
    # nvidia-ml-py returned bytes before 11.5xx and str since; structure fields stay bytes.
    return value.decode() if isinstance(value, bytes) else str(value)


def cuda_version(nvml: Any) -> str:
    """The CUDA version the driver supports, as ``13.0``."""
    cuda = int(nvml.nvmlSystemGetCudaDriverVersion_v2())
    return f"{cuda // 1000}.{cuda % 1000 // 10}"


@contextlib.contextmanager
def nvml_session(library: Path, purpose: str) -> Iterator[Any]:
    """pynvml on ``library``, initialised, and shut down after; a failure to load or to
    query is a DiscoveryError saying why NVML is not usable (``purpose``: what needed
    nvidia-ml-py, for the missing-dependency message)."""
    try:
        nvml = load_nvml(library)
    except ImportError:
        missing = MissingDependencyError("pynvml", purpose, NVML_EXTRA)
        raise DiscoveryError(f"NVML unavailable: {missing}") from None
    except Exception as exc:  # OSError from dlopen, NVMLError from init
        raise DiscoveryError(f"NVML unavailable: cannot load {library}: {exc}") from None
    try:
        yield nvml
    except Exception as exc:  # an NVMLError or a missing symbol: NVML is not usable
        raise DiscoveryError(f"NVML query failed with {library}: {exc}") from None
    finally:
        with contextlib.suppress(Exception):  # a failed shutdown does not change the result
            nvml.nvmlShutdown()


def load_nvml(library: Path | None) -> Any:
    """Import pynvml, point it at ``library`` (loaded by path) and initialise NVML."""
    import pynvml  # type: ignore[import-untyped,unused-ignore]  # only NVML mode needs it

    loaded = getattr(pynvml, "nvmlLib", None)
    if library is not None and getattr(loaded, "_name", None) != os.fspath(library):
        import ctypes  # here: procfs mode never needs it

        # nvidia-ml-py keeps one library per process, with its function pointers cached:
        # a run for another driver root must not be answered by the first one's NVML.
        pynvml.nvmlLib = ctypes.CDLL(os.fspath(library))
        cache = getattr(pynvml, "_nvmlGetFunctionPointer_cache", None)
        if isinstance(cache, dict):
            cache.clear()
    pynvml.nvmlInit()
    return pynvml


def discover_nvml(nvml: Any) -> NodeInfo:
    """Query an initialised pynvml module; the caller shuts NVML down."""
    version, cuda = nvml_text(nvml.nvmlSystemGetDriverVersion()), cuda_version(nvml)
    gpus = tuple(_nvml_gpu(nvml, i) for i in range(int(nvml.nvmlDeviceGetCount())))
    return NodeInfo(mode="nvml", driver_version=version, cuda_version=cuda, gpus=gpus)


def _nvml_gpu(nvml: Any, index: int) -> Gpu:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    mig_enabled = _mig_mode(nvml, handle)
    return Gpu(
        index=index,
        uuid=nvml_text(nvml.nvmlDeviceGetUUID(handle)),
        minor=int(nvml.nvmlDeviceGetMinorNumber(handle)),
        bus_id=normalize_bus_id(nvml_text(nvml.nvmlDeviceGetPciInfo(handle).busId)),
        name=nvml_text(nvml.nvmlDeviceGetName(handle)),
        brand=_BRANDS.get(int(nvml.nvmlDeviceGetBrand(handle)), "unknown"),
        compute_capability=f"{major}.{minor}",
        mig_enabled=mig_enabled,
        mig_devices=tuple(_nvml_migs(nvml, handle)) if mig_enabled else (),
    )


def _mig_mode(nvml: Any, handle: Any) -> bool:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError as exc:
        if exc.value == nvml.NVML_ERROR_NOT_SUPPORTED:
            return False  # not MIG-capable
        raise
    return bool(current == nvml.NVML_DEVICE_MIG_ENABLE)


def _nvml_migs(nvml: Any, handle: Any) -> Iterable[MigDevice]:
    empty_slot = (nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_ERROR_INVALID_ARGUMENT)
    for j in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
        except nvml.NVMLError as exc:
            if exc.value in empty_slot:
                continue
            raise
        gi = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
        profile_id = nvml.nvmlGpuInstanceGetInfo(
            nvml.nvmlDeviceGetGpuInstanceById(handle, gi)).profileId
        yield MigDevice(
            index=j,
            gi=gi,
            ci=int(nvml.nvmlDeviceGetComputeInstanceId(mig)),
            uuid=nvml_text(nvml.nvmlDeviceGetUUID(mig)),
            profile=_profile_name(nvml_text(nvml.nvmlDeviceGetName(mig))),
            gfx=int(profile_id) in _GFX_PROFILE_IDS,
        )


def _profile_name(device_name: str) -> str | None:
    # MIG device names end in the nvidia-smi profile: "NVIDIA H100 80GB HBM3 MIG 1g.10gb".
    _, sep, profile = device_name.rpartition(" MIG ")
    return profile.strip() if sep else None


def discover_with_nvml(library: Path | None) -> NodeInfo:
    """The node as NVML loaded from ``library`` sees it; DiscoveryError saying why NVML
    is not usable."""
    if library is None:
        raise DiscoveryError("NVML unavailable: no libnvidia-ml.so.1 under the driver root")
    # Before dlopen: for another architecture's library it says only "cannot open shared
    # object file: No such file or directory", of a file that is there. (What is not an ELF
    # object at all is left to dlopen, which says so.)
    try:
        foreign = foreign_to_this_process(library)
    except (OSError, ElfError):
        foreign = None
    if foreign is not None:
        raise DiscoveryError(f"NVML unavailable: {foreign}")
    with nvml_session(library, "NVML mode") as nvml:
        return discover_nvml(nvml)
