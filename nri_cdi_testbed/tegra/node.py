"""A built simulated Jetson: where its parts are, and running NVIDIA's tools on it."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_NAME = "tegra.json"
CSV_FOLDER = "etc/nvidia-container-runtime/host-files-for-container.d"
LIB = "usr/lib/aarch64-linux-gnu"
NV = f"{LIB}/nvidia"


@dataclass(frozen=True, slots=True, kw_only=True)
class BuiltTegraNode:
    """A built node: its root (driver and dev root alike), and the manifest."""

    root: Path
    manifest: dict[str, Any] = field(repr=False)

    @property
    def driver_root(self) -> Path:
        return self.root

    @property
    def dev_root(self) -> Path:
        return self.root

    @property
    def csv_folder(self) -> Path:
        return self.root / CSV_FOLDER

    @property
    def csv_files(self) -> list[Path]:
        return [self.csv_folder / name for name in self.manifest["csv_files"]]

    @property
    def nvml_library_folder(self) -> Path:
        return self.root / NV

    @classmethod
    def load(cls, root: str | os.PathLike[str]) -> BuiltTegraNode:
        path = Path(root)
        return cls(root=path, manifest=json.loads((path / MANIFEST_NAME).read_text()))



# Shows the node's /etc over the host's (an overlay: the host's files stay visible beneath),
# then runs "$@".
_NAMESPACE_SCRIPT = """set -e
node_etc=$1; shift
mount -t overlay tegra-etc -o "lowerdir=$node_etc:/etc" /etc
exec "$@"
"""


def in_tegra_namespace(node: BuiltTegraNode, argv: Sequence[str]) -> list[str]:
    """``argv`` run in a private mount namespace whose ``/etc`` shows the node's files:
    ``nvidia-ctk`` reads its default CSV files and ``/etc/nv_tegra_release`` from the host's
    ``/etc`` whatever its ``--driver-root``. Needs root and ``unshare``; the host's own
    mounts are untouched (the namespace ends with the process)."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", _NAMESPACE_SCRIPT, "sh",
            os.fspath(node.root / "etc"), *argv]
