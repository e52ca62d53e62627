"""Read the header and the DT_SONAME of an ELF shared object.

Not pyelftools: importing it and walking a driver's objects with it would cost the
generator more than all its other work (bench/reports/2026-11-27-generator-stdlib-2-cores/).
Only the headers, the PT_DYNAMIC segment and its strings are read (``os.pread``; a
driver library is tens of megabytes), located as the dynamic loader locates them, so an
object without section headers works too. Malformed input raises :class:`ElfError` naming
the file and offset.
"""

from __future__ import annotations

import os
import struct
import sys

from cdi.linux.namedtuple import TYPE_CHECKING, NamedTuple

_ELF_MAGIC = b"\x7fELF"
_ELFCLASS32, _ELFCLASS64 = 1, 2
_ELFDATA2LSB, _ELFDATA2MSB = 1, 2
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_STRTAB, _DT_STRSZ, _DT_SONAME = 0, 5, 10, 14
_MAX_STRING = 4096
# Real objects have a few dozen program headers and a dynamic segment of a few KiB; an
# untrusted file asking for more is read no further than these (an image's library is input).
_MAX_PHDR_TABLE = 4 << 20
_MAX_DYNAMIC = 1 << 20

# Layouts after e_ident, per class: (format, phdr format, dyn format).
_HEADER = {_ELFCLASS32: "HHIIIIIHHHHHH", _ELFCLASS64: "HHIQQQIHHHHHH"}
_PHDR32 = "IIIIIIII"  # type, offset, vaddr, paddr, filesz, memsz, flags, align
_PHDR64 = "IIQQQQQQ"  # type, flags, offset, vaddr, paddr, filesz, memsz, align
_DYN = {_ELFCLASS32: "iI", _ELFCLASS64: "qQ"}


class BinaryFormatError(Exception):
    """A malformed binary file (an ELF object, an ld.so.cache); ``source`` and ``offset``
    say where."""

    def __init__(self, message: str, *, source: str = "<bytes>", offset: int | None = None):
        self.source = source
        self.offset = offset
        where = source if offset is None else f"{source}: offset {offset}"
        super().__init__(f"{where}: {message}")


class ElfError(BinaryFormatError):
    """The file is not an ELF object or is malformed; says which file and where."""


class NotElfError(ElfError):
    """The file does not start with the ELF magic: not an object at all (a linker script
    such as ``libc.so``), as opposed to a malformed one."""


class ElfHeader(NamedTuple):
    """What the ELF file header says about the machine an object is for."""

    bits: int  # 32 or 64
    big_endian: bool
    machine: int  # e_machine (62 = x86-64, 183 = aarch64, 3 = i386)
    elf_type: int  # e_type (3 = ET_DYN)

    @property
    def architecture(self) -> str:
        return architecture_name(self.machine, self.bits, self.big_endian)


class DynamicInfo(NamedTuple):
    header: ElfHeader
    soname: str | None


# --- architectures ------------------------------------------------------------------------
# Names as ``uname -m`` spells them; (e_machine, bits) -> name.
_ARCHITECTURES = {(3, 32): "i386", (62, 64): "x86_64", (62, 32): "x32", (40, 32): "arm",
                  (183, 64): "aarch64", (21, 64): "ppc64", (243, 64): "riscv64",
                  (22, 64): "s390x"}
# What else a machine runs besides its own objects (the 32-bit ABIs of its kernel).
_COMPANIONS = {"x86_64": frozenset({"i386", "x32"}), "aarch64": frozenset({"arm"})}


def architecture_name(machine: int, bits: int, big_endian: bool = False) -> str:
    """``uname -m``'s name for objects of ``e_machine`` ``machine`` and class ``bits``."""
    name = _ARCHITECTURES.get((machine, bits), f"e_machine {machine} ({bits}-bit)")
    return name + "le" if name == "ppc64" and not big_endian else name


def this_machine() -> str:
    """The kernel's architecture (``uname -m``), aarch64 under an aarch64 emulator too."""
    machine = os.uname().machine
    return "arm" if machine in ("armv7l", "armv8l") else machine


def this_process() -> str:
    """The architecture of the objects this process can load (``dlopen``): the machine's,
    or its 32-bit one for a 32-bit interpreter."""
    machine = this_machine()
    if sys.maxsize > 2**32:
        return machine
    return {"x86_64": "i386", "aarch64": "arm"}.get(machine, machine)


def foreign_to_this_process(path: str | os.PathLike[str]) -> str | None:
    """None when this process can load the object at ``path`` as far as its ELF header
    says, else one line naming the file, its architecture and this process's."""
    header = read_header(path)
    here = this_process()
    if header.architecture == here:
        return None
    return _foreign(os.fspath(path), header.architecture, here)


def foreign_to_this_machine(path: str, header: ElfHeader) -> str | None:
    """None when this machine runs objects like ``header``'s (its own architecture or its
    32-bit companion: i386 on x86_64), else one line as :func:`foreign_to_this_process`."""
    here = this_machine()
    if header.architecture == here or header.architecture in _COMPANIONS.get(here, ()):
        return None
    return _foreign(path, header.architecture, here)


def _foreign(path: str, theirs: str, here: str) -> str:
    return f"{path} is built for {theirs}, and this machine is {here}"


def read_header(path: str | os.PathLike[str]) -> ElfHeader:
    """The file header of the object at ``path``: its class, byte order, machine, type."""
    source = os.fspath(path)
    fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        head = os.pread(fd, 20, 0)
    finally:
        os.close(fd)
    if head[:4] == _ELF_MAGIC and len(head) < 20:
        raise ElfError("truncated ELF header", source=source, offset=len(head))
    cls, order = _identify(head, source)
    e_type, e_machine = struct.unpack(order + "HH", head[16:20])
    return ElfHeader(bits=32 if cls == _ELFCLASS32 else 64, big_endian=order == ">",
                     machine=e_machine, elf_type=e_type)


def _identify(head: bytes, source: str) -> tuple[int, str]:
    """The class and the byte order (``<`` or ``>``) the ELF identification gives."""
    if head[:4] != _ELF_MAGIC:
        raise NotElfError("not an ELF file (bad magic)", source=source, offset=0)
    if len(head) < 16:
        raise ElfError("truncated ELF identification", source=source, offset=0)
    cls, data_enc = head[4], head[5]
    if cls not in _HEADER:
        raise ElfError(f"unknown ELF class {cls}", source=source, offset=4)
    if data_enc not in (_ELFDATA2LSB, _ELFDATA2MSB):
        raise ElfError(f"unknown ELF data encoding {data_enc}", source=source, offset=5)
    return cls, "<" if data_enc == _ELFDATA2LSB else ">"


if TYPE_CHECKING:  # collections would slow every hook process's start
    from collections.abc import Callable

    _Reader = Callable[[int, int], bytes]


def is_elf(path: str | os.PathLike[str]) -> bool:
    """Whether the file at ``path`` starts with the ELF magic (False when it cannot be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            return os.pread(fd, len(_ELF_MAGIC), 0) == _ELF_MAGIC
        finally:
            os.close(fd)
    except OSError:
        return False


def read_soname(path: str | os.PathLike[str]) -> str | None:
    """DT_SONAME of the object at ``path``, or None when it has none (or no dynamic part)."""
    return read_dynamic(path).soname


def read_dynamic(path: str | os.PathLike[str]) -> DynamicInfo:
    source = os.fspath(path)
    fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return read_dynamic_fd(fd, source)
    finally:
        os.close(fd)


def read_dynamic_fd(fd: int, source: str) -> DynamicInfo:
    """Same as :func:`read_dynamic` on an open file; ``source`` names it in errors."""
    raw = _file_reader(fd)
    cls, order = _identify(raw(0, 16), source)
    hdr_fmt = order + _HEADER[cls]
    hdr = struct.unpack(hdr_fmt, _exact(raw, 16, struct.calcsize(hdr_fmt), "ELF header", source))
    e_type, e_machine, e_phoff, e_phentsize, e_phnum = hdr[0], hdr[1], hdr[4], hdr[8], hdr[9]
    loads, dynamic = _program_headers(raw, order, cls, (e_phoff, e_phentsize, e_phnum), source)
    soname = None if dynamic is None else _soname(raw, order + _DYN[cls], dynamic, loads, source)
    header = ElfHeader(bits=32 if cls == _ELFCLASS32 else 64, big_endian=order == ">",
                       machine=e_machine, elf_type=e_type)
    return DynamicInfo(header=header, soname=soname)


def _file_reader(fd: int) -> _Reader:
    """``pread`` on ``fd``, never past the file's size as ``fstat`` gave it: an absurd
    offset or size in the headers asks for no memory, it comes back short and the caller
    says truncated."""
    size = os.fstat(fd).st_size

    def raw(off: int, want: int) -> bytes:
        if off < 0 or want <= 0 or off >= size:
            return b""
        return os.pread(fd, min(want, size - off), off)

    return raw


def _exact(raw: _Reader, off: int, size: int, what: str, source: str) -> bytes:
    chunk = raw(off, size) if off >= 0 else b""
    if len(chunk) != size:
        raise ElfError(f"truncated {what}", source=source, offset=off)
    return chunk


_Load = tuple[int, int, int]  # vaddr, filesz, offset


def _program_headers(
    raw: _Reader, order: str, cls: int, where: tuple[int, int, int], source: str
) -> tuple[list[_Load], tuple[int, int] | None]:
    phoff, phentsize, phnum = where
    fmt = order + (_PHDR32 if cls == _ELFCLASS32 else _PHDR64)
    if phnum and phentsize < struct.calcsize(fmt):
        raise ElfError(f"program header size {phentsize} too small", source=source, offset=phoff)
    if phentsize * phnum > _MAX_PHDR_TABLE:
        raise ElfError(f"program header table of {phnum} x {phentsize} bytes is absurd",
                       source=source, offset=phoff)
    table = _exact(raw, phoff, phentsize * phnum, "program header table", source)
    loads: list[_Load] = []
    dynamic: tuple[int, int] | None = None
    for i in range(phnum):
        f = struct.unpack_from(fmt, table, i * phentsize)
        if cls == _ELFCLASS32:
            p_type, p_offset, p_vaddr, p_filesz = f[0], f[1], f[2], f[4]
        else:
            p_type, p_offset, p_vaddr, p_filesz = f[0], f[2], f[3], f[5]
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_filesz, p_offset))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    return loads, dynamic


def _soname(
    raw: _Reader,
    fmt: str,  # the struct format of one entry, in the file's byte order and class
    dynamic: tuple[int, int],
    loads: list[_Load],
    source: str,
) -> str | None:
    entsize = struct.calcsize(fmt)
    offset, filesz = dynamic
    filesz = min(filesz, _MAX_DYNAMIC)  # entries past 64 Ki are never read by a loader
    blob = _exact(raw, offset, filesz - filesz % entsize, "dynamic segment", source)
    tags: dict[int, int] = {}
    for tag, val in struct.iter_unpack(fmt, blob):
        if tag == _DT_NULL:
            break
        tags.setdefault(tag, val)
    soname = tags.get(_DT_SONAME)
    if soname is None:
        return None
    if _DT_STRTAB not in tags:
        raise ElfError("dynamic segment has no DT_STRTAB", source=source, offset=offset)
    # DT_STRTAB is a virtual address: map it to a file offset through the PT_LOADs.
    strtab = tags[_DT_STRTAB]
    base = next((strtab - p_vaddr + p_offset for p_vaddr, p_filesz, p_offset in loads
                 if p_vaddr <= strtab < p_vaddr + p_filesz), None)
    if base is None:
        raise ElfError(
            f"DT_STRTAB 0x{strtab:x} is not in any PT_LOAD",
            source=source,
            offset=offset,
        )
    strsz = tags.get(_DT_STRSZ, _MAX_STRING)
    if soname >= strsz:
        raise ElfError(f"string offset {soname} beyond DT_STRSZ", source=source, offset=offset)
    chunk = raw(base + soname, min(strsz - soname, _MAX_STRING))
    nul = chunk.find(b"\0")
    if nul < 0:
        raise ElfError("unterminated string", source=source, offset=base + soname)
    return os.fsdecode(chunk[:nul])
