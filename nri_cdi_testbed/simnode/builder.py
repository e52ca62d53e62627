"""Building a simulated node in a folder, step by step (libraries, cache, /dev, /proc, /sys)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nri_cdi_testbed.simnode.compiler import Compiler, Job, default_cache_dir
from nri_cdi_testbed.simnode.csource import c_source
from nri_cdi_testbed.simnode.driverfiles import (
    BINARIES,
    FIRMWARE,
    LIBS,
    XORG_LIBS,
    Lib,
    configs,
    dirs_for,
)
from nri_cdi_testbed.simnode.hosttools import find_ldconfig, make_socket
from nri_cdi_testbed.simnode.layout import (
    CTL_MINOR,
    DRM_MAJOR,
    MANIFEST_FORMAT,
    MODESET_MINOR,
    NVIDIA_MAJOR,
    GpuSpec,
    NodeLayout,
    SimNodeError,
    det_uuid,
    host_machine,
)
from nri_cdi_testbed.simnode.node import MANIFEST_NAME, BuiltNode
from nri_cdi_testbed.simnode.nvml import NVML_DESCRIPTION, nvml_description
from nri_cdi_testbed.simnode.procfs import (
    PARAMS,
    cap_text,
    ci_cap_minor,
    gi_cap_minor,
    information_text,
    mig_minors_text,
    nvidia_smi_script,
    proc_devices_text,
    version_text,
)


class _Builder:
    def __init__(self, root: Path, layout: NodeLayout, cache_dir: Path,
                 ldconfig: Sequence[str] = ()):
        self.layout = layout
        self.ldconfig = list(ldconfig)
        if not ldconfig and host_machine() not in (None, layout.machine):
            raise SimNodeError(
                f"an {layout.machine} node's ld.so.cache needs that machine's ldconfig "
                f"(this one's skips {layout.machine} libraries): build_node(ldconfig="
                "[EMULATOR, LDCONFIG]), or --ldconfig on the command line")
        self.root = root
        self.driver_root = root / "run/nvidia/driver" if layout.driver_container else root
        self.dev_root = root
        self.proc_root = root
        self.sys_root = root
        self.dirs = dirs_for(layout.distro, layout.machine)
        self.compiler = Compiler(cache_dir, layout.machine)
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
        jobs: list[Job] = []
        links: list[tuple[str, str]] = []  # (link rel path, target)
        libs = LIBS
        if "vulkan-producer" in self.layout.extras:
            libs += (Lib("libnvidia-vulkan-producer.so.{v}", "libnvidia-vulkan-producer.so.{v}"),)
        sets = [(self.dirs["lib"], libs, 64), (self.dirs["xorg"], XORG_LIBS, 64)]
        if self.layout.compat32:
            sets.append((self.dirs["lib32"], tuple(x for x in LIBS if x.compat32), 32))
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

    def _lib_job(self, libdir: str, lib: Lib, bits: int, links: list[tuple[str, str]]) -> Job:
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
        source = c_source(lib, name, self.layout, bits=bits)
        return Job(source, soname, bits, self.driver_root / rel,
                   lib.needs if bits == 64 else ())

    def ldcache_step(self) -> None:
        conf = [self.dirs["lib"], self.dirs["lib"] + "/vdpau"]
        if self.layout.compat32:
            conf.append(self.dirs["lib32"])
        if self.dirs.get("uncached"):
            conf = []
        self._write(self.driver_root, "etc/ld.so.conf", "".join(f"/{d}\n" for d in conf))
        ldconfig = self.ldconfig or [find_ldconfig()]
        # -X: keep our links exactly as made (as the driver's packages would ship them).
        proc = subprocess.run(
            [*ldconfig, "-X", "-r", str(self.driver_root)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise SimNodeError(f"ldconfig -r failed: {proc.stderr.strip()}")

    def binaries_step(self) -> None:
        extra = ("nvidia-imex", "nvidia-imex-ctl") if "imex" in self.layout.extras else ()
        for name in (*BINARIES, *extra):
            body = (
                nvidia_smi_script(self.layout)
                if name == "nvidia-smi"
                else (f"#!/bin/sh\necho 'simulated {name} {self.layout.driver_version}'\n")
            )
            bin_dir = self.dirs.get("bin", "usr/bin")
            self._write(self.driver_root, f"{bin_dir}/{name}", body, 0o755)
            self.files["binaries"].append(f"/{bin_dir}/{name}")

    def firmware_step(self) -> None:
        for name in FIRMWARE:
            rel = f"lib/firmware/nvidia/{self.layout.driver_version}/{name}"
            self._write(self.driver_root, rel, b"\x7fGSP simulated firmware\n" + name.encode())
            self.files["firmware"].append("/" + rel)

    def configs_step(self) -> None:
        extras = self.layout.extras
        for rel, text in configs(self.layout.driver_version).items():
            if "vulkan-icd-at-root" in extras and rel.startswith("etc/vulkan/icd.d/"):
                rel = rel.removeprefix("etc/")
            if "configs-in-local-share" in extras and rel.startswith("usr/share/"):
                rel = "usr/local/" + rel.removeprefix("usr/")
            self._write(self.driver_root, rel, text)
            self.files["configs"].append("/" + rel)

    def ipc_step(self) -> None:
        if self.layout.persistenced_socket:
            rel = "run/nvidia-persistenced/socket"
            make_socket(self.driver_root / rel)
            self.files["ipc"].append("/" + rel)
        if "fabricmanager" in self.layout.extras:
            rel = "run/nvidia-fabricmanager/socket"
            make_socket(self.driver_root / rel)
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
                    "uuid": "MIG-" + det_uuid(lay.seed, "mig", i, gi, dev.ci),
                    "name": f"{gpu.name} MIG {dev.profile}",
                    "gi_cap_minor": gi_cap_minor(minor, gi),
                    "ci_cap_minor": ci_cap_minor(minor, gi, dev.ci),
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
        self._write(proc, "driver/nvidia/version", version_text(lay.driver_version))
        self._write(proc, "driver/nvidia/params", PARAMS)
        self._write(proc, "driver/nvidia/registry", 'Binary: ""\n')
        for g in gpus:
            self._write(proc, f"driver/nvidia/gpus/{g['bus_id']}/information", information_text(g))
            self._write_sysfs_pci(g)
        if any(g["mig_capable"] for g in gpus):
            self._write(proc, "driver/nvidia-caps/mig-minors", mig_minors_text())
            self._write(proc, "driver/nvidia/capabilities/mig/config", cap_text(1, 0o400))
            self._write(proc, "driver/nvidia/capabilities/mig/monitor", cap_text(2, 0o400))
        for g in gpus:
            for m in g["mig_devices"]:
                base = f"driver/nvidia/capabilities/gpu{g['minor']}/mig/gi{m['gi']}"
                self._write(proc, f"{base}/access", cap_text(m["gi_cap_minor"], 0o444))
                self._write(proc, f"{base}/ci{m['ci']}/access", cap_text(m["ci_cap_minor"], 0o444))
        self._write(proc, "devices", proc_devices_text(lay))
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
            "machine": lay.machine,
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


def build_node(
    root: str | os.PathLike[str],
    layout: NodeLayout | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    ldconfig: Sequence[str] = (),
) -> BuiltNode:
    """Build a simulated node in ``root`` (created; must be empty if it exists).

    ``ldconfig``: the command that runs ldconfig for ``layout.machine`` (default: this
    machine's), e.g. an emulator and the other machine's ldconfig, which is static."""
    layout = layout or NodeLayout()
    root_path = Path(root).absolute()
    if root_path.exists() and any(root_path.iterdir()):
        raise SimNodeError(f"{root_path} is not empty")
    root_path.mkdir(parents=True, exist_ok=True)
    b = _Builder(root_path, layout, Path(cache_dir) if cache_dir else default_cache_dir(),
                 ldconfig)
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


