"""Tegra's CSV mount specs (cdi.nvidia.mountspec): the lines a board ships parse, every bad
line is one error line naming the file and the line, and --csv.ignore-pattern drops the sym
lines nvidia-ctk drops."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdi.nvidia.mountspec import (
    DEFAULT_NAMES,
    MountSpec,
    MountSpecError,
    default_files,
    ignored,
    parse_mount_specs,
    read_mount_specs,
)

BOARD = b"""\
dev, /dev/nvhost-ctrl-gpu
dev, nvmap
lib, /usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1.1
sym, /usr/lib/aarch64-linux-gnu/libcuda.so
dir, /opt/nvidia/vpi3
lib, /usr/lib/aarch64-linux-gnu/nvidia/libnvrm_*.so
"""


def test_a_boards_lines() -> None:
    entries = parse_mount_specs(BOARD, "drivers.csv")
    assert [(e.kind, e.path) for e in entries] == [
        ("dev", "/dev/nvhost-ctrl-gpu"), ("dev", "nvmap"),
        ("lib", "/usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1.1"),
        ("sym", "/usr/lib/aarch64-linux-gnu/libcuda.so"), ("dir", "/opt/nvidia/vpi3"),
        ("lib", "/usr/lib/aarch64-linux-gnu/nvidia/libnvrm_*.so")]
    assert [e.source for e in entries] == [f"drivers.csv:{n}" for n in range(1, 7)]


def test_spacing_comments_blank_lines_and_crlf() -> None:
    text = b"# the board's list\r\n\r\n  lib ,  /a/lib b.so  \r\n\tdev,/dev/x\n#dev, /dev/y\n"
    entries = parse_mount_specs(text, "f.csv")
    assert entries == (MountSpec(kind="lib", path="/a/lib b.so", source="f.csv:3"),
                       MountSpec(kind="dev", path="/dev/x", source="f.csv:4"))


def test_only_the_first_comma_splits() -> None:
    (entry,) = parse_mount_specs(b"lib, /opt/a,b/lib.so\n", "f.csv")
    assert entry.path == "/opt/a,b/lib.so"


@pytest.mark.parametrize("line, message", [
    (b"lib /usr/lib/libcuda.so", "want 'KIND, PATH' (KIND one of dev, lib, sym, dir), "
                                 "got 'lib /usr/lib/libcuda.so'"),
    (b"library, /usr/lib/libcuda.so", "unknown kind 'library' (want one of dev, lib, sym, dir)"),
    (b"LIB, /usr/lib/libcuda.so", "unknown kind 'LIB'"),
    (b", /usr/lib/libcuda.so", "unknown kind ''"),
    (b"sym,", "sym line without a path"),
    (b"dir,   ", "dir line without a path"),
    (b"lib, /usr/lib/\xff.so", "not UTF-8 text"),
    (b"lib, /usr/lib/a\x00b.so", "the path holds a NUL byte"),
])
def test_each_bad_line_is_one_error_naming_file_and_line(line: bytes, message: str) -> None:
    with pytest.raises(MountSpecError) as info:
        parse_mount_specs(b"dev, /dev/nvmap\n\n" + line + b"\nlib, /ok.so\n", "/etc/x/l4t.csv")
    text = str(info.value)
    assert text.startswith(f"/etc/x/l4t.csv:3: {message}") and "\n" not in text


def test_a_long_bad_line_is_cut_in_the_message() -> None:
    with pytest.raises(MountSpecError) as info:
        parse_mount_specs(b"x" * 500 + b"\n", "f.csv")
    assert len(str(info.value)) < 200


def test_read_names_the_file_it_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "devices.csv").write_bytes(b"dev, /dev/nvmap\n")
    with pytest.raises(MountSpecError) as info:
        read_mount_specs([str(tmp_path / "devices.csv"), str(tmp_path / "missing.csv")])
    assert str(info.value) == f"{tmp_path}/missing.csv: cannot read: No such file or directory"
    (tmp_path / "bad.csv").write_bytes(b"dev, /dev/nvmap\nbad\n")
    with pytest.raises(MountSpecError, match=r"bad\.csv:2: want"):
        read_mount_specs([str(tmp_path / "devices.csv"), str(tmp_path / "bad.csv")])


def test_files_are_read_in_order(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(b"dev, /dev/a\n")
    (tmp_path / "b.csv").write_bytes(b"lib, /b.so\n")
    entries = read_mount_specs([str(tmp_path / "b.csv"), str(tmp_path / "a.csv")])
    assert [e.path for e in entries] == ["/b.so", "/dev/a"]


def test_default_files_are_the_base_files_present(tmp_path: Path) -> None:
    for name in ("drivers.csv", "devices.csv", "cuda.csv"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "l4t.csv").mkdir()  # not a file
    assert DEFAULT_NAMES == ("devices.csv", "drivers.csv", "l4t.csv")
    assert default_files(str(tmp_path)) == [f"{tmp_path}/devices.csv", f"{tmp_path}/drivers.csv"]
    assert default_files(str(tmp_path / "none")) == []


def _sym(path: str, kind: str = "sym") -> MountSpec:
    return MountSpec(kind=kind, path=path, source="f.csv:1")


@pytest.mark.parametrize("pattern, path, dropped", [
    ("**/libcuda.so", "/usr/lib/aarch64-linux-gnu/libcuda.so", True),
    ("**/libcuda.so", "/usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1", False),
    ("**/libcuda.so*", "/usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1", True),
    ("/usr/lib/aarch64-linux-gnu/*.so", "/usr/lib/aarch64-linux-gnu/libcuda.so", True),
    # a * stays in one folder, as Go's filepath.Match (nvidia-ctk's) has it
    ("/usr/lib/*.so", "/usr/lib/aarch64-linux-gnu/libcuda.so", False),
    ("/usr/lib/*/*.so", "/usr/lib/aarch64-linux-gnu/libcuda.so", True),
    ("*.so", "/usr/lib/aarch64-linux-gnu/libcuda.so", False),
    ("/etc/vulkan/icd.d/nvidia_icd.json", "/etc/vulkan/icd.d/nvidia_icd.json", True),
    ("/etc/vulkan/icd.d/[mn]vidia_icd.json", "/etc/vulkan/icd.d/nvidia_icd.json", True),
])
def test_ignore_patterns(pattern: str, path: str, dropped: bool) -> None:
    assert ignored(_sym(path), [pattern]) is dropped
    assert ignored(_sym(path), ["**/nothing", pattern]) is dropped


def test_ignore_patterns_drop_sym_lines_only() -> None:
    for kind in ("lib", "dir", "dev"):
        assert not ignored(_sym("/usr/lib/libcuda.so", kind), ["**/libcuda.so"])
    assert ignored(_sym("/usr/lib/libcuda.so"), ["**/libcuda.so"])
    assert not ignored(_sym("/usr/lib/libcuda.so"), [])
