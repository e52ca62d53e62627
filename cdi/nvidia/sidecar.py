"""The generator's sidecar: ``<spec>.meta`` next to every spec file it writes.

A JSON document with the node's fingerprint, the facts a policy needs (driver and CUDA
versions, each GPU's arch and brand, which file serves which driver capability) and the
``spec.sha256`` of the spec it belongs to. Named ``.meta``, not ``.json``: CDI runtimes
read every ``*.json`` in a spec folder as a spec. Written before the spec (each
atomically): the spec's change then wakes a reader with the matching sidecar in place, and
a sidecar whose ``spec.sha256`` matches no spec on disk is ignored and regenerated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUFFIX = ".meta"


def sidecar_path(spec: Path) -> Path:
    """The sidecar of the spec file ``spec``."""
    return spec.with_name(spec.name + SUFFIX)


def read_sidecar(spec: Path) -> dict[str, Any]:
    """The sidecar of the spec file ``spec`` ({} when absent or unreadable)."""
    try:
        data = json.loads(sidecar_path(spec).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
