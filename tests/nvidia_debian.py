"""NVIDIA's real driver as Debian ships it, as a test node: the driver root that
scripts/install-nvidia-debian.sh makes (Debian sid's 550.163.01 packages unpacked, the
alternatives links made by their own maintainer scripts), with a simulated kernel side
(``/proc/driver/nvidia``, device nodes, sysfs) from the simulated node's builder.

The expectations live in tests/data/nvidia-debian-550.163.01/: ``files.txt`` (the driver
root's files and links, as installed) and ``capabilities.txt`` (every driver file, the
capability it serves, and whether the spec includes it, with the reason when it does not).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import pytest

from nri_cdi_testbed.simnode import BuiltNode, NodeLayout, build_node

REPO = Path(__file__).resolve().parents[1]
VERSION = "550.163.01"
DATA = REPO / "tests" / "data" / f"nvidia-debian-{VERSION}"
# The folders whose contents are not driver files a container could use.
SKIPPED_TREES = ("usr/share/doc", "usr/share/man", "usr/share/lintian", "usr/share/bug")


def cache_dir() -> Path:
    env = os.environ.get("NRI_CDI_NVIDIA_CACHE")
    return Path(env) if env else REPO / ".cache" / "nvidia-debian"


def driver_root() -> Path:
    """The installed root; under CI a missing one fails (the install script makes it)."""
    root = cache_dir() / "root"
    if not (root / "usr/lib/x86_64-linux-gnu/nvidia/current").is_dir():
        why = (f"no Debian NVIDIA driver root at {root}: run scripts/install-nvidia-debian.sh "
               "(scripts/test.sh does)")
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return root


def docker_root() -> Path:
    root = cache_dir() / "docker"
    if not (root / "usr/sbin/dockerd").exists():
        why = f"no docker.io at {root}: run scripts/install-nvidia-debian.sh"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return root


def kernel_side(where: Path) -> BuiltNode:
    """A simulated node for driver 550.163.01 of which only the dev root is used: its
    ``dev/``, ``proc/`` and ``sys/`` stand for the kernel side of the real driver."""
    return build_node(where, NodeLayout(driver_version=VERSION, seed="debian-550"))


def file_list(root: Path) -> list[str]:
    """``f <path>`` and ``l <path> -> <target>`` lines, as files.txt holds them."""
    out = []
    for folder, dirs, files in os.walk(root):
        rel_folder = os.path.relpath(folder, root)
        dirs[:] = sorted(d for d in dirs if os.path.normpath(os.path.join(rel_folder, d))
                         not in SKIPPED_TREES and not os.path.islink(os.path.join(folder, d)))
        names = list(files) + [d for d in os.listdir(folder)
                               if os.path.islink(os.path.join(folder, d))
                               and os.path.isdir(os.path.join(folder, d))]
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.normpath(os.path.join(rel_folder, name))
            if os.path.islink(path):
                out.append(f"l {rel} -> {os.readlink(path)}")
            else:
                out.append(f"f {rel}")
    return sorted(set(out), key=lambda line: line.split()[1])


class Expected(NamedTuple):
    capability: str
    included: bool
    path: str  # in the driver root
    reason: str  # why it is not included ("" when it is)


def capability_table() -> list[Expected]:
    rows = []
    for line in (DATA / "capabilities.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        capability, state, path, *why = line.split(maxsplit=3)
        assert state in ("included", "excluded"), line
        assert (state == "excluded") == bool(why), f"an exclusion needs a reason: {line}"
        rows.append(Expected(capability, state == "included", path, why[0] if why else ""))
    return rows
