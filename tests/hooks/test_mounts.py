"""cdi/hooks/mounts.py on its own: the mount id the kernel gives a descriptor, a line found
in a mountinfo table, and the container's mount table (read from mountinfo files written
in tmp_path) saying which mount is a tmpfs of the container's own and describing the
others for a hook's message."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdi.hooks import mounts
from cdi.hooks.mounts import MountTable, find_mount, mount_id
from cdi.hooks.state import ContainerRoot

ROOT = "/run/ctr/rootfs"
PID = 4242


def line(mnt: int, device: str, root: str, point: str, fstype: str, source: str,
         optional: str = "shared:1") -> str:
    """A mountinfo line: id, parent, major:minor, root, mount point, options, optional
    fields, the separator, filesystem type, source, superblock options."""
    return f"{mnt} 1 {device} {root} {point} rw,nosuid {optional} - {fstype} {source} rw\n"


# The container's table (its init process's), as the kernel writes it.
TABLE = "".join((
    line(20, "8:1", "/", "/", "ext4", "/dev/sda1"),
    line(100, "0:50", "/", ROOT, "overlay", "overlay"),
    line(101, "0:51", "/", f"{ROOT}/dev", "tmpfs", "tmpfs"),
    # A tmpfs bound in from the host: its filesystem is mounted at its origin as well.
    line(30, "0:30", "/", "/run/host-tmp", "tmpfs", "tmpfs"),
    line(102, "0:30", "/", f"{ROOT}/dev/shm", "tmpfs", "tmpfs"),
    # A tmpfs mounted from a folder of its filesystem, not its root.
    line(103, "0:53", "/sub", f"{ROOT}/sub", "tmpfs", "tmpfs"),
    # Something stacked on a tmpfs: two mounts at one point.
    line(104, "0:54", "/", f"{ROOT}/stacked", "tmpfs", "tmpfs"),
    line(105, "8:1", "/srv", f"{ROOT}/stacked", "ext4", "/dev/sda1"),
    # A mount point with a space, escaped as the table writes it; no optional field.
    line(106, "0:56", "/", f"{ROOT}/my\\040dir", "tmpfs", "tmpfs", optional=""),
    # A tmpfs config.json does not ask for (a volume through an image symlink, say).
    line(107, "0:57", "/", f"{ROOT}/nospec", "tmpfs", "tmpfs"),
    # A tmpfs config.json asks for as a bind.
    line(108, "0:58", "/", f"{ROOT}/bound", "tmpfs", "tmpfs"),
    line(109, "8:1", "/srv/data", f"{ROOT}/data", "ext4", "/dev/sda1"),
    line(110, "0:60", "/", f"{ROOT}/spec-last", "tmpfs", "tmpfs"),
))
# The hook's own table: the host's (a createContainer hook runs in the container's).
SELF_TABLE = line(20, "8:1", "/", "/", "ext4", "/dev/sda1") + line(
    500, "0:70", "/", "/run/ours", "tmpfs", "tmpfs")

SPEC_MOUNTS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("/dev", "tmpfs", "tmpfs", ("nosuid", "strictatime", "mode=755")),
    ("/dev/shm", "tmpfs", "shm", ("nosuid",)),
    ("/sub", "tmpfs", "tmpfs", ()),
    ("/stacked", "tmpfs", "tmpfs", ()),
    ("/my dir", "tmpfs", "tmpfs", ()),
    ("bound/", "tmpfs", "tmpfs", ("rbind",)),  # normalised to /bound
    ("/data", "bind", "/srv/data", ("rbind", "ro")),
    ("/spec-last", "bind", "/srv/x", ("rbind",)),
    ("/spec-last", "tmpfs", "tmpfs", ()),  # the last one at a destination counts
)


def container(pid: int = PID) -> ContainerRoot:
    root = ContainerRoot(path=ROOT, readonly=False, mounts=SPEC_MOUNTS)
    root.pid = pid  # the state's, set where the state is read
    return root


def proc(tmp_path: Path, tables: dict[str, str]) -> str:
    """A /proc of its own: ``{who: mountinfo}``."""
    for who, text in tables.items():
        (tmp_path / "proc" / who).mkdir(parents=True)
        (tmp_path / "proc" / who / "mountinfo").write_text(text)
    return str(tmp_path / "proc")


@pytest.fixture
def table(tmp_path: Path) -> MountTable:
    return MountTable(ROOT + "/", container(), proc=proc(tmp_path, {
        str(PID): TABLE, "self": SELF_TABLE}))


# --- mount_id -------------------------------------------------------------------------------


def test_mount_id_is_the_mount_the_descriptor_lies_on(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    other = os.open(tmp_path / ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        mnt = mount_id(fd)
        assert mnt is not None and mnt == mount_id(other)
        with open("/proc/self/mountinfo", "rb") as f:
            info = find_mount(f.read(), mnt)
        assert info is not None
        # The mount the table gives for that id holds tmp_path.
        real = os.path.realpath(tmp_path)
        assert info.mount_point == "/" or real == info.mount_point \
            or real.startswith(info.mount_point + "/"), (info.mount_point, real)
    finally:
        os.close(fd)
        os.close(other)


def test_mount_id_of_a_closed_descriptor_fails(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    os.close(fd)
    with pytest.raises(FileNotFoundError):
        mount_id(fd)


# --- find_mount -----------------------------------------------------------------------------


def test_find_mount_reads_the_line_of_that_id_only() -> None:
    data = TABLE.encode()
    first = find_mount(data, 20)
    assert first is not None
    assert (first.mount_point, first.root, first.fstype, first.source) == (
        "/", "/", "ext4", "/dev/sda1")
    dev = find_mount(data, 101)
    assert dev is not None
    assert (dev.mount_point, dev.fstype, dev.device, dev.raw_point) == (
        f"{ROOT}/dev", "tmpfs", b"0:51", f"{ROOT}/dev".encode())
    sub = find_mount(data, 103)
    assert sub is not None and sub.root == "/sub"


def test_find_mount_unescapes_and_keeps_the_raw_point() -> None:
    info = find_mount(TABLE.encode(), 106)
    assert info is not None
    assert info.mount_point == f"{ROOT}/my dir"
    assert info.raw_point == f"{ROOT}/my\\040dir".encode()
    tab = find_mount(b"7 1 0:9 /a\\011b\\134 /x\\012y rw - tmpfs src\\040x rw", 7)
    assert tab is not None
    assert (tab.root, tab.mount_point, tab.source) == ("/a\tb\\", "/x\ny", "src x")


def test_find_mount_of_an_id_not_in_the_table_is_none() -> None:
    data = TABLE.encode()
    assert find_mount(data, 999) is None
    # Ids that end another's digits, or appear inside a line, are not its id.
    assert find_mount(data, 0) is None and find_mount(data, 1) is None
    assert find_mount(data, 10) is None  # "110 ..." and "101 ..." are not 10's
    assert find_mount(b"", 20) is None


def test_find_mount_of_the_last_line_without_a_newline() -> None:
    info = find_mount(TABLE.rstrip("\n").encode(), 110)
    assert info is not None and info.source == "tmpfs" and info.mount_point.endswith(
        "/spec-last")


def test_find_mount_of_a_line_not_of_the_format_is_none() -> None:
    assert find_mount(b"7 1 0:9 / /x rw shared:1 tmpfs tmpfs rw\n", 7) is None  # no "-"
    assert find_mount(b"7 1 0:9 / /x rw - tmpfs\n", 7) is None  # no source
    assert find_mount(b"7 1 0:9 / /x - tmpfs src rw\n", 7) is None  # "-" before field 6


# --- MountTable -----------------------------------------------------------------------------


def test_destination_is_the_path_in_the_container(table: MountTable) -> None:
    def at(point: str) -> str:
        return table.destination(mounts.MountInfo(point, "/", "tmpfs", "tmpfs"))

    assert at(ROOT) == "/"
    assert at(f"{ROOT}/dev/shm") == "/dev/shm"
    assert at("/run/ctr/rootfs-other/x") == "/run/ctr/rootfs-other/x"  # not under the root
    assert at("/run/host-tmp") == "/run/host-tmp"


def test_a_fresh_tmpfs_config_json_asks_for_is_the_containers(table: MountTable) -> None:
    assert table.is_private(101)  # /dev
    assert table.is_private(106)  # "/my dir", found by its escaped mount point
    assert table.is_private(110)  # the last config.json mount at /spec-last is a tmpfs


@pytest.mark.parametrize(("mnt", "why"), [
    (100, "the root filesystem is no tmpfs"),
    (102, "a host tmpfs bound in: its filesystem is mounted at its origin too"),
    (103, "mounted from a folder of its filesystem"),
    (104, "something is stacked at its mount point"),
    (107, "config.json asks for no mount there"),
    (108, "config.json asks for a bind there"),
    (109, "a bind of a host folder"),
    (999, "a mount in no table"),
])
def test_anything_else_is_not_the_containers(table: MountTable, mnt: int, why: str) -> None:
    assert not table.is_private(mnt), why


def test_a_table_too_large_to_read_whole_is_not_trusted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mounts, "_MAX_MOUNTINFO", len(TABLE.encode()))
    big = MountTable(ROOT, container(), proc=proc(tmp_path, {str(PID): TABLE}))
    assert not big.is_private(101)


def test_the_containers_table_first_then_the_hooks_own(tmp_path: Path) -> None:
    tables = MountTable(ROOT, container(), proc=proc(tmp_path, {
        str(PID): TABLE, "self": SELF_TABLE}))
    assert tables.describe(500) == ("a mount of tmpfs tmpfs:/ at /run/ours, not the "
                                    "container's root filesystem")
    # A mount id is in one table only; were it in both, the container's line would count.
    assert tables.describe(20).startswith("a mount of ext4 /dev/sda1:/ at /,")


def test_without_a_pid_or_its_table_only_the_hooks_own_is_read(tmp_path: Path) -> None:
    root = proc(tmp_path, {"self": TABLE})
    assert MountTable(ROOT, container(pid=0), proc=root).is_private(101)
    assert MountTable(ROOT, container(pid=PID), proc=root).is_private(101)  # pid's: none
    assert not MountTable(ROOT, None, proc=root).is_private(101)  # no config.json mounts


def test_no_table_to_read_knows_no_mount(tmp_path: Path) -> None:
    empty = MountTable(ROOT, container(), proc=str(tmp_path / "none"))
    assert not empty.is_private(101)
    assert empty.describe(101) == "mount 101, not the container's root filesystem"


def test_the_tables_are_read_once(tmp_path: Path) -> None:
    root = proc(tmp_path, {str(PID): TABLE})
    tables = MountTable(ROOT, container(), proc=root)
    assert not tables.is_private(500)
    (tmp_path / "proc" / str(PID) / "mountinfo").write_text(SELF_TABLE + TABLE)
    assert tables.describe(500) == "mount 500, not the container's root filesystem"
    assert MountTable(ROOT, container(), proc=root).describe(500).endswith(
        "at /run/ours, not the container's root filesystem")


def test_describe_names_the_config_json_mount_and_the_tables(table: MountTable) -> None:
    assert table.describe(109) == (
        "a bind mount of /srv/data at /data (config.json mounts; mount table: ext4 "
        "/dev/sda1:/srv/data), not the container's root filesystem")
    assert table.describe(108) == (  # a tmpfs asked for with rbind: a bind
        "a bind mount of tmpfs at /bound (config.json mounts; mount table: tmpfs tmpfs:/), "
        "not the container's root filesystem")
    assert table.describe(102) == (
        "a tmpfs mount of shm at /dev/shm (config.json mounts; mount table: tmpfs "
        "tmpfs:/), not the container's root filesystem")
    assert table.describe(107) == (
        "a mount of tmpfs tmpfs:/ at /nospec, not the container's root filesystem")
    assert table.describe(30) == (
        "a mount of tmpfs tmpfs:/ at /run/host-tmp, not the container's root filesystem")
    assert table.describe(999) == "mount 999, not the container's root filesystem"
