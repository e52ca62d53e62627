"""DT_SONAME reader: gcc-built objects, hand-built ELF32/64 LE/BE images, broken input."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdi.linux import elf
from cdi.linux.elf import ElfError

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not found")

_BASE = 0x10000
_DT = {"NULL": 0, "NEEDED": 1, "STRTAB": 5, "STRSZ": 10, "SONAME": 14}


def synthetic_elf(
    *,
    bits: int = 64,
    big: bool = False,
    soname: str | None = "libsyn.so.7",
    needed: tuple[str, ...] = ("libc.so.6",),
    strsz: bool = True,
) -> bytes:
    """A minimal shared object: header, PT_LOAD + PT_DYNAMIC, dynamic array, strings last."""
    o = ">" if big else "<"
    ehsize, phentsize = (64, 56) if bits == 64 else (52, 32)
    strings = bytearray(b"\0")
    offs = {}
    for name in (*([soname] if soname else []), *needed):
        offs[name] = len(strings)
        strings += name.encode() + b"\0"
    phoff = ehsize
    dyn_off = phoff + 2 * phentsize
    dyn_fmt = o + ("qQ" if bits == 64 else "iI")
    dyn_tags: list[tuple[int, int]] = []
    if soname:
        dyn_tags.append((_DT["SONAME"], offs[soname]))
    dyn_tags += [(_DT["NEEDED"], offs[n]) for n in needed]
    n_dyn = len(dyn_tags) + (3 if strsz else 2)
    str_off = dyn_off + n_dyn * struct.calcsize(dyn_fmt)
    dyn_tags.append((_DT["STRTAB"], _BASE + str_off))
    if strsz:
        dyn_tags.append((_DT["STRSZ"], len(strings)))
    dyn_tags.append((_DT["NULL"], 0))
    dynamic = b"".join(struct.pack(dyn_fmt, t, v) for t, v in dyn_tags)
    total = str_off + len(strings)
    ident = b"\x7fELF" + bytes([2 if bits == 64 else 1, 2 if big else 1, 1]) + bytes(9)
    machine = 62 if bits == 64 else 3
    if bits == 64:
        header = struct.pack(
            o + "HHIQQQIHHHHHH", 3, machine, 1, 0, phoff, 0, 0, ehsize, phentsize, 2, 64, 0, 0
        )
        phdrs = struct.pack(o + "IIQQQQQQ", 1, 5, 0, _BASE, _BASE, total, total, 0x1000)
        phdrs += struct.pack(
            o + "IIQQQQQQ",
            2,
            6,
            dyn_off,
            _BASE + dyn_off,
            _BASE + dyn_off,
            len(dynamic),
            len(dynamic),
            8,
        )
    else:
        header = struct.pack(
            o + "HHIIIIIHHHHHH", 3, machine, 1, 0, phoff, 0, 0, ehsize, phentsize, 2, 40, 0, 0
        )
        phdrs = struct.pack(o + "IIIIIIII", 1, 0, _BASE, _BASE, total, total, 5, 0x1000)
        phdrs += struct.pack(
            o + "IIIIIIII",
            2,
            dyn_off,
            _BASE + dyn_off,
            _BASE + dyn_off,
            len(dynamic),
            len(dynamic),
            6,
            4,
        )
    image = ident + header + phdrs + dynamic + bytes(strings)
    assert len(image) == total
    return image


def parse_dynamic(image: bytes) -> elf.DynamicInfo:
    """``image`` read as the hooks read a library: through an open file."""
    fd = os.memfd_create("synthetic-elf")
    try:
        os.write(fd, image)
        return elf.read_dynamic_fd(fd, "<bytes>")
    finally:
        os.close(fd)


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("big", [False, True], ids=["le", "be"])
def test_synthetic_images(bits: int, big: bool) -> None:
    info = parse_dynamic(synthetic_elf(bits=bits, big=big))
    assert (info.header.bits, info.header.big_endian, info.soname) == (bits, big, "libsyn.so.7")
    assert info.header.elf_type == 3


def test_no_soname() -> None:
    assert parse_dynamic(synthetic_elf(soname=None, needed=())).soname is None
    assert parse_dynamic(synthetic_elf(soname=None)).soname is None


def test_without_strsz() -> None:
    assert parse_dynamic(synthetic_elf(strsz=False)).soname == "libsyn.so.7"


@pytest.mark.parametrize("bits", [32, 64])
def test_truncated_at_every_offset(bits: int) -> None:
    image = synthetic_elf(bits=bits, big=bits == 32, needed=())  # the SONAME is read last
    for cut in range(len(image)):
        with pytest.raises(ElfError):
            parse_dynamic(image[:cut])


def test_not_elf(tmp_path: Path) -> None:
    path = tmp_path / "script.so"
    path.write_text("#!/bin/sh\n")
    with pytest.raises(ElfError, match="not an ELF") as info:
        elf.read_soname(path)
    assert str(path) in str(info.value) and info.value.offset == 0


def test_bad_class_and_encoding() -> None:
    image = bytearray(synthetic_elf())
    image[4] = 9
    with pytest.raises(ElfError, match="class"):
        parse_dynamic(bytes(image))
    image[4], image[5] = 2, 7
    with pytest.raises(ElfError, match="encoding"):
        parse_dynamic(bytes(image))


def test_strtab_outside_loads() -> None:
    image = bytearray(synthetic_elf(soname="x", needed=()))
    # Dynamic entries start after the 64-byte header and two 56-byte program headers.
    dyn_off = 64 + 2 * 56
    tag, _ = struct.unpack_from("<qQ", image, dyn_off + 16)
    assert tag == _DT["STRTAB"]
    struct.pack_into("<qQ", image, dyn_off + 16, tag, 0xDEAD0000)
    with pytest.raises(ElfError, match="PT_LOAD"):
        parse_dynamic(bytes(image))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_corruption_only_raises_elferror(data: st.DataObject) -> None:
    image = bytearray(synthetic_elf(bits=data.draw(st.sampled_from([32, 64]))))
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(4, len(image) - 1))
        image[pos] = data.draw(st.integers(0, 255))
    with contextlib.suppress(ElfError):
        parse_dynamic(bytes(image))


def _readelf_soname(path: Path) -> str | None:
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) not found")
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
    m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", out)
    return m.group(1) if m else None


@needs_gcc
@pytest.mark.parametrize("m32", [False, True], ids=["elf64", "elf32"])
def test_gcc_objects_agree_with_readelf(tmp_path: Path, m32: bool, gcc_m32: bool) -> None:
    if m32 and not gcc_m32:
        pytest.skip("gcc -m32 cannot build shared objects here (no multilib support)")
    src = tmp_path / "x.c"
    src.write_text("int x(void) { return 1; }\n")
    out = tmp_path / "libx.so.3.1"
    args = ["gcc", "-shared", "-fPIC", "-Wl,-soname,libx.so.3", "-o", str(out), str(src)]
    if m32:
        args[1:1] = ["-m32", "-nostdlib"]
    subprocess.run(args, check=True, capture_output=True)
    info = elf.read_dynamic(out)
    assert info.soname == "libx.so.3" == _readelf_soname(out)
    assert info.header.bits == (32 if m32 else 64)


def test_simulated_node_sonames(node8) -> None:  # type: ignore[no-untyped-def]
    for lib in node8.manifest["libraries"]:
        path = node8.host_path(lib["path"])
        assert elf.read_soname(path) == lib["soname"], lib["path"]


def test_real_system_library() -> None:
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    if not libc.exists():
        pytest.skip("no x86-64 libc at the Debian path")
    assert elf.read_soname(libc) == "libc.so.6"


def test_import_is_cheap() -> None:
    """The module must not pull in pyelftools (or anything heavy) at import."""
    code = "import sys, cdi.linux.elf; print(sorted(m for m in sys.modules if 'elftools' in m))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout
    assert out.strip() == "[]"
