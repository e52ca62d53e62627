"""``enable-cuda-compat``: use the image's CUDA forward-compatibility libraries when they are
newer than the host driver, deciding as NVIDIA's hook of the same name does (:func:`use_compat`).

CUDA images can carry ``cuda-compat`` (``/usr/local/cuda/compat/libcuda.so.<version>``): a
user-space driver newer than the node's, which datacenter GPUs accept on an older kernel
module. The hook writes ``/etc/ld.so.conf.d/00-compat-nri-cdi.conf`` naming the folder, which
``update-ldcache``, run after it, puts ahead of the injected driver (as ``ldconfig`` would).
"""

from __future__ import annotations

import os
import struct
from types import SimpleNamespace

from cdi.hooks.ldconfig import CONF_DIR, write_file
from cdi.hooks.rootfs import (
    ForeignMountError,
    RootFS,
    RootFSError,
    describe_error,
    folder_names,
    split_container_path,
)
from cdi.linux.namedtuple import NamedTuple

# On the hook's start-up path (the generator runs enable-cuda-compat in every container):
# no re, fnmatch, json or dataclasses here (tests/hooks/test_one_process.py).

COMPAT_ROOT = "/usr/local/cuda/compat"
CONF_PATH = f"{CONF_DIR}/00-compat-nri-cdi.conf"
NOTE_SECTION = b".note.cuda.fwd_compatibility"
NOTE_OWNER = b"NVIDIA Corporation"
_SHT_NOTE = 7
_MAX_SECTIONS = 4096
_MAX_NOTE = 64 << 10
_MAX_SHSTRTAB = 1 << 20


class CompatNote(NamedTuple):
    cuda_version: str
    drivers: tuple[int, ...]


class CompatResult(NamedTuple):
    folder: str | None  # the compat folder put first, or None when not used
    reason: str  # why (one line, for the hook's message)
    warn: bool = False  # the reason names what in the image was skipped: the hook prints it


def parse_dotted_version(text: str | None) -> tuple[int, int, int] | None:
    """``580``, ``12.9`` or ``575.57.08`` as a comparable triple (missing parts are 0)."""
    text = (text or "").strip()
    parts = (text[1:] if text.startswith("v") else text).split(".")
    if len(parts) > 3 or not all(p.isdecimal() for p in parts):
        return None
    major, minor, patch = (*map(int, parts), 0, 0)[:3]
    return major, minor, patch


def use_compat(compat_version: str, host_driver: str, host_cuda: str,
               note: CompatNote | None) -> bool:
    """Whether the compat library of ``compat_version`` should win over the host driver: by
    its ``.note.cuda.fwd_compatibility`` note when it has one (the drivers it supports, else
    its CUDA version against the host's), else by the driver's major version alone."""
    compat, driver, cuda = (parse_dotted_version(compat_version), parse_dotted_version(host_driver),
                            parse_dotted_version(host_cuda))
    if note is not None:
        if compat is None or driver is None:
            wanted = parse_dotted_version(note.cuda_version)
            return cuda is not None and wanted is not None and wanted > cuda
        return driver[0] in note.drivers and compat > driver
    if host_cuda or compat is None or driver is None:
        return False  # a CUDA version alone can only be checked against the note
    return driver[0] < compat[0]


# --- the ELF note (untrusted bytes) -----------------------------------------------------------


def parse_note(data: bytes, *, little: bool, align: int) -> CompatNote | None:
    """The JSON description of an NVIDIA note section (``{"CUDA Version": "12.9", "Driver":
    [535, 550], ...}``), or None when it is not one."""
    order = "<" if little else ">"
    if len(data) < 12:
        return None
    namesz, descsz, _ = struct.unpack_from(f"{order}III", data)
    if not namesz or not descsz:
        return None
    step = max(align, 1)
    name_end = 12 + (namesz + step - 1) // step * step
    if data[12:12 + namesz].strip(b"\0") != NOTE_OWNER:
        return None
    import json  # lazy: it imports re, off the hook's start; a note only

    try:
        desc = json.loads(data[name_end:name_end + descsz].strip(b"\0"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(desc, dict):
        return None
    cuda = desc.get("CUDA Version")
    drivers = desc.get("Driver")
    return CompatNote(
        cuda_version=cuda if isinstance(cuda, str) else "",
        drivers=tuple(d for d in drivers if type(d) is int) if isinstance(drivers, list) else ())


def read_compat_note(fd: int) -> CompatNote | None:
    """The ``.note.cuda.fwd_compatibility`` note of the ELF file open at ``fd``, if any. The
    file is the image's: every offset and size is checked against its size before a read, so
    a malformed header is ``None`` or a :class:`ValueError` naming it, never a huge read."""
    size = os.fstat(fd).st_size
    head = os.pread(fd, 64, 0)
    if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        return None
    is64, little = head[4] == 2, head[5] == 1
    if is64 and len(head) < 64:
        raise ValueError("truncated ELF header")
    o = "<" if little else ">"
    if is64:
        shoff, = struct.unpack_from(f"{o}Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from(f"{o}HHH", head, 0x3A)
        fmt, entry = f"{o}IIQQQQIIQQ", 64
    else:
        shoff, = struct.unpack_from(f"{o}I", head, 0x20)
        shentsize, shnum, shstrndx = struct.unpack_from(f"{o}HHH", head, 0x2E)
        fmt, entry = f"{o}IIIIIIIIII", 40
    if shentsize != entry or not 0 < shnum <= _MAX_SECTIONS or shstrndx >= shnum:
        return None
    table = _read(fd, shoff, shnum * entry, size, "section header table")
    sections = [struct.unpack_from(fmt, table, i * entry) for i in range(shnum)]
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    strtab = sections[shstrndx]
    if strtab[5] > _MAX_SHSTRTAB:
        raise ValueError(f"section name table of {strtab[5]} bytes")
    names = _read(fd, strtab[4], strtab[5], size, "section name table")
    for sec in sections:
        if sec[1] != _SHT_NOTE or sec[0] >= len(names):
            continue
        name_end = names.find(b"\0", sec[0])
        if names[sec[0]:name_end] != NOTE_SECTION:
            continue
        if sec[5] > _MAX_NOTE:
            raise ValueError(f"note section of {sec[5]} bytes")
        return parse_note(_read(fd, sec[4], sec[5], size, "note section"), little=little,
                          align=sec[8])
    return None


def _read(fd: int, offset: int, length: int, size: int, what: str) -> bytes:
    """``length`` bytes at ``offset``, checked against the file's ``size`` first."""
    if offset > size or length > size - offset:
        raise ValueError(f"{what} ({length} bytes at offset {offset}) lies past the end of "
                         f"the file ({size} bytes)")
    data = os.pread(fd, length, offset)
    if len(data) != length:
        raise ValueError(f"{what}: short read")
    return data


# --- the hook -------------------------------------------------------------------------------


def _only_library(root: RootFS, compat_root: str,
                  names: set[str]) -> tuple[str, CompatNote | None] | CompatResult:
    """The one libcuda.so.*.* in ``compat_root`` (of ``names``) with its note, or why not."""
    found: list[tuple[str, int]] = []
    try:
        for name in sorted(n for n in names if n.startswith("libcuda.so.")
                           and "." in n[len("libcuda.so."):]):
            path = f"{compat_root.rstrip('/')}/{name}"
            try:
                found.append((path, root.open_read(path)))
            except (OSError, RootFSError):
                continue  # a folder, a FIFO, a dangling link: not a library
        if len(found) != 1:
            return CompatResult(folder=None, reason=f"want one libcuda.so.*.* in {compat_root}, "
                                f"found {', '.join(p for p, _ in found) or 'none'}")
        path, fd = found[0]
        try:
            return path, read_compat_note(fd)
        except (ValueError, OSError, struct.error) as exc:
            return CompatResult(folder=None, warn=True, reason=f"{path}: malformed ELF object "
                                f"({exc}); the host driver's libcuda is used")
    finally:
        for _, fd in found:
            os.close(fd)


def run(root: RootFS, args: SimpleNamespace) -> list[str]:
    result = enable_cuda_compat(root, host_driver=args.host_driver_version or "",
                                host_cuda=args.host_cuda_version or "",
                                compat_root=args.cuda_compat_container_root or COMPAT_ROOT)
    return [result.reason] if result.warn else []


def enable_cuda_compat(root: RootFS, *, host_driver: str = "", host_cuda: str = "",
                       compat_root: str = COMPAT_ROOT) -> CompatResult:
    """Decide, and write :data:`CONF_PATH` when the image's compat libraries should win."""
    split_container_path(compat_root)
    if not host_driver and not host_cuda:
        return CompatResult(folder=None, reason="no host driver or CUDA version given")
    try:
        with root.directory(compat_root) as dir_fd:
            names = folder_names(dir_fd, compat_root)
    except (FileNotFoundError, NotADirectoryError):
        return CompatResult(folder=None, reason=f"no {compat_root} in the container")
    except (OSError, RootFSError) as exc:  # a loop, a folder too large: the image's
        return CompatResult(folder=None, warn=True, reason=f"{compat_root}: cannot be read "
                            f"({describe_error(exc)}); the host driver's libcuda is used")
    found = _only_library(root, compat_root, names)
    if isinstance(found, CompatResult):
        return found
    path, note = found
    version = path.rsplit("/libcuda.so.", 1)[1]
    if not use_compat(version, host_driver, host_cuda, note):
        return CompatResult(folder=None, reason=f"{path} is not newer than the host driver "
                                                f"{host_driver or host_cuda}")
    try:
        write_file(root, CONF_PATH, f"{compat_root}\n".encode())
    except ForeignMountError as exc:
        return CompatResult(folder=None, warn=True, reason=f"{exc}; {CONF_PATH} not written, "
                                                           "the host driver's libcuda is used")
    return CompatResult(folder=compat_root,
                        reason=f"{path} is newer than the host driver {host_driver or host_cuda}")
