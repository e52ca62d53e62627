"""The registry made current for one container, as the kubelet's allocation needs it now
(docs/developer/kubernetes-allocation.md): a DRA claim's spec is written a moment before
its container is created, and removed a moment after, so a name the registry does not know
gets a bounded re-read of the spec folders (``OnMiss``, the one file I/O of a decision) and
known names wait for a spec removal already made (``OnHit``, no file I/O).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cdi.cache import Snapshot
from nri_plugin.nri.wire import Code
from nri_plugin.plugins.cdi_injector.plan import InjectionError, lookup_devices
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.plugins.cdi_injector.requests import DeviceRequest
from nri_plugin.plugins.cdi_injector.vendor import Registry

# Called with the names the registry does not know; returns the registry after a bounded
# re-read of the spec folders (None: the re-read did not finish in time).
OnMiss = Callable[[Sequence[str]], Registry | None]
# Called when every name is known; returns a newer registry once spec removals already
# made are applied (a bounded wait, no file I/O), None when none is pending.
OnHit = Callable[[], Registry | None]


def current_registry(names: Sequence[str], registry: Registry, on_miss: OnMiss | None,
                     on_hit: OnHit | None) -> tuple[Registry, bool]:
    """The registry to decide with, and whether the spec folders were read again for a
    name ``registry`` did not know (without ``on_miss`` an unknown name is refused as is)."""
    unknown = [n for n in names if n not in registry.snapshot.devices] if on_miss else []
    newer = None
    if unknown and on_miss is not None:
        newer = on_miss(unknown)
    elif names and on_hit is not None:
        newer = on_hit()
    return (newer if newer is not None else registry), bool(unknown)


def rechecked_refusal(snapshot: Snapshot, requests: Sequence[DeviceRequest]) -> Refusal | None:
    """After the re-read: the refusal for the names still unknown (None: all resolve). It
    names each device and where it was asked for, and says the folders were read again."""
    try:
        lookup_devices(snapshot, requests)
    except InjectionError as exc:
        folders = ", ".join(snapshot.spec_dirs) or "(none)"
        return Refusal(f"{exc} (the node's spec folders were read again just now)",
                       rule="unresolvable", code=Code.NOT_FOUND, device=exc.reason.device,
                       node_detail=f"folders {folders}")
    return None
