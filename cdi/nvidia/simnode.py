"""Simulated GPU node: a folder a CDI generator can read exactly like a real node.

``build_node(root, NodeLayout(...))`` creates, under ``root``:

* a driver root with real ELF shared objects (built by gcc, with the SONAMEs, version
  suffixes and symlinks of a 5xx driver), an ``etc/ld.so.cache`` written by glibc's own
  ``ldconfig -r``, binaries, GSP firmware, ICD/vendor configs and IPC sockets;
* a dev root with character devices made by ``mknod`` (majors and modes as on a real
  node: 195 for nvidia, a dynamic major for nvidia-uvm and nvidia-caps, 226 for DRM);
* ``proc/`` (driver version, per-GPU information, MIG capabilities, mig-minors,
  devices) and ``sys/`` (PCI DRM entries);
* ``simnode.json``, a manifest of everything above, at the top of ``root`` and outside
  the driver tree, so tests can compute expectations and the pynvml test double can
  answer from it.

The fake ``libcuda`` exports ``cuDriverGetVersion``/``cuInit``/``cuDeviceGetCount`` (the
count is the number of ``/dev/nvidia<N>`` character devices visible to the caller, so it
tells what a container was given) and ``fake_gpu_node_id``.  The simulated ``libnvidia-ml``
answers the NVML calls of nvidia-ml-py and of ``nvidia-ctk cdi generate`` (go-nvml) from
the node's description ``simnode-nvml.txt`` (written next to the manifest, found by walking
up from the library's own path, or named by ``$SIMNODE_NVML_NODE``; read afresh by each
``nvmlInit``): GPUs by index, UUID and PCI bus id, MIG devices, GPU and compute instances and
their profiles, versions.  ``in_node_namespace`` runs a tool such as nvidia-ctk in a private
mount namespace that shows it the node's ``/proc/driver`` and ``/sys/bus/pci/devices``.
Every library exports ``fake_nvidia_library()`` returning its own file name.

Compiled objects are cached by content (``cache_dir``, default
``$SIMNODE_CACHE`` or ``~/.cache/nri-cdi/simnode``) and copied, so a second build of an
8-GPU x 7-MIG node takes a fraction of a second.  gcc and ldconfig are only needed when
building; importing this module needs neither.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "EXTRAS",
    "BuiltNode",
    "GpuSpec",
    "MigDevice",
    "NodeLayout",
    "SimNodeError",
    "build_node",
    "in_node_namespace",
    "main",
    "nvml_description",
    "parse_mig_arg",
]

MANIFEST_NAME = "simnode.json"
# What the simulated libnvidia-ml reads; it finds it by walking up from its own file.
NVML_DESCRIPTION = "simnode-nvml.txt"
DEFAULT_DRIVER_VERSION = "580.82.07"
MANIFEST_FORMAT = 1
NVIDIA_MAJOR = 195
DRM_MAJOR = 226
CTL_MINOR = 255
MODESET_MINOR = 254
# The driver's mig-minors file has entries for this many GPU minors (config=1, monitor=2, then
# 135 minors per GPU: for each of 15 GPU instances, its access cap + 8 compute instances).
MIG_MINORS_GPUS = 32
_GI_PER_GPU = 15
_CI_PER_GI = 8
_MINORS_PER_GI = 1 + _CI_PER_GI

Distro = Literal["debian", "rhel", "debian-current", "gke"]
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
        if self.gi is not None and not 0 <= self.gi < _GI_PER_GPU:
            raise SimNodeError(f"GPU instance id {self.gi} out of range 0..{_GI_PER_GPU - 1}")
        if not 0 <= self.ci < _CI_PER_GI:
            raise SimNodeError(f"compute instance id {self.ci} out of range 0..{_CI_PER_GI - 1}")

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

    def __post_init__(self) -> None:
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?", self.driver_version):
            raise SimNodeError(f"bad driver version {self.driver_version!r}")
        if unknown := set(self.extras) - set(EXTRAS):
            raise SimNodeError(f"unknown extras {sorted(unknown)} (known: {sorted(EXTRAS)})")
        if self.distro not in _DIRS:
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
        return "GPU-" + _det_uuid(self.seed, "gpu", index)

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
    candidates: list[int] = [*_GI_CANDIDATES.get(slices, ()), *range(_GI_PER_GPU)]
    for gi in candidates:
        if gi not in used:
            return gi
    raise SimNodeError("no free GPU-instance id left")


def _det_uuid(seed: str, *parts: object) -> str:
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


@dataclass(frozen=True, slots=True)
class _Lib:
    file: str  # relative to the lib dir; "{v}" = driver version
    soname: str
    links: tuple[str, ...] = ()  # extra dev links -> soname
    kind: str = "generic"  # which C source: generic, cuda, nvml
    compat32: bool = False  # also shipped as i386


# Roughly the library set of a 5xx data-centre driver.
_LIBS: tuple[_Lib, ...] = (
    _Lib("libcuda.so.{v}", "libcuda.so.1", ("libcuda.so",), "cuda", True),
    _Lib("libcudadebugger.so.{v}", "libcudadebugger.so.1"),
    _Lib("libnvidia-ml.so.{v}", "libnvidia-ml.so.1", (), "nvml", True),
    _Lib("libnvidia-ptxjitcompiler.so.{v}", "libnvidia-ptxjitcompiler.so.1", (), "generic", True),
    _Lib("libnvidia-nvvm.so.{v}", "libnvidia-nvvm.so.4", (), "generic", True),
    _Lib("libnvidia-nvvm70.so.4", "libnvidia-nvvm70.so.4"),
    _Lib("libnvidia-gpucomp.so.{v}", "libnvidia-gpucomp.so.{v}", (), "generic", True),
    _Lib("libnvidia-opencl.so.{v}", "libnvidia-opencl.so.1"),
    _Lib("libnvidia-allocator.so.{v}", "libnvidia-allocator.so.1"),
    _Lib("libnvidia-cfg.so.{v}", "libnvidia-cfg.so.1"),
    _Lib("libnvidia-sandboxutils.so.{v}", "libnvidia-sandboxutils.so.1"),
    _Lib("libnvidia-pkcs11.so.{v}", "libnvidia-pkcs11.so.{v}"),
    _Lib("libnvidia-pkcs11-openssl3.so.{v}", "libnvidia-pkcs11-openssl3.so.{v}"),
    _Lib("libnvidia-eglcore.so.{v}", "libnvidia-eglcore.so.{v}", (), "generic", True),
    _Lib("libnvidia-glcore.so.{v}", "libnvidia-glcore.so.{v}", (), "generic", True),
    _Lib("libnvidia-glsi.so.{v}", "libnvidia-glsi.so.{v}", (), "generic", True),
    _Lib("libnvidia-tls.so.{v}", "libnvidia-tls.so.{v}", (), "generic", True),
    _Lib("libnvidia-glvkspirv.so.{v}", "libnvidia-glvkspirv.so.{v}"),
    _Lib("libnvidia-rtcore.so.{v}", "libnvidia-rtcore.so.{v}"),
    _Lib("libGLX_nvidia.so.{v}", "libGLX_nvidia.so.0", (), "generic", True),
    _Lib("libEGL_nvidia.so.{v}", "libEGL_nvidia.so.0", (), "generic", True),
    _Lib("libGLESv2_nvidia.so.{v}", "libGLESv2_nvidia.so.2", (), "generic", True),
    _Lib("libGLESv1_CM_nvidia.so.{v}", "libGLESv1_CM_nvidia.so.1", (), "generic", True),
    _Lib("libnvidia-encode.so.{v}", "libnvidia-encode.so.1", ("libnvidia-encode.so",)),
    _Lib("libnvcuvid.so.{v}", "libnvcuvid.so.1", ("libnvcuvid.so",)),
    _Lib(
        "libnvidia-opticalflow.so.{v}", "libnvidia-opticalflow.so.1", ("libnvidia-opticalflow.so",)
    ),
    _Lib("vdpau/libvdpau_nvidia.so.{v}", "libvdpau_nvidia.so.1"),
    _Lib("libnvidia-fbc.so.{v}", "libnvidia-fbc.so.1"),
    _Lib("libnvidia-ngx.so.{v}", "libnvidia-ngx.so.1"),
    _Lib("libnvoptix.so.{v}", "libnvoptix.so.1"),
    _Lib("libnvidia-api.so.1", "libnvidia-api.so.1"),
    _Lib("libnvidia-wayland-client.so.{v}", "libnvidia-wayland-client.so.{v}"),
    _Lib("libnvidia-vksc-core.so.{v}", "libnvidia-vksc-core.so.1"),
    _Lib("libnvidia-egl-wayland.so.1.1.19", "libnvidia-egl-wayland.so.1"),
    _Lib("libnvidia-egl-gbm.so.1.1.2", "libnvidia-egl-gbm.so.1"),
    _Lib("libnvidia-egl-xcb.so.1.0.1", "libnvidia-egl-xcb.so.1"),
    _Lib("libnvidia-egl-xlib.so.1.0.1", "libnvidia-egl-xlib.so.1"),
)
# X.Org modules, relative to the xorg modules dir.
_XORG_LIBS: tuple[_Lib, ...] = (
    _Lib("drivers/nvidia_drv.so", ""),
    _Lib(
        "extensions/libglxserver_nvidia.so.{v}",
        "libglxserver_nvidia.so.{v}",
        ("libglxserver_nvidia.so",),
    ),
)
_BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
_FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")

_DIRS: dict[str, dict[str, str]] = {
    "debian": {
        "lib": "usr/lib/x86_64-linux-gnu",
        "lib32": "usr/lib/i386-linux-gnu",
        "xorg": "usr/lib/xorg/modules",
    },
    "rhel": {"lib": "usr/lib64", "lib32": "usr/lib", "xorg": "usr/lib64/xorg/modules"},
    # Debian's packaged driver: the libraries in a nvidia/current folder the cache names.
    "debian-current": {
        "lib": "usr/lib/x86_64-linux-gnu/nvidia/current",
        "lib32": "usr/lib/i386-linux-gnu/nvidia/current",
        "xorg": "usr/lib/xorg/modules",
    },
    # GKE and other hosted nodes: the whole driver in one folder outside /usr, which the
    # loader's cache does not list (containers get it by LD_LIBRARY_PATH).
    "gke": {
        "lib": "usr/local/nvidia/lib64",
        "lib32": "usr/local/nvidia/lib",
        "xorg": "usr/local/nvidia/lib64/xorg/modules",
        "bin": "usr/local/nvidia/bin",
        "uncached": "yes",
    },
}


def _json(obj: object) -> str:
    return json.dumps(obj, indent=2) + "\n"


def _configs(v: str) -> dict[str, str]:
    """Config files by path relative to the driver root."""
    icd = {"file_format_version": "1.0.0", "ICD": {"library_path": "libEGL_nvidia.so.0"}}

    def egl_platform(lib: str) -> str:
        return _json({"file_format_version": "1.0.0", "ICD": {"library_path": lib}})

    vulkan = {
        "file_format_version": "1.0.1",
        "ICD": {"library_path": "libGLX_nvidia.so.0", "api_version": "1.4.312"},
    }
    layers = {
        "file_format_version": "1.0.1",
        "layer": {
            "name": "VK_LAYER_NV_optimus",
            "type": "INSTANCE",
            "library_path": "libGLX_nvidia.so.0",
            "api_version": "1.4.312",
            "implementation_version": "1",
            "description": "NVIDIA Optimus layer",
        },
    }
    platform = "usr/share/egl/egl_external_platform.d/"
    xorg_conf = (
        'Section "OutputClass"\n    Identifier "nvidia"\n    MatchDriver "nvidia-drm"\n'
        '    Driver "nvidia"\nEndSection\n'
    )
    return {
        "usr/share/glvnd/egl_vendor.d/10_nvidia.json": _json(icd),
        platform + "10_nvidia_wayland.json": egl_platform("libnvidia-egl-wayland.so.1"),
        platform + "15_nvidia_gbm.json": egl_platform("libnvidia-egl-gbm.so.1"),
        platform + "20_nvidia_xcb.json": egl_platform("libnvidia-egl-xcb.so.1"),
        platform + "20_nvidia_xlib.json": egl_platform("libnvidia-egl-xlib.so.1"),
        "etc/vulkan/icd.d/nvidia_icd.json": _json(vulkan),
        "etc/vulkan/implicit_layer.d/nvidia_layers.json": _json(layers),
        "etc/OpenCL/vendors/nvidia.icd": "libnvidia-opencl.so.1\n",
        "usr/share/nvidia/nvoptix.bin": f"simulated optix data for driver {v}\n",
        "usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf": xorg_conf,
    }


# --- C sources -------------------------------------------------------------------------------

_EXPORT = '__attribute__((visibility("default")))'

_C_GENERIC = """\
/* Simulated NVIDIA driver library (nri-cdi test fixture). */
{export} const char *fake_nvidia_library(void) {{ return "{name}"; }}
{export} const char *fake_nvidia_driver_version(void) {{ return "{version}"; }}
"""

_C_CUDA = """\
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The node's GPUs in NVML index order: minor, name, memory in MiB. */
static const struct {{ int minor; const char *name; unsigned long long mib; }} gpus[] = {{
{gpu_table}
}};
#define NGPUS ((int)(sizeof(gpus) / sizeof(gpus[0])))

/* CUDA numbers the GPUs this process can see (their /dev/nvidia<minor> is a character
 * device), in NVML order: ordinal i is the i-th visible GPU. */
static int visible(int ordinal) {{
    char path[32];
    struct stat st;
    int seen = 0;
    for (int i = 0; i < NGPUS; i++) {{
        snprintf(path, sizeof(path), "/dev/nvidia%d", gpus[i].minor);
        if (stat(path, &st) == 0 && S_ISCHR(st.st_mode)) {{
            if (seen == ordinal) return i;
            seen++;
        }}
    }}
    return ordinal < 0 ? seen : -1;  /* visible(-1): how many */
}}

static int initialised, contexts;

/* CUDA_SUCCESS 0, INVALID_VALUE 1, NOT_INITIALIZED 3, NO_DEVICE 100, INVALID_DEVICE 101,
 * INVALID_CONTEXT 201 */
{export} int cuInit(unsigned int flags) {{
    (void)flags;
    struct stat st;
    if (stat("/dev/nvidiactl", &st) != 0 || visible(-1) == 0) return 100;
    initialised = 1;
    return 0;
}}

{export} int cuDriverGetVersion(int *version) {{
    if (!version) return 1;
    *version = {cuda};
    return 0;
}}

{export} int cuDeviceGetCount(int *count) {{
    if (!count) return 1;
    *count = visible(-1);
    return 0;
}}

{export} int cuDeviceGet(int *device, int ordinal) {{
    if (!initialised) return 3;
    if (!device) return 1;
    if (visible(ordinal) < 0) return 101;
    *device = ordinal;
    return 0;
}}

{export} int cuDeviceGetName(char *name, int len, int device) {{
    if (!initialised) return 3;
    int i = visible(device);
    if (i < 0) return 101;
    if (!name || len <= 0) return 1;
    snprintf(name, (size_t)len, "%s", gpus[i].name);
    return 0;
}}

{export} int cuDeviceTotalMem_v2(size_t *bytes, int device) {{
    if (!initialised) return 3;
    int i = visible(device);
    if (i < 0) return 101;
    if (!bytes) return 1;
    *bytes = (size_t)(gpus[i].mib << 20);
    return 0;
}}

{export} int cuCtxCreate_v2(void **ctx, unsigned int flags, int device) {{
    (void)flags;
    if (!initialised) return 3;
    if (visible(device) < 0) return 101;
    if (!ctx) return 1;
    *ctx = malloc(1);
    contexts++;
    return 0;
}}

{export} int cuCtxDestroy_v2(void *ctx) {{
    if (!ctx || contexts == 0) return 201;
    free(ctx);
    contexts--;
    return 0;
}}

/* "Device memory" is host memory here: enough to prove the calls reach the driver. */
{export} int cuMemAlloc_v2(unsigned long long *dptr, size_t bytes) {{
    if (!initialised) return 3;
    if (contexts == 0) return 201;
    if (!dptr || bytes == 0) return 1;
    void *p = malloc(bytes);
    if (!p) return 2;  /* CUDA_ERROR_OUT_OF_MEMORY */
    *dptr = (unsigned long long)(size_t)p;
    return 0;
}}

{export} int cuMemFree_v2(unsigned long long dptr) {{
    if (contexts == 0) return 201;
    free((void *)(size_t)dptr);
    return 0;
}}

{export} const char *fake_gpu_node_id(void) {{ return "{node_id}"; }}
"""

_C_NVML = r"""/* Simulated NVML (nri-cdi test fixture): answers from the node description that
 * cdi/nvidia/simnode.py writes (simnode-nvml.txt at the node's top, found by walking up
 * from this library's own path, or named by $SIMNODE_NVML_NODE). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define OK 0
#define E_UNINIT 1
#define E_ARG 2
#define E_NOTSUP 3
#define E_NOTFOUND 6
#define E_SIZE 7
#define E_DRIVER 9
#define E_UNKNOWN 999
#define MAXGPU 32
#define MAXMIG 16 /* _NVML_MAX_MIG in simnode.py */
#define SLEN 96

enum { M_GPU = 0x51a0, M_MIG, M_GI, M_CI };

struct hdr { int magic; void *owner; };
struct gpu;
struct gi { struct hdr h; struct gpu *gpu; unsigned id, profile, start, size; };
struct mig {
    struct hdr dev, ci; struct gpu *gpu; struct gi *gi; int index;
    unsigned gi_id, ci_id, gi_profile, ci_profile, slices; unsigned long long mem_mb;
    char uuid[SLEN], name[SLEN];
};
struct gpu {
    struct hdr h; int index; unsigned minor, mig_capable, mig_enabled, max_mig, pci_id, brand;
    unsigned cc_major, cc_minor, arch; unsigned long long mem_mb;
    char uuid[SLEN], bus[32], bus_legacy[16], name[SLEN];
    int nmig, ngi; struct mig migs[MAXMIG]; struct gi gis[MAXMIG];
};

static struct gpu gpus[MAXGPU];
static int ngpus, inited;
static char driver[SLEN], nvml_version[SLEN];
static int cuda_version;

/* --- loading the description ------------------------------------------------------------ */

static FILE *open_description(void) {
    const char *env = getenv("SIMNODE_NVML_NODE");
    if (env && *env) return fopen(env, "r");
    Dl_info info;
    char path[PATH_MAX];
    if (!dladdr((void *)open_description, &info) || !info.dli_fname) return NULL;
    if (!realpath(info.dli_fname, path)) return NULL;
    for (int up = 0; up < 12; up++) {
        char *slash = strrchr(path, '/');
        if (!slash) return NULL;
        *slash = 0;
        char cand[PATH_MAX + 32];
        snprintf(cand, sizeof cand, "%s/simnode-nvml.txt", path);
        FILE *f = fopen(cand, "r");
        if (f) return f;
        if (!*path) return NULL;
    }
    return NULL;
}

static void rest_of_line(const char *s, char *out) {
    while (*s == ' ') s++;
    snprintf(out, SLEN, "%s", s);
    out[strcspn(out, "\n")] = 0;
}

static struct gi *gi_of(struct gpu *g, unsigned id, unsigned profile, unsigned slices) {
    for (int k = 0; k < g->ngi; k++)
        if (g->gis[k].id == id) return &g->gis[k];
    struct gi *x = &g->gis[g->ngi++];
    x->h.magic = M_GI; x->h.owner = x; x->gpu = g; x->id = id; x->profile = profile;
    x->start = id; x->size = slices;
    return x;
}

static int load(void) {
    FILE *f = open_description();
    if (!f) return E_DRIVER;
    char line[512];
    int n, ok = 0;
    ngpus = 0;
    while (fgets(line, sizeof line, f)) {
        struct gpu *g = ngpus ? &gpus[ngpus - 1] : NULL;
        if (sscanf(line, "simnode-nvml %d", &n) == 1) ok = (n == 1);
        else if (sscanf(line, "driver %95s", driver) == 1) {}
        else if (sscanf(line, "nvml %95s", nvml_version) == 1) {}
        else if (sscanf(line, "cuda %d", &cuda_version) == 1) {}
        else if (strncmp(line, "gpu ", 4) == 0 && ngpus < MAXGPU) {
            g = &gpus[ngpus];
            memset(g, 0, sizeof *g);
            if (sscanf(line, "gpu %u %u %u %u %x %u %u %u %u %llu %95s %31s %15s %n", &g->minor,
                       &g->mig_capable, &g->mig_enabled, &g->max_mig, &g->pci_id, &g->brand,
                       &g->cc_major, &g->cc_minor, &g->arch, &g->mem_mb, g->uuid, g->bus,
                       g->bus_legacy, &n) < 13) { ok = 0; break; }
            rest_of_line(line + n, g->name);
            g->h.magic = M_GPU; g->h.owner = g; g->index = ngpus++;
        } else if (strncmp(line, "mig ", 4) == 0 && g && g->nmig < MAXMIG) {
            struct mig *m = &g->migs[g->nmig];
            memset(m, 0, sizeof *m);
            if (sscanf(line, "mig %u %u %u %u %u %llu %95s %n", &m->gi_id, &m->ci_id,
                       &m->gi_profile, &m->ci_profile, &m->slices, &m->mem_mb, m->uuid,
                       &n) < 7) { ok = 0; break; }
            rest_of_line(line + n, m->name);
            m->dev.magic = M_MIG; m->dev.owner = m; m->ci.magic = M_CI; m->ci.owner = m;
            m->gpu = g; m->index = g->nmig++;
            m->gi = gi_of(g, m->gi_id, m->gi_profile, m->slices);
        }
    }
    fclose(f);
    return ok ? OK : E_UNKNOWN;
}

/* --- handles ---------------------------------------------------------------------------- */

typedef struct hdr *nvmlDevice_t;

static struct gpu *as_gpu(nvmlDevice_t d) {
    return (inited && d && d->magic == M_GPU) ? (struct gpu *)d->owner : NULL;
}
static struct mig *as_mig(nvmlDevice_t d) {
    return (inited && d && d->magic == M_MIG) ? (struct mig *)d->owner : NULL;
}
#define CHECK_INIT if (!inited) return E_UNINIT

static int copy_out(const char *s, char *buf, unsigned len) {
    if (!buf) return E_ARG;
    if (strlen(s) + 1 > len) return E_SIZE;
    strcpy(buf, s);
    return OK;
}

/* --- init and system -------------------------------------------------------------------- */

EXPORT int nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    if (!inited) { /* read afresh each session: a long-lived caller sees a changed node */
        int r = load();
        if (r != OK) return r;
    }
    inited++;
    return OK;
}
EXPORT int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT int nvmlInit(void) { return nvmlInitWithFlags(0); }
EXPORT int nvmlShutdown(void) { CHECK_INIT; inited--; return OK; }

EXPORT const char *nvmlErrorString(int r) {
    switch (r) {
    case OK: return "Success";
    case E_UNINIT: return "Uninitialized";
    case E_ARG: return "Invalid Argument";
    case E_NOTSUP: return "Not Supported";
    case E_NOTFOUND: return "Not Found";
    case E_SIZE: return "Insufficient Size";
    case E_DRIVER: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

EXPORT int nvmlSystemGetDriverVersion(char *buf, unsigned len) {
    CHECK_INIT; return copy_out(driver, buf, len);
}
EXPORT int nvmlSystemGetNVMLVersion(char *buf, unsigned len) {
    CHECK_INIT; return copy_out(nvml_version, buf, len);
}
EXPORT int nvmlSystemGetCudaDriverVersion(int *v) {
    CHECK_INIT; if (!v) return E_ARG; *v = cuda_version; return OK;
}
EXPORT int nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

/* --- GPUs ------------------------------------------------------------------------------- */

EXPORT int nvmlDeviceGetCount_v2(unsigned *n) {
    CHECK_INIT; if (!n) return E_ARG; *n = ngpus; return OK;
}
EXPORT int nvmlDeviceGetCount(unsigned *n) { return nvmlDeviceGetCount_v2(n); }

EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) {
    CHECK_INIT;
    if (!d || i >= (unsigned)ngpus) return E_ARG;
    *d = &gpus[i].h;
    return OK;
}
EXPORT int nvmlDeviceGetHandleByIndex(unsigned i, nvmlDevice_t *d) {
    return nvmlDeviceGetHandleByIndex_v2(i, d);
}

EXPORT int nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    CHECK_INIT;
    if (!uuid || !d) return E_ARG;
    for (int i = 0; i < ngpus; i++) {
        if (strcmp(gpus[i].uuid, uuid) == 0) { *d = &gpus[i].h; return OK; }
        for (int j = 0; j < gpus[i].nmig; j++)
            if (strcmp(gpus[i].migs[j].uuid, uuid) == 0) { *d = &gpus[i].migs[j].dev; return OK; }
    }
    return E_NOTFOUND;
}

EXPORT int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *d) {
    CHECK_INIT;
    if (!bus || !d) return E_ARG;
    for (int i = 0; i < ngpus; i++)
        if (strcasecmp(gpus[i].bus, bus) == 0 || strcasecmp(gpus[i].bus_legacy, bus) == 0
            || strcasecmp(gpus[i].bus + 4, bus) == 0) { *d = &gpus[i].h; return OK; }
    return E_NOTFOUND;
}
EXPORT int nvmlDeviceGetHandleByPciBusId(const char *b, nvmlDevice_t *d) {
    return nvmlDeviceGetHandleByPciBusId_v2(b, d);
}

/* A MIG device's index is its index within its parent GPU (the j of i:j). */
EXPORT int nvmlDeviceGetIndex(nvmlDevice_t d, unsigned *i) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    CHECK_INIT;
    if (!i || !(g || m)) return E_ARG;
    *i = g ? (unsigned)g->index : (unsigned)m->index;
    return OK;
}

EXPORT int nvmlDeviceGetUUID(nvmlDevice_t d, char *buf, unsigned len) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    CHECK_INIT;
    if (g) return copy_out(g->uuid, buf, len);
    if (m) return copy_out(m->uuid, buf, len);
    return E_ARG;
}

EXPORT int nvmlDeviceGetName(nvmlDevice_t d, char *buf, unsigned len) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    CHECK_INIT;
    if (g) return copy_out(g->name, buf, len);
    if (m) return copy_out(m->name, buf, len);
    return E_ARG;
}

EXPORT int nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned *minor) {
    struct gpu *g = as_gpu(d);
    CHECK_INIT;
    if (as_mig(d)) return E_NOTSUP;
    if (!g || !minor) return E_ARG;
    *minor = g->minor;
    return OK;
}

EXPORT int nvmlDeviceGetBrand(nvmlDevice_t d, int *brand) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    CHECK_INIT;
    if (m) g = m->gpu;
    if (!g || !brand) return E_ARG;
    *brand = (int)g->brand;
    return OK;
}

EXPORT int nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    CHECK_INIT;
    if (m) g = m->gpu;
    if (!g || !major || !minor) return E_ARG;
    *major = (int)g->cc_major; *minor = (int)g->cc_minor;
    return OK;
}

EXPORT int nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned *arch) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    CHECK_INIT;
    if (m) g = m->gpu;
    if (!g || !arch) return E_ARG;
    *arch = g->arch;
    return OK;
}

typedef struct { char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
                 char busId[32]; } pci_v3;
typedef struct { char busId[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId,
                 r0, r1, r2, r3; } pci_v1;

static int pci_fields(nvmlDevice_t d, struct gpu **out, unsigned *dom, unsigned *bus,
                      unsigned *dev) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    if (!inited) return E_UNINIT;
    if (m) g = m->gpu;
    if (!g) return E_ARG;
    if (sscanf(g->bus, "%x:%x:%x", dom, bus, dev) != 3) return E_UNKNOWN;
    *out = g;
    return OK;
}

EXPORT int nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, pci_v3 *p) {
    struct gpu *g; unsigned dom, bus, dev;
    int r = pci_fields(d, &g, &dom, &bus, &dev);
    if (r != OK) return r;
    if (!p) return E_ARG;
    memset(p, 0, sizeof *p);
    snprintf(p->busId, sizeof p->busId, "%s", g->bus);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%s", g->bus_legacy);
    p->domain = dom; p->bus = bus; p->device = dev; p->pciDeviceId = g->pci_id;
    p->pciSubSystemId = 0x16a110de;
    return OK;
}
EXPORT int nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, pci_v3 *p) {
    return nvmlDeviceGetPciInfo_v3(d, p);
}
EXPORT int nvmlDeviceGetPciInfo(nvmlDevice_t d, pci_v1 *p) {
    struct gpu *g; unsigned dom, bus, dev;
    int r = pci_fields(d, &g, &dom, &bus, &dev);
    if (r != OK) return r;
    if (!p) return E_ARG;
    memset(p, 0, sizeof *p);
    snprintf(p->busId, sizeof p->busId, "%s", g->bus_legacy);
    p->domain = dom; p->bus = bus; p->device = dev; p->pciDeviceId = g->pci_id;
    p->pciSubSystemId = 0x16a110de;
    return OK;
}

typedef struct { unsigned long long total, free, used; } mem_v1;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } mem_v2;

static unsigned long long mem_bytes(nvmlDevice_t d) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    if (m) return m->mem_mb << 20;
    return g ? g->mem_mb << 20 : 0;
}
EXPORT int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, mem_v1 *mem) {
    CHECK_INIT;
    if (!mem || !(as_gpu(d) || as_mig(d))) return E_ARG;
    mem->total = mem->free = mem_bytes(d); mem->used = 0;
    return OK;
}
EXPORT int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, mem_v2 *mem) {
    CHECK_INIT;
    if (!mem || !(as_gpu(d) || as_mig(d))) return E_ARG;
    mem->total = mem->free = mem_bytes(d); mem->used = mem->reserved = 0;
    return OK;
}

/* --- MIG -------------------------------------------------------------------------------- */

EXPORT int nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned *current, unsigned *pending) {
    struct gpu *g = as_gpu(d);
    CHECK_INIT;
    if (as_mig(d)) return E_NOTSUP;
    if (!g || !current || !pending) return E_ARG;
    if (!g->mig_capable) return E_NOTSUP;
    *current = *pending = g->mig_enabled;
    return OK;
}

EXPORT int nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned *is_mig) {
    CHECK_INIT;
    if (!is_mig || !(as_gpu(d) || as_mig(d))) return E_ARG;
    *is_mig = as_mig(d) != NULL;
    return OK;
}

EXPORT int nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned *n) {
    struct gpu *g = as_gpu(d);
    CHECK_INIT;
    if (!g || !n) return E_ARG;
    *n = g->mig_capable ? g->max_mig : 0;
    return OK;
}

EXPORT int nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned i, nvmlDevice_t *out) {
    struct gpu *g = as_gpu(d);
    CHECK_INIT;
    if (!g || !out) return E_ARG;
    if (!g->mig_capable) return E_NOTSUP;
    if (i >= g->max_mig) return E_ARG;
    if (!g->mig_enabled || i >= (unsigned)g->nmig) return E_NOTFOUND;
    *out = &g->migs[i].dev;
    return OK;
}

EXPORT int nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *out) {
    struct mig *m = as_mig(d);
    CHECK_INIT;
    if (!m || !out) return E_ARG;
    *out = &m->gpu->h;
    return OK;
}

EXPORT int nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned *id) {
    struct mig *m = as_mig(d);
    CHECK_INIT;
    if (as_gpu(d)) return E_NOTSUP;
    if (!m || !id) return E_ARG;
    *id = m->gi_id;
    return OK;
}

EXPORT int nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned *id) {
    struct mig *m = as_mig(d);
    CHECK_INIT;
    if (as_gpu(d)) return E_NOTSUP;
    if (!m || !id) return E_ARG;
    *id = m->ci_id;
    return OK;
}

typedef struct { unsigned mp, ce, dec, enc, jpeg, ofa, gi_slices, ci_slices;
                 unsigned long long mem_mb; } attrs_t;

EXPORT int nvmlDeviceGetAttributes_v2(nvmlDevice_t d, attrs_t *a) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    CHECK_INIT;
    if (!a || !(g || m)) return E_ARG;
    memset(a, 0, sizeof *a);
    unsigned slices = m ? m->slices : 8;
    a->mp = 16 * slices; a->ce = slices; a->dec = slices; a->jpeg = slices;
    a->gi_slices = slices; a->ci_slices = slices;
    a->mem_mb = m ? m->mem_mb : g->mem_mb;
    return OK;
}
EXPORT int nvmlDeviceGetAttributes(nvmlDevice_t d, attrs_t *a) {
    return nvmlDeviceGetAttributes_v2(d, a);
}

typedef struct { nvmlDevice_t device; unsigned id, profileId, start, size; } gi_info_t;
typedef struct { nvmlDevice_t device; struct hdr *gi; unsigned id, profileId, start, size;
} ci_info_t;

EXPORT int nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned id, struct hdr **out) {
    struct gpu *g = as_gpu(d);
    CHECK_INIT;
    if (!g || !out) return E_ARG;
    if (!g->mig_capable) return E_NOTSUP;
    for (int k = 0; k < g->ngi; k++)
        if (g->gis[k].id == id) { *out = &g->gis[k].h; return OK; }
    return E_NOTFOUND;
}

static struct gi *as_gi(struct hdr *h) {
    return (inited && h && h->magic == M_GI) ? (struct gi *)h->owner : NULL;
}

EXPORT int nvmlGpuInstanceGetInfo(struct hdr *h, gi_info_t *info) {
    struct gi *x = as_gi(h);
    CHECK_INIT;
    if (!x || !info) return E_ARG;
    info->device = &x->gpu->h; info->id = x->id; info->profileId = x->profile;
    info->start = x->start; info->size = x->size;
    return OK;
}

EXPORT int nvmlGpuInstanceGetComputeInstanceById(struct hdr *h, unsigned id, struct hdr **out) {
    struct gi *x = as_gi(h);
    CHECK_INIT;
    if (!x || !out) return E_ARG;
    for (int j = 0; j < x->gpu->nmig; j++) {
        struct mig *m = &x->gpu->migs[j];
        if (m->gi == x && m->ci_id == id) { *out = &m->ci; return OK; }
    }
    return E_NOTFOUND;
}

EXPORT int nvmlComputeInstanceGetInfo_v2(struct hdr *h, ci_info_t *info) {
    CHECK_INIT;
    if (!h || h->magic != M_CI || !info) return E_ARG;
    struct mig *m = (struct mig *)h->owner;
    info->device = &m->gpu->h; info->gi = &m->gi->h; info->id = m->ci_id;
    info->profileId = m->ci_profile; info->start = 0; info->size = m->slices;
    return OK;
}
EXPORT int nvmlComputeInstanceGetInfo(struct hdr *h, ci_info_t *info) {
    return nvmlComputeInstanceGetInfo_v2(h, info);
}

/* GPU-instance profiles: the standard ones, plus whatever the node's instances use. */
static const unsigned std_slices[] = {1, 2, 3, 4, 7}; /* profile ids 0..4 */

typedef struct { unsigned id, p2p, slices, count, mp, ce, dec, enc, jpeg, ofa;
                 unsigned long long mem_mb; } gip_v1;
typedef struct { unsigned version, id, p2p, slices, count, mp, ce, dec, enc, jpeg, ofa;
                 unsigned long long mem_mb; char name[96]; } gip_v2;

static int gi_profile(struct gpu *g, unsigned profile, gip_v1 *p) {
    unsigned slices = 0; unsigned long long mem = 0;
    for (int j = 0; j < g->nmig; j++)
        if (g->migs[j].gi_profile == profile) {
            slices = g->migs[j].slices; mem = g->migs[j].mem_mb;
        }
    if (!slices && profile < 5) { slices = std_slices[profile]; mem = g->mem_mb * slices / 8; }
    if (!slices) return E_NOTSUP;
    memset(p, 0, sizeof *p);
    p->id = profile; p->slices = slices; p->count = 7 / slices; p->mp = 16 * slices;
    p->ce = slices; p->dec = slices; p->jpeg = slices; p->mem_mb = mem;
    return OK;
}

EXPORT int nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned profile, gip_v1 *p) {
    struct gpu *g = as_gpu(d);
    CHECK_INIT;
    if (!g || !p) return E_ARG;
    if (!g->mig_capable) return E_NOTSUP;
    return gi_profile(g, profile, p);
}

EXPORT int nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t d, unsigned profile, gip_v2 *p) {
    struct gpu *g = as_gpu(d); gip_v1 v1;
    CHECK_INIT;
    if (!g || !p) return E_ARG;
    if (!g->mig_capable) return E_NOTSUP;
    int r = gi_profile(g, profile, &v1);
    if (r != OK) return r;
    unsigned version = p->version;
    memset(p, 0, sizeof *p);
    p->version = version; p->id = v1.id; p->slices = v1.slices; p->count = v1.count;
    p->mp = v1.mp; p->ce = v1.ce; p->dec = v1.dec; p->jpeg = v1.jpeg; p->mem_mb = v1.mem_mb;
    snprintf(p->name, sizeof p->name, "%ug.%llugb", v1.slices, (v1.mem_mb + 512) / 1024);
    return OK;
}

typedef struct { unsigned id, slices, count, mp, ce, dec, enc, jpeg, ofa; } cip_v1;

EXPORT int nvmlGpuInstanceGetComputeInstanceProfileInfo(struct hdr *h, unsigned profile,
                                                         unsigned engine, cip_v1 *p) {
    struct gi *x = as_gi(h);
    CHECK_INIT;
    if (!x || !p) return E_ARG;
    if (engine != 0) return E_NOTSUP;
    for (int j = 0; j < x->gpu->nmig; j++) {
        struct mig *m = &x->gpu->migs[j];
        if (m->gi == x && m->ci_profile == profile) {
            memset(p, 0, sizeof *p);
            p->id = profile; p->slices = m->slices; p->count = 1; p->mp = 16 * m->slices;
            return OK;
        }
    }
    return E_NOTSUP;
}
"""
_C_NVML_ID = """
{export} const char *fake_gpu_node_id(void) {{ return "{node_id}"; }}
"""


def _c_source(lib: _Lib, name: str, layout: NodeLayout, *, bits: int) -> str:
    text = _C_GENERIC.format(export=_EXPORT, name=name, version=layout.driver_version)
    if bits == 32:  # no 32-bit libc here: keep compat objects header- and libc-free
        return text
    params = {
        "export": _EXPORT,
        "cuda": layout.cuda_driver_version,
        "node_id": layout.node_id,
        "version": layout.driver_version,
        "gpus": len(layout.gpus),
        "gpu_table": ",\n".join(
            f"    {{{layout.minor_of(i)}, {json.dumps(g.name)}, {_memory_mb(g.name)}ULL}}"
            for i, g in enumerate(layout.gpus)),
    }
    if lib.kind == "cuda":
        text += _C_CUDA.format(**params)
    elif lib.kind == "nvml":
        # The same object for every node: it reads the node's description when NVML starts.
        text = _C_NVML + text + _C_NVML_ID.format(**params)
    return text


@dataclass(frozen=True, slots=True)
class _Job:
    source: str
    soname: str
    bits: int
    dest: Path


class _Compiler:
    """gcc with a content-addressed cache of built objects."""

    def __init__(self, cache_dir: Path):
        self.cache_dir = cache_dir
        self.gcc = shutil.which("gcc") or shutil.which("cc")

    def build_all(self, jobs: Sequence[_Job]) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        workers = min(len(jobs), os.cpu_count() or 2) or 1
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(self._build, jobs))

    def _args(self, job: _Job, out: str, src: str) -> list[str]:
        args = [self.gcc or "gcc", "-shared", "-fPIC", "-O1", "-Wl,--build-id=none"]
        if job.soname:
            args.append(f"-Wl,-soname,{job.soname}")
        if job.bits == 32:
            args += ["-m32", "-nostdlib"]
        return [*args, "-o", out, src]

    def _build(self, job: _Job) -> None:
        key = hashlib.sha256(
            json.dumps([job.source, job.soname, job.bits, self._args(job, "", "")]).encode()
        ).hexdigest()[:32]
        cached = self.cache_dir / f"{key}.so"
        if not cached.exists():
            self._compile(job, cached)
        shutil.copyfile(cached, job.dest)
        os.chmod(job.dest, 0o755)

    def _compile(self, job: _Job, cached: Path) -> None:
        if self.gcc is None:
            raise SimNodeError("building a simulated node needs gcc on PATH")
        with tempfile.TemporaryDirectory(dir=self.cache_dir) as tmp:
            src, out = os.path.join(tmp, "lib.c"), os.path.join(tmp, "lib.so")
            Path(src).write_text(job.source)
            proc = subprocess.run(self._args(job, out, src), capture_output=True, text=True)
            if proc.returncode != 0:
                hint = " (32-bit build: is gcc multilib installed?)" if job.bits == 32 else ""
                raise SimNodeError(
                    f"gcc failed for {job.soname or job.dest.name}{hint}:\n{proc.stderr.strip()}"
                )
            os.replace(out, cached)  # atomic: parallel builders may race on the same key


def _default_cache_dir() -> Path:
    env = os.environ.get("SIMNODE_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "nri-cdi" / "simnode"


# --- result ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BuiltNode:
    """Where a built node's parts are; ``manifest`` is the parsed ``simnode.json``."""

    root: Path
    driver_root: Path
    dev_root: Path
    proc_root: Path  # the folder holding ``proc/`` (i.e. a stand-in for "/")
    sys_root: Path
    manifest_path: Path
    manifest: Mapping[str, Any] = field(repr=False)

    @property
    def lib_dir(self) -> Path:
        return self.driver_root / str(self.manifest["lib_dir"]).lstrip("/")

    @property
    def ldcache_path(self) -> Path:
        return self.driver_root / "etc" / "ld.so.cache"

    @property
    def driver_version(self) -> str:
        return str(self.manifest["driver_version"])

    def host_path(self, container_path: str, *, where: str = "driver") -> Path:
        """Host path of an absolute in-root path (``where``: driver, dev, proc or sys)."""
        base = {
            "driver": self.driver_root,
            "dev": self.dev_root,
            "proc": self.proc_root,
            "sys": self.sys_root,
        }[where]
        return base / container_path.lstrip("/")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BuiltNode:
        """Open an existing node from its root folder or its manifest file."""
        p = Path(path)
        manifest_path = p / MANIFEST_NAME if p.is_dir() else p
        manifest = json.loads(manifest_path.read_text())
        root = manifest_path.parent
        roots = manifest["roots"]
        return cls(
            root=root,
            driver_root=(root / roots["driver"]).resolve(),
            dev_root=(root / roots["dev"]).resolve(),
            proc_root=(root / roots["proc"]).resolve(),
            sys_root=(root / roots["sys"]).resolve(),
            manifest_path=manifest_path,
            manifest=manifest,
        )


# --- builder ---------------------------------------------------------------------------------


class _Builder:
    def __init__(self, root: Path, layout: NodeLayout, cache_dir: Path):
        self.layout = layout
        self.root = root
        self.driver_root = root / "run/nvidia/driver" if layout.driver_container else root
        self.dev_root = root
        self.proc_root = root
        self.sys_root = root
        self.dirs = _DIRS[layout.distro]
        self.compiler = _Compiler(cache_dir)
        self.libraries: list[dict[str, Any]] = []
        self.device_nodes: list[dict[str, Any]] = []
        self.files: dict[str, list[str]] = {
            "binaries": [],
            "firmware": [],
            "configs": [],
            "ipc": [],
            "symlinks": [],
        }

    # small helpers

    def _write(self, base: Path, rel: str, text: str | bytes, mode: int = 0o644) -> Path:
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        os.chmod(path, mode)
        return path

    def _symlink(self, base: Path, rel: str, target: str) -> None:
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)
        self.files["symlinks"].append("/" + rel)

    def _v(self, s: str) -> str:
        return s.replace("{v}", self.layout.driver_version)

    # steps

    def libraries_step(self) -> None:
        jobs: list[_Job] = []
        links: list[tuple[str, str]] = []  # (link rel path, target)
        libs = _LIBS
        if "vulkan-producer" in self.layout.extras:
            libs += (_Lib("libnvidia-vulkan-producer.so.{v}", "libnvidia-vulkan-producer.so.{v}"),)
        sets = [(self.dirs["lib"], libs, 64), (self.dirs["xorg"], _XORG_LIBS, 64)]
        if self.layout.compat32:
            sets.append((self.dirs["lib32"], tuple(x for x in _LIBS if x.compat32), 32))
        for libdir, libs, bits in sets:
            for lib in libs:
                jobs.append(self._lib_job(libdir, lib, bits, links))
        for job in jobs:
            job.dest.parent.mkdir(parents=True, exist_ok=True)
        self.compiler.build_all(jobs)
        for link, target in links:
            self._symlink(self.driver_root, link, target)
        # GBM backend link, as the driver installer makes it.
        self._symlink(
            self.driver_root,
            self.dirs["lib"] + "/gbm/nvidia-drm_gbm.so",
            "../libnvidia-allocator.so.1",
        )

    def _lib_job(self, libdir: str, lib: _Lib, bits: int, links: list[tuple[str, str]]) -> _Job:
        rel = f"{libdir}/{self._v(lib.file)}"
        name = os.path.basename(rel)
        soname = self._v(lib.soname)
        folder = os.path.dirname(rel)
        entry_links = []
        if soname and soname != name:
            links.append((f"{folder}/{soname}", name))
            entry_links.append(f"/{folder}/{soname}")
        for dev in lib.links:
            dev = self._v(dev)
            links.append((f"{folder}/{dev}", soname or name))
            entry_links.append(f"/{folder}/{dev}")
        self.libraries.append(
            {"path": "/" + rel, "soname": soname or None, "bits": bits, "links": entry_links}
        )
        source = _c_source(lib, name, self.layout, bits=bits)
        return _Job(source, soname, bits, self.driver_root / rel)

    def ldcache_step(self) -> None:
        conf = [self.dirs["lib"], self.dirs["lib"] + "/vdpau"]
        if self.layout.compat32:
            conf.append(self.dirs["lib32"])
        if self.dirs.get("uncached"):
            conf = []
        self._write(self.driver_root, "etc/ld.so.conf", "".join(f"/{d}\n" for d in conf))
        ldconfig = _find_ldconfig()
        # -X: keep our links exactly as made (as the driver's packages would ship them).
        proc = subprocess.run(
            [ldconfig, "-X", "-r", str(self.driver_root)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise SimNodeError(f"ldconfig -r failed: {proc.stderr.strip()}")

    def binaries_step(self) -> None:
        extra = ("nvidia-imex", "nvidia-imex-ctl") if "imex" in self.layout.extras else ()
        for name in (*_BINARIES, *extra):
            body = (
                _nvidia_smi_script(self.layout)
                if name == "nvidia-smi"
                else (f"#!/bin/sh\necho 'simulated {name} {self.layout.driver_version}'\n")
            )
            bin_dir = self.dirs.get("bin", "usr/bin")
            self._write(self.driver_root, f"{bin_dir}/{name}", body, 0o755)
            self.files["binaries"].append(f"/{bin_dir}/{name}")

    def firmware_step(self) -> None:
        for name in _FIRMWARE:
            rel = f"lib/firmware/nvidia/{self.layout.driver_version}/{name}"
            self._write(self.driver_root, rel, b"\x7fGSP simulated firmware\n" + name.encode())
            self.files["firmware"].append("/" + rel)

    def configs_step(self) -> None:
        extras = self.layout.extras
        for rel, text in _configs(self.layout.driver_version).items():
            if "vulkan-icd-at-root" in extras and rel.startswith("etc/vulkan/icd.d/"):
                rel = rel.removeprefix("etc/")
            if "configs-in-local-share" in extras and rel.startswith("usr/share/"):
                rel = "usr/local/" + rel.removeprefix("usr/")
            self._write(self.driver_root, rel, text)
            self.files["configs"].append("/" + rel)

    def ipc_step(self) -> None:
        if self.layout.persistenced_socket:
            rel = "run/nvidia-persistenced/socket"
            _make_socket(self.driver_root / rel)
            self.files["ipc"].append("/" + rel)
        if "fabricmanager" in self.layout.extras:
            rel = "run/nvidia-fabricmanager/socket"
            _make_socket(self.driver_root / rel)
            self.files["ipc"].append("/" + rel)
        if self.layout.mps_pipe_dir:
            d = self.driver_root / "tmp/nvidia-mps"
            d.mkdir(parents=True, exist_ok=True)
            os.mkfifo(d / "control")
            self.files["ipc"].append("/tmp/nvidia-mps")

    def devices_step(self) -> list[dict[str, Any]]:
        lay = self.layout
        self._node("nvidiactl", NVIDIA_MAJOR, CTL_MINOR, 0o666)
        self._node("nvidia-modeset", NVIDIA_MAJOR, MODESET_MINOR, 0o666)
        self._node("nvidia-uvm", lay.uvm_major, 0, 0o666)
        self._node("nvidia-uvm-tools", lay.uvm_major, 1, 0o666)
        if lay.bmc_vga:
            self._drm_card(0, None, "0000:03:00.0")
        gpus = []
        for i, gpu in enumerate(lay.gpus):
            minor = lay.minor_of(i)
            self._node(f"nvidia{minor}", NVIDIA_MAJOR, minor, 0o666)
            card = i + (1 if lay.bmc_vga else 0)
            drm = self._drm_card(card, 128 + i, lay.bus_id_of(i))
            gpus.append(self._gpu_record(i, gpu, minor, drm))
        if any(g.mig_capable for g in lay.gpus):
            self._node("nvidia-caps/nvidia-cap1", lay.caps_major, 1, 0o400)
            self._node("nvidia-caps/nvidia-cap2", lay.caps_major, 2, 0o400)
            for rec in gpus:
                for mig in rec["mig_devices"]:
                    self._node(
                        f"nvidia-caps/nvidia-cap{mig['gi_cap_minor']}",
                        lay.caps_major,
                        mig["gi_cap_minor"],
                        0o444,
                    )
                    self._node(
                        f"nvidia-caps/nvidia-cap{mig['ci_cap_minor']}",
                        lay.caps_major,
                        mig["ci_cap_minor"],
                        0o444,
                    )
        return gpus

    def _node(self, rel: str, major: int, minor: int, mode: int, gid: int = 0) -> None:
        path = self.dev_root / "dev" / rel
        if any(n["path"] == f"/dev/{rel}" for n in self.device_nodes):
            return  # GI cap shared by several compute instances
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.layout.device_nodes:
            try:
                os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
            except PermissionError as e:
                raise SimNodeError(
                    f"mknod {path}: {e.strerror}; building device nodes needs root or "
                    "CAP_MKNOD (or NodeLayout(device_nodes=False))"
                ) from None
            os.chmod(path, mode)  # mknod's mode is filtered by the umask
            if gid:
                os.chown(path, 0, gid)
        self.device_nodes.append(
            {"path": f"/dev/{rel}", "major": major, "minor": minor, "mode": mode, "gid": gid}
        )

    def _drm_card(self, card: int, render: int | None, bus_id: str) -> dict[str, Any]:
        names = {"card": f"card{card}"}
        self._node(f"dri/card{card}", DRM_MAJOR, card, 0o660, self.layout.video_gid)
        self._symlink(self.dev_root, f"dev/dri/by-path/pci-{bus_id}-card", f"../card{card}")
        if render is not None:
            names["render"] = f"renderD{render}"
            self._node(f"dri/renderD{render}", DRM_MAJOR, render, 0o660, self.layout.render_gid)
            self._symlink(
                self.dev_root, f"dev/dri/by-path/pci-{bus_id}-render", f"../renderD{render}"
            )
        for name in names.values():
            (self.sys_root / f"sys/bus/pci/devices/{bus_id}/drm/{name}").mkdir(
                parents=True, exist_ok=True
            )
        return names

    def _gpu_record(self, i: int, gpu: GpuSpec, minor: int, drm: dict[str, str]) -> dict[str, Any]:
        lay = self.layout
        bus_id = lay.bus_id_of(i)
        domain, bus, devfn = bus_id.split(":")
        mig = []
        for j, (dev, gi) in enumerate(lay.mig_of(i)):
            mig.append(
                {
                    "index": j,
                    "gi": gi,
                    "ci": dev.ci,
                    "profile": dev.profile,
                    "profile_id": dev.nvml_profile_id,
                    "gfx": dev.gfx,
                    "uuid": "MIG-" + _det_uuid(lay.seed, "mig", i, gi, dev.ci),
                    "name": f"{gpu.name} MIG {dev.profile}",
                    "gi_cap_minor": _gi_cap_minor(minor, gi),
                    "ci_cap_minor": _ci_cap_minor(minor, gi, dev.ci),
                }
            )
        return {
            "index": i,
            "minor": minor,
            "uuid": lay.gpu_uuid(i),
            "bus_id": bus_id,
            # NVML's spellings: 8-digit domain, upper-case hex.
            "nvml_bus_id": f"{int(domain, 16):08X}:{bus.upper()}:{devfn.upper()}",
            "nvml_bus_id_legacy": f"{int(domain, 16):04X}:{bus.upper()}:{devfn.upper()}",
            "pci_device_id": (gpu.pci_device_id << 16) | 0x10DE,
            "name": gpu.name,
            "brand": gpu.brand,
            "compute_capability": list(gpu.compute_capability),
            "mig_capable": gpu.mig_capable,
            "mig_enabled": gpu.mig_enabled,
            "max_mig_devices": gpu.max_mig_devices if gpu.mig_capable else 0,
            "drm": drm,
            "vbios": gpu.vbios,
            "mig_devices": mig,
        }

    def proc_step(self, gpus: list[dict[str, Any]]) -> None:
        lay = self.layout
        proc = self.proc_root / "proc"
        self._write(proc, "driver/nvidia/version", _version_text(lay.driver_version))
        self._write(proc, "driver/nvidia/params", _PARAMS)
        self._write(proc, "driver/nvidia/registry", 'Binary: ""\n')
        for g in gpus:
            self._write(proc, f"driver/nvidia/gpus/{g['bus_id']}/information", _information_text(g))
            self._write_sysfs_pci(g)
        if any(g["mig_capable"] for g in gpus):
            self._write(proc, "driver/nvidia-caps/mig-minors", _mig_minors_text())
            self._write(proc, "driver/nvidia/capabilities/mig/config", _cap_text(1, 0o400))
            self._write(proc, "driver/nvidia/capabilities/mig/monitor", _cap_text(2, 0o400))
        for g in gpus:
            for m in g["mig_devices"]:
                base = f"driver/nvidia/capabilities/gpu{g['minor']}/mig/gi{m['gi']}"
                self._write(proc, f"{base}/access", _cap_text(m["gi_cap_minor"], 0o444))
                self._write(proc, f"{base}/ci{m['ci']}/access", _cap_text(m["ci_cap_minor"], 0o444))
        self._write(proc, "devices", _proc_devices_text(lay))
        self._write(self.sys_root, "sys/module/firmware_class/parameters/path", "\n")

    def _write_sysfs_pci(self, g: dict[str, Any]) -> None:
        base = self.sys_root / f"sys/bus/pci/devices/{g['bus_id']}"
        self._write(base, "vendor", "0x10de\n")
        self._write(base, "device", f"0x{g['pci_device_id'] >> 16:04x}\n")
        self._write(base, "class", "0x030200\n")

    def manifest(self, gpus: list[dict[str, Any]]) -> dict[str, Any]:
        lay = self.layout

        def rel(p: Path) -> str:
            return os.path.relpath(p, self.root)

        return {
            "format": MANIFEST_FORMAT,
            "node_id": lay.node_id,
            "seed": lay.seed,
            "driver_version": lay.driver_version,
            "cuda_version": f"{lay.cuda_version[0]}.{lay.cuda_version[1]}",
            "cuda_driver_version": lay.cuda_driver_version,
            "distro": lay.distro,
            "driver_container": lay.driver_container,
            "roots": {
                "driver": rel(self.driver_root),
                "dev": rel(self.dev_root),
                "proc": rel(self.proc_root),
                "sys": rel(self.sys_root),
            },
            "lib_dir": "/" + self.dirs["lib"],
            "lib32_dir": "/" + self.dirs["lib32"] if lay.compat32 else None,
            "xorg_dir": "/" + self.dirs["xorg"],
            "majors": {
                "nvidia": NVIDIA_MAJOR,
                "nvidia-uvm": lay.uvm_major,
                "nvidia-caps": lay.caps_major,
                "drm": DRM_MAJOR,
            },
            "gids": {"video": lay.video_gid, "render": lay.render_gid},
            "gpus": gpus,
            "libraries": self.libraries,
            "device_nodes": self.device_nodes,
            **self.files,
        }


def _find_ldconfig() -> str:
    for cand in (shutil.which("ldconfig"), "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        if cand and os.access(cand, os.X_OK):
            # Ubuntu ships a wrapper script; the real binary sits next to it.
            real = cand + ".real"
            return real if os.access(real, os.X_OK) else cand
    raise SimNodeError("building a simulated node needs glibc's ldconfig")


def _make_socket(path: Path) -> None:
    """A bound unix socket file at ``path``; binds in a short temp dir, then renames.

    sun_path holds at most 107 bytes, which deep test folders exceed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmpdir = tempfile.mkdtemp(prefix="simsock")
    try:
        tmp = os.path.join(tmpdir, "s")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(tmp)
        os.chmod(tmp, 0o666)
        shutil.move(tmp, path)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _gi_cap_minor(gpu_minor: int, gi: int) -> int:
    return 3 + gpu_minor * _GI_PER_GPU * _MINORS_PER_GI + gi * _MINORS_PER_GI


def _ci_cap_minor(gpu_minor: int, gi: int, ci: int) -> int:
    return _gi_cap_minor(gpu_minor, gi) + 1 + ci


def _mig_minors_text() -> str:
    lines = ["config 1", "monitor 2"]
    for g in range(MIG_MINORS_GPUS):
        for gi in range(_GI_PER_GPU):
            lines.append(f"gpu{g}/gi{gi}/access {_gi_cap_minor(g, gi)}")
            lines.extend(
                f"gpu{g}/gi{gi}/ci{ci}/access {_ci_cap_minor(g, gi, ci)}"
                for ci in range(_CI_PER_GI)
            )
    return "\n".join(lines) + "\n"


def _cap_text(minor: int, mode: int) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


def _version_text(v: str) -> str:
    return (
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  "
        "(simnode@builder)  Mon Jan  6 12:00:00 UTC 2025\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )


_PARAMS = "".join(
    f"{k}: {v}\n"
    for k, v in (
        ("ResmanDebugLevel", "4294967295"),
        ("RmLogonRC", "1"),
        ("ModifyDeviceFiles", "1"),
        ("DeviceFileUID", "0"),
        ("DeviceFileGID", "0"),
        ("DeviceFileMode", "438"),
        ("InitializeSystemMemoryAllocations", "1"),
        ("UsePageAttributeTable", "4294967295"),
        ("EnableMSI", "1"),
        ("EnablePCIeGen3", "0"),
        ("MemoryPoolSize", "0"),
        ("KMallocHeapMaxSize", "0"),
        ("VMallocHeapMaxSize", "0"),
        ("IgnoreMMIOCheck", "0"),
        ("EnableStreamMemOPs", "0"),
        ("EnableUserNUMAManagement", "1"),
        ("NvLinkDisable", "0"),
        ("RmProfilingAdminOnly", "1"),
        ("PreserveVideoMemoryAllocations", "0"),
        ("EnableS0ixPowerManagement", "0"),
        ("DynamicPowerManagement", "3"),
        ("RegistryDwords", '""'),
        ("RmMsg", '""'),
        ("GpuBlacklist", '""'),
        ("TemporaryFilePath", '""'),
        ("ExcludedGpus", '""'),
        ("DmaRemapPeerMmio", "1"),
    )
)


def _information_text(g: Mapping[str, Any]) -> str:
    rows = (
        ("Model", g["name"]),
        ("IRQ", str(200 + g["index"])),
        ("GPU UUID", g["uuid"]),
        ("Video BIOS", g["vbios"]),
        ("Bus Type", "PCIe"),
        ("DMA Size", "52 bits"),
        ("DMA Mask", "0xfffffffffffff"),
        ("Bus Location", g["bus_id"]),
        ("Device Minor", str(g["minor"])),
        ("GPU Excluded", "No"),
    )
    return "".join(f"{k}: \t {v}\n" for k, v in rows)


def _proc_devices_text(lay: NodeLayout) -> str:
    chars = [
        (1, "mem"),
        (4, "/dev/vc/0"),
        (4, "tty"),
        (5, "/dev/tty"),
        (5, "/dev/console"),
        (5, "/dev/ptmx"),
        (10, "misc"),
        (13, "input"),
        (136, "pts"),
        (NVIDIA_MAJOR, "nvidia-frontend"),
        (DRM_MAJOR, "drm"),
        (lay.uvm_major, "nvidia-uvm"),
        (lay.caps_major, "nvidia-caps"),
    ]
    blocks = [(7, "loop"), (8, "sd"), (259, "blkext")]
    out = ["Character devices:"]
    out += [f"{m:3d} {n}" for m, n in sorted(chars, key=lambda x: x[0])]
    out += ["", "Block devices:"] + [f"{m:3d} {n}" for m, n in blocks]
    return "\n".join(out) + "\n"


def _nvidia_smi_script(lay: NodeLayout) -> str:
    """A POSIX shell ``nvidia-smi`` (it runs in a busybox container too): ``-L`` lists the
    GPUs whose ``/dev/nvidia<minor>`` the caller sees, numbered as NVML would in there
    (``$SIMNODE_DEV`` names another dev folder, e.g. the node's, on the host)."""
    lines = ["n=0"]
    for i, gpu in enumerate(lay.gpus):
        listing = [f"GPU $n: {gpu.name} (UUID: {lay.gpu_uuid(i)})"]
        for j, (dev, gi) in enumerate(lay.mig_of(i)):
            mig_uuid = "MIG-" + _det_uuid(lay.seed, "mig", i, gi, dev.ci)
            listing.append(f"  MIG {dev.profile:<11} Device {j:>2}: (UUID: {mig_uuid})")
        echo = "; ".join(f'echo "{line}"' for line in listing)
        lines.append(f"if [ -c $dev/nvidia{lay.minor_of(i)} ]; then {echo}; n=$((n+1)); fi")
    major, minor = lay.cuda_version
    return (
        "#!/bin/sh\n# simulated nvidia-smi ($SIMNODE_DEV: the node's /dev, to run it on the host)\n"
        "dev=${SIMNODE_DEV:-/dev}\n"
        '[ -c $dev/nvidiactl ] || { echo "NVIDIA-SMI has failed because it couldn\'t '
        'communicate with the NVIDIA driver." >&2; exit 9; }\n'
        'if [ "$1" = "-L" ]; then\n' + "\n".join(lines) + "\nexit 0\nfi\n"
        f"echo 'NVIDIA-SMI {lay.driver_version}  Driver Version: {lay.driver_version}  "
        f"CUDA Version: {major}.{minor}'\n"
    )


# nvmlDeviceArchitecture_t by compute capability major (8.9 is Ada, the rest of 8.x Ampere).
_ARCH_BY_CC = {3: 2, 5: 3, 6: 4, 7: 5, 8: 7, 9: 9, 10: 10, 12: 10}
# Compute-instance profile ids (nvmlComputeInstanceProfile) by slice count.
_CI_PROFILE_IDS = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}


def _arch(cc: Sequence[int]) -> int:
    if tuple(cc[:2]) == (7, 5):
        return 6  # Turing
    if tuple(cc[:2]) == (8, 9):
        return 8  # Ada
    return _ARCH_BY_CC.get(int(cc[0]), 0xFFFFFFFF)  # NVML_DEVICE_ARCH_UNKNOWN


def _memory_mb(name: str) -> int:
    match = re.search(r"(\d+)GB", name)
    return int(match.group(1)) * 1024 if match else 81920


_NVML_MAX_MIG = 16  # MAXMIG in the C source


def nvml_description(manifest: Mapping[str, Any]) -> str:
    """The node as the simulated ``libnvidia-ml`` reads it (``simnode-nvml.txt``): one
    ``gpu`` line per GPU in NVML index order, each followed by its ``mig`` lines in MIG
    index order; names run to the end of the line."""
    version = manifest["driver_version"]
    major = int(manifest["cuda_driver_version"]) // 1000
    lines = ["simnode-nvml 1", f"driver {version}", f"nvml {major}.{version}",
             f"cuda {manifest['cuda_driver_version']}"]
    for g in manifest["gpus"]:
        if len(g["mig_devices"]) > _NVML_MAX_MIG or len(g["name"]) >= 96:
            raise SimNodeError(f"GPU {g['index']}: the simulated NVML holds at most "
                               f"{_NVML_MAX_MIG} MIG devices and 95-character names")
        lines.append(
            f"gpu {g['minor']} {int(g['mig_capable'])} {int(g['mig_enabled'])} "
            f"{g['max_mig_devices']} {g['pci_device_id']:x} {g['brand']} "
            f"{g['compute_capability'][0]} {g['compute_capability'][1]} "
            f"{_arch(g['compute_capability'])} {_memory_mb(g['name'])} {g['uuid']} "
            f"{g['nvml_bus_id']} {g['nvml_bus_id_legacy']} {g['name']}")
        for m in g["mig_devices"]:
            slices = int(m["profile"].split("g.", 1)[0])
            mem = int(m["profile"].split(".", 1)[1].split("gb", 1)[0]) * 1024
            lines.append(
                f"mig {m['gi']} {m['ci']} {m['profile_id']} {_CI_PROFILE_IDS.get(slices, 0)} "
                f"{slices} {mem} {m['uuid']} {m['name']}")
    return "\n".join(lines) + "\n"


def build_node(
    root: str | os.PathLike[str],
    layout: NodeLayout | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> BuiltNode:
    """Build a simulated node in ``root`` (created; must be empty if it exists)."""
    layout = layout or NodeLayout()
    root_path = Path(root).absolute()
    if root_path.exists() and any(root_path.iterdir()):
        raise SimNodeError(f"{root_path} is not empty")
    root_path.mkdir(parents=True, exist_ok=True)
    b = _Builder(root_path, layout, Path(cache_dir) if cache_dir else _default_cache_dir())
    b.libraries_step()
    b.ldcache_step()
    b.binaries_step()
    b.firmware_step()
    b.configs_step()
    b.ipc_step()
    gpus = b.devices_step()
    b.proc_step(gpus)
    manifest_path = root_path / MANIFEST_NAME
    manifest = b.manifest(gpus)
    (root_path / NVML_DESCRIPTION).write_text(nvml_description(manifest))
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return BuiltNode.load(manifest_path)


# --- running other tools on the node ---------------------------------------------------------

# Shows the node's proc/driver and sys/bus/pci/devices at the host paths, then runs "$@".
_NAMESPACE_SCRIPT = """set -e
node_proc=$1 node_sys=$2; shift 2
mount -t tmpfs -o mode=0755 simnode /proc/driver
for d in nvidia nvidia-caps; do
  if [ -d "$node_proc/driver/$d" ]; then
    mkdir /proc/driver/$d && mount --bind "$node_proc/driver/$d" /proc/driver/$d
  fi
done
mount --bind "$node_sys/bus/pci/devices" /sys/bus/pci/devices
exec "$@"
"""


def in_node_namespace(node: BuiltNode, argv: Sequence[str]) -> list[str]:
    """``argv`` run in a private mount namespace where the host's ``/proc/driver`` and
    ``/sys/bus/pci/devices`` are the node's copies: for tools such as ``nvidia-ctk`` that
    read those from the host rather than from their ``--dev-root``.  Needs root and
    ``unshare``; the host's own mounts are untouched (the namespace ends with the process)."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", _NAMESPACE_SCRIPT, "sh",
            os.fspath(node.proc_root / "proc"), os.fspath(node.sys_root / "sys"), *argv]


# --- CLI -------------------------------------------------------------------------------------


def _arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cdi.nvidia.simnode",
        description="Build a simulated NVIDIA GPU node (driver files, /dev, /proc, /sys).",
    )
    p.add_argument("root", type=Path, help="folder to build in (created, must be empty)")
    p.add_argument("--gpus", type=int, default=1, help="number of GPUs (default 1)")
    p.add_argument(
        "--mig",
        action="append",
        default=[],
        metavar="INDEX:PROFILES",
        help="enable MIG on a GPU, e.g. 0:1g.10gb*7 or 1:3g.40gb,2g.20gb "
        "(repeatable; '+gfx' marks a graphics profile)",
    )
    p.add_argument("--minors", help="comma-separated device minors by GPU index")
    p.add_argument("--layout", choices=sorted(_DIRS), default="debian")
    p.add_argument("--extra", action="append", default=[], choices=sorted(EXTRAS),
                   help="optional parts (repeatable)")
    p.add_argument(
        "--driver-container",
        action="store_true",
        help="driver under ROOT/run/nvidia/driver, device nodes under ROOT/dev",
    )
    p.add_argument("--driver-version", default=DEFAULT_DRIVER_VERSION)
    p.add_argument("--cuda", default="13.0", help="CUDA version the driver supports")
    p.add_argument("--seed", default="simnode", help="seed for UUIDs")
    p.add_argument("--compat32", action="store_true", help="also build i386 libraries")
    p.add_argument("--bmc-vga", action="store_true", help="an on-board VGA owns card0")
    p.add_argument("--no-device-nodes", action="store_true", help="skip mknod (no root)")
    p.add_argument("--cache-dir", type=Path, help="compiled-object cache")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _arg_parser().parse_args(argv)
    try:
        mig = dict(parse_mig_arg(m) for m in args.mig)
        minors = [int(x) for x in args.minors.split(",")] if args.minors else None
        if minors is not None and len(minors) != args.gpus:
            raise SimNodeError("--minors needs one minor per GPU")
        cuda_major, _, cuda_minor = args.cuda.partition(".")
        layout = NodeLayout.uniform(
            args.gpus,
            mig=mig,
            minors=minors,
            driver_version=args.driver_version,
            cuda_version=(int(cuda_major), int(cuda_minor or 0)),
            distro=args.layout,
            driver_container=args.driver_container,
            seed=args.seed,
            compat32=args.compat32,
            bmc_vga=args.bmc_vga,
            device_nodes=not args.no_device_nodes,
            extras=tuple(args.extra),
        )
        node = build_node(args.root, layout, cache_dir=args.cache_dir)
    except (SimNodeError, ValueError) as e:
        print(f"simnode: error: {e}", file=sys.stderr)
        return 2
    _print_summary(node)
    return 0


def _print_summary(node: BuiltNode) -> None:
    m = node.manifest
    print(f"driver root: {node.driver_root}")
    print(f"dev root:    {node.dev_root}")
    print(f"manifest:    {node.manifest_path}")
    print(
        f"driver {m['driver_version']}, CUDA {m['cuda_version']}, "
        f"{len(m['libraries'])} libraries, {len(m['device_nodes'])} device nodes"
    )
    for g in m["gpus"]:
        mig = f", MIG: {len(g['mig_devices'])} devices" if g["mig_enabled"] else ""
        print(f"  GPU {g['index']} minor {g['minor']} {g['bus_id']} {g['uuid']}{mig}")


if __name__ == "__main__":
    sys.exit(main())
