"""Where scripts/install-containerd.sh puts things; what a private containerd still lacks."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

# The folder that holds the nri_plugin package (a source checkout, or site-packages).
REPO = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = "scripts/install-containerd.sh"
# bookworm's runc by default; $NRI_CDI_RUNC names another (a node without /usr/sbin/runc).
RUNC = Path(os.environ.get("NRI_CDI_RUNC") or "/usr/sbin/runc")
CRI_PACKAGE = "cri_api_v1"


CACHE_ENV = "NRI_CDI_CACHE"  # scripts/install-containerd.sh reads the same variable


def cache_dir() -> Path:
    """The install script's cache folder (same rule as the script: $NRI_CDI_CACHE first)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else REPO / ".cache" / "containerd"


# The containerd versions the install script unpacks, and the cache subfolder of each:
# trixie's 1.7 (NRI 0.6.1, CDI 0.5.4) and sid's 2.1 (NRI 0.8.0, CDI 1.0.1).
RUNTIMES: dict[str, str] = {"1.7": "root", "2.1": "root-2.1"}
DEFAULT_RUNTIME = "1.7"


def bin_dir(version: str = DEFAULT_RUNTIME) -> Path:
    """containerd, ctr and containerd-shim-runc-v2 of ``version`` (a key of RUNTIMES),
    unpacked by the install script."""
    return cache_dir() / RUNTIMES[version] / "usr" / "bin"


def cri_gen_dir() -> Path:
    """Folder to put on sys.path to import the generated CRI v1 stubs."""
    return cache_dir() / "cri_gen"


def busybox() -> Path | None:
    found = shutil.which("busybox") or "/bin/busybox"
    return Path(found) if os.access(found, os.X_OK) else None


def missing_prerequisites(versions: tuple[str, ...] = tuple(RUNTIMES)) -> list[str]:
    """Human-readable list of what keeps a private containerd from running here (empty when
    ready)."""
    missing = [
        f"{bin_dir(version) / name}"
        for version in versions
        for name in ("containerd", "ctr", "containerd-shim-runc-v2")
        if not os.access(bin_dir(version) / name, os.X_OK)
    ]
    if not os.access(RUNC, os.X_OK):
        missing.append(str(RUNC))
    if busybox() is None:
        missing.append("busybox (busybox-static)")
    if not (cri_gen_dir() / CRI_PACKAGE / "api_pb2_grpc.py").is_file():
        missing.append(f"CRI stubs in {cri_gen_dir() / CRI_PACKAGE}")
    if importlib.util.find_spec("grpc") is None:
        missing.append("python package grpcio")
    if os.geteuid() != 0:
        missing.append("root privileges (containerd and runc need them)")
    return missing
