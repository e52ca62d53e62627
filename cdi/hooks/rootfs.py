"""Paths inside a container root, resolved as if chrooted into it so that nothing in the image
can point outside it: by ``openat2(2)`` (``RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS``) where the
kernel has it, else by a walk of one ``O_PATH | O_NOFOLLOW`` component at a time, into
descriptors that callers act through (docs/developer/hook-safety.md §2).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct

from cdi.hooks.mounts import MountTable, mount_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from cdi.hooks.state import ContainerRoot

_MAX_HOPS = 40  # symlinks per resolution, the bound Linux's own path walk uses
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
# openat2 is 437 on x86_64 and on the generic table that aarch64 uses.
_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(os.uname().machine, 0)
_O_PATH = os.O_PATH | os.O_CLOEXEC
_MAX_NAMES = 1 << 16  # names per folder listed; a distribution's /usr/lib has a few 1000


class RootFSError(Exception):
    """A path inside the container root cannot be used as asked; says which and why."""


class ForeignMountError(RootFSError):
    """The folder (or name) to write lies on a mount other than the container's own
    filesystems (a volume, a bind mount of a host folder): the hook does not write there."""


def split_container_path(path: str) -> tuple[str, ...]:
    """The components of an absolute container path given to a hook. Paths come from the
    spec (host-controlled): ``..`` or a relative path is the spec's bug, refused."""
    if not path.startswith("/") or "\0" in path:
        raise RootFSError(f"{path!r}: want an absolute path inside the container")
    parts = tuple(p for p in path.split("/") if p not in ("", "."))
    if ".." in parts:
        raise RootFSError(f"{path!r}: '..' is not allowed in hook paths")
    return parts


def read_only_message(where: str) -> str:
    return (f"{where}: the container's filesystem is read-only, so the hook cannot write "
            "there; generate the spec with --link-mode mounts for read-only roots")


def describe_error(exc: BaseException) -> str:
    """One line for a message: an OSError's own words without its path, else the text."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def folder_names(dir_fd: int, folder: str) -> set[str]:
    """The names in the folder open at ``dir_fd``, at most :data:`_MAX_NAMES` (an image's
    folder is input)."""
    # scandir needs a readable fd; re-open the folder we resolved (not its name).
    fd = os.open(f"/proc/self/fd/{dir_fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    names: set[str] = set()
    try:
        with os.scandir(fd) as it:
            for entry in it:
                if len(names) >= _MAX_NAMES:
                    raise RootFSError(f"{folder} holds more than {_MAX_NAMES} names")
                names.add(entry.name)
    finally:
        os.close(fd)
    return names


# --- the two resolvers ----------------------------------------------------------------------


_LIBC: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    """This process's libc (no ``ctypes.util`` lookup), loaded once."""
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
        _LIBC.syscall.restype = ctypes.c_long
    return _LIBC


def syscall(number: int, *args: object, what: str) -> int:
    """``syscall(2)``: the result, or OSError naming ``what``."""
    result = libc().syscall(ctypes.c_long(number), *args)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), what)
    return int(result)


def _openat2(root_fd: int, parts: tuple[str, ...], follow: bool) -> int:
    flags = _O_PATH | (0 if follow else os.O_NOFOLLOW)
    how = struct.pack("=QQQ", flags, 0, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
    path = "/" + "/".join(parts)
    name = ctypes.c_char_p(os.fsencode(path[1:] or "."))
    for _ in range(16):  # EAGAIN: a concurrent rename was seen; the kernel asks to retry
        try:
            return syscall(_OPENAT2, ctypes.c_int(root_fd), name, ctypes.c_char_p(how),
                           ctypes.c_size_t(len(how)), what=path)
        except BlockingIOError:
            continue
    raise OSError(errno.EAGAIN, "path keeps changing", path)


def _walk(root_fd: int, parts: tuple[str, ...], follow: bool) -> int:
    stack = [os.dup(root_fd)]  # stack[0] is the root; '..' never pops it
    todo = list(reversed(parts))  # no "" or "." in it: split_container_path, link targets
    hops = 0
    try:
        while todo:
            part = todo.pop()
            if part == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            fd = os.open(part, _O_PATH | os.O_NOFOLLOW, dir_fd=stack[-1])
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode) and (todo or follow):
                target = os.readlink("", dir_fd=fd)  # the link we hold, not a new lookup
                os.close(fd)
                hops += 1
                if hops > _MAX_HOPS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), part)
                if target.startswith("/"):  # restarts at the root
                    while len(stack) > 1:
                        os.close(stack.pop())
                todo.extend(reversed([p for p in target.split("/") if p not in ("", ".")]))
                continue
            if todo and not stat.S_ISDIR(mode):
                os.close(fd)
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), part)
            stack.append(fd)
        return os.dup(stack[-1])
    finally:
        for fd in stack:
            os.close(fd)


def _probe_openat2() -> Callable[[int, tuple[str, ...], bool], int] | None:
    if not _OPENAT2:
        return None
    try:
        fd = os.open("/", _O_PATH | os.O_DIRECTORY)
        try:
            os.close(_openat2(fd, (), True))
        finally:
            os.close(fd)
    except (OSError, AttributeError):  # ENOSYS on old kernels, EPERM under some seccomp
        return None
    return _openat2


# --- the API hooks use ----------------------------------------------------------------------


class RootFS:
    """An open container root; every method resolves its path inside it. ``resolver``:
    ``"auto"`` (openat2 when the kernel has it), or, to test each, ``"openat2"``, ``"walk"``."""

    def __init__(self, path: str, *, resolver: str = "auto",
                 container: ContainerRoot | None = None):
        self.path = path
        self.container = container  # its config's mounts name the mounts in messages
        self._mount: int | None = None
        self._mounts: MountTable | None = None
        if resolver not in ("auto", "openat2", "walk"):
            raise ValueError(f"unknown resolver {resolver!r}")
        # probed per root: a hook opens one
        impl = _probe_openat2() if resolver != "walk" else None
        if impl is None and resolver == "openat2":
            raise RootFSError("openat2 is not available on this kernel")
        self._open = impl or _walk
        try:
            self.fd = os.open(path, _O_PATH | os.O_DIRECTORY)
        except OSError as exc:
            raise RootFSError(f"container root {path}: {exc.strerror}") from None

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> RootFS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def where(self, path: str) -> str:
        """A host-side name for messages only (never opened)."""
        return f"{self.path.rstrip('/')}{path}"

    def open_path(self, path: str, *, follow: bool = True) -> int:
        """An ``O_PATH`` fd of ``path`` resolved in the root; the caller closes it."""
        return self._open(self.fd, split_container_path(path), follow)

    def directory(self, path: str, *, create: bool = False) -> _Folder:
        """An ``O_PATH`` fd of the folder ``path``, made (``0755``) with its parents if asked;
        a context manager that closes it."""
        return _Folder(self._open_dir(split_container_path(path), create))

    def parent(self, path: str, *, create: bool = False) -> _Parent:
        """The folder holding ``path`` (resolved) and the last component (not resolved); a
        context manager giving ``(fd, name)`` that closes the fd."""
        parts = split_container_path(path)
        if not parts:
            raise RootFSError(f"{path!r}: the container root itself has no parent")
        return _Parent(self._open_dir(parts[:-1], create), parts[-1])

    def check_writable(self, dir_fd: int, path: str) -> None:
        """Refuse a folder on another mount than the container's own (:meth:`check_own`) and,
        with a clear message rather than EROFS half-way, a read-only one."""
        self.check_own(dir_fd, path)
        if os.fstatvfs(dir_fd).f_flag & os.ST_RDONLY:
            raise RootFSError(read_only_message(self.where(path)))

    def check_own(self, fd: int, path: str) -> None:
        """Raise :class:`ForeignMountError` unless the object open at ``fd`` lies on the
        container's root filesystem or on a tmpfs made for it alone (see
        :mod:`cdi.hooks.mounts`): decided by the mount the kernel says it is on."""
        mnt = mount_id(fd)
        if self._mount is None:
            self._mount = mount_id(self.fd)
        if mnt is None or mnt == self._mount:
            return  # Linux < 3.15 says nothing: the folder walk still kept it in the root
        if self._mounts is None:
            self._mounts = MountTable(self.path, self.container)
        if not self._mounts.is_private(mnt):
            raise ForeignMountError(f"{path}: on {self._mounts.describe(mnt)}; the hook "
                                    "writes only into the container's own filesystems")

    def replace(self, dir_fd: int, name: str, path: str, make: Callable[[str], None]) -> None:
        """Replace ``name`` in the folder ``dir_fd`` (``path`` in messages) so that the name
        never disappears: ``make(tmp)`` makes the new object under a fresh name beside it (or
        raises having made nothing), which is renamed over ``name``. Refused when ``name`` is
        a mount point of another mount (a host file bind-mounted there)."""
        try:
            fd = os.open(name, _O_PATH | os.O_NOFOLLOW, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        else:
            try:
                self.check_own(fd, path)
            finally:
                os.close(fd)
        tmp = f".{name}.nri-cdi-{os.urandom(4).hex()}"
        make(tmp)
        try:
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError:
            os.unlink(tmp, dir_fd=dir_fd)
            raise

    def open_read(self, path: str) -> int:
        """A read-only fd of the regular file at ``path``; the caller closes it. Re-opened
        through ``/proc/self/fd`` from the ``O_PATH`` fd held, so a FIFO or device node
        planted in the image is refused before anything opens it."""
        pfd = self.open_path(path)
        try:
            if not stat.S_ISREG(os.fstat(pfd).st_mode):
                raise RootFSError(f"{self.where(path)} is not a regular file")
            try:
                return os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
            except FileNotFoundError:
                raise RootFSError("cannot re-open files: /proc is not mounted") from None
        finally:
            os.close(pfd)

    def read_file(self, path: str, *, limit: int) -> bytes | None:
        """The contents of a regular file (``None`` if absent), refusing more than ``limit``."""
        try:
            fd = self.open_read(path)
        except FileNotFoundError:
            return None
        try:
            data = os.read(fd, limit + 1)
        finally:
            os.close(fd)
        if len(data) > limit:
            raise RootFSError(f"{self.where(path)} is larger than {limit} bytes")
        return data

    def _open_dir(self, parts: tuple[str, ...], create: bool) -> int:
        try:
            fd = self._open(self.fd, parts, True)
        except FileNotFoundError:
            if not create or not parts:
                raise
            with _Folder(self._open_dir(parts[:-1], True)) as pfd:
                self.check_writable(pfd, "/" + "/".join(parts[:-1]))
                try:  # noqa: SIM105 (contextlib would slow the hook's start)
                    os.mkdir(parts[-1], 0o755, dir_fd=pfd)
                except FileExistsError:
                    pass  # made meanwhile, or a dangling link: see below
            try:
                fd = self._open(self.fd, parts, True)
            except FileNotFoundError:
                raise RootFSError(f"{self.where('/' + '/'.join(parts))} is a dangling symlink; "
                                  "not making a folder through it") from None
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            os.close(fd)
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", "/" + "/".join(parts))
        return fd


# Plain context managers: importing contextlib would slow every hook's start.


class _Folder:
    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> int:
        return self.fd

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


class _Parent(_Folder):
    __slots__ = ("name",)

    def __init__(self, fd: int, name: str) -> None:
        self.fd, self.name = fd, name

    def __enter__(self) -> tuple[int, str]:  # type: ignore[override]
        return self.fd, self.name
