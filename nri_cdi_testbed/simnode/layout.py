"""What a simulated node is made of: its GPUs, MIG devices and driver layout (values only)."""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from nri_cdi_testbed.simnode.driverfiles import DIRS, TRIPLETS

DEFAULT_DRIVER_VERSION = "580.82.07"
MANIFEST_FORMAT = 1
NVIDIA_MAJOR = 195
DRM_MAJOR = 226
CTL_MINOR = 255
MODESET_MINOR = 254
# The driver's mig-minors file has entries for this many GPU minors (config=1, monitor=2, then
# 135 minors per GPU: for each of 15 GPU instances, its access cap + 8 compute instances).
MIG_MINORS_GPUS = 32
GI_PER_GPU = 15
CI_PER_GI = 8
MINORS_PER_GI = 1 + CI_PER_GI

Distro = Literal["debian", "rhel", "debian-current", "gke"]
Machine = Literal["x86_64", "aarch64"]
# Optional parts of a node (NodeLayout.extras):
EXTRAS = {
    "vulkan-icd-at-root": "the Vulkan ICD at <driver root>/vulkan/icd.d (GKE), none in /etc",
    "vulkan-producer": "libnvidia-vulkan-producer.so.<v> without its .so link (drivers 470-525)",
    "configs-in-local-share": "the /usr/share configs under /usr/local/share instead",
    "imex": "nvidia-imex and nvidia-imex-ctl binaries",
    "fabricmanager": "the fabric manager's socket",
}


class SimNodeError(Exception):
    """The layout is invalid or the node cannot be built here (missing gcc, no mknod)."""


def host_machine() -> Machine | None:
    """This machine, if a node can be built for it (``uname -m``)."""
    machine = os.uname().machine
    return "aarch64" if machine == "aarch64" else "x86_64" if machine == "x86_64" else None

# --- description ---------------------------------------------------------------------------


_PROFILE_RE = re.compile(r"^(?P<slices>[1-8])g\.(?P<mem>\d+)gb(?P<attrs>(\+[a-z]+)*)$")
# NVML GPU-instance profile ids (nvmlGpuInstanceProfile) by slice count and attribute.
_PROFILE_IDS = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}
_PROFILE_IDS_GFX = {1: 0xA, 2: 0xB, 4: 0xC, 3: 0x11}
_PROFILE_IDS_ME = {1: 0x7, 2: 0x8}
# GPU-instance ids the driver hands out first for each size on a 7-slice GPU.
_GI_CANDIDATES: dict[int, tuple[int, ...]] = {
    7: (0,),
    4: (1,),
    3: (1, 2),
    2: (3, 4, 5),
    1: tuple(range(7, 15)),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class MigDevice:
    """One MIG device: a GPU instance ``gi`` with compute instance ``ci``.

    ``profile`` is the nvidia-smi name (``1g.10gb``, ``3g.40gb``, ``1g.24gb+gfx``); a
    ``+gfx`` attribute makes it a graphics-capable instance (gets the GPU's DRM nodes).
    ``gi=None`` picks the id the driver would use first for that size.
    """

    profile: str = "1g.10gb"
    gi: int | None = None
    ci: int = 0
    profile_id: int | None = None

    def __post_init__(self) -> None:
        if not _PROFILE_RE.match(self.profile):
            raise SimNodeError(f"bad MIG profile name {self.profile!r} (want e.g. 1g.10gb)")
        if self.gi is not None and not 0 <= self.gi < GI_PER_GPU:
            raise SimNodeError(f"GPU instance id {self.gi} out of range 0..{GI_PER_GPU - 1}")
        if not 0 <= self.ci < CI_PER_GI:
            raise SimNodeError(f"compute instance id {self.ci} out of range 0..{CI_PER_GI - 1}")

    @property
    def slices(self) -> int:
        return int(self.profile.split("g.", 1)[0])

    @property
    def attributes(self) -> tuple[str, ...]:
        return tuple(a for a in self.profile.split("+")[1:])

    @property
    def gfx(self) -> bool:
        return "gfx" in self.attributes

    @property
    def nvml_profile_id(self) -> int:
        if self.profile_id is not None:
            return self.profile_id
        table = (
            _PROFILE_IDS_GFX
            if self.gfx
            else _PROFILE_IDS_ME
            if "me" in self.attributes
            else _PROFILE_IDS
        )
        return table.get(self.slices, _PROFILE_IDS.get(self.slices, 0))


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One physical GPU.  ``minor``/``bus_id`` default from the GPU's index."""

    name: str = "NVIDIA H100 80GB HBM3"
    brand: int = 14  # NVML_BRAND_NVIDIA, what current drivers report for data-centre parts
    compute_capability: tuple[int, int] = (9, 0)
    minor: int | None = None
    bus_id: str | None = None
    pci_device_id: int = 0x2330
    mig_capable: bool = True
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    max_mig_devices: int = 7
    vbios: str = "96.00.99.00.01"

    def __post_init__(self) -> None:
        if self.mig_devices and not self.mig_enabled:
            raise SimNodeError("MIG devices given for a GPU with MIG disabled")
        if self.mig_enabled and not self.mig_capable:
            raise SimNodeError("MIG enabled on a GPU that is not MIG-capable")
        if len(self.mig_devices) > self.max_mig_devices:
            raise SimNodeError(
                f"{len(self.mig_devices)} MIG devices, at most {self.max_mig_devices}"
            )
        if self.bus_id is not None and not _BUS_ID_RE.match(self.bus_id):
            raise SimNodeError(f"bad PCI bus id {self.bus_id!r} (want 0000:65:00.0)")


_BUS_ID_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# Bus ids of the eight GPUs of a typical 8-way HGX board.
_DEFAULT_BUS_IDS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLayout:
    """Everything that varies between simulated nodes; defaults are a 1-GPU Debian host."""

    gpus: tuple[GpuSpec, ...] = (GpuSpec(),)
    driver_version: str = DEFAULT_DRIVER_VERSION
    cuda_version: tuple[int, int] = (13, 0)
    distro: Distro = "debian"
    driver_container: bool = False  # driver under <root>/run/nvidia/driver, /dev at <root>
    uvm_major: int = 508
    caps_major: int = 509
    video_gid: int = 44
    render_gid: int = 105
    seed: str = "simnode"
    persistenced_socket: bool = True
    mps_pipe_dir: bool = False
    compat32: bool = False  # also build i386 libraries (needs gcc -m32)
    bmc_vga: bool = False  # an on-board VGA takes /dev/dri/card0 (GPUs start at card1)
    device_nodes: bool = True  # mknod; needs root or CAP_MKNOD
    extras: tuple[str, ...] = ()  # names from EXTRAS
    # What the libraries are built for: this machine's by default (another one needs a
    # cross compiler and that machine's ldconfig: builder.build_node)
    machine: Machine = field(default_factory=lambda: host_machine() or "x86_64")

    def __post_init__(self) -> None:
        if self.machine not in TRIPLETS:
            raise SimNodeError(f"unknown machine {self.machine!r} (known: {sorted(TRIPLETS)})")
        if self.compat32 and self.machine != "x86_64":
            raise SimNodeError("compat32 (i386 libraries) is for x86_64 nodes only")
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?", self.driver_version):
            raise SimNodeError(f"bad driver version {self.driver_version!r}")
        if unknown := set(self.extras) - set(EXTRAS):
            raise SimNodeError(f"unknown extras {sorted(unknown)} (known: {sorted(EXTRAS)})")
        if self.distro not in DIRS:
            raise SimNodeError(f"unknown distro layout {self.distro!r}")
        if not 1 <= len(self.gpus) <= MIG_MINORS_GPUS:
            raise SimNodeError(f"GPU count must be 1..{MIG_MINORS_GPUS}")
        minors = [self.minor_of(i) for i in range(len(self.gpus))]
        if len(set(minors)) != len(minors) or not all(0 <= m < MIG_MINORS_GPUS for m in minors):
            raise SimNodeError(f"GPU minors must be distinct and in 0..31: {minors}")
        bus_ids = [self.bus_id_of(i) for i in range(len(self.gpus))]
        if len(set(bus_ids)) != len(bus_ids):
            raise SimNodeError(f"duplicate PCI bus ids: {bus_ids}")
        for i in range(len(self.gpus)):
            self.mig_of(i)  # validates GI/CI uniqueness

    @classmethod
    def uniform(
        cls,
        count: int = 1,
        *,
        gpu: GpuSpec | None = None,
        mig: Mapping[int, str | Sequence[MigDevice]] | None = None,
        minors: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> NodeLayout:
        """``count`` identical GPUs; ``mig`` maps a GPU index to its MIG devices."""
        base = gpu or GpuSpec()
        mig = dict(mig or {})
        gpus = []
        for i in range(count):
            spec = base
            if minors is not None:
                spec = replace(spec, minor=minors[i])
            if i in mig:
                devs = mig[i]
                devices = parse_mig_devices(devs) if isinstance(devs, str) else tuple(devs)
                spec = replace(spec, mig_enabled=True, mig_devices=devices)
            gpus.append(spec)
        if set(mig) - set(range(count)):
            raise SimNodeError(f"MIG given for unknown GPU index: {sorted(set(mig))}")
        return cls(gpus=tuple(gpus), **kwargs)

    # -- derived values --

    def minor_of(self, index: int) -> int:
        m = self.gpus[index].minor
        return index if m is None else m

    def bus_id_of(self, index: int) -> str:
        b = self.gpus[index].bus_id
        if b is not None:
            return b
        bus = _DEFAULT_BUS_IDS[index] if index < len(_DEFAULT_BUS_IDS) else f"{index + 0xE0:02x}"
        return f"0000:{bus}:00.0"

    def gpu_uuid(self, index: int) -> str:
        return "GPU-" + det_uuid(self.seed, "gpu", index)

    def mig_of(self, index: int) -> tuple[tuple[MigDevice, int], ...]:
        """The GPU's MIG devices with their GPU-instance id resolved."""
        used: set[int] = {d.gi for d in self.gpus[index].mig_devices if d.gi is not None}
        pairs: set[tuple[int, int]] = set()
        out = []
        for dev in self.gpus[index].mig_devices:
            gi = dev.gi
            if gi is None:
                gi = _pick_gi(dev.slices, used)
                used.add(gi)
            if (gi, dev.ci) in pairs:
                raise SimNodeError(f"GPU {index}: MIG gi{gi}/ci{dev.ci} given twice")
            pairs.add((gi, dev.ci))
            out.append((dev, gi))
        return tuple(out)

    @property
    def cuda_driver_version(self) -> int:
        major, minor = self.cuda_version
        return major * 1000 + minor * 10

    @property
    def node_id(self) -> str:
        return "simnode-" + hashlib.sha256(self.seed.encode()).hexdigest()[:12]


def _pick_gi(slices: int, used: set[int]) -> int:
    candidates: list[int] = [*_GI_CANDIDATES.get(slices, ()), *range(GI_PER_GPU)]
    for gi in candidates:
        if gi not in used:
            return gi
    raise SimNodeError("no free GPU-instance id left")


def det_uuid(seed: str, *parts: object) -> str:
    digest = hashlib.sha256("/".join([seed, *map(str, parts)]).encode()).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


def parse_mig_devices(text: str) -> tuple[MigDevice, ...]:
    """``"1g.10gb*3,2g.20gb"`` -> MIG devices; ``*N`` repeats a profile."""
    devices: list[MigDevice] = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        profile, _, count = item.partition("*")
        try:
            n = int(count) if count else 1
        except ValueError:
            raise SimNodeError(f"bad MIG repeat count in {item!r}") from None
        devices.extend(MigDevice(profile=profile) for _ in range(n))
    return tuple(devices)


def parse_mig_arg(text: str) -> tuple[int, tuple[MigDevice, ...]]:
    """``"0:1g.10gb*7"`` (the CLI's ``--mig``) -> (GPU index, devices)."""
    index, sep, rest = text.partition(":")
    if not sep or not index.isdigit():
        raise SimNodeError(f"--mig wants INDEX:PROFILES, got {text!r}")
    return int(index), parse_mig_devices(rest)


# --- the driver's file set -------------------------------------------------------------------


