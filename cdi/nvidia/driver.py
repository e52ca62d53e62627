"""The driver's artifacts on a node: libraries, links, binaries, configs, firmware, IPC
sockets and device nodes, located under the driver and dev roots.

Plain values with both sides of every path: ``host`` (under the driver root) and ``path``
(in a container); ``generate.py`` turns them into edits. Every path is resolved inside the
driver root as if it were ``/`` (``DriverRoot``), so a hostile driver root cannot make us
read host files. Libraries: the usual library folders, then the root's own loader cache
(with ``--library-search-path``, only those folders). The driver's folders are the parents
of every ``*.so.<driver-version>``, and every such file in them (and their ``vdpau/``) is
the driver's, as are the graphics libraries without the RM version in their names.
"""

import errno
import fnmatch
import os
import posixpath
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from cdi.linux.elf import ElfError, is_elf, read_soname
from cdi.linux.ldcache import LdCacheError, find_libraries, read_ldcache, resolve_from
from cdi.nvidia.discover import Roots, listdir

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
    # GKE and other hosted nodes: the driver in one folder that the loader's cache may
    # not list (issue 18).
    "/usr/local/nvidia/lib64",
)
# The 32-bit (i386) libraries, beside the 64-bit ones (Debian ships them as :i386 packages):
# the ``compat32`` capability.
LIBRARY_DIRS_32 = (
    "/usr/lib/i386-linux-gnu",
    "/usr/lib/i386-linux-gnu/nvidia/current",
    "/usr/lib32",
    "/lib/i386-linux-gnu",
)
# Subfolders of the default library folders where the driver's users look for its files by
# name: libvdpau (vdpau/), Mesa's GBM (gbm/), libnvidia-cfg on Debian (nvidia/).
LINK_SUBDIRS = ("", "vdpau", "gbm", "nvidia")
# DLLs NGX-enabled Windows programs (Proton, DXVK-NVAPI) load from ``nvidia/wine/`` beside
# the folder libGLX_nvidia.so.0 was loaded from.
WINE_DLLS = "nvidia/wine"
# Graphics libraries that do not carry the RM version in their names.
GRAPHICS_LIBRARIES = (
    "libnvidia-egl-gbm.so.*.*", "libnvidia-egl-wayland.so.*.*", "libnvidia-egl-wayland2.so.*.*",
    "libnvidia-egl-xcb.so.*.*", "libnvidia-egl-xlib.so.*.*", "libnvidia-nvvm70.so.*",
    # NvAPI (DXVK-NVAPI): one file with no RM version in its name.
    "libnvidia-api.so.1",
)
BINARIES = (
    "nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server", "nvidia-imex", "nvidia-imex-ctl", "nvidia-xconfig",
)
# The generating process's $PATH describes its own root, not the driver root, so only
# this fixed list is searched; output does not depend on the caller's environment.
BINARY_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin",
               "/usr/local/nvidia/bin")
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
# $XDG_DATA_DIRS when unset or empty (the XDG base directory spec's default).
XDG_DATA_DIRS = ("/usr/local/share", "/usr/share")
XORG_SUBDIRS = ("drivers", "extensions", "updates/drivers", "updates/extensions")
XORG_BASES = ("/usr/lib/xorg/modules", "/usr/lib64/xorg/modules", "/usr/X11R6/lib/modules",
              "/usr/X11R6/lib64/modules")
FILE_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
IPC_OPTIONS = ("nosuid", "nodev", "rbind", "rprivate", "noexec")
# A device node bound at another name (a by-path link's, in link mode ``mounts``): writable
# and without ``nodev``, or the node could not be opened through that name.
DEVICE_NODE_OPTIONS = ("nosuid", "noexec", "rbind", "rprivate")
CONTROL_NODE_PATHS = ("/dev/nvidia-modeset", "/dev/nvidia-uvm-tools", "/dev/nvidia-uvm",
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
                 "libnvidia-cbl.so", "libnvidia-api.so", "libnvidia-egl-gbm.so",
                 "libnvidia-egl-wayland.so", "libnvidia-egl-wayland2.so",
                 "libnvidia-egl-xcb.so", "libnvidia-egl-xlib.so"),
    "ngx": ("libnvidia-ngx.so", "nvngx.dll", "_nvngx.dll"),
    # The X server's driver and GLX modules.
    "display": ("nvidia_drv.so", "libglxserver_nvidia.so"),
}




def capability_of(basename: str) -> str | None:
    # "libcuda.so" must match "libcuda.so.1" but "nvidia-smi" only itself.
    for capability, prefixes in CAPABILITY_PREFIXES.items():
        if any(basename == p or basename.startswith(p + ".") for p in prefixes):
            return capability
    return None


class FileMount(NamedTuple):
    host: str  # host path (under the driver root)
    path: str  # container path
    options: tuple[str, ...] = FILE_OPTIONS


class Link(NamedTuple):
    """A symlink the driver has on the host, to recreate in the container."""

    target: str  # the link's text, usually a bare file name
    path: str  # container path of the link
    resolved: FileMount | None  # the file the link ends at, for link-mode ``mounts``


class DeviceNodeInfo(NamedTuple):
    path: str  # in the container (/dev/...)
    host: str  # on the host (under the dev root)
    type: str
    major: int
    minor: int
    mode: int  # permission bits
    gid: int


class DriverFiles(NamedTuple):
    version: str
    lib_dirs: tuple[str, ...]  # container paths holding driver libraries
    libraries: tuple[FileMount, ...]
    links: tuple[Link, ...]
    binaries: tuple[FileMount, ...]
    ipc: tuple[FileMount, ...]
    firmware: tuple[FileMount, ...]
    configs: tuple[FileMount, ...]
    control_nodes: tuple[DeviceNodeInfo, ...]
    skipped: tuple[str, ...] = ()  # "<host path>: why", for what was left out as untrustworthy
    lib32_dirs: tuple[str, ...] = ()  # container paths holding the i386 libraries (compat32)

    def mounts(self) -> tuple[FileMount, ...]:
        return (*self.libraries, *self.binaries, *self.ipc, *self.firmware, *self.configs)


# --- the driver root ------------------------------------------------------------------------


class DriverRoot:
    """The driver root seen from inside, like a chroot: absolute link targets restart at
    the root and ``..`` never climbs above it (``ldcache.resolve_from``)."""

    def __init__(self, root: Path) -> None:
        self.root = os.fspath(root)
        # Host paths left out (a link loop, a SONAME naming another folder) and why:
        # reported, never fatal (one bad file must not cost the node its whole spec).
        self.skipped: dict[str, str] = {}
        # Each folder's walk (its components and the links followed to get there; None
        # when it is no folder or its links loop), for this run only: a run probes a few
        # hundred paths in a few dozen folders, most of them missing, and a walk continued
        # from its folder is the walk from the top.
        self._folders: dict[str, tuple[list[str], int] | None] = {}

    def host(self, container: str) -> str:
        rel = container.lstrip("/")
        return os.path.join(self.root, rel) if rel else self.root

    def container(self, host: str) -> str:
        rel = os.path.relpath(host, self.root)
        return "/" if rel == "." else "/" + rel

    def resolve(self, path: str) -> str | None:
        """The host path that the container path ``path`` resolves to (its last component
        kept as it is when missing); None when its folder is none or its links loop."""
        folder, _, name = posixpath.normpath("/" + path).rpartition("/")
        walked = self._folder(folder)
        if walked is not None:
            walked = self._walk(walked[0], name, walked[1])
        return None if walked is None else self.host("/".join(walked[0]))

    def _folder(self, folder: str) -> tuple[list[str], int] | None:
        """The walk to ``folder`` (normal, "" for the root), continued from its parent's."""
        if folder not in self._folders:
            parent, _, name = folder.rpartition("/")
            walked = self._folder(parent) if folder else ([], 0)
            if walked is not None and folder:
                walked = self._walk(walked[0], name, walked[1])
            if walked is not None and not os.path.isdir(self.host("/".join(walked[0]))):
                walked = None
            self._folders[folder] = walked
        return self._folders[folder]

    def _walk(self, done: list[str], rest: str, hops: int) -> tuple[list[str], int] | None:
        try:
            return resolve_from(self.root, done, rest, hops)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            self.skipped[exc.filename] = "too many levels of symbolic links (a link loop)"
            return None

    def file(self, path: str) -> str | None:
        """The host path of the regular file ``path`` resolves to, else None."""
        host = self.resolve(path)
        return host if host is not None and os.path.isfile(host) else None

    def first_file(self, paths: Iterable[str]) -> tuple[str, str] | None:
        """The first of ``paths`` that resolves to a regular file, and that file."""
        return next(((p, host) for p in paths if (host := self.file(p)) is not None), None)

    def folder(self, path: str) -> str | None:
        """The host path of the folder ``path`` resolves to, else None.  Errors other than
        "not there" propagate (``Path.is_dir``): a folder we may not read is no empty one."""
        host = self.resolve(path)
        return host if host is not None and Path(host).is_dir() else None


def _glob(folder: str, pattern: str) -> list[str]:
    """Host paths of the regular files (links followed) in the host folder ``folder``
    whose names match ``pattern``, in name order."""
    paths = (os.path.join(folder, name) for name in fnmatch.filter(listdir(folder), pattern))
    return [path for path in paths if os.path.isfile(path)]


def _mount(tree: DriverRoot, host: str, path: str | None = None,
           options: tuple[str, ...] = FILE_OPTIONS) -> FileMount:
    return FileMount(host=host, path=path or tree.container(host), options=options)


# --- device nodes ---------------------------------------------------------------------------


def stat_device_node(roots: Roots, path: str) -> DeviceNodeInfo | None:
    """The character device at ``path`` (a /dev path) under the dev root, or None."""
    host = os.fspath(roots.dev_path(path))
    try:
        st = os.stat(host)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return DeviceNodeInfo(path=path, host=host, type="c",
                          major=os.major(st.st_rdev), minor=os.minor(st.st_rdev),
                          mode=stat.S_IMODE(st.st_mode), gid=st.st_gid)


def _device_nodes(roots: Roots, paths: Iterable[str]) -> tuple[DeviceNodeInfo, ...]:
    """The character devices among ``paths`` (/dev paths) under the dev root."""
    found = (stat_device_node(roots, p) for p in paths)
    return tuple(n for n in found if n is not None)


# --- libraries ------------------------------------------------------------------------------


def _scan_dirs(tree: DriverRoot, dirs: Sequence[str]) -> list[str]:
    """The distinct real folders (resolved in the driver root) among ``dirs``."""
    found = (tree.folder(folder) for folder in dirs)
    return list(dict.fromkeys(folder for folder in found if folder is not None))


def _ldcache_files(tree: DriverRoot, pattern: str) -> list[str]:
    try:
        entries = read_ldcache(os.path.join(tree.root, "etc", "ld.so.cache"))
    except (OSError, LdCacheError):
        return []
    return [os.fspath(p) for p in find_libraries(entries, pattern, root=tree.root)]


def find_version_from_libraries(roots: Roots, search: Sequence[str] | None) -> str | None:
    """The RM version from ``libcuda.so.<v>`` or ``libnvidia-ml.so.<v>`` file names."""
    tree = DriverRoot(roots.driver)
    for stem in ("libcuda.so.", "libnvidia-ml.so."):
        for path in _library_candidates(tree, search, stem + "*.*"):
            suffix = os.path.basename(path)[len(stem):]
            if suffix.replace(".", "").isdigit():
                return suffix
    return None


def _library_candidates(tree: DriverRoot, search: Sequence[str] | None, pattern: str,
                        defaults: Sequence[str] = LIBRARY_DIRS) -> list[str]:
    found = [p for folder in _scan_dirs(tree, search or defaults) for p in _glob(folder, pattern)]
    if not found and not search and defaults is LIBRARY_DIRS:
        # The loader's own view: finds drivers installed outside the usual folders.
        found = _ldcache_files(tree, pattern)
    return list(dict.fromkeys(found))


def find_nvml_library(roots: Roots, search: Sequence[str] | None) -> Path | None:
    """The ``libnvidia-ml.so.1`` under the driver root, resolved to its file."""
    tree = DriverRoot(roots.driver)
    hits = [found for folder in _scan_dirs(tree, search or LIBRARY_DIRS)
            if (found := tree.file(tree.container(folder) + "/libnvidia-ml.so.1"))]
    if not hits and not search:
        hits = _ldcache_files(tree, "libnvidia-ml.so.1")
    return Path(hits[0]) if hits else None


def _driver_libraries(tree: DriverRoot, version: str, search: Sequence[str] | None,
                      defaults: Sequence[str] = LIBRARY_DIRS) -> tuple[list[str], list[str]]:
    """(library folders, library files) of the driver, as host paths."""
    seeds = _library_candidates(tree, search, f"*.so.{version}", defaults)
    files: list[str] = []
    for folder in dict.fromkeys(os.path.dirname(p) for p in seeds):
        for pattern in (f"*.so.{version}", *GRAPHICS_LIBRARIES):
            files += _glob(folder, pattern)
        vdpau = tree.resolve(tree.container(folder) + "/vdpau")  # links in the root
        if vdpau is not None:
            files += _glob(vdpau, f"*.so.{version}")
    files = list(dict.fromkeys(files))
    # Folders that hold a library (vdpau/ included), in first-seen order.
    return list(dict.fromkeys(os.path.dirname(p) for p in files)), files


def _library_links(tree: DriverRoot, files: Sequence[str], folders: Sequence[str],
                   version: str) -> list[Link]:
    links: list[Link | None] = []  # each ends at a library
    for path in files:
        folder, name = os.path.split(path)
        try:
            soname = read_soname(path)
        except (OSError, ElfError):
            soname = None
        if soname and not _is_file_name(soname):
            tree.skipped[path] = f"its SONAME {soname!r} names another folder; no link made"
        elif soname and soname != name:
            links.append(_host_link(tree, folder, soname))
        links.append(_host_link(tree, folder, name.split(".so", 1)[0] + ".so"))
    # Links the driver's users expect even where the host lacks them.
    # libnvidia-vulkan-producer.so: what drivers 470-525 load by that name, without a link.
    extra = {"libcuda.so": "libcuda.so.1", "libGLX_indirect.so.0": f"libGLX_nvidia.so.{version}",
             "libnvidia-vulkan-producer.so": f"libnvidia-vulkan-producer.so.{version}"}
    for folder in folders:
        for name, target in extra.items():
            links.append(_link(tree, tree.container(os.path.join(folder, name)), target))
        links.append(_host_link(tree, os.path.join(folder, "gbm"), "nvidia-drm_gbm.so"))
    return _unique_links(links)


def _default_folder_links(tree: DriverRoot, files: Sequence[str],
                          search: Sequence[str] | None, dirs: Sequence[str]) -> list[Link]:
    """The links in the default library folders (and their vdpau/, gbm/, nvidia/) that end
    at one of the driver's files, however many hops they take: what a distribution's
    install scripts made there (Debian's /etc/alternatives), for the loader, libvdpau and
    GBM to find the driver by name.  Not with --library-search-path (only those folders)."""
    if search or not files:
        return []
    ends = set(files)
    links = []
    for folder in _scan_dirs(tree, dirs):
        for sub in LINK_SUBDIRS:
            where = os.path.join(folder, sub) if sub else folder
            for name in listdir(where):
                path = os.path.join(where, name)
                if not os.path.islink(path):
                    continue
                container = tree.container(path)
                end = tree.file(container)
                if end in ends:
                    links.append(Link(target=os.readlink(path), path=container,
                                      resolved=FileMount(host=end, path=container)))
    return links


def _anchor_links(tree: DriverRoot, links: Iterable[Link],
                  mounts: Sequence[FileMount]) -> list[Link]:
    """Every link as the container will see it: its text kept where it names a file or link
    the spec provides, else pointed at the provided file it ends at (the host's text may
    name /etc/alternatives/..., or a link in a folder the spec leaves out); a link that
    ends at nothing the spec provides is left out (it would dangle), noted in ``skipped``."""
    chosen = list(links)
    provided = {m.path for m in mounts} | {k.path for k in chosen}
    by_host: dict[str, str] = {}
    for m in mounts:
        by_host.setdefault(m.host, m.path)
    out = []
    for link in chosen:
        if link.resolved is None:
            out.append(link)
            continue
        end = by_host.get(link.resolved.host)
        if end is None:
            tree.skipped[tree.host(link.path)] = (
                f"link to {link.target}: it ends at {link.resolved.host}, which the spec "
                "does not provide; no link made")
            continue
        folder = posixpath.dirname(link.path)
        direct = posixpath.normpath(posixpath.join(folder, link.target))
        if link.target.startswith("/") or direct not in provided or direct == link.path:
            link = link._replace(target=posixpath.relpath(end, folder))
        out.append(link)
    return out


def _wine_dlls(tree: DriverRoot, folders: Sequence[str], files: Sequence[str],
               links: Sequence[Link]) -> list[FileMount]:
    """NGX's Windows DLLs (``nvidia/wine/*.dll`` beside the 64-bit libraries), where they
    are and beside every 64-bit libGLX_nvidia.so.0 link, the folder Proton looks in."""
    found: dict[str, FileMount] = {}
    ours = set(files)
    glx = [posixpath.dirname(k.path) for k in links
           if posixpath.basename(k.path) == "libGLX_nvidia.so.0"
           and k.resolved is not None and k.resolved.host in ours]
    for folder in folders:
        for host in _glob(os.path.join(folder, WINE_DLLS), "*.dll"):
            folder_of, name = os.path.split(host)
            for where in (tree.container(folder_of), *(f"{g}/{WINE_DLLS}" for g in glx)):
                path = f"{where}/{name}"
                found.setdefault(path, _mount(tree, host, path))
    return list(found.values())


def _is_file_name(soname: str) -> bool:
    # A SONAME is read from the library itself: one naming another folder ("../x", "/etc/x")
    # is no link the driver made next to it, and would put a link outside the folder.
    return soname not in (".", "..") and "/" not in soname and "\0" not in soname


def _host_link(tree: DriverRoot, folder: str, name: str) -> Link | None:
    path = os.path.join(folder, name)
    try:
        target = os.readlink(path)
    except OSError:
        return None  # only links the driver made on the host are recreated
    return _link(tree, tree.container(path), target)


def _link(tree: DriverRoot, container: str, target: str) -> Link | None:
    # Follow the target rather than the link: a link we add may not exist on the host.
    end = tree.file(posixpath.join(posixpath.dirname(container), target))
    if end is None:
        return None
    return Link(target=target, path=container,
                resolved=FileMount(host=end, path=container))


def _unique_links(links: Iterable[Link | None]) -> list[Link]:
    seen: dict[str, Link] = {}
    for link in links:
        if link is not None:
            seen.setdefault(link.path, link)
    return sorted(seen.values(), key=lambda k: k.path)


def _xorg(tree: DriverRoot, lib_dirs: Sequence[str],
          version: str) -> tuple[list[FileMount], list[Link]]:
    """The X server's NVIDIA driver and GLX modules, mounted in the folders Xorg loads them
    from (``<modules>/drivers``, ``<modules>/extensions``), wherever the host keeps the
    files (Debian: /usr/lib/nvidia/current, reached through /etc/alternatives links).  The
    GLX module is looked for versioned, then by the unversioned name Debian's links have."""
    folders = [f"{base}/{sub}" for base in XORG_BASES for sub in XORG_SUBDIRS]
    folders += [f"{d}/nvidia/xorg" for d in lib_dirs]
    folders += [f"{d}/xorg/modules/{sub}" for d in lib_dirs for sub in XORG_SUBDIRS]
    mounts: list[FileMount] = []
    links: list[Link] = []
    glx = f"libglxserver_nvidia.so.{version}"
    for names, sub in ((("nvidia_drv.so",), "drivers"),
                       ((glx, "libglxserver_nvidia.so"), "extensions")):
        hit = tree.first_file(f"{folder}/{name}" for name in names for folder in folders)
        if hit is None:
            continue
        found, host = posixpath.normpath(hit[0]), hit[1]
        name = posixpath.basename(found)
        ours = any(found.startswith(b + "/") for b in XORG_BASES)
        path = found if ours else f"{XORG_BASES[0]}/{sub}/{name}"
        mounts.append(_mount(tree, host, path))
        if name == glx:
            unversioned = f"{posixpath.dirname(path)}/libglxserver_nvidia.so"
            links.append(Link(target=name, path=unversioned,
                              resolved=FileMount(host=host, path=unversioned)))
    return mounts, links


# --- other files ----------------------------------------------------------------------------


def _binaries(tree: DriverRoot) -> list[FileMount]:
    """Each binary at the first folder that has it, as a container's PATH would find it.

    When that file is not an ELF program but a later folder holds one, the later file is
    mounted there instead: a host's wrapper script (``/usr/bin/nvidia-smi`` running ``exec
    /usr/local/nvidia/bin/nvidia-smi``, as on a real H100 node) names a path the container
    does not have, and fails there with "not found".
    """
    found = []
    for name in BINARIES:
        hosts = []
        for folder in BINARY_DIRS:
            host = tree.file(f"{folder}/{name}")
            if host is not None and os.access(host, os.X_OK):
                hosts.append((folder, host))
        if hosts:
            program = next((h for _, h in hosts if is_elf(h)), hosts[0][1])
            found.append(_mount(tree, program, path=f"{hosts[0][0]}/{name}"))
    return found


def _ipc(tree: DriverRoot) -> list[FileMount]:
    found: dict[str, FileMount] = {}
    for path in IPC_SOCKETS:
        host = tree.resolve(path)
        if host is not None and Path(host).is_socket():
            found.setdefault(host, _mount(tree, host, path, IPC_OPTIONS))
    mps = tree.folder(MPS_PIPE_DIR)
    if mps is not None:
        found.setdefault(mps, _mount(tree, mps, MPS_PIPE_DIR, IPC_OPTIONS))
    return list(found.values())


def _firmware(tree: DriverRoot, roots: Roots, version: str) -> list[FileMount]:
    release = os.uname().release
    try:
        custom = roots.dev_path("sys/module/firmware_class/parameters/path").read_text().strip()
    except OSError:
        custom = ""
    dirs = [*([custom] if custom else []), f"/lib/firmware/updates/{release}",
            "/lib/firmware/updates", f"/lib/firmware/{release}", "/lib/firmware"]
    found: dict[str, FileMount] = {}
    for folder in dirs:
        sub = f"{folder}/nvidia/{version}"
        where = tree.resolve(sub)
        for host in _glob(where, "gsp*.bin") if where is not None else ():
            found.setdefault(host, _mount(tree, host, f"{sub}/{os.path.basename(host)}"))
    return list(found.values())


def _configs(tree: DriverRoot, search: Sequence[str] | None,
             xdg_data_dirs: str | None) -> list[FileMount]:
    # Without --config-search-path: /etc and the XDG data folders ($XDG_DATA_DIRS, absolute
    # entries only).
    xdg = [d.rstrip("/") or "/" for d in (xdg_data_dirs or "").split(":") if d.startswith("/")]
    dirs = tuple(search) if search else ("/etc", *dict.fromkeys(xdg or XDG_DATA_DIRS))
    found = []
    # The driver's application profiles (/usr/share/nvidia/nvidia-application-profiles-*)
    # are left out, as nvidia-ctk leaves them out (docs/developer/nvidia-ctk-parity.md).
    for rel, where in [*((r, "/usr/share") for r in SHARE_CONFIGS),
                       *((r, "/etc") for r in ETC_CONFIGS)]:
        # GKE's driver installs the Vulkan files at the top of its driver root.
        top = ("/",) if rel.startswith("vulkan/") and not search else ()
        hit = tree.first_file(f"{folder}/{rel}" for folder in (*dirs, *top))
        if hit is not None:
            found.append(_mount(tree, hit[1], f"{where}/{rel}"))
    return found


# --- entry ----------------------------------------------------------------------------------


def locate_driver(
    roots: Roots,
    version: str,
    *,
    library_search_paths: Sequence[str] | None = None,
    config_search_paths: Sequence[str] | None = None,
    xdg_data_dirs: str | None = None,
) -> DriverFiles:
    """Every driver artifact of ``version`` under the roots (missing ones are left out)."""
    tree = DriverRoot(roots.driver)
    search = library_search_paths
    folders, files = _driver_libraries(tree, version, search)
    folders32, files32 = ([], []) if search else _driver_libraries(tree, version, None,
                                                                    LIBRARY_DIRS_32)
    lib_dirs = [tree.container(f) for f in folders]
    xorg_mounts, xorg_links = _xorg(tree, lib_dirs, version)
    every = [*files, *files32]
    defaults = _default_folder_links(tree, every, search, (*LIBRARY_DIRS, *LIBRARY_DIRS_32))
    libraries = [*(_mount(tree, p) for p in every), *xorg_mounts]
    libraries += _wine_dlls(tree, folders, files, defaults)
    links = (_library_links(tree, files, folders, version)
             + _library_links(tree, files32, folders32, version) + xorg_links)
    # The host's own links first: where a folder has both, the link the host made wins.
    links = _anchor_links(tree, _unique_links([*defaults, *links]), libraries)
    return DriverFiles(
        version=version,
        lib_dirs=tuple(lib_dirs),
        lib32_dirs=tuple(tree.container(f) for f in folders32),
        libraries=tuple(libraries),
        links=tuple(_unique_links(links)),
        binaries=tuple(_binaries(tree)),
        ipc=tuple(_ipc(tree)),
        firmware=tuple(_firmware(tree, roots, version)),
        configs=tuple(_configs(tree, config_search_paths, xdg_data_dirs)),
        control_nodes=_device_nodes(roots, CONTROL_NODE_PATHS),
        skipped=tuple(f"{path}: {why}" for path, why in sorted(tree.skipped.items())),
    )


# --- per-device nodes -----------------------------------------------------------------------


class DeviceNodes(NamedTuple):
    """The nodes of one GPU or MIG device, and its ``/dev/dri/by-path`` links."""

    nodes: tuple[DeviceNodeInfo, ...]
    links: tuple[Link, ...] = ()


def gpu_nodes(roots: Roots, minor: int, bus_id: str) -> DeviceNodes:
    """``/dev/nvidia<minor>``, the GPU's DRM nodes and their ``/dev/dri/by-path`` links
    (those present in /dev only: a sysfs DRM entry without a /dev node, old kernels'
    controlD<N>, would fail every container that asks for the GPU)."""
    names = listdir(roots.dev_path(f"sys/bus/pci/devices/{bus_id}/drm"))
    nodes = _device_nodes(roots, [f"/dev/nvidia{minor}", *(f"/dev/dri/{n}" for n in names)])
    links = []
    for suffix in ("card", "render"):
        link = f"/dev/dri/by-path/pci-{bus_id}-{suffix}"
        try:
            target = os.readlink(roots.dev_path(link))
        except OSError:
            continue
        if any(n.path == os.path.normpath(f"/dev/dri/by-path/{target}") for n in nodes):
            links.append(Link(target=target, path=link, resolved=None))
    return DeviceNodes(nodes=nodes, links=tuple(links))


def read_mig_minors(roots: Roots) -> dict[str, str] | None:
    """``proc/driver/nvidia-caps/mig-minors`` as {key: minor, in digits}; None when it is
    missing.  The minors stay text: the file has thousands of lines, a spec uses a few of
    them, and ``generate`` makes numbers of those."""
    try:
        text = roots.proc_path("driver/nvidia-caps/mig-minors").read_text()
    except OSError:
        return None
    # ``<key> <minor>`` lines; a line whose rest, stripped, is not a number is no entry.
    table = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        value = value.strip()
        if value.isascii() and value.isdigit():  # int() refuses other scripts' digits
            table[key] = value
    return table


# Management mode takes every NVIDIA node except those of other subsystems.
_MANAGEMENT_SKIP = ("nvidia-fs", "nvidia-nvswitch", "nvidia-nvlink")


def management_nodes(roots: Roots) -> tuple[DeviceNodeInfo, ...]:
    paths = [f"/dev/{n}" for n in listdir(roots.dev_path("/dev"))
             if n.startswith("nvidia") and not n.startswith(_MANAGEMENT_SKIP)]
    paths += [f"/dev/nvidia-caps/{n}" for n in listdir(roots.dev_path("/dev/nvidia-caps"))
              if n.startswith("nvidia-cap")]
    paths += [f"/dev/nvidia-caps-imex-channels/{n}"
              for n in listdir(roots.dev_path("/dev/nvidia-caps-imex-channels"))
              if n.startswith("channel")]
    return _device_nodes(roots, paths)
