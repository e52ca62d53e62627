"""A record of what ``nri-cdi generate`` reads on a node, and a root rebuilt from it.

``record(driver_root, dev_root)`` lists, under the driver root, every file, link and folder
of the folders the generator searches whose name is a driver's (with each file's mode, its
ELF SONAME and class, or the text of a small text file), the ld cache's entries, and, under
the dev root, the NVIDIA and DRM device nodes (numbers, mode, owner), ``/proc/driver``'s
NVIDIA files, ``/proc/devices`` and the ``/sys`` entries the generator reads.
``nri-cdi doctor --e2e --record-node FILE`` writes it beside the report, so a real node's
spec can be regenerated later from what the node had (``rebuild``), not only re-read.

``rebuild(record, into)`` makes a driver root and a dev root that answer the generator as
the node did: ELF files are built with their SONAME (gcc), device nodes made with their
numbers (root), the ld cache written by ``ldconfig -r``.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

from cdi.linux.elf import ElfError, is_elf, read_header, read_soname
from cdi.linux.ldcache import LdCacheError, read_ldcache
from nri_cdi_testbed.simnode.hosttools import make_socket

# The driver root's folders the generator searches (libraries, programs, configs, firmware,
# sockets), walked to this depth; only names below are kept.
DRIVER_FOLDERS = ("usr/lib", "usr/lib64", "usr/lib32", "lib", "lib64", "lib32", "usr/bin",
                  "usr/sbin", "bin", "sbin", "usr/local/bin", "usr/local/sbin",
                  "usr/local/nvidia", "usr/local/lib", "etc/vulkan", "etc/OpenCL", "etc/egl",
                  "etc/glvnd", "etc/X11", "usr/share/glvnd", "usr/share/egl",
                  "usr/share/vulkan", "usr/share/nvidia", "usr/share/X11",
                  "usr/local/share", "run/nvidia-persistenced", "var/run/nvidia-persistenced",
                  "run/nvidia-fabricmanager", "var/run/nvidia-fabricmanager", "tmp/nvidia-mps")
DEPTH = 6
DRIVER_NAME = re.compile(r"nvidia|nvcuvid|cuda|vdpau|libEGL|libGL|libnv|gsp_|nvoptix|"
                         r"xorg|gbm|icd|egl_|vendors|firmware|^socket$")
DEV_NAMES = re.compile(r"^(nvidia.*|dri|card\d+|renderD\d+|by-path|pci-.*)$")
TEXT_LIMIT = 1024 * 1024  # a text file up to this size is kept whole


def _entry(path: Path) -> dict[str, Any]:
    st = path.lstat()
    out: dict[str, Any] = {"mode": stat.S_IMODE(st.st_mode)}
    if stat.S_ISLNK(st.st_mode):
        out["link"] = os.readlink(path)
    elif stat.S_ISDIR(st.st_mode):
        out["type"] = "d"
    elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        out.update(type="c" if stat.S_ISCHR(st.st_mode) else "b", major=os.major(st.st_rdev),
                   minor=os.minor(st.st_rdev), uid=st.st_uid, gid=st.st_gid)
    elif stat.S_ISSOCK(st.st_mode):
        out["type"] = "s"
    elif stat.S_ISREG(st.st_mode):
        out["type"] = "f"
        try:
            if is_elf(path):
                header = read_header(path)
                out["elf"] = {"soname": read_soname(path), "bits": header.bits,
                              "machine": header.machine}
            elif st.st_size <= TEXT_LIMIT:
                out["text"] = path.read_text()
            else:
                out["size"] = st.st_size
        except (ElfError, OSError, UnicodeDecodeError):
            out["size"] = st.st_size
    return out


def _walk(root: Path, rel: str, keep: re.Pattern[str], depth: int,
          out: dict[str, dict[str, Any]]) -> bool:
    """Record ``rel``'s entries whose names ``keep`` matches (and folders on the way to
    one); True when something under ``rel`` was kept."""
    folder = root / rel
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return False
    kept = False
    for name in names:
        sub = f"{rel}/{name}"
        path = root / sub
        inside = (depth > 0 and path.is_dir() and not path.is_symlink()
                  and _walk(root, sub, keep, depth - 1, out))
        if inside or keep.search(name):
            out["/" + sub] = _entry(path)
            kept = True
    return kept


def _tree(root: Path, rel: str) -> dict[str, dict[str, Any]]:
    """Every entry under ``rel`` (a small tree: /proc/driver/nvidia)."""
    out: dict[str, dict[str, Any]] = {}
    _walk(root, rel, re.compile(""), DEPTH, out)
    return out


def record(driver_root: str | Path, dev_root: str | Path = "/") -> dict[str, Any]:
    driver, dev = Path(driver_root), Path(dev_root)
    files: dict[str, dict[str, Any]] = {}
    for folder in DRIVER_FOLDERS:
        path = driver / folder
        if not (path.is_symlink() or path.exists()):
            continue
        files["/" + folder] = _entry(path)  # a merged /usr's /lib is a link: not walked
        if not path.is_symlink():
            _walk(driver, folder, DRIVER_NAME, DEPTH, files)
    try:
        cache = [[e.key, e.path] for e in read_ldcache(driver / "etc/ld.so.cache")]
    except (LdCacheError, OSError):
        cache = []
    devices: dict[str, dict[str, Any]] = {}
    for folder in ("dev", "dev/nvidia-caps", "dev/nvidia-caps-imex-channels", "dev/dri",
                   "dev/dri/by-path"):
        for name in sorted(os.listdir(dev / folder)) if (dev / folder).is_dir() else ():
            if DEV_NAMES.match(name) or folder != "dev":
                devices[f"/{folder}/{name}"] = _entry(dev / folder / name)
    proc = {**_tree(dev, "proc/driver/nvidia"), **_tree(dev, "proc/driver/nvidia-caps")}
    for rel in ("proc/devices", "sys/module/firmware_class/parameters/path"):
        if (dev / rel).is_file():
            proc["/" + rel] = {"type": "f", "mode": 0o444, "text": (dev / rel).read_text()}
    for bus in sorted(os.listdir(dev / "sys/bus/pci/devices")) if (
            dev / "sys/bus/pci/devices").is_dir() else ():
        drm = dev / "sys/bus/pci/devices" / bus / "drm"
        if drm.is_dir():
            proc[f"/sys/bus/pci/devices/{bus}/drm"] = {"type": "d", "mode": 0o755}
            for name in sorted(os.listdir(drm)):
                proc[f"/sys/bus/pci/devices/{bus}/drm/{name}"] = {"type": "d", "mode": 0o755}
    return {"driver_files": files, "ld.so.cache": cache, "dev": devices, "proc": proc}


# --- rebuilding ---------------------------------------------------------------------------


def _make(root: Path, path: str, entry: dict[str, Any], build: Path) -> None:
    target = root / path.lstrip("/")
    if os.path.lexists(target):  # made already (a folder of the list, or through a link)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    kind = entry.get("type")
    if "link" in entry:
        target.symlink_to(entry["link"])
        return
    if kind == "d":
        target.mkdir(exist_ok=True)
    elif kind in ("c", "b"):
        flag = stat.S_IFCHR if kind == "c" else stat.S_IFBLK
        os.mknod(target, flag | entry["mode"], os.makedev(entry["major"], entry["minor"]))
        os.chown(target, entry["uid"], entry["gid"])
    elif kind == "s":
        make_socket(target)
    elif "elf" in entry:
        elf = entry["elf"]
        source = build / "empty.c"
        source.write_text("int nri_cdi_rebuilt;\n")
        soname = [f"-Wl,-soname,{elf['soname']}"] if elf.get("soname") else []
        bits = ["-m32"] if elf.get("bits") == 32 else []
        subprocess.run(["gcc", *bits, "-shared", "-nostdlib", "-fPIC", *soname, "-o",
                        os.fspath(target), os.fspath(source)], check=True, capture_output=True)
    elif "text" in entry:
        target.write_text(entry["text"])
    else:
        target.write_bytes(b"\0" * min(int(entry.get("size", 0)), 4096))
    if kind != "d":
        os.chmod(target, entry["mode"])


def rebuild(doc: dict[str, Any], into: Path) -> tuple[Path, Path]:
    """A driver root and a dev root made from ``doc``; returns (driver root, dev root)."""
    driver, dev, build = into / "driver", into / "dev-root", into / "build"
    for folder in (driver, dev, build):
        folder.mkdir(parents=True)
    for path, entry in sorted(doc["driver_files"].items()):
        _make(driver, path, entry, build)
    for path, entry in sorted({**doc["dev"], **doc["proc"]}.items()):
        _make(dev, path, entry, build)
    folders = list(dict.fromkeys(os.path.dirname(p) for _, p in doc["ld.so.cache"]))
    (driver / "etc").mkdir(exist_ok=True)
    (driver / "etc/ld.so.conf").write_text("".join(f"{f}\n" for f in folders))
    subprocess.run(["ldconfig", "-X", "-r", os.fspath(driver)], check=True, capture_output=True)
    return driver, dev
