"""The driver's artifacts on a node: libraries, links, binaries, configs, firmware, IPC
sockets and device nodes, located under the driver and dev roots.

Returned as plain values with both sides of every path: ``host`` (where it is on this
machine, under the driver root) and ``path`` (where it goes in a container: the host path
minus the driver root).  Nothing here knows about CDI; ``generate.py`` turns these into
edits.

Locating libraries: first a scan of the usual 64-bit library folders under the driver
root, then our own ld.so.cache reader (``<driver-root>/etc/ld.so.cache``), so drivers in
unusual folders are found too (the cache is how the loader finds them).  With
``--library-search-path`` only those folders are scanned.  The driver's folders are the
parents of every ``*.so.<driver-version>`` found; every such file in them (and in their
``vdpau/``) is a driver library, as is the set of non-RM-versioned graphics libraries.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import posixpath
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .discover import Roots

__all__ = [
    "DeviceNodeInfo",
    "DriverFiles",
    "FileMount",
    "Link",
    "capability_of",
    "find_version_from_libraries",
    "locate_driver",
    "stat_device_node",
]

LIBRARY_DIRS = (
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/aarch64-linux-gnu",
    "/lib/aarch64-linux-gnu/nvidia/current",
)
# Graphics libraries that do not carry the RM version in their names.
GRAPHICS_LIBRARIES = (
    "libnvidia-egl-gbm.so.*.*", "libnvidia-egl-wayland.so.*.*", "libnvidia-egl-wayland2.so.*.*",
    "libnvidia-egl-xcb.so.*.*", "libnvidia-egl-xlib.so.*.*", "libnvidia-nvvm70.so.*",
)
BINARIES = (
    "nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server", "nvidia-imex", "nvidia-imex-ctl", "nvidia-xconfig",
)
# The generating process's $PATH describes its own root, not the driver root, so only
# this fixed list is searched; output does not depend on the caller's environment.
BINARY_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
IPC_SOCKETS = (
    "/run/nvidia-persistenced/socket", "/var/run/nvidia-persistenced/socket",
    "/run/nvidia-fabricmanager/socket", "/var/run/nvidia-fabricmanager/socket",
)
MPS_PIPE_DIR = "/tmp/nvidia-mps"
SHARE_CONFIGS = (
    "glvnd/egl_vendor.d/10_nvidia.json",
    "egl/egl_external_platform.d/15_nvidia_gbm.json",
    "egl/egl_external_platform.d/10_nvidia_wayland.json",
    "egl/egl_external_platform.d/09_nvidia_wayland2.json",
    "egl/egl_external_platform.d/20_nvidia_xcb.json",
    "egl/egl_external_platform.d/20_nvidia_xlib.json",
    "nvidia/nvoptix.bin",
    "X11/xorg.conf.d/10-nvidia.conf",
    "X11/xorg.conf.d/nvidia-drm-outputclass.conf",
)
ETC_CONFIGS = (
    "OpenCL/vendors/nvidia.icd",
    "vulkan/icd.d/nvidia_icd.json",
    "vulkan/icd.d/nvidia_icd.x86_64.json",
    "vulkan/icd.d/nvidia_icd.aarch64.json",
    "vulkan/icd.d/nvidia_layers.json",
    "vulkan/implicit_layer.d/nvidia_layers.json",
)
CONFIG_DIRS = ("/etc", "/usr/local/share", "/usr/share")
XORG_SUBDIRS = ("drivers", "extensions", "updates/drivers", "updates/extensions")
XORG_BASES = ("/usr/lib/xorg/modules", "/usr/lib64/xorg/modules", "/usr/X11R6/lib/modules",
              "/usr/X11R6/lib64/modules")
FILE_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
IPC_OPTIONS = ("nosuid", "nodev", "rbind", "rprivate", "noexec")
CONTROL_NODES = ("/dev/nvidia-modeset", "/dev/nvidia-uvm-tools", "/dev/nvidia-uvm",
                 "/dev/nvidiactl")

# Driver capabilities (NVIDIA_DRIVER_CAPABILITIES) by basename prefix, as libnvidia-container
# assigns them; ``display`` shares graphics' list.  A later policy step uses this to mount
# only what an image asks for.
CAPABILITY_PREFIXES: dict[str, tuple[str, ...]] = {
    "utility": ("libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so", "nvidia-smi",
                "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager"),
    "compute": ("libcuda.so", "libcudadebugger.so", "libnvidia-opencl.so",
                "libnvidia-gpucomp.so", "libnvidia-ptxjitcompiler.so",
                "libnvidia-fatbinaryloader.so", "libnvidia-allocator.so",
                "libnvidia-compiler.so", "libnvidia-pkcs11.so", "libnvidia-pkcs11-openssl3.so",
                "libnvidia-nvvm.so", "libnvidia-tileiras.so", "nvidia-cuda-mps-control",
                "nvidia-cuda-mps-server"),
    "video": ("libvdpau_nvidia.so", "libnvidia-encode.so", "libnvidia-opticalflow.so",
              "libnvcuvid.so"),
    "graphics": ("libnvidia-eglcore.so", "libnvidia-glcore.so", "libnvidia-tls.so",
                 "libnvidia-glsi.so", "libnvidia-fbc.so", "libnvidia-ifr.so",
                 "libnvidia-rtcore.so", "libnvoptix.so", "libGLX_nvidia.so", "libEGL_nvidia.so",
                 "libGLESv2_nvidia.so", "libGLESv1_CM_nvidia.so", "libnvidia-glvkspirv.so",
                 "libnvidia-cbl.so"),
    "ngx": ("libnvidia-ngx.so",),
}


def capability_of(basename: str) -> str | None:
    for capability, prefixes in CAPABILITY_PREFIXES.items():
        if any(_prefix_match(basename, p) for p in prefixes):
            return capability
    return None


def _prefix_match(basename: str, prefix: str) -> bool:
    # "libcuda.so" must match "libcuda.so.1" but "nvidia-smi" only itself.
    return basename == prefix or basename.startswith(prefix + ".")


@dataclass(frozen=True, slots=True, kw_only=True)
class FileMount:
    host: str  # host path (under the driver root)
    path: str  # container path
    kind: str  # library, binary, config, firmware, ipc, xorg
    options: tuple[str, ...] = FILE_OPTIONS


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """A symlink the driver has on the host, to recreate in the container."""

    target: str  # the link's text, usually a bare file name
    path: str  # container path of the link
    resolved: FileMount | None  # the file the link ends at, for link-mode ``mounts``


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceNodeInfo:
    path: str  # in the container (/dev/...)
    host: str  # on the host (under the dev root)
    type: str
    major: int
    minor: int
    mode: int  # permission bits
    gid: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DriverFiles:
    version: str
    lib_dirs: tuple[str, ...]  # container paths holding driver libraries
    libraries: tuple[FileMount, ...]
    links: tuple[Link, ...]
    binaries: tuple[FileMount, ...]
    ipc: tuple[FileMount, ...]
    firmware: tuple[FileMount, ...]
    configs: tuple[FileMount, ...]
    control_nodes: tuple[DeviceNodeInfo, ...]

    def mounts(self) -> tuple[FileMount, ...]:
        return (*self.libraries, *self.binaries, *self.ipc, *self.firmware, *self.configs)


# --- small file-system helpers --------------------------------------------------------------


def _container_path(root: Path, host: Path) -> str:
    rel = os.path.relpath(host, root)
    return "/" if rel == "." else "/" + rel


def _resolve(root: Path, path: str) -> Path:
    """``path`` resolved inside ``root``.  Folders are resolved once and remembered: the
    generator probes about a hundred candidate files in a dozen folders."""
    folder, name = posixpath.split(posixpath.normpath("/" + path))
    base = _resolve_folder(root, folder)
    candidate = base / name if name else base
    if name and os.path.islink(candidate):
        return _resolve_in_root(root, _container_path(root, candidate))
    return candidate


@functools.lru_cache(maxsize=256)
def _resolve_folder(root: Path, folder: str) -> Path:
    return _resolve_in_root(root, folder)


def _resolve_in_root(root: Path, path: str) -> Path:
    from .ldcache import resolve_in_root

    return resolve_in_root(root, path)


def _listdir(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _mount(root: Path, host: Path, kind: str, path: str | None = None,
           options: tuple[str, ...] = FILE_OPTIONS) -> FileMount:
    return FileMount(host=os.fspath(host), path=path or _container_path(root, host),
                     kind=kind, options=options)


# --- device nodes ---------------------------------------------------------------------------


def stat_device_node(roots: Roots, path: str) -> DeviceNodeInfo | None:
    """The character device at ``path`` (a /dev path) under the dev root, or None."""
    host = roots.dev_path(path)
    try:
        st = os.stat(host)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return DeviceNodeInfo(path=path, host=os.fspath(host), type="c",
                          major=os.major(st.st_rdev), minor=os.minor(st.st_rdev),
                          mode=stat.S_IMODE(st.st_mode), gid=st.st_gid)


def control_nodes(roots: Roots) -> tuple[DeviceNodeInfo, ...]:
    found = (stat_device_node(roots, p) for p in CONTROL_NODES)
    return tuple(n for n in found if n is not None)


# --- libraries ------------------------------------------------------------------------------


def _scan_dirs(roots: Roots, dirs: Sequence[str]) -> list[Path]:
    """The distinct real folders (resolved in the driver root) among ``dirs``."""
    seen: dict[Path, None] = {}
    for folder in dirs:
        real = _resolve(roots.driver, folder)
        if real.is_dir():
            seen.setdefault(real)
    return list(seen)


def _ldcache_files(roots: Roots, patterns: Sequence[str]) -> list[Path]:
    from .ldcache import LdCacheError, find_libraries, read_ldcache

    cache = roots.driver_path("etc/ld.so.cache")
    try:
        entries = read_ldcache(cache)
    except (OSError, LdCacheError):
        return []
    return find_libraries(entries, patterns, root=roots.driver)


def _glob(folder: Path, pattern: str) -> list[Path]:
    return [folder / n for n in _listdir(folder)
            if fnmatch.fnmatchcase(n, pattern) and _is_file(folder / n)]


def find_version_from_libraries(roots: Roots, search: Sequence[str] | None) -> str | None:
    """The RM version from ``libcuda.so.<v>`` or ``libnvidia-ml.so.<v>`` file names."""
    for stem in ("libcuda.so.", "libnvidia-ml.so."):
        for path in _library_candidates(roots, search, [stem + "*.*"]):
            suffix = path.name[len(stem):]
            if suffix.replace(".", "").isdigit():
                return suffix
    return None


def _library_candidates(roots: Roots, search: Sequence[str] | None,
                        patterns: Sequence[str]) -> list[Path]:
    folders = _scan_dirs(roots, search if search else LIBRARY_DIRS)
    found = [p for folder in folders for pat in patterns for p in _glob(folder, pat)]
    if not found and not search:
        # The loader's own view: finds drivers installed outside the usual folders.
        found = _ldcache_files(roots, patterns)
    return list(dict.fromkeys(found))


def find_nvml_library(roots: Roots, search: Sequence[str] | None) -> Path | None:
    """The ``libnvidia-ml.so.1`` under the driver root, resolved to its file."""
    for folder in _scan_dirs(roots, search if search else LIBRARY_DIRS):
        candidate = _resolve(roots.driver, _container_path(roots.driver, folder)
                             + "/libnvidia-ml.so.1")
        if _is_file(candidate):
            return candidate
    if not search:
        hits = _ldcache_files(roots, ["libnvidia-ml.so.1"])
        return hits[0] if hits else None
    return None


def _driver_libraries(roots: Roots, version: str,
                      search: Sequence[str] | None) -> tuple[list[Path], list[Path]]:
    """(library folders, library files) of the driver."""
    seeds = _library_candidates(roots, search, [f"*.so.{version}"])
    folders = list(dict.fromkeys(p.parent for p in seeds))
    files: list[Path] = []
    for folder in folders:
        for sub in (folder, folder / "vdpau"):
            files += _glob(sub, f"*.so.{version}")
            if sub == folder:
                for pattern in GRAPHICS_LIBRARIES:
                    files += _glob(sub, pattern)
    files = list(dict.fromkeys(files))
    # Folders that hold a library (vdpau/ included), in first-seen order.
    return list(dict.fromkeys(p.parent for p in files)), files


def _library_links(roots: Roots, files: Sequence[Path], folders: Sequence[Path],
                   version: str) -> list[Link]:
    from .elf import ElfError, read_soname

    by_host = {p: _mount(roots.driver, p, "library") for p in files}
    links: list[Link] = []
    for path in files:
        names = []
        try:
            soname = read_soname(path)
        except (OSError, ElfError):
            soname = None
        if soname and soname != path.name:
            names.append(soname)
        stem = path.name.split(".so", 1)[0] + ".so"
        names.append(stem)
        links += (_host_link(roots, by_host, path.parent / n) for n in names)
    # Links the driver's users expect even where the host lacks them.
    extra = {"libcuda.so": "libcuda.so.1", "libGLX_indirect.so.0": f"libGLX_nvidia.so.{version}"}
    for folder in folders:
        for name, target in extra.items():
            links.append(_link(roots, by_host, folder / name, target))
        links.append(_host_link(roots, by_host, folder / "gbm" / "nvidia-drm_gbm.so"))
    return _unique_links(links)


def _host_link(roots: Roots, by_host: dict[Path, FileMount], path: Path) -> Link | None:
    try:
        target = os.readlink(path)
    except OSError:
        return None  # only links the driver made on the host are recreated
    return _link(roots, by_host, path, target)


def _link(roots: Roots, by_host: dict[Path, FileMount], path: Path, target: str) -> Link | None:
    container = _container_path(roots.driver, path)
    # Follow the target rather than the link: a link we add may not exist on the host.
    end = _resolve(roots.driver, posixpath.join(posixpath.dirname(container), target))
    if not _is_file(end):
        return None
    kind = by_host[end].kind if end in by_host else "library"
    return Link(target=target, path=container,
                resolved=_mount(roots.driver, end, kind, path=container))


def _unique_links(links: Iterable[Link | None]) -> list[Link]:
    seen: dict[str, Link] = {}
    for link in links:
        if link is not None:
            seen.setdefault(link.path, link)
    return sorted(seen.values(), key=lambda k: k.path)


def _xorg(roots: Roots, lib_dirs: Sequence[str], version: str) -> tuple[list[Path], list[Link]]:
    bases = [f"{d}/nvidia/xorg" for d in lib_dirs] + [f"{d}/xorg/modules" for d in lib_dirs]
    bases += list(XORG_BASES)
    files: list[Path] = []
    links: list[Link] = []
    for name in ("nvidia_drv.so", f"libglxserver_nvidia.so.{version}"):
        hit = _first_xorg(roots, bases, name)
        if hit is None:
            continue
        files.append(hit)
        if name.startswith("libglxserver"):
            links.append(_host_link(roots, {}, hit.parent / "libglxserver_nvidia.so"))
    return files, [k for k in links if k is not None]


def _first_xorg(roots: Roots, bases: Sequence[str], name: str) -> Path | None:
    for base in bases:
        if base.endswith("/nvidia/xorg"):
            subdirs: tuple[str, ...] = ("",)
        else:
            subdirs = XORG_SUBDIRS
        for sub in subdirs:
            candidate = _resolve(roots.driver, f"{base}/{sub}/{name}" if sub else f"{base}/{name}")
            if _is_file(candidate):
                return candidate
    return None


# --- other files ----------------------------------------------------------------------------


def _binaries(roots: Roots) -> list[FileMount]:
    found = []
    for name in BINARIES:
        for folder in BINARY_DIRS:
            host = _resolve(roots.driver, f"{folder}/{name}")
            if _is_file(host) and os.access(host, os.X_OK):
                found.append(_mount(roots.driver, host, "binary", path=f"{folder}/{name}"))
                break
    return found


def _ipc(roots: Roots) -> list[FileMount]:
    found: dict[Path, FileMount] = {}
    for path in IPC_SOCKETS:
        host = _resolve(roots.driver, path)
        try:
            is_socket = stat.S_ISSOCK(os.stat(host).st_mode)
        except OSError:
            continue
        if is_socket:
            found.setdefault(host, _mount(roots.driver, host, "ipc", path, IPC_OPTIONS))
    mps = _resolve(roots.driver, MPS_PIPE_DIR)
    if mps.is_dir():
        found.setdefault(mps, _mount(roots.driver, mps, "ipc", MPS_PIPE_DIR, IPC_OPTIONS))
    return list(found.values())


def _firmware(roots: Roots, version: str) -> list[FileMount]:
    release = os.uname().release
    dirs = []
    try:
        custom = roots.sys_path("module/firmware_class/parameters/path").read_text().strip()
    except OSError:
        custom = ""
    if custom:
        dirs.append(custom)
    dirs += [f"/lib/firmware/updates/{release}", "/lib/firmware/updates",
             f"/lib/firmware/{release}", "/lib/firmware"]
    found: dict[Path, FileMount] = {}
    for folder in dirs:
        sub = f"{folder}/nvidia/{version}"
        for host in _glob(_resolve(roots.driver, sub), "gsp*.bin"):
            found.setdefault(host, _mount(roots.driver, host, "firmware", f"{sub}/{host.name}"))
    return list(found.values())


def _configs(roots: Roots, search: Sequence[str] | None) -> list[FileMount]:
    dirs = tuple(search) if search else CONFIG_DIRS
    found = []
    for rel, where in [*((r, "/usr/share") for r in SHARE_CONFIGS),
                       *((r, "/etc") for r in ETC_CONFIGS)]:
        for folder in dirs:
            host = _resolve(roots.driver, f"{folder}/{rel}")
            if _is_file(host):
                found.append(_mount(roots.driver, host, "config", f"{where}/{rel}"))
                break
    return found


# --- entry ----------------------------------------------------------------------------------


def locate_driver(
    roots: Roots,
    version: str,
    *,
    library_search_paths: Sequence[str] | None = None,
    config_search_paths: Sequence[str] | None = None,
) -> DriverFiles:
    """Every driver artifact of ``version`` under the roots (missing ones are left out)."""
    folders, files = _driver_libraries(roots, version, library_search_paths)
    lib_dirs = [_container_path(roots.driver, f) for f in folders]
    xorg_files, xorg_links = _xorg(roots, lib_dirs, version)
    libraries = [_mount(roots.driver, p, "library") for p in [*files, *xorg_files]]
    links = _library_links(roots, files, folders, version) + xorg_links
    return DriverFiles(
        version=version,
        lib_dirs=tuple(lib_dirs),
        libraries=tuple(libraries),
        links=tuple(_unique_links(links)),
        binaries=tuple(_binaries(roots)),
        ipc=tuple(_ipc(roots)),
        firmware=tuple(_firmware(roots, version)),
        configs=tuple(_configs(roots, config_search_paths)),
        control_nodes=control_nodes(roots),
    )


# --- per-device nodes -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceNodes:
    """The nodes of one GPU or MIG device, and its ``/dev/dri/by-path`` links."""

    nodes: tuple[DeviceNodeInfo, ...]
    links: tuple[Link, ...] = ()


def gpu_nodes(roots: Roots, minor: int, bus_id: str) -> DeviceNodes:
    """``/dev/nvidia<minor>`` and the GPU's DRM nodes (those present in /dev only)."""
    main = stat_device_node(roots, f"/dev/nvidia{minor}")
    drm = drm_nodes(roots, bus_id)
    nodes = tuple(n for n in (main, *drm.nodes) if n is not None)
    return DeviceNodes(nodes=nodes, links=drm.links)


def drm_nodes(roots: Roots, bus_id: str) -> DeviceNodes:
    # A sysfs DRM entry without a /dev node (old kernels' controlD<N>) is skipped: a spec
    # naming a missing node fails every container that asks for the GPU.
    names = _listdir(roots.sys_path(f"bus/pci/devices/{bus_id}/drm"))
    nodes = [stat_device_node(roots, f"/dev/dri/{name}") for name in names]
    present = [n for n in nodes if n is not None]
    links = []
    for suffix in ("card", "render"):
        link = f"/dev/dri/by-path/pci-{bus_id}-{suffix}"
        try:
            target = os.readlink(roots.dev_path(link))
        except OSError:
            continue
        if any(n.path == os.path.normpath(f"/dev/dri/by-path/{target}") for n in present):
            links.append(Link(target=target, path=link, resolved=None))
    return DeviceNodes(nodes=tuple(present), links=tuple(links))


def read_mig_minors(roots: Roots) -> dict[str, int] | None:
    """``proc/driver/nvidia-caps/mig-minors`` as {key: minor}; None when it is missing."""
    try:
        text = roots.proc_path("driver/nvidia-caps/mig-minors").read_text()
    except OSError:
        return None
    table = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            table[key] = int(value)
    return table


def mig_cap_paths(minors: dict[str, int], parent_minor: int, gi: int, ci: int) -> tuple[str, str]:
    """The GPU-instance and compute-instance cap nodes of one MIG device."""
    gi_key = f"gpu{parent_minor}/gi{gi}/access"
    ci_key = f"gpu{parent_minor}/gi{gi}/ci{ci}/access"
    return (f"/dev/nvidia-caps/nvidia-cap{minors[gi_key]}",
            f"/dev/nvidia-caps/nvidia-cap{minors[ci_key]}")


# Management mode takes every NVIDIA node except those of other subsystems.
_MANAGEMENT_SKIP = ("nvidia-fs", "nvidia-nvswitch", "nvidia-nvlink")


def management_nodes(roots: Roots) -> tuple[DeviceNodeInfo, ...]:
    paths = [f"/dev/{n}" for n in _listdir(roots.dev_path("/dev"))
             if n.startswith("nvidia") and not n.startswith(_MANAGEMENT_SKIP)]
    paths += [f"/dev/nvidia-caps/{n}" for n in _listdir(roots.dev_path("/dev/nvidia-caps"))
              if n.startswith("nvidia-cap")]
    paths += [f"/dev/nvidia-caps-imex-channels/{n}"
              for n in _listdir(roots.dev_path("/dev/nvidia-caps-imex-channels"))
              if n.startswith("channel")]
    found = (stat_device_node(roots, p) for p in paths)
    return tuple(n for n in found if n is not None)
