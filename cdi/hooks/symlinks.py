"""``create-symlinks``: make ``LINK -> TARGET`` inside the container root.

TARGET is only the text stored in the link, never resolved by the hook (the container reads
it in its own root). A link already pointing at TARGET is left alone (hooks may run twice);
a link or file with other contents is replaced atomically, a folder never; a link on
another mount than the container's own is skipped with a line: docs/developer/hook-safety.md §3.
"""

from __future__ import annotations

import os
import stat

from cdi.hooks.rootfs import ForeignMountError, RootFS, RootFSError, split_container_path
from cdi.linux.namedtuple import NamedTuple

TYPE_CHECKING = False  # collections would slow every hook's start
if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import SimpleNamespace


# Not dataclasses: ``dataclasses`` imports ``inspect``, which costs a hook process's start
# more than the hook's work.


class Link:
    __slots__ = ("path", "target")

    def __init__(self, *, target: str, path: str) -> None:
        if not target or "\0" in target:
            raise RootFSError(f"link {path!r}: empty or invalid target")
        if not split_container_path(path):
            raise RootFSError(f"link {path!r}: cannot replace the container root")
        self.target = target
        self.path = path


class LinkResult(NamedTuple):
    link: Link
    action: str  # "created" | "kept" | "replaced" | "skipped"
    # the old target, "<file>" for a replaced regular file, or why it was skipped
    previous: str | None = None


def parse_link(spec: str) -> Link:
    """``TARGET::LINK`` as written on the command line (the vendors' hook programs' syntax)."""
    target, sep, path = spec.partition("::")
    if not sep:
        raise RootFSError(f"--link {spec!r}: want TARGET::LINK")
    return Link(target=target, path=path)


def run(root: RootFS, args: SimpleNamespace) -> list[str]:
    """The operation: ``--link``s, and the ``--device-link``s of the container's devices."""
    links = [parse_link(s) for s in args.link]
    for spec in args.device_link:  # all checked, also those for devices not in this container
        device, sep, link = spec.partition("::")
        target, sep2, path = link.partition("::")
        if not sep or not sep2 or not device.startswith("/"):
            raise RootFSError(f"--device-link {spec!r}: want DEVICE::TARGET::LINK")
        found = Link(target=target, path=path)
        if device in args.container.devices:  # the link is for a device this container has
            links.append(found)
    return [f"replaced {r.link.path} -> {r.link.target} (was {r.previous})"
            if r.action == "replaced" else f"{r.previous}; link not made"
            for r in create_symlinks(root, links) if r.action in ("replaced", "skipped")]


def create_symlinks(root: RootFS, links: Iterable[Link]) -> list[LinkResult]:
    return [_create(root, link) for link in links]


def _create(root: RootFS, link: Link) -> LinkResult:
    try:
        with root.parent(link.path, create=True) as (dir_fd, name):
            previous = _current(root, link, dir_fd, name)
            if previous == link.target:
                return LinkResult(link=link, action="kept")  # nothing to write or to check
            root.check_writable(dir_fd, link.path)
            if previous is None:
                try:
                    os.symlink(link.target, name, dir_fd=dir_fd)
                    return LinkResult(link=link, action="created")
                except FileExistsError:
                    previous = _current(root, link, dir_fd, name)  # raced: fall through
                    if previous == link.target:
                        return LinkResult(link=link, action="kept")
            root.replace(dir_fd, name, link.path,
                         lambda tmp: os.symlink(link.target, tmp, dir_fd=dir_fd))
            return LinkResult(link=link, action="replaced", previous=previous)
    except ForeignMountError as exc:  # a volume, a host folder: not the container's to write
        return LinkResult(link=link, action="skipped", previous=str(exc))


def _current(root: RootFS, link: Link, dir_fd: int, name: str) -> str | None:
    """The target of the existing link, ``"<file>"`` for a regular file, None if absent."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return os.readlink(name, dir_fd=dir_fd)
    if stat.S_ISREG(st.st_mode):
        return "<file>"
    raise RootFSError(f"{root.where(link.path)} exists and is not a file or a link; "
                      "not replacing it with a link")
