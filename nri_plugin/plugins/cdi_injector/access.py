"""Device-cgroup access that NRI cannot give, and when the runtime's own CDI can. Pure.

NRI grants every node it adds ``rw`` (``rwm`` for a block device) by a rule of its own, so
a char device asking ``rwm`` loses ``m``; a rule of the plugin's adds it only from NRI 0.10,
as a second rule (docs/reference/runtime-cdi.md). Only the runtime's own CDI gives native
CDI's one rule, so such a request is handed to it where that works (``plan.py``).
"""

from __future__ import annotations

from cdi.model import ContainerEdits
from cdi.oci import cgroup_access
from nri_plugin.nri.derived import beyond_derived


def wider_than_nri(edits: ContainerEdits) -> list[str]:
    """The device nodes whose access NRI's own rule does not fully grant (e.g. ``m`` of a
    char device), as ``path (+letters)``."""
    out = []
    for node in edits.device_nodes:
        if node.type not in ("c", "b"):
            continue
        extra = beyond_derived(node.type, cgroup_access(node))
        if extra:
            out.append(f"{node.path} (+{extra})")
    return out
