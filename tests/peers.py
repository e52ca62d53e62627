"""NVIDIA's own programs, for the tests and benchmarks that compare with them.

``nvidia-ctk`` and ``nvidia-cdi-hook`` are not part of this repository: they are found in
the folder named by ``$NRI_CDI_PEERS``. Where it is unset, or a program is not in it, a
comparison with what a program produces uses its recording (``RECORDINGS``, made by a run
that had it), and a test that runs the program itself is skipped (or, in a benchmark, left
out), saying so. With the program at hand, ``$NRI_CDI_RECORD_PEERS=1`` rewrites the
recordings from it (docs/developer/nvidia-ctk-parity.md).
"""

from __future__ import annotations

import os
from pathlib import Path

PEERS_ENV = "NRI_CDI_PEERS"
RECORD_ENV = "NRI_CDI_RECORD_PEERS"
RECORDINGS = Path(__file__).resolve().parent / "data" / "peers"


def recording_requested() -> bool:
    """Whether this run is to rewrite the recordings from the live programs."""
    return os.environ.get(RECORD_ENV, "") == "1"


def peer(name: str) -> Path:
    """Where the peer program ``name`` would be; check ``is_file()`` before using it."""
    folder = os.environ.get(PEERS_ENV, "")
    return Path(folder) / name if folder else Path(f"${PEERS_ENV}") / name


def absent(name: str) -> str:
    """Why ``name`` cannot be run, for a skip message."""
    folder = os.environ.get(PEERS_ENV, "")
    where = f"not in ${PEERS_ENV} ({folder})" if folder else f"${PEERS_ENV} is not set"
    return f"{name}: {where}; NVIDIA's peer programs are not part of this repository"
