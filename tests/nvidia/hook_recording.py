"""What NVIDIA's hook programs did with the hooks our specs write for them, recorded.

``nri-cdi generate --hook-path <nvidia-cdi-hook | nvidia-ctk>`` writes NVIDIA's hook layout;
``test_generate_options.test_nvidia_binary_understands_the_hooks`` runs each hook entry with
the real program on a container root (where ``$NRI_CDI_PEERS`` has it). Each run is kept
here: the arguments (the node's folder and the container root written as placeholders),
the exit status, what it printed, and what it changed under the root; and at the end the
root's ld.so.cache. ``test_hook_arguments_are_recorded`` checks, without the program,
that every argument set our spec writes today is one the program was seen to accept.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.nvidia.peer_parity import HOOKS_FILE, NODE

ROOT = "/@ROOT@"  # the container root a hook ran on
RECORD_HINT = ("re-record with the real binary: NRI_CDI_PEERS=<folder with nvidia-cdi-hook and "
               "nvidia-ctk> NRI_CDI_RECORD_PEERS=1 python3 -m pytest "
               "tests/nvidia/test_generate_options.py -k nvidia_binary (as root)")
_TIME = re.compile(r'time="[^"]*" ')  # logrus's timestamp, different on every run
# update-ldcache's random names: its scratch folder /run/nvidia-ctk-hook/<UUID> and its
# /etc/ld.so.conf.d/{00,zz}-nvcr-<number>.conf files
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
                   r"|(?<=-nvcr-)[0-9]+(?=\.conf)")


def arguments(program: str, args: Sequence[str], node_root: str) -> list[str]:
    """A hook entry's arguments as recorded: the node's folder written NODE."""
    return [a.replace(node_root, NODE) for a in args]


def tree(root: Path) -> dict[str, str]:
    """Every path under ``root``: ``l -> TARGET``, ``d``, or ``f SIZE``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            rel = "/" + os.fspath(path.relative_to(root))
            if path.is_symlink():
                out[rel] = f"l -> {os.readlink(path)}"
            elif path.is_dir():
                out[rel] = "d"
            else:
                out[rel] = f"f {path.stat().st_size}"
    return out


def changed(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """What a hook made or changed under the root, one line each (a file by its size only:
    ld.so.cache's bytes are read separately)."""
    return [_UUID.sub("<random>", f"{path} {kind}") for path, kind in sorted(after.items())
            if before.get(path) != kind]


def printed(text: bytes, root: Path, node_root: str) -> str:
    out = text.decode(errors="replace").replace(os.fspath(root), ROOT)
    return _UUID.sub("<random>", _TIME.sub("", out.replace(node_root, NODE)))


def load() -> dict[str, Any]:
    if not HOOKS_FILE.is_file():
        raise AssertionError(f"no recording of NVIDIA's hook programs ({HOOKS_FILE}): "
                             + RECORD_HINT)
    return dict(yaml.safe_load(HOOKS_FILE.read_text()))


def save(doc: Mapping[str, Any]) -> None:
    header = ("# NVIDIA's hook programs running the hooks nri-cdi generate writes for them, on "
              "a container\n# root (tests/nvidia/hook_recording.py). Written by "
              "NRI_CDI_RECORD_PEERS=1; do not edit.\n")
    HOOKS_FILE.write_text(header + yaml.safe_dump(dict(doc), sort_keys=True, width=100))
