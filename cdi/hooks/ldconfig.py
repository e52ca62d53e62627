"""``update-ldcache``: make the injected folders' libraries findable by SONAME, without
running ``ldconfig`` (docs/developer/hook-safety.md §1).

glibc: a new ``/etc/ld.so.cache`` with the injected entries first and the image's (a
malformed one is dropped), SONAME links made as ``ldconfig`` would, and, when the image has
``/etc/ld.so.conf.d``, a ``000-nri-cdi.conf`` naming the folders, so that an ``ldconfig``
run later in the container keeps them. musl: the folders go into ``/etc/ld-musl-<arch>.path``.
"""

from __future__ import annotations

import os
import stat

from cdi.hooks.rootfs import (
    RootFS,
    RootFSError,
    describe_error,
    folder_names,
    split_container_path,
)
from cdi.linux.elf import (
    DynamicInfo,
    ElfError,
    NotElfError,
    foreign_to_this_machine,
    read_dynamic_fd,
)
from cdi.linux.ldcache import LdCacheEntry, LdCacheError, NameOrder, encode, merge, parse_ldcache

TYPE_CHECKING = False  # collections would slow every hook's start
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import SimpleNamespace

CACHE = "/etc/ld.so.cache"
CONF_DIR = "/etc/ld.so.conf.d"
CONF_NAME = "000-nri-cdi.conf"  # sorts first: our folders win, as ldconfig reads in order
_MAX_CACHE = 64 << 20
_MAX_PATH_FILE = 1 << 20
_MAX_COMPAT_CONF = 64 << 10
_MUSL_ARCH = {"x86_64": "x86_64", "aarch64": "aarch64"}.get(os.uname().machine, "x86_64")
_MUSL_DEFAULT = ("/lib", "/usr/local/lib", "/usr/lib")  # musl's path when no .path file
# After ".so": nothing, or "." and these (a version such as ".1", ".580.82.07").
_SO_SUFFIX = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_.+-")
_ET_DYN = 3
_FLAG_ELF_LIBC6 = 0x0003
# (e_machine, bits) -> ldconfig's arch bits; the loader accepts only its own exact flags.
_ARCH_FLAGS = {(62, 64): 0x0300, (183, 64): 0x0A00, (21, 64): 0x0500, (62, 32): 0x0800,
               (3, 32): 0x0000}


def run(root: RootFS, args: SimpleNamespace) -> list[str]:
    return update_ldcache(root, args.folder)  # --ldconfig-path: ignored, nothing is run


def update_ldcache(root: RootFS, folders: Sequence[str]) -> list[str]:
    """Returns the warnings: what in the image was skipped or replaced."""
    for folder in folders:
        split_container_path(folder)  # validate every argument before touching anything
    if _mode(root, f"/lib/ld-musl-{_MUSL_ARCH}.so.1"):
        return _update_musl(root, folders)
    return _update_glibc(root, folders)


def _mode(root: RootFS, path: str) -> int:
    """The ``st_mode`` of what ``path`` resolves to in the root; 0 when nothing."""
    try:
        fd = root.open_path(path)
    except OSError:
        return 0
    try:
        return os.fstat(fd).st_mode
    finally:
        os.close(fd)


# --- glibc ----------------------------------------------------------------------------------


def _update_glibc(root: RootFS, folders: Sequence[str]) -> list[str]:
    warnings: list[str] = []
    added: list[LdCacheEntry] = []
    ours = {f.rstrip("/") or "/" for f in folders}
    # The folders a 00-compat-*.conf names first (a vendor's forward-compatibility hook
    # writes one): their libraries must win over the injected ones, as with ldconfig.
    first = compat_folders(root, warnings)
    for folder in dict.fromkeys(f.rstrip("/") or "/" for f in (*first, *folders)):
        try:
            added += _scan(root, folder, warnings)
        except FileNotFoundError:
            warnings.append(f"{folder}: not in the container; skipped")
        except (OSError, RootFSError) as exc:
            if folder in ours:  # the spec's own folder: its libraries cannot be served
                raise RootFSError(f"{folder}: {describe_error(exc)}; an injected folder must "
                                  "be a folder inside the container root") from None
            # a folder the image's conf names: the GPU is served without it
            warnings.append(f"{folder} (named by {CONF_DIR}/00-compat-*.conf): "
                            f"{describe_error(exc)}; skipped")
    write_file(root, CACHE, encode(merge(added, _old_entries(root, warnings))))
    conf = "".join(f"{f}\n" for f in dict.fromkeys(folders))
    if stat.S_ISDIR(_mode(root, CONF_DIR)):
        try:
            write_file(root, f"{CONF_DIR}/{CONF_NAME}", conf.encode())
        except RootFSError as exc:  # optional: only for an ldconfig run later in the image
            warnings.append(f"{exc}; {CONF_DIR}/{CONF_NAME} not written")
    return warnings


def _old_entries(root: RootFS, warnings: list[str]) -> list[LdCacheEntry]:
    try:
        data = root.read_file(CACHE, limit=_MAX_CACHE)
        return parse_ldcache(data, source=CACHE) if data is not None else []
    except (RootFSError, LdCacheError, OSError, ValueError) as exc:
        warnings.append(f"the image's {CACHE} is not usable ({exc}); writing a new one")
        return []


def _scan(root: RootFS, folder: str, warnings: list[str]) -> list[LdCacheEntry]:
    """Cache entries for the shared objects in ``folder``, its missing SONAME links made.
    Where the folder cannot be written (another mount than the container's own, read-only),
    the entry names the library's own file instead, which the loader opens as well."""
    with root.directory(folder) as dir_fd:
        names = folder_names(dir_fd, folder)
        by_soname = _libraries(root, folder, names, warnings)
        entries: list[LdCacheEntry] = []
        writable: bool | None = None
        for soname, found in by_soname.items():
            target = soname
            if soname not in names:
                newest = max(found, key=lambda f: NameOrder(f[0]))[0]
                if writable is None:
                    writable = _may_write(root, dir_fd, folder, warnings)
                if writable:
                    try:  # noqa: SIM105 (contextlib would slow the hook's start)
                        os.symlink(newest, soname, dir_fd=dir_fd)
                    except FileExistsError:  # made meanwhile (by another container, say): kept
                        pass
                else:
                    target = newest
            for flags in dict.fromkeys(f for _, f in found):
                entries.append(LdCacheEntry(key=soname, path=f"{folder.rstrip('/')}/{target}",
                                            flags=flags))
    return entries


def _libraries(root: RootFS, folder: str, names: set[str],
               warnings: list[str]) -> dict[str, list[tuple[str, int]]]:
    """``_scan``'s libraries of this machine in ``folder``: (file, cache flags) by SONAME."""
    by_soname: dict[str, list[tuple[str, int]]] = {}
    for name in sorted(names):
        if not _is_library_name(name):
            continue
        path = f"{folder}/{name}".replace("//", "/")
        info = _elf(root, path, warnings)
        if info is None or info.header.elf_type != _ET_DYN:
            continue
        foreign = foreign_to_this_machine(path, info.header)
        if foreign is not None:  # the loader would pass it over without a word
            warnings.append(f"{foreign}: left out of the cache")
            continue
        arch = _ARCH_FLAGS.get((info.header.machine, info.header.bits))
        soname = info.soname or name
        if arch is None or not _plain_name(soname):
            continue  # a hostile SONAME such as "../../x" names no file we would make
        by_soname.setdefault(soname, []).append((name, _FLAG_ELF_LIBC6 | arch))
    return by_soname


def _may_write(root: RootFS, dir_fd: int, folder: str, warnings: list[str]) -> bool:
    try:
        root.check_writable(dir_fd, folder)
    except RootFSError as exc:
        warnings.append(f"{exc}; no SONAME links made there (the cache names the files)")
        return False
    return True


def _is_library_name(name: str) -> bool:
    """``lib*.so``, ``lib*.so.VERSION``, ``ld-*.so*``: the names ldconfig looks at."""
    if not name.startswith(("lib", "ld-")) or "\n" in name:
        return False
    start = 3
    while (i := name.find(".so", start)) >= 0:
        rest = name[i + 3:]
        if not rest or (rest[0] == "." and _SO_SUFFIX.issuperset(rest)):
            return True
        start = i + 1
    return False


def _elf(root: RootFS, path: str, warnings: list[str]) -> DynamicInfo | None:
    try:
        fd = root.open_read(path)
    except (OSError, RootFSError):
        return None  # dangling link, folder, FIFO, ...: not a library
    try:
        return read_dynamic_fd(fd, path)
    except NotElfError:
        return None  # a linker script (libc.so), text: not a library, nothing to say
    except (ElfError, OSError) as exc:
        warnings.append(f"{path}: malformed ELF object, skipped ({describe_error(exc)})")
        return None
    finally:
        os.close(fd)


def _plain_name(name: str) -> bool:
    return (0 < len(name) < 256 and "/" not in name and "\0" not in name
            and name not in (".", "..") and name.isprintable())


def write_file(root: RootFS, path: str, data: bytes) -> None:
    """Replace the container file ``path`` atomically (mode 0644, folders made)."""
    with root.parent(path, create=True) as (dir_fd, name):
        root.check_writable(dir_fd, path)
        root.replace(dir_fd, name, path, lambda tmp: _new_file(dir_fd, tmp, data))


def _new_file(dir_fd: int, name: str, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o644)  # whatever the hook's umask
        os.write(fd, data)
    except BaseException:
        os.unlink(name, dir_fd=dir_fd)
        raise
    finally:
        os.close(fd)


# --- musl -----------------------------------------------------------------------------------


def _update_musl(root: RootFS, folders: Sequence[str]) -> list[str]:
    path = f"/etc/ld-musl-{_MUSL_ARCH}.path"
    data = root.read_file(path, limit=_MAX_PATH_FILE)
    current = [p for p in os.fsdecode(data or b"").replace("\n", ":").split(":") if p]
    known = current or list(_MUSL_DEFAULT)  # the file replaces musl's default path
    new = known + [f for f in dict.fromkeys(folders) if f not in known]
    if data is None or new != current:
        write_file(root, path, ("\n".join(new) + "\n").encode())
    return []


# --- 00-compat-*.conf: folders a hook named to go first -------------------------------


def compat_folders(root: RootFS, warnings: list[str]) -> list[str]:
    """The folders named by ``/etc/ld.so.conf.d/00-compat-*.conf`` (in name order), which
    ``update-ldcache`` puts ahead of the injected ones. The files are the image's: bounded,
    and one that cannot be read (a FIFO, a link out of the root) is a line in ``warnings``."""
    try:
        with root.directory(CONF_DIR) as dir_fd:
            names = sorted(n for n in folder_names(dir_fd, CONF_DIR)
                           if n.startswith("00-compat-") and n.endswith(".conf"))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except (OSError, RootFSError) as exc:
        warnings.append(f"{CONF_DIR}: cannot be read ({describe_error(exc)}); no compat "
                        "folders used")
        return []
    folders: list[str] = []
    for name in names[:16]:
        path = f"{CONF_DIR}/{name}"
        try:
            data = root.read_file(path, limit=_MAX_COMPAT_CONF)
        except (OSError, RootFSError) as exc:
            warnings.append(f"{path}: cannot be read ({describe_error(exc)}); skipped")
            continue
        for line in os.fsdecode(data or b"").splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("/") and ".." not in line.split("/") and "\0" not in line:
                folders.append(line)
    return list(dict.fromkeys(folders))[:64]
