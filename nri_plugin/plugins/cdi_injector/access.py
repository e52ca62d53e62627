"""Device-cgroup access that NRI cannot give, and when the runtime's own CDI can. Pure.

NRI grants every device node it adds ``rw`` (``rwm`` for block devices) by a rule of its
own (``nri_plugin.nri.derived``). A CDI device node asks for ``rwm`` unless its spec says
otherwise, so through NRI a char device loses ``m`` (mknod): narrower, never wider, but not
what native CDI gives. Before NRI 0.10 no rule of the plugin's reaches the container; from
0.10 one can add ``m``, as a second rule after NRI's. Only the runtime's own CDI gives the
one ``rwm`` rule native CDI gives, so the whole request is handed to it
(``ContainerAdjustment.CDI_devices``) wherever that is known to work, and only when nothing
the plugin does beyond native CDI would be lost (a vendor's edit filter, the hook-free
library path).
"""

from __future__ import annotations

from collections.abc import Sequence

from cdi.device import Device
from cdi.libpath import EXTRA_LIBRARY_PATH_ENV
from cdi.model import ContainerEdits
from cdi.oci import cgroup_access
from nri_plugin.nri.derived import beyond_derived
from nri_plugin.nri.versions import RuntimeInfo
from nri_plugin.plugins.cdi_injector.delegation import delegation_problems
from nri_plugin.plugins.cdi_injector.vendor import EditFilter

_EXTRA = EXTRA_LIBRARY_PATH_ENV + "="


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


def hand_over_for_access(edits: ContainerEdits, devices: Sequence[Device],
                         runtime: RuntimeInfo, edit_filter: EditFilter | None) -> bool:
    """Whether to hand the whole request to the runtime's own CDI so that its devices get
    the access their spec asks for: the runtime takes CDI_devices, its CDI set-up is known
    and reads every spec involved, and neither a vendor filter (one that leaves out
    something) nor the library-path merge changes the edits."""
    if not runtime.supports_cdi_devices or runtime.cdi_spec_dirs is None:
        return False
    if not wider_than_nri(edits) or any(e.startswith(_EXTRA) for e in edits.env):
        return False
    if edit_filter is not None and edit_filter.apply(edits) != edits:
        return False
    return not delegation_problems(devices, runtime)
