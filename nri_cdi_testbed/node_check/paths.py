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
    """Folder to put on sys.path to import the compiled CRI v1 messages."""
    return cache_dir() / "cri_gen"


def busybox() -> Path | None:
    found = shutil.which("busybox") or "/bin/busybox"
    return Path(found) if os.access(found, os.X_OK) else None


def install_script() -> Path | None:
    """scripts/install-containerd.sh when this is a source checkout (a wheel has none)."""
    script = REPO / INSTALL_SCRIPT
    return script if script.is_file() else None


def _how_to_install(what: str) -> str:
    script = install_script()
    if script is not None:
        return f"run: bash {script} (as root; NRI_CDI_CACHE=DIR for another cache folder)"
    return (f"{what} are made by {INSTALL_SCRIPT} of the nri-cdi source repository, which "
            "an installed nri-cdi does not ship: run it from a checkout as root with "
            "NRI_CDI_CACHE=DIR, then pass --cache DIR")


def missing_prerequisites(versions: tuple[str, ...] = tuple(RUNTIMES), *,
                          private_containerd: bool = True) -> list[str]:
    """What keeps the node check (a private containerd, or the node's with
    ``private_containerd`` False) from running here, one line each: what is missing, then
    how to get it. Empty when ready."""
    missing = []
    if private_containerd:
        for version in versions:
            absent = [name for name in ("containerd", "ctr", "containerd-shim-runc-v2")
                      if not os.access(bin_dir(version) / name, os.X_OK)]
            if absent:
                missing.append(f"containerd {version} ({', '.join(absent)} in "
                               f"{bin_dir(version)}): "
                               + _how_to_install("the private containerds")
                               + "; or --containerd-bin DIR; or the node's containerd with "
                                 "--containerd-address SOCK")
        if not os.access(RUNC, os.X_OK):
            missing.append(f"runc ({RUNC}): apt-get install runc, or --runc PATH")
    if busybox() is None:
        missing.append("busybox (the test containers' image): apt-get install busybox-static")
    messages = cri_gen_dir() / CRI_PACKAGE / "api_pb2.py"
    if not messages.is_file():
        missing.append(f"the CRI v1 messages ({messages}): "
                       + _how_to_install("they")
                       + " (it needs pip install grpcio-tools)")
    if importlib.util.find_spec("grpc") is None:
        missing.append("the python package grpcio (the CRI client): "
                       "pip install 'nri-cdi[e2e]', or pip install grpcio")
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        missing.append("gcc (builds the CUDA probe run in the containers): "
                       "apt-get install gcc libc6-dev")
    if os.geteuid() != 0:
        missing.append("root privileges (containerd and runc need them): run as root")
    return missing
