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

Paths are handled as plain strings, and each run resolves and lists a folder once: a run
probes a few hundred candidate paths in a few dozen folders, and making pathlib objects for
them used to cost more than the system calls.  Host paths are spelled exactly as pathlib
would spell them (the spec is compared byte for byte).
"""

import errno
import fnmatch
import os
import posixpath
import stat
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from cdi.linux.elf import ElfError, is_elf, read_soname
from cdi.linux.ldcache import (
    LdCacheError,
    find_libraries,
    host_path,
    read_ldcache,
    resolve_from,
    root_prefix,
)
from cdi.nvidia.discover import Roots, read_text, under

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
CONFIG_DIRS = ("/etc", "/usr/local/share", "/usr/share")
# $XDG_DATA_DIRS when unset or empty (the XDG base directory spec's default).
XDG_DATA_DIRS = ("/usr/local/share", "/usr/share")
XORG_SUBDIRS = ("drivers", "extensions", "updates/drivers", "updates/extensions")
XORG_BASES = ("/usr/lib/xorg/modules", "/usr/lib64/xorg/modules", "/usr/X11R6/lib/modules",
              "/usr/X11R6/lib64/modules")
FILE_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
IPC_OPTIONS = ("nosuid", "nodev", "rbind", "rprivate", "noexec")
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
                 "libnvidia-cbl.so", "libnvidia-api.so"),
    "ngx": ("libnvidia-ngx.so", "nvngx.dll", "_nvngx.dll"),
    # The X server's driver and GLX modules.
    "display": ("nvidia_drv.so", "libglxserver_nvidia.so"),
}


# The same table, as what a basename may start with: ``prefix.`` (``libcuda.so.1``).
_CAPABILITY_DOTTED = {cap: tuple(p + "." for p in prefixes)
                      for cap, prefixes in CAPABILITY_PREFIXES.items()}


def capability_of(basename: str) -> str | None:
    # "libcuda.so" must match "libcuda.so.1" but "nvidia-smi" only itself.
    for capability, prefixes in CAPABILITY_PREFIXES.items():
        if basename in prefixes or basename.startswith(_CAPABILITY_DOTTED[capability]):
            return capability
    return None


class FileMount(NamedTuple):
    host: str  # host path (under the driver root)
    path: str  # container path
    kind: str  # library, binary, config, firmware, ipc, xorg
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

# A folder resolved inside the root: its components (none of them a link), the links
# followed to get there, and whether it is a folder: True; False when it certainly is not
# (so nothing under it exists); None when stat failed otherwise (ask the kernel each time).
_Folder = tuple[list[str], int, bool | None]
_MISSING_ERRNOS = (errno.ENOENT, errno.ENOTDIR)
# errnos that pathlib's is_dir()/is_file() answer False to; any other error propagates.
_PATHLIB_IGNORED = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)


class _Tree:
    """The driver root as seen from inside (like a chroot), for one run.

    Paths resolve as ``ldcache.resolve_in_root`` resolves them, but each folder is resolved
    once (from its resolved parent) and listed at most once: a file probed in a known
    folder then costs one ``lstat``, and one in a missing folder none.  Nothing outlives the
    run, so a long-lived caller sees a node that changed.
    """

    def __init__(self, root: Path) -> None:
        self.root = os.fspath(root)
        self._prefix = root_prefix(self.root)
        self._folders: dict[str, _Folder] = {"": ([], 0, _folder_state(self.root))}
        self._listings: dict[str, list[os.DirEntry[str]]] = {}
        # Host paths left out (a link loop, a SONAME naming another folder) and why:
        # reported, never fatal (one bad file must not cost the node its whole spec).
        self.skipped: dict[str, str] = {}

    def host(self, container: str) -> str:
        """The host path of a resolved container path (absolute, normal)."""
        return self.root if container == "/" else self._prefix + container[1:]

    def container(self, host: str) -> str:
        """The container path of a host path under the root: ``/`` + its relative path."""
        rel = host[len(self._prefix):]
        if (self.root != "." and host.startswith(self._prefix) and rel and "//" not in rel
                and not rel.startswith((".", "/")) and "/." not in rel and not rel.endswith("/")):
            return "/" + rel  # already what relpath would make of it
        rel = os.path.relpath(host, self.root)  # "..", "." or the root itself: spell it out
        return "/" if rel == "." else "/" + rel

    def lookup(self, path: str) -> tuple[str, os.stat_result | None]:
        """``path`` resolved inside the root, and what ``os.stat`` says of it (None where
        that fails).  Folders are normalised first (lexically, ``..`` included), and only
        the last component is followed when it is a link."""
        folder, _, name = _normal(path).rpartition("/")
        parts, _hops, state = self._folder(folder)
        if not name:
            return "/", _stat(self.root)
        resolved = [*parts, name]
        if state is False:
            return "/" + "/".join(resolved), None  # in no folder: no file either
        try:
            st = os.lstat(self.host("/" + "/".join(resolved)))
        except OSError:
            return "/" + "/".join(resolved), None
        if stat.S_ISLNK(st.st_mode):
            # The folder's components are no links, so this is the walk from the top.
            walked = self._walk(parts, name, 0)
            if walked is None:
                return "/" + "/".join(resolved), None
            container = "/" + "/".join(walked[0])
            return container, _stat(self.host(container))
        return "/" + "/".join(resolved), st  # not a link: lstat is stat

    def resolve(self, path: str) -> str:
        return self.lookup(path)[0]

    def glob(self, folder: str, pattern: str) -> list[str]:
        """Host paths of the regular files (links followed) in the host folder ``folder``
        whose names match ``pattern``, in name order."""
        entries = self._listings.get(folder)
        if entries is None:
            entries = self._listings[folder] = _scandir(folder)
        match = star_matcher(pattern)
        if match is None:
            names = set(fnmatch.filter([e.name for e in entries], pattern))  # one compile
            match = names.__contains__
        return [host_path(folder, (e.name,)) for e in entries
                if match(e.name) and _entry_is_file(e)]

    def _folder(self, folder: str) -> _Folder:
        known = self._folders.get(folder)
        if known is None:
            parent, _, name = folder.rpartition("/")
            parts, hops, state = self._folder(parent)
            if state is False:  # nothing under it exists, so no component is a link
                known = ([*parts, name], hops, False)
            else:
                walked = self._walk(parts, name, hops)
                if walked is None:
                    known = ([*parts, name], hops, False)
                else:
                    parts, hops = walked
                    known = (parts, hops, _folder_state(self.host("/" + "/".join(parts))))
            self._folders[folder] = known
        return known


    def _walk(self, parts: list[str], rest: str, hops: int) -> tuple[list[str], int] | None:
        try:
            return resolve_from(self.root, parts, rest, hops)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            where = exc.filename or self.host("/" + "/".join([*parts, rest]))
            self.skipped[where] = "too many levels of symbolic links (a link loop)"
            return None


def star_matcher(pattern: str) -> Callable[[str], bool] | None:
    """What ``fnmatch`` matches (on POSIX) for a pattern whose only wildcard is ``*`` (all of
    ours), without compiling a regular expression: a run globs a dozen patterns once each,
    and compiling them cost more than the matching.  None for other patterns."""
    if "?" in pattern or "[" in pattern:
        return None
    if "*" not in pattern:
        return pattern.__eq__
    head, *middle, tail = pattern.split("*")
    least = len(head) + len(tail) + sum(map(len, middle))

    def match(name: str) -> bool:
        if len(name) < least or not name.startswith(head) or not name.endswith(tail):
            return False
        pos, end = len(head), len(name) - len(tail)
        for part in middle:  # leftmost placement of each part leaves the most room after it
            found = name.find(part, pos, end)
            if found < 0:
                return False
            pos = found + len(part)
        return True

    return match


def _normal(path: str) -> str:
    """``path`` as an absolute path with one leading slash, lexically normalised."""
    path = "/" + path.lstrip("/")
    if "//" in path or "/." in path or (path.endswith("/") and path != "/"):
        return posixpath.normpath(path)
    return path


def _folder_state(host: str) -> bool | None:
    try:
        return stat.S_ISDIR(os.stat(host).st_mode)
    except OSError as exc:
        return False if exc.errno in _MISSING_ERRNOS else None


def _stat(host: str) -> os.stat_result | None:
    try:
        return os.stat(host)
    except OSError:
        return None


def _is_dir(host: str) -> bool:
    """``Path(host).is_dir()``: errors other than "not there" propagate."""
    try:
        return stat.S_ISDIR(os.stat(host).st_mode)
    except OSError as exc:
        if exc.errno not in _PATHLIB_IGNORED:
            raise
        return False
    except ValueError:
        return False


def _is_regular(st: os.stat_result | None) -> bool:
    return st is not None and stat.S_ISREG(st.st_mode)


def _scandir(folder: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as entries:
            return sorted(entries, key=lambda e: e.name)
    except OSError:
        return []


def _entry_is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()  # d_type answers for all but links: no stat
    except OSError:
        return False


def _parent(host: str) -> str:
    """``str(Path(host).parent)`` for a pathlib-normal path."""
    folder = host.rpartition("/")[0]
    if folder.strip("/"):
        return folder
    return host[: host.rindex("/") + 1] if "/" in host else "."


def _name(host: str) -> str:
    return host.rpartition("/")[2]


def _child(folder: str, name: str) -> str:
    """``str(Path(folder) / name)``; ``name`` is usually a plain file name, but a SONAME
    read from a file can be anything."""
    if not name or name == "." or "/" in name:
        return os.fspath(Path(folder) / name)
    return host_path(folder, (name,))


def _mount(tree: _Tree, host: str, kind: str, path: str | None = None,
           options: tuple[str, ...] = FILE_OPTIONS) -> FileMount:
    return FileMount(host=host, path=path or tree.container(host), kind=kind, options=options)


def _listdir(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


# --- device nodes ---------------------------------------------------------------------------


def stat_device_node(roots: Roots, path: str) -> DeviceNodeInfo | None:
    """The character device at ``path`` (a /dev path) under the dev root, or None."""
    host = under(roots.dev, path)
    try:
        st = os.stat(host)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return DeviceNodeInfo(path=path, host=host, type="c",
                          major=os.major(st.st_rdev), minor=os.minor(st.st_rdev),
                          mode=stat.S_IMODE(st.st_mode), gid=st.st_gid)


def control_nodes(roots: Roots) -> tuple[DeviceNodeInfo, ...]:
    found = (stat_device_node(roots, p) for p in CONTROL_NODE_PATHS)
    return tuple(n for n in found if n is not None)


# --- libraries ------------------------------------------------------------------------------


def _scan_dirs(tree: _Tree, dirs: Sequence[str]) -> list[str]:
    """The distinct real folders (resolved in the driver root) among ``dirs``."""
    seen: dict[str, None] = {}
    for folder in dirs:
        real = tree.host(tree.resolve(folder))
        if _is_dir(real):
            seen.setdefault(real)
    return list(seen)


def _ldcache_files(tree: _Tree, patterns: Sequence[str]) -> list[str]:
    cache = host_path(tree.root, ("etc", "ld.so.cache"))
    try:
        entries = read_ldcache(cache)
    except (OSError, LdCacheError):
        return []
    return [os.fspath(p) for p in find_libraries(entries, patterns, root=tree.root)]


def find_version_from_libraries(roots: Roots, search: Sequence[str] | None) -> str | None:
    """The RM version from ``libcuda.so.<v>`` or ``libnvidia-ml.so.<v>`` file names."""
    tree = _Tree(roots.driver)
    for stem in ("libcuda.so.", "libnvidia-ml.so."):
        for path in _library_candidates(tree, search, [stem + "*.*"]):
            suffix = _name(path)[len(stem):]
            if suffix.replace(".", "").isdigit():
                return suffix
    return None


def _library_candidates(tree: _Tree, search: Sequence[str] | None,
                        patterns: Sequence[str],
                        defaults: Sequence[str] = LIBRARY_DIRS) -> list[str]:
    folders = _scan_dirs(tree, search if search else defaults)
    found = [p for folder in folders for pat in patterns for p in tree.glob(folder, pat)]
    if not found and not search and defaults is LIBRARY_DIRS:
        # The loader's own view: finds drivers installed outside the usual folders.
        found = _ldcache_files(tree, patterns)
    return list(dict.fromkeys(found))


def find_nvml_library(roots: Roots, search: Sequence[str] | None) -> Path | None:
    """The ``libnvidia-ml.so.1`` under the driver root, resolved to its file."""
    tree = _Tree(roots.driver)
    for folder in _scan_dirs(tree, search if search else LIBRARY_DIRS):
        found, st = tree.lookup(tree.container(folder) + "/libnvidia-ml.so.1")
        if _is_regular(st):
            return Path(tree.host(found))
    if not search:
        hits = _ldcache_files(tree, ["libnvidia-ml.so.1"])
        return Path(hits[0]) if hits else None
    return None


def _driver_libraries(tree: _Tree, version: str, search: Sequence[str] | None,
                      defaults: Sequence[str] = LIBRARY_DIRS) -> tuple[list[str], list[str]]:
    """(library folders, library files) of the driver, as host paths."""
    seeds = _library_candidates(tree, search, [f"*.so.{version}"], defaults)
    files: list[str] = []
    for folder in dict.fromkeys(_parent(p) for p in seeds):
        files += tree.glob(folder, f"*.so.{version}")
        for pattern in GRAPHICS_LIBRARIES:
            files += tree.glob(folder, pattern)
        vdpau = tree.host(tree.resolve(tree.container(folder) + "/vdpau"))  # links in the root
        files += tree.glob(vdpau, f"*.so.{version}")
    files = list(dict.fromkeys(files))
    # Folders that hold a library (vdpau/ included), in first-seen order.
    return list(dict.fromkeys(_parent(p) for p in files)), files


def _library_links(tree: _Tree, files: Sequence[str], folders: Sequence[str],
                   version: str) -> list[Link]:
    links: list[Link | None] = []  # each ends at a library
    for path in files:
        folder, name = _parent(path), _name(path)
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
            links.append(_link(tree, tree.container(_child(folder, name)), target))
        links.append(_host_link(tree, _child(folder, "gbm"), "nvidia-drm_gbm.so"))
    return _unique_links(links)


def _default_folder_links(tree: _Tree, files: Sequence[str], search: Sequence[str] | None,
                          dirs: Sequence[str]) -> list[Link]:
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
            where = _child(folder, sub) if sub else folder
            entries = _scandir(where)
            plain = {e.name for e in entries if not e.is_symlink()}
            for entry in entries:
                if not entry.is_symlink():
                    continue
                text = os.readlink(entry.path)
                # Most links in a system folder name a plain file beside them (a SONAME
                # link): one that is no driver file needs no walk (a few hundred per run).
                if "/" not in text and text in plain and _child(where, text) not in ends:
                    continue
                container = tree.container(_child(where, entry.name))
                end, st = tree.lookup(container)
                if _is_regular(st) and tree.host(end) in ends:
                    links.append(Link(target=text, path=container,
                                      resolved=FileMount(host=tree.host(end), path=container,
                                                         kind="library")))
    return links


def _anchor_links(tree: _Tree, links: Iterable[Link], mounts: Sequence[FileMount]) -> list[Link]:
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


def _wine_dlls(tree: _Tree, folders: Sequence[str], files: Sequence[str],
               links: Sequence[Link]) -> list[FileMount]:
    """NGX's Windows DLLs (``nvidia/wine/*.dll`` beside the 64-bit libraries), where they
    are and beside every 64-bit libGLX_nvidia.so.0 link, the folder Proton looks in."""
    found: dict[str, FileMount] = {}
    ours = set(files)
    glx = [posixpath.dirname(k.path) for k in links
           if posixpath.basename(k.path) == "libGLX_nvidia.so.0"
           and k.resolved is not None and k.resolved.host in ours]
    for folder in folders:
        for host in tree.glob(_child(folder, WINE_DLLS), "*.dll"):
            name = _name(host)
            for where in (tree.container(_parent(host)), *(f"{g}/{WINE_DLLS}" for g in glx)):
                path = f"{where}/{name}"
                found.setdefault(path, _mount(tree, host, "library", path))
    return list(found.values())


def _is_file_name(soname: str) -> bool:
    # A SONAME is read from the library itself: one naming another folder ("../x", "/etc/x")
    # is no link the driver made next to it, and would put a link outside the folder.
    return soname not in (".", "..") and "/" not in soname and "\0" not in soname


def _host_link(tree: _Tree, folder: str, name: str) -> Link | None:
    path = _child(folder, name)
    try:
        target = os.readlink(path)
    except OSError:
        return None  # only links the driver made on the host are recreated
    return _link(tree, tree.container(path), target)


def _link(tree: _Tree, container: str, target: str) -> Link | None:
    # Follow the target rather than the link: a link we add may not exist on the host.
    end, st = tree.lookup(posixpath.join(posixpath.dirname(container), target))
    if not _is_regular(st):
        return None
    return Link(target=target, path=container,
                resolved=FileMount(host=tree.host(end), path=container, kind="library"))


def _unique_links(links: Iterable[Link | None]) -> list[Link]:
    seen: dict[str, Link] = {}
    for link in links:
        if link is not None:
            seen.setdefault(link.path, link)
    return sorted(seen.values(), key=lambda k: k.path)


def _xorg(tree: _Tree, lib_dirs: Sequence[str],
          version: str) -> tuple[list[FileMount], list[Link]]:
    """The X server's NVIDIA driver and GLX modules, mounted in the folders Xorg loads them
    from (``<modules>/drivers``, ``<modules>/extensions``), wherever the host keeps the
    files (Debian: /usr/lib/nvidia/current, reached through /etc/alternatives links).  The
    GLX module is looked for versioned, then by the unversioned name Debian's links have."""
    bases = list(XORG_BASES) + [f"{d}/nvidia/xorg" for d in lib_dirs]
    bases += [f"{d}/xorg/modules" for d in lib_dirs]
    mounts: list[FileMount] = []
    links: list[Link] = []
    glx = f"libglxserver_nvidia.so.{version}"
    for names, sub in ((("nvidia_drv.so",), "drivers"),
                       ((glx, "libglxserver_nvidia.so"), "extensions")):
        for name in names:
            hit = _first_xorg(tree, bases, name)
            if hit is None:
                continue
            found, host = hit
            base = next((b for b in XORG_BASES if found.startswith(b + "/")), None)
            path = found if base is not None else f"{XORG_BASES[0]}/{sub}/{name}"
            mounts.append(_mount(tree, host, "library", path))
            if name == glx:
                unversioned = f"{posixpath.dirname(path)}/libglxserver_nvidia.so"
                links.append(Link(target=name, path=unversioned,
                                  resolved=FileMount(host=host, path=unversioned,
                                                     kind="library")))
            break
    return mounts, links


def _first_xorg(tree: _Tree, bases: Sequence[str], name: str) -> tuple[str, str] | None:
    """(the container path it was found at, the host file it ends at)."""
    for base in bases:
        if base.endswith("/nvidia/xorg"):
            subdirs: tuple[str, ...] = ("",)
        else:
            subdirs = XORG_SUBDIRS
        for sub in subdirs:
            path = f"{base}/{sub}/{name}" if sub else f"{base}/{name}"
            found, st = tree.lookup(path)
            if _is_regular(st):
                return _normal(path), tree.host(found)
    return None


# --- other files ----------------------------------------------------------------------------


def _binaries(tree: _Tree) -> list[FileMount]:
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
            resolved, st = tree.lookup(f"{folder}/{name}")
            host = tree.host(resolved)
            if _is_regular(st) and os.access(host, os.X_OK):
                hosts.append((folder, host))
        if hosts:
            program = next((h for _, h in hosts if is_elf(h)), hosts[0][1])
            found.append(_mount(tree, program, "binary", path=f"{hosts[0][0]}/{name}"))
    return found


def _ipc(tree: _Tree) -> list[FileMount]:
    found: dict[str, FileMount] = {}
    for path in IPC_SOCKETS:
        resolved, st = tree.lookup(path)
        if st is not None and stat.S_ISSOCK(st.st_mode):
            host = tree.host(resolved)
            found.setdefault(host, _mount(tree, host, "ipc", path, IPC_OPTIONS))
    mps = tree.host(tree.resolve(MPS_PIPE_DIR))
    if _is_dir(mps):
        found.setdefault(mps, _mount(tree, mps, "ipc", MPS_PIPE_DIR, IPC_OPTIONS))
    return list(found.values())


def _firmware(tree: _Tree, roots: Roots, version: str) -> list[FileMount]:
    release = os.uname().release
    dirs = []
    try:
        custom = read_text(under(roots.dev, "sys/module/firmware_class/parameters/path")).strip()
    except OSError:
        custom = ""
    if custom:
        dirs.append(custom)
    dirs += [f"/lib/firmware/updates/{release}", "/lib/firmware/updates",
             f"/lib/firmware/{release}", "/lib/firmware"]
    found: dict[str, FileMount] = {}
    for folder in dirs:
        sub = f"{folder}/nvidia/{version}"
        for host in tree.glob(tree.host(tree.resolve(sub)), "gsp*.bin"):
            found.setdefault(host, _mount(tree, host, "firmware", f"{sub}/{_name(host)}"))
    return list(found.values())


def config_dirs(xdg_data_dirs: str | None) -> tuple[str, ...]:
    """``/etc`` and the XDG data folders (``$XDG_DATA_DIRS``: absolute entries only)."""
    xdg = [d.rstrip("/") or "/" for d in (xdg_data_dirs or "").split(":") if d.startswith("/")]
    return ("/etc", *dict.fromkeys(xdg or XDG_DATA_DIRS))


def _configs(tree: _Tree, search: Sequence[str] | None,
             xdg_data_dirs: str | None = None, version: str = "") -> list[FileMount]:
    dirs = tuple(search) if search else config_dirs(xdg_data_dirs)
    found = []
    # The driver's application profiles, read by its GL/EGL/Vulkan libraries from
    # /usr/share/nvidia under their versioned names.
    profiles = [f"nvidia/nvidia-application-profiles-{version}-{kind}"
                for kind in ("rc", "key-documentation")] if version else []
    for rel, where in [*((r, "/usr/share") for r in (*SHARE_CONFIGS, *profiles)),
                       *((r, "/etc") for r in ETC_CONFIGS)]:
        # GKE's driver installs the Vulkan files at the top of its driver root.
        top = ("/",) if rel.startswith("vulkan/") and not search else ()
        for folder in (*dirs, *top):
            resolved, st = tree.lookup(f"{folder}/{rel}")
            if _is_regular(st):
                found.append(_mount(tree, tree.host(resolved), "config", f"{where}/{rel}"))
                break
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
    tree = _Tree(roots.driver)
    search = library_search_paths
    folders, files = _driver_libraries(tree, version, search)
    folders32, files32 = ([], []) if search else _driver_libraries(tree, version, None,
                                                                    LIBRARY_DIRS_32)
    lib_dirs = [tree.container(f) for f in folders]
    xorg_mounts, xorg_links = _xorg(tree, lib_dirs, version)
    every = [*files, *files32]
    defaults = _default_folder_links(tree, every, search, (*LIBRARY_DIRS, *LIBRARY_DIRS_32))
    libraries = [*(_mount(tree, p, "library") for p in every), *xorg_mounts]
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
        configs=tuple(_configs(tree, config_search_paths, xdg_data_dirs, version)),
        control_nodes=control_nodes(roots),
        skipped=tuple(f"{path}: {why}" for path, why in sorted(tree.skipped.items())),
    )


# --- per-device nodes -----------------------------------------------------------------------


class DeviceNodes(NamedTuple):
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
    names = _listdir(under(roots.dev, f"sys/bus/pci/devices/{bus_id}/drm"))
    nodes = [stat_device_node(roots, f"/dev/dri/{name}") for name in names]
    present = [n for n in nodes if n is not None]
    links = []
    for suffix in ("card", "render"):
        link = f"/dev/dri/by-path/pci-{bus_id}-{suffix}"
        try:
            target = os.readlink(under(roots.dev, link))
        except OSError:
            continue
        if any(n.path == os.path.normpath(f"/dev/dri/by-path/{target}") for n in present):
            links.append(Link(target=target, path=link, resolved=None))
    return DeviceNodes(nodes=tuple(present), links=tuple(links))


def read_mig_minors(roots: Roots) -> dict[str, str] | None:
    """``proc/driver/nvidia-caps/mig-minors`` as {key: minor, in digits}; None when it is
    missing.  The minors stay text: the file has thousands of lines, a spec uses a few of
    them, and ``mig_cap_paths`` makes numbers of those."""
    try:
        text = read_text(under(roots.dev, "proc/driver/nvidia-caps/mig-minors"))
    except OSError:
        return None
    fast = _mig_minors_fast(text)
    if fast is not None:
        return fast
    # ``<key> <minor>`` lines; a line whose rest, stripped, is not a number is no entry.
    table = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        value = value.strip()
        if value.isascii() and value.isdigit():  # int() refuses other scripts' digits
            table[key] = value
    return table


def _mig_minors_fast(text: str) -> dict[str, str] | None:
    """The table in a few C-level passes when every line is ``<key> <digits>`` (as the driver
    writes the file: thousands of lines); None when any line is not, for the careful loop."""
    if "\t" in text or "\r" in text or "\n " in text or text.startswith(" "):
        return None
    tokens = text.split()
    if len(tokens) != 2 * len(text.splitlines()):
        return None  # a line with one or three words, or an empty line
    values = tokens[1::2]
    digits = "".join(values)
    if not (digits.isascii() and digits.isdigit()):
        return None
    return dict(zip(tokens[::2], values, strict=True))


def mig_cap_paths(minors: dict[str, str], parent_minor: int, gi: int, ci: int) -> tuple[str, str]:
    """The GPU-instance and compute-instance cap nodes of one MIG device."""
    gi_key = f"gpu{parent_minor}/gi{gi}/access"
    ci_key = f"gpu{parent_minor}/gi{gi}/ci{ci}/access"
    return (f"/dev/nvidia-caps/nvidia-cap{int(minors[gi_key])}",
            f"/dev/nvidia-caps/nvidia-cap{int(minors[ci_key])}")


# Management mode takes every NVIDIA node except those of other subsystems.
_MANAGEMENT_SKIP = ("nvidia-fs", "nvidia-nvswitch", "nvidia-nvlink")


def management_nodes(roots: Roots) -> tuple[DeviceNodeInfo, ...]:
    paths = [f"/dev/{n}" for n in _listdir(under(roots.dev, "/dev"))
             if n.startswith("nvidia") and not n.startswith(_MANAGEMENT_SKIP)]
    paths += [f"/dev/nvidia-caps/{n}" for n in _listdir(under(roots.dev, "/dev/nvidia-caps"))
              if n.startswith("nvidia-cap")]
    paths += [f"/dev/nvidia-caps-imex-channels/{n}"
              for n in _listdir(under(roots.dev, "/dev/nvidia-caps-imex-channels"))
              if n.startswith("channel")]
    found = (stat_device_node(roots, p) for p in paths)
    return tuple(n for n in found if n is not None)
