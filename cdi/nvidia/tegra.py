"""A Jetson (Tegra) node's driver files, found from its CSV mount specs (``--mode csv``).

The entries of :mod:`cdi.nvidia.mountspec` become the same plain values the other modes
produce (:class:`~cdi.nvidia.driver.DriverFiles` and the GPU's
:class:`~cdi.nvidia.driver.DeviceNodes`), so that ``generate.py`` builds the spec as for
any node; what each kind becomes, as ``nvidia-ctk cdi generate --mode csv`` makes it:
docs/usage/jetson.md. Every path is resolved inside the driver root; an entry that finds
nothing is left out and reported (a board lists files only some of its modules have).
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from cdi.linux.elf import ElfError, read_soname
from cdi.nvidia.discover import Roots, cuda_version, listdir, nvml_session, nvml_text
from cdi.nvidia.driver import (
    DeviceNodeInfo,
    DeviceNodes,
    DriverFiles,
    DriverRoot,
    FileMount,
    Link,
    stat_device_node,
)
from cdi.nvidia.mountspec import MountSpec

RELEASE_FILE = "/etc/nv_tegra_release"
# Where CUDA images for Orin keep their forward-compatibility libraries (nvidia-ctk's
# default for --csv.compat-container-root, used only on an Orin).
ORIN_COMPAT_ROOT = "/usr/local/cuda/compat_orin"
# Links made beside a versioned library whatever the host has: (file name pattern, link
# target, link name); ``{name}`` is the library's own file name.
_EXTRA_LINKS = (
    ("libcuda.so.*.*", "libcuda.so.1", "libcuda.so"),
    ("libGLX_nvidia.so.*.*", "{name}", "libGLX_indirect.so.0"),
    ("libnvidia-opticalflow.so.*.*", "libnvidia-opticalflow.so.1", "libnvidia-opticalflow.so"),
)
_WILDCARDS = frozenset("*?[")


class TegraFiles(NamedTuple):
    driver: DriverFiles  # the mounts, links and library folders (spec-wide edits)
    nodes: DeviceNodes  # the GPU device's nodes
    missing: tuple[str, ...]  # "FILE:LINE: KIND PATH", entries that found nothing


class NvmlFacts(NamedTuple):
    driver_version: str
    cuda_version: str  # "12.6"
    gpus: tuple[str, ...]  # names, by NVML index


def integrated(name: str) -> bool:
    """An integrated GPU by its NVML name: an Orin's ``Orin (nvgpu)``, or a Thor."""
    return "(nvgpu)" in name or "NVIDIA Thor" in name


def is_tegra(roots: Roots) -> bool:
    """Tegra's files: the L4T release file, or a SoC family named tegra."""
    if (roots.driver / RELEASE_FILE.lstrip("/")).is_file():
        return True
    try:
        with open(roots.dev_path("sys/devices/soc0/family"), "rb") as file:
            return file.read(64).lower().startswith(b"tegra")
    except OSError:
        return False


def nvml_facts(library: Path) -> NvmlFacts:
    """The GPU names and versions from the board's NVML (DiscoveryError when it fails)."""
    with nvml_session(library, "reading the board's NVML") as nvml:
        names = tuple(nvml_text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i)))
                      for i in range(int(nvml.nvmlDeviceGetCount())))
        return NvmlFacts(driver_version=nvml_text(nvml.nvmlSystemGetDriverVersion()),
                         cuda_version=cuda_version(nvml), gpus=names)


# --- paths inside a root --------------------------------------------------------------------


class _Root(DriverRoot):
    """A root (driver or dev) seen from inside, as a chroot would show it, with what the CSV
    entries need: wildcards, the file a path ends at, a link's text."""

    def expand(self, pattern: str) -> list[str]:
        """The paths in the root that ``pattern`` (absolute, maybe with wildcards in any
        component) names, as written (links not resolved), in name order. A component
        without wildcards is kept as it is, existing or not."""
        paths = ["/"]
        for part in (p for p in pattern.split("/") if p):
            if _WILDCARDS.isdisjoint(part):
                paths = [posixpath.join(p, part) for p in paths]
                continue
            found = []
            for folder in paths:
                host = self.resolve(folder)
                names = listdir(host) if host is not None else []
                found += [posixpath.join(folder, n) for n in fnmatch.filter(names, part)]
            paths = found
        return paths

    def end(self, path: str, *, folder: bool = False) -> str | None:
        """The host path of the folder (``folder``) or the other thing ``path`` ends at;
        None when it ends at nothing, or at the other kind."""
        host = self.resolve(path)
        try:
            st = os.stat(host) if host is not None else None
        except OSError:  # missing
            return None
        return host if st is not None and stat.S_ISDIR(st.st_mode) == folder else None

    def readlink(self, path: str) -> str | None:
        """The text of the link at ``path`` (its folder resolved), or None if it is none."""
        folder = self.resolve(posixpath.dirname(path))
        try:
            return os.readlink(os.path.join(folder, posixpath.basename(path))) if folder else None
        except OSError:
            return None


def _under(prefix: str, path: str) -> str:
    """``path`` under the folder ``prefix`` (both in a root; Go's filepath.Join)."""
    return posixpath.normpath(f"{prefix.rstrip('/')}/{path.lstrip('/')}")


# --- the entries ----------------------------------------------------------------------------


class _Found:
    """What the entries found so far, de-duplicated in first-found order."""

    def __init__(self) -> None:
        self.nodes: dict[str, DeviceNodeInfo] = {}
        self.mounts: dict[str, FileMount] = {}  # by host path
        self.links: dict[str, Link] = {}  # by container path
        self.missing: list[str] = []

    def mount(self, host: str, path: str) -> FileMount:
        return self.mounts.setdefault(host, FileMount(host=host, path=path))


def locate_tegra(roots: Roots, entries: Sequence[MountSpec],
                 library_search_paths: Sequence[str] = ()) -> TegraFiles:
    """Every entry of ``entries`` found under ``roots``; ``library_search_paths``
    (``--library-search-path``): folders a ``lib`` or ``sym`` entry is also looked for
    in, before the root itself."""
    driver, dev = _Root(roots.driver), _Root(roots.dev)
    found = _Found()
    search = [*library_search_paths, "/"]
    for entry in (e for e in entries if e.kind == "dev"):
        _device(roots, dev, entry, found)
    for entry in (e for e in entries if e.kind == "dir"):
        _folder(driver, entry, found)
    libraries: dict[FileMount, None] = {}
    for entry in (e for e in entries if e.kind == "lib"):
        libraries.update(dict.fromkeys(_files(driver, entry, search, found)))
    for entry in (e for e in entries if e.kind == "sym"):
        _files(driver, entry, search, found)
        _chain_links(driver, entry, found)
    release = driver.file(RELEASE_FILE)
    if release is not None:
        found.mount(release, RELEASE_FILE)
    # The links beside the libraries first; where a sym line's chain makes the same link,
    # the host's own text wins.
    links = {k.path: k for m in libraries for k in _library_links(m)} | found.links
    mounts = tuple(found.mounts.values())
    return TegraFiles(
        driver=DriverFiles(
            version="", lib_dirs=_library_folders(mounts), libraries=mounts,
            links=tuple(links.values()), binaries=(), ipc=(), firmware=(), configs=(),
            control_nodes=()),
        nodes=DeviceNodes(nodes=tuple(found.nodes.values())),
        missing=tuple(found.missing))


def _device(roots: Roots, dev: _Root, entry: MountSpec, found: _Found) -> None:
    hits = [node for prefix in ("/", "/dev") for path in dev.expand(_under(prefix, entry.path))
            if (node := stat_device_node(roots, path)) is not None]
    if not hits:
        found.missing.append(f"{entry.source}: dev {entry.path}")
    for node in hits:
        found.nodes.setdefault(node.path, node)


def _folder(driver: _Root, entry: MountSpec, found: _Found) -> None:
    hits = [(path, host) for path in driver.expand(_under("/", entry.path))
            if (host := driver.end(path, folder=True)) is not None]
    if not hits:
        found.missing.append(f"{entry.source}: dir {entry.path}")
    for path, host in hits:
        found.mount(host, path)


def _files(driver: _Root, entry: MountSpec, search: Sequence[str],
           found: _Found) -> list[FileMount]:
    """The files (not folders) a ``lib`` or ``sym`` entry ends at, each mounted at the path
    it resolves to."""
    out = []
    for prefix in search:
        for path in driver.expand(_under(prefix, entry.path)):
            if (host := driver.end(path)) is not None:
                out.append(found.mount(host, driver.container(host)))
    if not out:
        found.missing.append(f"{entry.source}: {entry.kind} {entry.path}")
    return out


def _chain_links(driver: _Root, entry: MountSpec, found: _Found) -> None:
    """The links of a ``sym`` entry's chain: the listed link, the one its text names, ...,
    each with its own text, up to the file they end at."""
    for path in driver.expand(_under("/", entry.path)):
        host = driver.end(path)
        if host is None:
            continue
        last = found.mount(host, driver.container(host))
        seen = set()
        while path not in seen:
            seen.add(path)
            text = driver.readlink(path)
            if text is None:
                break
            found.links.setdefault(path, Link(target=text, path=path,
                                              resolved=last._replace(path=path)))
            path = posixpath.normpath(posixpath.join(posixpath.dirname(path), text))


def _library_links(library: FileMount) -> list[Link]:
    """The links a versioned library gets beside it: the fixed ones of ``_EXTRA_LINKS``,
    and its SONAME and ``.so`` links where the host folder has them as links."""
    folder, name = posixpath.split(library.path)
    host_folder = os.path.dirname(library.host)
    wanted = [(target.format(name=name), link) for pattern, target, link in _EXTRA_LINKS
              if fnmatch.fnmatchcase(name, pattern)]
    if fnmatch.fnmatchcase(name, "*.*.*"):
        try:
            soname = read_soname(library.host) or name
        except (OSError, ElfError):
            soname = None  # not an ELF library: no SONAME to link by
        if soname is not None:
            dev_name = _dev_link_name(soname)
            wanted += [(target, link) for target, link in ((name, soname), (soname, dev_name))
                       if link and link != target
                       and os.path.islink(os.path.join(host_folder, link))]
    return [Link(target=target, path=f"{folder}/{link}",
                 resolved=library._replace(path=f"{folder}/{link}")) for target, link in wanted]


def _dev_link_name(soname: str) -> str:
    """The ``.so`` name of a library name: ``libfoo.so.1.2`` -> ``libfoo.so``; "" for a
    name without ``.so``."""
    if soname.endswith(".so"):
        return soname
    stem, sep, _ = soname.rpartition(".so.")
    return stem + ".so" if sep else ""


def _library_folders(mounts: Iterable[FileMount]) -> tuple[str, ...]:
    """The folders of the mounted libraries (``lib?*.so`` or ``lib?*.so.<suffix>``)."""
    return tuple(dict.fromkeys(posixpath.dirname(m.path) for m in mounts
                               if _is_library_name(posixpath.basename(m.path))))


def _is_library_name(name: str) -> bool:
    if not fnmatch.fnmatchcase(name, "lib?*.so*"):
        return False
    after = name.rsplit(".so", 1)[1]
    return after == "" or after.startswith(".")

