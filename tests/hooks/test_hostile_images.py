"""Hostile image content and hostile mounts against the hook, as the runtime starts it.

* folders on mounts the runtime added (a host folder bind-mounted read-write or read-only,
  a host file bind-mounted over a name the hook replaces): nothing is written there, the
  host folder is unchanged (names, modes, owners, link targets, contents), the cache is
  still written in the root and still finds the library;
* a tmpfs the OCI spec makes for this container alone (``/dev``) is written (device links);
* malformed ELF objects (absurd header offsets and sizes) in a scanned folder and as the
  compat libcuda: one warning naming the file, no traceback, exit 0;
* an image conf naming a folder that loops (through ``/proc/1/root`` or plainly): skipped
  with a warning, the GPU's folder is still served.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdi.linux.elf import ElfError, read_dynamic
from cdi.linux.ldcache import read_ldcache
from cdi.nvidia.hooks.cuda_compat import read_compat_note
from tests.hooks.conftest import FAKE_C, _cc, host_snapshot, make_bundle
from tests.hooks.test_symlinks import run_hook

LIB = "/opt/gpu/lib"


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the test libraries")
    out = tmp_path_factory.mktemp("hostile-libs")
    built = {}
    for name, soname in (("libfake.so.1.2.3", "libfake.so.1"), ("libsecx.so.1.0", "libsecx.so.1"),
                         ("libcuda.so.999.1", "libcuda.so.1")):
        _cc(["-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(out / name)], FAKE_C)
        built[name] = out / name
    return built


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@pytest.fixture
def mounted(need_root: None) -> Iterator[list[Path]]:
    """Mount points to unmount after the test (innermost first)."""
    points: list[Path] = []
    yield points
    for point in reversed(points):
        subprocess.run(["umount", "-l", str(point)], check=False)


def _image(tmp_path: Path, libs: dict[str, Path]) -> Path:
    rootfs = tmp_path / "rootfs"
    (rootfs / LIB.lstrip("/")).mkdir(parents=True)
    shutil.copy2(libs["libfake.so.1.2.3"], rootfs / LIB.lstrip("/") / "libfake.so.1.2.3")
    (rootfs / "etc/ld.so.conf.d").mkdir(parents=True)
    return rootfs


def _volume(tmp_path: Path, rootfs: Path, libs: dict[str, Path], mounted: list[Path],
            *, ro: bool = False) -> tuple[Path, dict[str, object]]:
    """A host folder with a library, bind-mounted at /vol as a CRI volume is."""
    host = tmp_path / "host-volume"
    host.mkdir()
    shutil.copy2(libs["libsecx.so.1.0"], host / "libsecx.so.1.0")
    os.chown(host, 1000, 1000)
    (rootfs / "vol").mkdir()
    _mount("--bind", str(host), str(rootfs / "vol"))
    mounted.append(rootfs / "vol")
    options = ["rbind", "rprivate", "ro" if ro else "rw"]
    if ro:
        _mount("-o", "remount,bind,ro", str(rootfs / "vol"))
    return host, {"destination": "/vol", "type": "bind", "source": str(host),
                  "options": options}


def _cache(rootfs: Path) -> dict[str, str]:
    return {e.key: e.path for e in read_ldcache(rootfs / "etc/ld.so.cache")}


@pytest.mark.parametrize("ro", [False, True], ids=["rw-volume", "ro-volume"])
def test_conf_folder_on_a_volume_is_not_written(tmp_path: Path, libs: dict[str, Path],
                                               mounted: list[Path], ro: bool) -> None:
    rootfs = _image(tmp_path, libs)
    (rootfs / "etc/ld.so.conf").write_text("/vol\n")
    (rootfs / "etc/ld.so.conf.d/00-compat-evil.conf").write_text("/vol\n")
    host, spec_mount = _volume(tmp_path, rootfs, libs, mounted, ro=ro)
    before = host_snapshot(host)
    proc = run_hook(make_bundle(tmp_path, rootfs, mounts=[spec_mount]),
                    "update-ldcache", "--folder", LIB)
    assert proc.returncode == 0, proc.stderr
    assert host_snapshot(host) == before  # no root-owned libsecx.so.1 in the host folder
    (line,) = [x for x in proc.stderr.splitlines() if "/vol" in x]
    assert "a bind mount of" in line and "not the container's root filesystem" in line, line
    assert "Traceback" not in proc.stderr
    cache = _cache(rootfs)
    assert cache["libfake.so.1"] == f"{LIB}/libfake.so.1"  # served: link and cache in the root
    assert os.readlink(rootfs / LIB.lstrip("/") / "libfake.so.1") == "libfake.so.1.2.3"
    assert cache["libsecx.so.1"] == "/vol/libsecx.so.1.0"  # found without a link there


def test_spec_link_into_a_volume_is_skipped(tmp_path: Path, libs: dict[str, Path],
                                            mounted: list[Path]) -> None:
    rootfs = _image(tmp_path, libs)
    host, spec_mount = _volume(tmp_path, rootfs, libs, mounted)
    before = host_snapshot(host)
    proc = run_hook(make_bundle(tmp_path, rootfs, mounts=[spec_mount]),
                    "create-symlinks", "--link", "libsecx.so.1.0::/vol/libsecx.so.1",
                    "--link", "libsecx.so.1.0::/vol/sub/libsecx.so",
                    "--link", f"libfake.so.1.2.3::{LIB}/libfake.so.1")
    assert proc.returncode == 0, proc.stderr
    assert host_snapshot(host) == before
    assert len([x for x in proc.stderr.splitlines() if "link not made" in x]) == 2, proc.stderr
    assert os.readlink(rootfs / LIB.lstrip("/") / "libfake.so.1") == "libfake.so.1.2.3"


def test_host_file_over_the_cache_is_refused_in_one_line(tmp_path: Path, libs: dict[str, Path],
                                                         mounted: list[Path]) -> None:
    rootfs = _image(tmp_path, libs)
    bait = tmp_path / "host-cache"
    bait.write_text("host")
    (rootfs / "etc/ld.so.cache").write_text("image")
    _mount("--bind", str(bait), str(rootfs / "etc/ld.so.cache"))
    mounted.append(rootfs / "etc/ld.so.cache")
    proc = run_hook(make_bundle(tmp_path, rootfs, mounts=[
        {"destination": "/etc/ld.so.cache", "type": "bind", "source": str(bait),
         "options": ["rbind"]}]), "update-ldcache", "--folder", LIB)
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    assert line.startswith("nri-cdi hook update-ldcache: error: /etc/ld.so.cache: on a bind "
                           f"mount of {bait}"), line
    assert bait.read_text() == "host"


def test_private_tmpfs_gets_device_links_shared_one_does_not(
        tmp_path: Path, libs: dict[str, Path], mounted: list[Path]) -> None:
    rootfs = _image(tmp_path, libs)
    (rootfs / "dev").mkdir()
    _mount("-t", "tmpfs", "tmpfs", str(rootfs / "dev"))
    mounted.append(rootfs / "dev")
    shared = tmp_path / "host-tmpfs"
    shared.mkdir()
    _mount("-t", "tmpfs", "tmpfs", str(shared))
    mounted.append(shared)
    (rootfs / "shm").mkdir()
    _mount("--bind", str(shared), str(rootfs / "shm"))
    mounted.append(rootfs / "shm")
    before = host_snapshot(shared)
    proc = run_hook(make_bundle(tmp_path, rootfs, devices=["/dev/fake0"], mounts=[
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "mode=755"]},
        {"destination": "/shm", "type": "bind", "source": str(shared), "options": ["rbind"]}]),
        "create-symlinks", "--device-link", "/dev/fake0::../fake0::/dev/by-path/fake-0",
        "--link", "x::/shm/x")
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(rootfs / "dev/by-path/fake-0") == "../fake0"
    assert host_snapshot(shared) == before
    assert "/shm/x: on a bind mount of" in proc.stderr


@pytest.mark.parametrize("attack", ["stacked", "shared-tmpfs"])
def test_a_tmpfs_in_the_spec_does_not_vouch_for_what_is_mounted(
        tmp_path: Path, libs: dict[str, Path], mounted: list[Path], attack: str) -> None:
    """``stacked``: an image whose /vol is a link to /dev gets the volume mounted over the
    container's /dev tmpfs; ``shared-tmpfs``: a host tmpfs bound where the spec says a new
    tmpfs goes. Neither is the container's own filesystem, whatever the spec says."""
    rootfs = _image(tmp_path, libs)
    (rootfs / "dev").mkdir()
    host = tmp_path / "host"
    host.mkdir()
    if attack == "stacked":
        _mount("-t", "tmpfs", "tmpfs", str(rootfs / "dev"))
        mounted.append(rootfs / "dev")
    else:
        _mount("-t", "tmpfs", "tmpfs", str(host))
        mounted.append(host)
    _mount("--bind", str(host), str(rootfs / "dev"))
    mounted.append(rootfs / "dev")
    before = host_snapshot(host)
    proc = run_hook(make_bundle(tmp_path, rootfs, devices=["/dev/fake0"], mounts=[
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]},
        {"destination": "/vol", "type": "bind", "source": str(host), "options": ["rbind"]}]),
        "create-symlinks", "--device-link", "/dev/fake0::../fake0::/dev/by-path/fake-0")
    assert proc.returncode == 0, proc.stderr
    # the spec's word (a tmpfs) and what the table shows are both named
    assert "/dev: on a tmpfs mount of tmpfs at /dev (config.json mounts; mount table: " \
        in proc.stderr, proc.stderr
    assert "link not made" in proc.stderr
    assert host_snapshot(host) == before


# --- malformed ELF ----------------------------------------------------------------------------


def _patched(src: Path, dst: Path, *fields: tuple[int, str, int]) -> Path:
    data = bytearray(src.read_bytes())
    for offset, fmt, value in fields:
        struct.pack_into(fmt, data, offset, value)
    dst.write_bytes(bytes(data))
    return dst


def _dynamic_filesz_offset(data: bytes) -> int:
    phoff: int = struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        at: int = phoff + i * phentsize
        if struct.unpack_from("<I", data, at)[0] == 2:  # PT_DYNAMIC
            return at + 32  # p_filesz
    raise AssertionError("no PT_DYNAMIC")


BAD_ELF = {  # name: fields (offset, format, value) of a 64-bit little-endian object
    "phoff": [(0x20, "<Q", 0x7FFF_FFFF_FFFF_0000)],
    "phtable": [(0x36, "<H", 0xFFFF), (0x38, "<H", 0xFFFF)],
    "phoff-u64": [(0x20, "<Q", 0xFFFF_FFFF_FFFF_FFF0)],
}
BAD_SECTIONS = {
    "shoff": [(0x28, "<Q", 0xFFFF_FFFF_FFFF_FFF0)],
    "shoff-big": [(0x28, "<Q", 0x7FFF_FFFF_FFFF_0000)],
}


@pytest.mark.parametrize("case", [*BAD_ELF, "dynamic"])
def test_malformed_elf_is_an_elf_error(tmp_path: Path, libs: dict[str, Path], case: str) -> None:
    src = libs["libfake.so.1.2.3"]
    fields = BAD_ELF.get(case) or [(_dynamic_filesz_offset(src.read_bytes()), "<Q", 1 << 62)]
    bad = _patched(src, tmp_path / "libbad.so.1", *fields)
    with pytest.raises(ElfError):
        read_dynamic(bad)


@pytest.mark.parametrize("case", BAD_SECTIONS)
def test_malformed_section_table_is_a_value_error(tmp_path: Path, libs: dict[str, Path],
                                                  case: str) -> None:
    bad = _patched(libs["libcuda.so.999.1"], tmp_path / "libcuda.so.999.1", *BAD_SECTIONS[case])
    fd = os.open(bad, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="past the end of the file"):
            read_compat_note(fd)
    finally:
        os.close(fd)


def test_malformed_libraries_in_the_image_are_skipped_with_one_line_each(
        need_root: None, tmp_path: Path, libs: dict[str, Path]) -> None:
    rootfs = _image(tmp_path, libs)
    folder = rootfs / LIB.lstrip("/")
    for name, fields in BAD_ELF.items():
        _patched(libs["libsecx.so.1.0"], folder / f"libbad-{name}.so.1", *fields)
    compat = rootfs / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    _patched(libs["libcuda.so.999.1"], compat / "libcuda.so.999.1", *BAD_SECTIONS["shoff"])
    proc = run_hook(make_bundle(tmp_path, rootfs), "enable-cuda-compat",
                    "--host-driver-version", "550.54.15", "update-ldcache", "--folder", LIB)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    for name in BAD_ELF:
        assert len([x for x in lines if f"libbad-{name}.so.1: malformed ELF" in x]) == 1, lines
    assert [x for x in lines if "/usr/local/cuda/compat/libcuda.so.999.1: malformed ELF" in x]
    assert _cache(rootfs)["libfake.so.1"] == f"{LIB}/libfake.so.1"


# --- folders that loop ------------------------------------------------------------------------


def test_conf_folder_that_loops_is_skipped(tmp_path: Path, libs: dict[str, Path],
                                           mounted: list[Path]) -> None:
    rootfs = _image(tmp_path, libs)
    (rootfs / "proc").mkdir()
    _mount("-t", "proc", "proc", str(rootfs / "proc"))
    mounted.append(rootfs / "proc")
    os.symlink("/proc/1/root/loop", rootfs / "loop")  # a magic link, and a loop in the root
    os.symlink("/plain-b", rootfs / "plain-a")
    os.symlink("/plain-a", rootfs / "plain-b")
    (rootfs / "etc/ld.so.conf.d/00-compat-loop.conf").write_text("/loop\n/plain-a\n")
    proc = run_hook(make_bundle(tmp_path, rootfs), "update-ldcache", "--folder", LIB)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert [x for x in lines if x.endswith("skipped") and "/loop (named by" in x], lines
    assert [x for x in lines if "/plain-a (named by" in x and "symbolic links" in x], lines
    assert _cache(rootfs)["libfake.so.1"] == f"{LIB}/libfake.so.1"


def test_unusable_confs_and_cache_are_skipped_with_one_line_each(
        need_root: None, tmp_path: Path, libs: dict[str, Path]) -> None:
    rootfs = _image(tmp_path, libs)
    confd = rootfs / "etc/ld.so.conf.d"
    os.mkfifo(confd / "00-compat-fifo.conf")  # opening it would block the runtime
    (confd / "00-compat-huge.conf").write_bytes(b"/x\n" * (64 << 10))
    os.symlink("00-compat-loop.conf", confd / "00-compat-loop.conf")
    os.symlink("/proc/self/root/etc/passwd", confd / "00-compat-proc.conf")  # absent: silent
    (rootfs / "etc/ld.so.cache").write_bytes(b"glibc-ld.so.cache1.1" + b"\xff" * 40)
    proc = run_hook(make_bundle(tmp_path, rootfs), "update-ldcache", "--folder", LIB)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    for name in ("00-compat-fifo.conf", "00-compat-huge.conf", "00-compat-loop.conf"):
        assert len([x for x in lines if f"/etc/ld.so.conf.d/{name}: cannot be read" in x]) == 1, \
            lines
    assert [x for x in lines if "the image's /etc/ld.so.cache is not usable" in x], lines
    assert len(lines) == 4 and "Traceback" not in proc.stderr, lines
    assert _cache(rootfs)["libfake.so.1"] == f"{LIB}/libfake.so.1"


def test_container_mounts_are_read_from_any_config(tmp_path: Path) -> None:
    from cdi.hooks.state import root_from_config

    config = {"root": {"path": "rootfs"}, "mounts": [
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", 1]},
        {"destination": 5}, "junk", {"destination": "/v", "options": "rbind"}]}
    container = root_from_config(str(tmp_path), config)
    assert container.mounts == (("/dev", "tmpfs", "tmpfs", ("nosuid",)), ("/v", "", "", ()))
    assert root_from_config(str(tmp_path), {"root": {"path": "r"}, "mounts": {}}).mounts == ()
