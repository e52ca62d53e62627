"""Whether a node's runtime set-up can serve Kubernetes DRA claims at all (doctor, and the
plugin when it connects): with containerd's own CDI off, the CRI CDIDevices a kubelet
>= 1.31 sends for a claim reach no plugin (docs/developer/kubernetes-allocation.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from nri_plugin.nri.versions import RuntimeInfo

CLAIM_MARK = "-claim_"  # in the transient spec names NVIDIA's DRA driver writes


def claim_specs(dirs: Iterable[str]) -> list[str]:
    """Transient per-claim spec files present now (a DRA driver is in use)."""
    found = []
    for folder in dirs:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        found += sorted(os.path.join(folder, n) for n in names if CLAIM_MARK in n)
    return found


def start_warning(runtime: RuntimeInfo) -> str | None:
    """What the plugin logs once it knows the runtime: the DRA-broken set-up, or None."""
    if runtime.native_cdi is not False:
        return None
    if not runtime.is_containerd:
        return None  # CRI-O's CDI cannot be switched off
    refuses = runtime.version is not None and runtime.version >= (2, 3, 0)
    what = ("fail to be created (containerd refuses CDIDevices with its CDI off)" if refuses
            else "start without their devices")
    return (f"{runtime.describe()} with its own CDI off: CRI CDIDevices (DRA claims from "
            "kubelet >= 1.31, the device plugin's cdi-cri) reach neither the runtime nor this "
            f"plugin, so those containers {what}; set enable_cdi = true "
            "and cdi_spec_dirs to the plugin's folders in containerd's CRI config "
            "(nri-cdi doctor shows the lines)")
