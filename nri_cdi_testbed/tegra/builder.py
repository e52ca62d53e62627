"""Building a simulated Jetson in a folder: CSV files, libraries, links, folders, /dev."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

from nri_cdi_testbed.simnode.compiler import Compiler, Job, default_cache_dir
from nri_cdi_testbed.simnode.csource import c_source
from nri_cdi_testbed.simnode.driverfiles import Lib
from nri_cdi_testbed.simnode.hosttools import find_ldconfig
from nri_cdi_testbed.simnode.layout import NodeLayout, SimNodeError
from nri_cdi_testbed.simnode.nvml import NVML_DESCRIPTION, nvml_description
from nri_cdi_testbed.tegra.node import CSV_FOLDER, LIB, MANIFEST_NAME, NV, BuiltTegraNode

VIDEO_GID = 44
RENDER_GID = 105

# The board's device nodes: (path under /dev, major, minor, mode, group). The majors of
# nvgpu, nvhost and host1x are dynamic on a real board; these are a plausible set.
DEVICE_NODES: tuple[tuple[str, int, int, int, int], ...] = (
    *((f"nvhost-{name}-gpu", 499, i, 0o660, VIDEO_GID) for i, name in enumerate(
        ("ctrl", "as", "dbg", "prof", "tsg", "power", "sched", "ctxsw"))),
    ("nvhost-gpu", 499, 8, 0o660, VIDEO_GID),
    *((f"nvgpu/igpu0/{name}", 498, i, 0o660, VIDEO_GID) for i, name in enumerate(
        ("ctrl", "as", "channel", "tsg", "power", "prof", "dbg", "sched", "ctxsw"))),
    ("nvmap", 10, 125, 0o666, 0),
    ("host1x-fence", 497, 0, 0o666, 0),
    ("dri/card0", 226, 0, 0o660, VIDEO_GID),
    ("dri/renderD128", 226, 128, 0o660, RENDER_GID),
    # JetPack 6's display driver (nvidia.ko) registers these
    ("nvidia0", 195, 0, 0o666, 0),
    ("nvidiactl", 195, 255, 0o666, 0),
    ("nvidia-modeset", 195, 254, 0o666, 0),
)
# Listed by the board's devices.csv, but not on this module (an Orin Nano has no DLA).
ABSENT_NODES = ("nvhost-ctrl-nvdla0", "nvhost-nvdla0")

# Libraries in the nvidia/ folder: (file, SONAME or "" for none, links beside it:
# (name, target)). "{v}" is the driver version.
LIBRARIES: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("libcuda.so.1.1", "libcuda.so.1", (("libcuda.so.1", "libcuda.so.1.1"),
                                        ("libcuda.so", "libcuda.so.1"))),
    ("libnvidia-ptxjitcompiler.so.{v}", "libnvidia-ptxjitcompiler.so.1",
     (("libnvidia-ptxjitcompiler.so.1", "libnvidia-ptxjitcompiler.so.{v}"),)),
    ("libnvidia-gpucomp.so.{v}", "libnvidia-gpucomp.so.{v}", ()),
    ("libnvidia-rmapi-tegra.so.{v}", "libnvidia-rmapi-tegra.so.{v}", ()),
    ("libnvidia-eglcore.so.{v}", "libnvidia-eglcore.so.{v}", ()),
    ("libnvidia-glcore.so.{v}", "libnvidia-glcore.so.{v}", ()),
    ("libEGL_nvidia.so.0", "libEGL_nvidia.so.0", ()),
    ("libGLX_nvidia.so.0", "libGLX_nvidia.so.0", ()),
    ("libnvrm_gpu.so", "libnvrm_gpu.so", ()),
    ("libnvrm_mem.so", "libnvrm_mem.so", ()),
    ("libnvrm_host1x.so", "libnvrm_host1x.so", ()),
    ("libnvrm_sync.so", "libnvrm_sync.so", ()),
    ("libnvos.so", "libnvos.so", ()),
    ("libnvsocsys.so", "libnvsocsys.so", ()),
    ("libnvtegrahv.so", "libnvtegrahv.so", ()),
)
NVML_LIBRARY = ("libnvidia-ml.so.{v}", "libnvidia-ml.so.1",
                (("libnvidia-ml.so.1", "libnvidia-ml.so.{v}"),))

# The CSV files, as the board support package ships them (an abridged set): the libraries
# and links above, a folder, a firmware file reached through the /lib -> usr/lib link, a
# glob, and entries this module lacks.
DRIVERS_CSV = f"""\
lib, /{NV}/libcuda.so.1.1
sym, /{NV}/libcuda.so.1
sym, /{NV}/libcuda.so
sym, /{LIB}/libcuda.so
lib, /{NV}/libnvidia-ptxjitcompiler.so.{{v}}
sym, /{NV}/libnvidia-ptxjitcompiler.so.1
sym, /{LIB}/libnvidia-ptxjitcompiler.so.1
lib, /{NV}/libnvidia-gpucomp.so.{{v}}
lib, /{NV}/libnvidia-rmapi-tegra.so.{{v}}
lib, /{NV}/libnvidia-eglcore.so.{{v}}
lib, /{NV}/libnvidia-glcore.so.{{v}}
lib, /{NV}/libEGL_nvidia.so.0
lib, /{NV}/libGLX_nvidia.so.0
lib, /{NV}/libnvdla_runtime.so
lib, /usr/share/glvnd/egl_vendor.d/10_nvidia.json
sym, /etc/vulkan/icd.d/nvidia_icd.json
"""
NVML_CSV = f"""\
lib, /{NV}/libnvidia-ml.so.{{v}}
sym, /{NV}/libnvidia-ml.so.1
"""
L4T_CSV = f"""\
lib, /{NV}/libnvrm_*.so
lib, /{NV}/libnvos.so
lib, /{NV}/libnvsocsys.so
lib, /{NV}/libnvtegrahv.so
lib, /lib/firmware/ga10b/gpmu_ucode_image.bin
dir, /opt/nvidia/vpi3
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class TegraLayout:
    """What to build. ``nvml``: the GPU names the board's NVML reports (JetPack 6 on Orin
    has one, ``Orin (nvgpu)``); empty for a board without NVML."""

    release: str = "36.4.3"  # L4T
    driver_version: str = "540.4.0"
    cuda_version: tuple[int, int] = (12, 6)
    nvml: tuple[str, ...] = ()
    seed: str = "tegra"
    device_nodes: bool = True  # mknod; needs root or CAP_MKNOD

    @property
    def node_id(self) -> str:
        return "tegra-" + hashlib.sha256(self.seed.encode()).hexdigest()[:12]

    @property
    def cuda_driver_version(self) -> int:
        return self.cuda_version[0] * 1000 + self.cuda_version[1] * 10


@cache
def _tegra_c() -> str:
    return files("nri_cdi_testbed.tegra").joinpath("c", "tegra.c").read_text()


class _Builder:
    def __init__(self, root: Path, layout: TegraLayout, cache_dir: Path) -> None:
        self.root = root
        self.layout = layout
        self.compiler = Compiler(cache_dir)
        self.nodes: list[dict[str, Any]] = []
        self.libraries: list[dict[str, Any]] = []
        self.links: list[dict[str, str]] = []

    def _v(self, text: str) -> str:
        return text.replace("{v}", self.layout.driver_version)

    def _write(self, rel: str, text: str, mode: int = 0o644) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.chmod(path, mode)

    def _symlink(self, rel: str, target: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)
        self.links.append({"path": "/" + rel, "target": target})

    def libraries_step(self) -> None:
        wanted = [*LIBRARIES, *((NVML_LIBRARY,) if self.layout.nvml else ())]
        jobs = []
        for file, soname, _ in wanted:
            name, soname = self._v(file), self._v(soname)
            dest = self.root / NV / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            jobs.append(Job(self._source(name), soname, 64, dest))
            self.libraries.append({"path": f"/{NV}/{name}", "soname": soname})
        self.compiler.build_all(jobs)
        for _, _, links in wanted:
            for link, target in links:
                self._symlink(f"{NV}/{self._v(link)}", self._v(target))
        # The folder above: one relative link, one absolute (the board's own paths).
        self._symlink(f"{LIB}/libcuda.so", "nvidia/libcuda.so")
        self._symlink(f"{LIB}/libnvidia-ptxjitcompiler.so.1",
                      f"/{NV}/libnvidia-ptxjitcompiler.so.1")
        self._symlink("lib", "usr/lib")  # usrmerge: /lib/firmware is /usr/lib/firmware

    def _source(self, name: str) -> str:
        if name.startswith("libnvidia-ml.so"):
            layout = NodeLayout(driver_version=self.layout.driver_version, seed=self.layout.seed)
            return c_source(Lib(name, "libnvidia-ml.so.1", kind="nvml"), name, layout, bits=64)
        defines = {"TEGRA_EXPORT": '__attribute__((visibility("default")))',
                   "TEGRA_LIBRARY": json.dumps(name)}
        if name.startswith("libcuda.so"):
            defines |= {"TEGRA_CUDA": "1",
                        "TEGRA_CUDA_VERSION": str(self.layout.cuda_driver_version),
                        "TEGRA_NODE_ID": json.dumps(self.layout.node_id)}
        return ("/* Built by nri_cdi_testbed/tegra/builder.py from c/tegra.c */\n"
                + "".join(f"#define {k} {v}\n" for k, v in defines.items()) + _tegra_c())

    def files_step(self) -> None:
        lay = self.layout
        self._write("etc/nv_tegra_release",
                    f"# R{lay.release.split('.')[0]} (release), REVISION: "
                    f"{'.'.join(lay.release.split('.')[1:])}, GCID: 00000000, BOARD: generic, "
                    "EABI: aarch64, DATE: simulated\n")
        self._write(f"{NV}/nvidia_icd.json", json.dumps(
            {"file_format_version": "1.0.0", "ICD": {"library_path": "libGLX_nvidia.so.0",
                                                     "api_version": "1.3.0"}}) + "\n")
        self._symlink("etc/vulkan/icd.d/nvidia_icd.json",
                      "../../../usr/lib/aarch64-linux-gnu/nvidia/nvidia_icd.json")
        self._write("usr/share/glvnd/egl_vendor.d/10_nvidia.json", json.dumps(
            {"file_format_version": "1.0.0",
             "ICD": {"library_path": "libEGL_nvidia.so.0"}}) + "\n")
        self._write("usr/lib/firmware/ga10b/gpmu_ucode_image.bin", "simulated firmware\n")
        self._write("opt/nvidia/vpi3/etc/vpi.conf", "simulated VPI\n")
        self._write(f"{CSV_FOLDER}/devices.csv", "".join(
            f"dev, /dev/{path}\n" for path in (*(n[0] for n in DEVICE_NODES), *ABSENT_NODES)))
        self._write(f"{CSV_FOLDER}/drivers.csv",
                    self._v(DRIVERS_CSV + (NVML_CSV if lay.nvml else "")))
        self._write(f"{CSV_FOLDER}/l4t.csv", self._v(L4T_CSV))
        # The loader finds the driver through ld.so.conf.d, as on the board.
        self._write("etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
        self._write("etc/ld.so.conf.d/nvidia-tegra.conf", f"/{NV}\n")
        proc = subprocess.run([find_ldconfig(), "-X", "-r", str(self.root)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SimNodeError(f"ldconfig -r failed: {proc.stderr.strip()}")

    def devices_step(self) -> None:
        for rel, major, minor, mode, gid in DEVICE_NODES:
            path = self.root / "dev" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if self.layout.device_nodes:
                try:
                    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
                except PermissionError as exc:
                    raise SimNodeError(f"mknod {path}: {exc.strerror}; building device nodes "
                                       "needs root (or TegraLayout(device_nodes=False))"
                                       ) from None
                os.chmod(path, mode)  # mknod's mode is filtered by the umask
                os.chown(path, 0, gid)
            self.nodes.append({"path": f"/dev/{rel}", "major": major, "minor": minor,
                               "mode": mode, "gid": gid})

    def nvml_step(self) -> None:
        """The board's NVML answers from simnode-nvml.txt, as the simulated node's does."""
        lay = self.layout
        gpus = [{"index": i, "minor": i, "mig_capable": False, "mig_enabled": False,
                 "max_mig_devices": 0, "pci_device_id": 0x10DE, "brand": 14,
                 "compute_capability": [8, 7], "name": name,
                 "uuid": _uuid(lay.seed, i), "nvml_bus_id": f"00000000:0{i}:00.0",
                 "nvml_bus_id_legacy": f"0000:0{i}:00.0", "mig_devices": []}
                for i, name in enumerate(lay.nvml)]
        (self.root / NVML_DESCRIPTION).write_text(nvml_description(
            {"driver_version": lay.driver_version,
             "cuda_driver_version": lay.cuda_driver_version, "gpus": gpus}))

    def manifest(self) -> dict[str, Any]:
        lay = self.layout
        return {"format": 1, "node_id": lay.node_id, "release": lay.release,
                "driver_version": lay.driver_version,
                "cuda_version": f"{lay.cuda_version[0]}.{lay.cuda_version[1]}",
                "nvml": list(lay.nvml), "csv_files": ["devices.csv", "drivers.csv", "l4t.csv"],
                "device_nodes": self.nodes,
                "absent_nodes": [f"/dev/{n}" for n in ABSENT_NODES],
                "libraries": self.libraries, "links": self.links}


def _uuid(seed: str, index: int) -> str:
    """An Orin's NVML UUID is a bare 8-4-4-4-12 hex string (no ``GPU-``)."""
    h = hashlib.sha256(f"{seed}/{index}".encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def build_tegra_node(root: str | os.PathLike[str], layout: TegraLayout | None = None, *,
                     cache_dir: str | os.PathLike[str] | None = None) -> BuiltTegraNode:
    """Build a simulated Jetson in ``root`` (created; must be empty if it exists)."""
    layout = layout or TegraLayout()
    path = Path(root).absolute()
    if path.exists() and any(path.iterdir()):
        raise SimNodeError(f"{path} is not empty")
    path.mkdir(parents=True, exist_ok=True)
    builder = _Builder(path, layout, Path(cache_dir) if cache_dir else default_cache_dir())
    builder.libraries_step()
    builder.files_step()
    builder.devices_step()
    if layout.nvml:
        builder.nvml_step()
    (path / MANIFEST_NAME).write_text(json.dumps(builder.manifest(), indent=2) + "\n")
    return BuiltTegraNode.load(path)
