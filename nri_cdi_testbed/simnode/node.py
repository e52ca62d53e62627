"""A built node: where its parts are, and running other tools on it."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_NAME = "simnode.json"

@dataclass(frozen=True, slots=True, kw_only=True)
class BuiltNode:
    """Where a built node's parts are; ``manifest`` is the parsed ``simnode.json``."""

    root: Path
    driver_root: Path
    dev_root: Path
    proc_root: Path  # the folder holding ``proc/`` (i.e. a stand-in for "/")
    sys_root: Path
    manifest_path: Path
    manifest: Mapping[str, Any] = field(repr=False)

    @property
    def lib_dir(self) -> Path:
        return self.driver_root / str(self.manifest["lib_dir"]).lstrip("/")

    @property
    def ldcache_path(self) -> Path:
        return self.driver_root / "etc" / "ld.so.cache"

    @property
    def driver_version(self) -> str:
        return str(self.manifest["driver_version"])

    def host_path(self, container_path: str, *, where: str = "driver") -> Path:
        """Host path of an absolute in-root path (``where``: driver, dev, proc or sys)."""
        base = {
            "driver": self.driver_root,
            "dev": self.dev_root,
            "proc": self.proc_root,
            "sys": self.sys_root,
        }[where]
        return base / container_path.lstrip("/")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BuiltNode:
        """Open an existing node from its root folder or its manifest file."""
        p = Path(path)
        manifest_path = p / MANIFEST_NAME if p.is_dir() else p
        manifest = json.loads(manifest_path.read_text())
        root = manifest_path.parent
        roots = manifest["roots"]
        return cls(
            root=root,
            driver_root=(root / roots["driver"]).resolve(),
            dev_root=(root / roots["dev"]).resolve(),
            proc_root=(root / roots["proc"]).resolve(),
            sys_root=(root / roots["sys"]).resolve(),
            manifest_path=manifest_path,
            manifest=manifest,
        )




# Shows the node's proc/driver and sys/bus/pci/devices at the host paths, then runs "$@".
_NAMESPACE_SCRIPT = """set -e
node_proc=$1 node_sys=$2; shift 2
mount -t tmpfs -o mode=0755 simnode /proc/driver
for d in nvidia nvidia-caps; do
  if [ -d "$node_proc/driver/$d" ]; then
    mkdir /proc/driver/$d && mount --bind "$node_proc/driver/$d" /proc/driver/$d
  fi
done
mount --bind "$node_sys/bus/pci/devices" /sys/bus/pci/devices
exec "$@"
"""


def in_node_namespace(node: BuiltNode, argv: Sequence[str]) -> list[str]:
    """``argv`` run in a private mount namespace where the host's ``/proc/driver`` and
    ``/sys/bus/pci/devices`` are the node's copies: for tools such as ``nvidia-ctk`` that
    read those from the host rather than from their ``--dev-root``.  Needs root and
    ``unshare``; the host's own mounts are untouched (the namespace ends with the process)."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", _NAMESPACE_SCRIPT, "sh",
            os.fspath(node.proc_root / "proc"), os.fspath(node.sys_root / "sys"), *argv]


