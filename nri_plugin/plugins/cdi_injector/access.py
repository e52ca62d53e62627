"""Device-cgroup access that NRI cannot give, and when the runtime's own CDI can. Pure.

NRI grants every device node it adds ``rw`` (``rwm`` for block devices) by a rule of its
own (``nri_plugin.nri.derived``). A CDI device node asks for ``rwm`` unless its spec says
otherwise, so through NRI a char device loses ``m`` (mknod): narrower, never wider, but not
what native CDI gives. Before NRI 0.10 no rule of the plugin's reaches the container; from
0.10 one can add ``m``, as a second rule after NRI's. Only the runtime's own CDI gives the
one ``rwm`` rule native CDI gives, so the whole request is handed to it
(``ContainerAdjustment.CDI_devices``) wherever that is known to work and nothing the plugin
does beyond native CDI would be lost (``plan.py``).
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
