"""ld.so.cache parser: against caches glibc's ldconfig wrote, and against broken input."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdi.linux import ldcache
from cdi.linux.ldcache import LdCacheError

# ldconfig's arch bits (FLAG_X8664_LIB64, the default 32-bit ABI)
X86_64, I386 = 0x0300, 0x0000
LDCONFIG = next(
    (
        p
        for p in (shutil.which("ldconfig"), "/sbin/ldconfig", "/usr/sbin/ldconfig")
        if p and os.access(p, os.X_OK)
    ),
    None,
)
needs_ldconfig = pytest.mark.skipif(LDCONFIG is None, reason="glibc's ldconfig not found")
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not found")


def _gcc_lib(out: Path, soname: str, *, m32: bool = False) -> None:
    src = out.parent / (out.name + ".c")
    src.write_text(f'const char *name(void) {{ return "{soname}"; }}\n')
    args = ["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(out), str(src)]
    if m32:
        args[1:1] = ["-m32", "-nostdlib"]
    subprocess.run(args, check=True, capture_output=True)
    src.unlink()


@pytest.fixture(scope="module")
def small_root(tmp_path_factory: pytest.TempPathFactory, gcc_m32: bool) -> Path:
    """A root with a few gcc-built libraries (64-bit, plus i386 when gcc -m32 works)."""
    if shutil.which("gcc") is None or LDCONFIG is None:
        pytest.skip("gcc and ldconfig are needed")
    root = tmp_path_factory.mktemp("ldroot")
    lib64 = root / "usr/lib/x86_64-linux-gnu"
    lib32 = root / "usr/lib/i386-linux-gnu"
    lib64.mkdir(parents=True)
    lib32.mkdir(parents=True)
    (root / "etc").mkdir()
    for name in ("libfoo", "libbar", "libnvidia-ml"):
        _gcc_lib(lib64 / f"{name}.so.1.2.3", f"{name}.so.1")
        if gcc_m32:
            _gcc_lib(lib32 / f"{name}.so.1.2.3", f"{name}.so.1", m32=True)
    (root / "etc/ld.so.conf").write_text("/usr/lib/x86_64-linux-gnu\n/usr/lib/i386-linux-gnu\n")
    assert LDCONFIG is not None
    subprocess.run([LDCONFIG, "-r", str(root)], check=True, capture_output=True)
    (root / "etc/ld.so.cache").rename(root / "etc/ld.so.cache.new")
    subprocess.run([LDCONFIG, "-c", "compat", "-r", str(root)], check=True, capture_output=True)
    (root / "etc/ld.so.cache").rename(root / "etc/ld.so.cache.compat")
    return root


def _ldconfig_print(cache: Path) -> list[tuple[str, str]]:
    """(name, path) pairs as ``ldconfig -p`` lists them, in order: the oracle."""
    assert LDCONFIG is not None
    out = subprocess.run(
        [LDCONFIG, "-p", "-C", str(cache)], check=True, capture_output=True, text=True
    ).stdout
    return re.findall(r"^\s+(\S+) \([^)]*\) => (\S+)$", out, re.M)


@pytest.mark.parametrize("variant", ["new", "compat"])
def test_matches_ldconfig_listing(small_root: Path, variant: str) -> None:
    path = small_root / f"etc/ld.so.cache.{variant}"
    entries = ldcache.parse_ldcache(path.read_bytes(), source=str(path))
    assert [(e.key, e.path) for e in entries] == _ldconfig_print(path)


def test_64bit_entries_and_flags(small_root: Path) -> None:
    entries = ldcache.read_ldcache(small_root / "etc/ld.so.cache.new")
    lib64 = [e for e in entries if "/x86_64-linux-gnu/" in e.path]
    assert {e.key for e in lib64} == {"libfoo.so.1", "libbar.so.1", "libnvidia-ml.so.1"}
    for e in lib64:
        assert e.is_64bit and e.flags & 1 and e.arch_flag == X86_64  # the FLAG_ELF bit


def test_32bit_entries(small_root: Path, gcc_m32: bool) -> None:
    if not gcc_m32:
        pytest.skip("gcc -m32 cannot build shared objects here (no multilib support)")
    entries = ldcache.read_ldcache(small_root / "etc/ld.so.cache.new")
    lib32 = [e for e in entries if "/i386-linux-gnu/" in e.path]
    assert len(lib32) == 3
    for e in lib32:
        assert not e.is_64bit and e.flags & 1 and e.arch_flag == I386


def test_find_libraries_keeps_64bit_and_resolves(small_root: Path) -> None:
    shutil.copy(small_root / "etc/ld.so.cache.new", small_root / "etc/ld.so.cache")
    entries = ldcache.read_ldcache(small_root / "etc/ld.so.cache")
    found = ldcache.find_libraries(entries, "libnvidia-ml.so.1", root=small_root)
    assert found == [small_root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1.2.3"]
    # A glob on the resolved name works as well as one on the SONAME.
    by_target = ldcache.find_libraries(entries, "libfoo.so.*.*", root=small_root)
    assert [p.name for p in by_target] == ["libfoo.so.1.2.3"]
    all64 = ldcache.find_libraries(entries, ["libfoo*", "libbar*"], root=small_root)
    assert {p.parent.name for p in all64} == {"x86_64-linux-gnu"}


def test_simulated_node_cache(node8) -> None:  # type: ignore[no-untyped-def]
    entries = ldcache.read_ldcache(node8.ldcache_path)
    if LDCONFIG is not None:
        assert [(e.key, e.path) for e in entries] == _ldconfig_print(node8.ldcache_path)
    by_key = {e.key: e for e in entries}
    for lib in node8.manifest["libraries"]:
        if lib["bits"] != 64 or not lib["soname"] or "/xorg/" in lib["path"]:
            continue
        folder = os.path.dirname(lib["path"])
        assert by_key[lib["soname"]].path == f"{folder}/{lib['soname']}"
    version = node8.driver_version
    cuda = ldcache.find_libraries(entries, f"libcuda.so.{version}", root=node8.driver_root)
    assert cuda == [node8.lib_dir / f"libcuda.so.{version}"]


# --- malformed input -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_caches(small_root: Path) -> dict[str, bytes]:
    return {v: (small_root / f"etc/ld.so.cache.{v}").read_bytes() for v in ("new", "compat")}


@pytest.mark.parametrize("variant", ["new", "compat"])
def test_truncated_at_every_offset(small_caches: dict[str, bytes], variant: str) -> None:
    data = small_caches[variant]
    for cut in range(len(data)):
        with pytest.raises(LdCacheError):
            ldcache.parse_ldcache(data[:cut], source="x.cache")
    assert ldcache.parse_ldcache(data)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_corruption_only_raises_ldcacheerror(
    small_caches: dict[str, bytes], data: st.DataObject
) -> None:
    blob = bytearray(small_caches[data.draw(st.sampled_from(["new", "compat"]))])
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(blob) - 1))
        blob[pos] = data.draw(st.integers(0, 255))
    with contextlib.suppress(LdCacheError):
        ldcache.parse_ldcache(bytes(blob))


def test_error_names_file_and_offset(tmp_path: Path) -> None:
    bad = tmp_path / "ld.so.cache"
    bad.write_bytes(b"not a cache at all")
    with pytest.raises(LdCacheError) as info:
        ldcache.read_ldcache(bad)
    assert str(bad) in str(info.value) and "offset 0" in str(info.value)
    assert info.value.source == str(bad) and info.value.offset == 0


def _synthetic(
    entries: list[tuple[int, str, str]], *, big: bool = False, endian_flag: int | None = None
) -> bytes:
    """A new-format cache built by hand (to reach cases ldconfig never writes)."""
    order = ">" if big else "<"
    strings = bytearray()
    offsets = []
    table_start = 48 + 24 * len(entries)
    for _flags, key, value in entries:
        k = table_start + len(strings)
        strings += key.encode() + b"\0"
        v = table_start + len(strings)
        strings += value.encode() + b"\0"
        offsets.append((k, v))
    flag = endian_flag if endian_flag is not None else (3 if big else 2)
    header = ldcache.NEW_MAGIC + struct.pack(
        order + "IIB3xI12x", len(entries), len(strings), flag, 0
    )
    assert len(header) == 48
    body = b"".join(
        struct.pack(order + "iIIIQ", f, k, v, 0, 0)
        for (f, _, _), (k, v) in zip(entries, offsets, strict=True)
    )
    return header + body + bytes(strings)


def test_big_endian_cache() -> None:
    data = _synthetic([(0x0303, "libx.so.1", "/lib64/libx.so.1")], big=True)
    (entry,) = ldcache.parse_ldcache(data)
    assert (entry.key, entry.path, entry.is_64bit) == ("libx.so.1", "/lib64/libx.so.1", True)


@pytest.mark.parametrize(
    ("flags", "is64"),
    [
        (0x0303, True),  # x86-64
        (0x0A03, True),  # aarch64
        (0x0503, True),  # ppc64
        (0x0003, False),  # i386
        (0x0803, False),  # x32
        (0x0903, False),  # armhf
        (0x7F03, False),  # unknown
    ],
)
def test_arch_flags(flags: int, is64: bool) -> None:
    (entry,) = ldcache.parse_ldcache(_synthetic([(flags, "l.so", "/l.so")]))
    assert (entry.arch_flag, entry.is_64bit) == (flags & 0xFF00, is64)


def test_invalid_endian_flag() -> None:
    with pytest.raises(LdCacheError, match="byte order"):
        ldcache.parse_ldcache(_synthetic([], endian_flag=1))


def test_string_offset_out_of_range() -> None:
    data = bytearray(_synthetic([(0x0303, "libx.so.1", "/libx.so.1")]))
    struct.pack_into("<I", data, 48 + 8, 10_000)  # value offset of entry 0
    with pytest.raises(LdCacheError, match="outside the string table") as info:
        ldcache.parse_ldcache(bytes(data))
    assert info.value.offset == 48 + 8


def test_string_offset_into_header_rejected() -> None:
    data = bytearray(_synthetic([(0x0303, "libx.so.1", "/libx.so.1")]))
    struct.pack_into("<I", data, 48 + 4, 0)  # key points at the magic
    with pytest.raises(LdCacheError, match="outside the string table"):
        ldcache.parse_ldcache(bytes(data))


def test_unterminated_string() -> None:
    data = _synthetic([(0x0303, "libx.so.1", "/libx.so.1")])
    with pytest.raises(LdCacheError, match="unterminated"):
        ldcache.parse_ldcache(data[:-1] + b"x")


def test_huge_entry_count() -> None:
    data = bytearray(_synthetic([]))
    struct.pack_into("<I", data, 20, 0xFFFFFFFF)
    with pytest.raises(LdCacheError, match="truncated"):
        ldcache.parse_ldcache(bytes(data))


def test_old_format_without_new_section() -> None:
    data = ldcache.OLD_MAGIC + b"\0" + struct.pack("<I", 0)
    with pytest.raises(LdCacheError, match="not supported"):
        ldcache.parse_ldcache(data)


# --- in-root resolution ----------------------------------------------------------------------


def resolve_in_root(root: Path, path: str) -> Path:
    parts, _hops = ldcache.resolve_from(str(root), (), path)
    return root.joinpath(*parts)


def test_resolve_in_root_never_escapes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "lib").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc/passwd").write_text("in-root\n")
    os.symlink("/etc/passwd", root / "lib/abs")
    os.symlink("../../../../../../../etc/passwd", root / "lib/rel")
    os.symlink("/lib/../../..", root / "lib/up")
    assert resolve_in_root(root, "/lib/abs") == root / "etc/passwd"
    assert resolve_in_root(root, "/lib/rel") == root / "etc/passwd"
    assert resolve_in_root(root, "/lib/up/etc/passwd") == root / "etc/passwd"
    assert resolve_in_root(root, "../../x") == root / "x"


def test_resolve_in_root_chain_and_loop(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib"
    lib.mkdir(parents=True)
    (lib / "libz.so.1.2").write_text("")
    os.symlink("libz.so.1.2", lib / "libz.so.1")
    os.symlink("/usr/lib/libz.so.1", lib / "libz.so")
    os.symlink("/lib", tmp_path / "lib-link")
    os.symlink("usr/lib", tmp_path / "lib")
    assert resolve_in_root(tmp_path, "/lib/libz.so") == lib / "libz.so.1.2"
    os.symlink("loop2", lib / "loop1")
    os.symlink("loop1", lib / "loop2")
    with pytest.raises(OSError) as info:
        resolve_in_root(tmp_path, "/usr/lib/loop1")
    assert info.value.errno == errno.ELOOP


def test_find_libraries_skips_escaping_and_dangling(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib64"
    lib.mkdir(parents=True)
    os.symlink("/etc/hostname", lib / "libevil.so.1")  # would be the host's file
    os.symlink("libgone.so.1.0", lib / "libgone.so.1")
    entries = [
        ldcache.LdCacheEntry(key="libevil.so.1", path="/usr/lib64/libevil.so.1", flags=0x0303),
        ldcache.LdCacheEntry(key="libgone.so.1", path="/usr/lib64/libgone.so.1", flags=0x0303),
    ]
    assert ldcache.find_libraries(entries, "lib*", root=tmp_path) == []
