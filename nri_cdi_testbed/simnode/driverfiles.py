"""The driver's file set: libraries, binaries, firmware and config files, per distro layout."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Lib:
    file: str  # relative to the lib dir; "{v}" = driver version
    soname: str
    links: tuple[str, ...] = ()  # extra dev links -> soname
    kind: str = "generic"  # which C source: generic, cuda, nvml
    compat32: bool = False  # also shipped as i386
    # glibc libraries it is linked against besides libc (NEEDED, 64-bit build), as the real
    # driver's: a container must have them for dlopen() to succeed.
    needs: tuple[str, ...] = ()


# Roughly the library set of a 5xx data-centre driver.
LIBS: tuple[Lib, ...] = (
    # The real libcuda.so.550.163.01 (readelf -d): libm, libc, libdl, libpthread, librt.
    Lib("libcuda.so.{v}", "libcuda.so.1", ("libcuda.so",), "cuda", True,
        ("libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")),
    Lib("libcudadebugger.so.{v}", "libcudadebugger.so.1"),
    Lib("libnvidia-ml.so.{v}", "libnvidia-ml.so.1", (), "nvml", True),
    Lib("libnvidia-ptxjitcompiler.so.{v}", "libnvidia-ptxjitcompiler.so.1", (), "generic", True),
    Lib("libnvidia-nvvm.so.{v}", "libnvidia-nvvm.so.4", (), "generic", True),
    Lib("libnvidia-nvvm70.so.4", "libnvidia-nvvm70.so.4"),
    Lib("libnvidia-gpucomp.so.{v}", "libnvidia-gpucomp.so.{v}", (), "generic", True),
    Lib("libnvidia-opencl.so.{v}", "libnvidia-opencl.so.1"),
    Lib("libnvidia-allocator.so.{v}", "libnvidia-allocator.so.1"),
    Lib("libnvidia-cfg.so.{v}", "libnvidia-cfg.so.1"),
    Lib("libnvidia-sandboxutils.so.{v}", "libnvidia-sandboxutils.so.1"),
    Lib("libnvidia-pkcs11.so.{v}", "libnvidia-pkcs11.so.{v}"),
    Lib("libnvidia-pkcs11-openssl3.so.{v}", "libnvidia-pkcs11-openssl3.so.{v}"),
    Lib("libnvidia-eglcore.so.{v}", "libnvidia-eglcore.so.{v}", (), "generic", True),
    Lib("libnvidia-glcore.so.{v}", "libnvidia-glcore.so.{v}", (), "generic", True),
    Lib("libnvidia-glsi.so.{v}", "libnvidia-glsi.so.{v}", (), "generic", True),
    Lib("libnvidia-tls.so.{v}", "libnvidia-tls.so.{v}", (), "generic", True),
    Lib("libnvidia-glvkspirv.so.{v}", "libnvidia-glvkspirv.so.{v}"),
    Lib("libnvidia-rtcore.so.{v}", "libnvidia-rtcore.so.{v}"),
    Lib("libGLX_nvidia.so.{v}", "libGLX_nvidia.so.0", (), "generic", True),
    Lib("libEGL_nvidia.so.{v}", "libEGL_nvidia.so.0", (), "generic", True),
    Lib("libGLESv2_nvidia.so.{v}", "libGLESv2_nvidia.so.2", (), "generic", True),
    Lib("libGLESv1_CM_nvidia.so.{v}", "libGLESv1_CM_nvidia.so.1", (), "generic", True),
    Lib("libnvidia-encode.so.{v}", "libnvidia-encode.so.1", ("libnvidia-encode.so",)),
    Lib("libnvcuvid.so.{v}", "libnvcuvid.so.1", ("libnvcuvid.so",)),
    Lib(
        "libnvidia-opticalflow.so.{v}", "libnvidia-opticalflow.so.1", ("libnvidia-opticalflow.so",)
    ),
    Lib("vdpau/libvdpau_nvidia.so.{v}", "libvdpau_nvidia.so.1"),
    Lib("libnvidia-fbc.so.{v}", "libnvidia-fbc.so.1"),
    Lib("libnvidia-ngx.so.{v}", "libnvidia-ngx.so.1"),
    Lib("libnvoptix.so.{v}", "libnvoptix.so.1"),
    Lib("libnvidia-api.so.1", "libnvidia-api.so.1"),
    Lib("libnvidia-wayland-client.so.{v}", "libnvidia-wayland-client.so.{v}"),
    Lib("libnvidia-vksc-core.so.{v}", "libnvidia-vksc-core.so.1"),
    Lib("libnvidia-egl-wayland.so.1.1.19", "libnvidia-egl-wayland.so.1"),
    Lib("libnvidia-egl-gbm.so.1.1.2", "libnvidia-egl-gbm.so.1"),
    Lib("libnvidia-egl-xcb.so.1.0.1", "libnvidia-egl-xcb.so.1"),
    Lib("libnvidia-egl-xlib.so.1.0.1", "libnvidia-egl-xlib.so.1"),
)
# X.Org modules, relative to the xorg modules dir.
XORG_LIBS: tuple[Lib, ...] = (
    Lib("drivers/nvidia_drv.so", ""),
    Lib(
        "extensions/libglxserver_nvidia.so.{v}",
        "libglxserver_nvidia.so.{v}",
        ("libglxserver_nvidia.so",),
    ),
)
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")

DIRS: dict[str, dict[str, str]] = {
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


# The machines a node can be built for: the architecture's Debian triplet, and the C
# compiler that builds its libraries (a cross compiler on another machine).
TRIPLETS = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}


def dirs_for(distro: str, machine: str) -> dict[str, str]:
    """``DIRS[distro]`` for ``machine``: Debian's folders carry the architecture's triplet
    (the other layouts use the same folders on every architecture)."""
    triplet = TRIPLETS[machine]
    return {k: v.replace(TRIPLETS["x86_64"], triplet) for k, v in DIRS[distro].items()}


def _json(obj: object) -> str:
    return json.dumps(obj, indent=2) + "\n"


def configs(v: str) -> dict[str, str]:
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


