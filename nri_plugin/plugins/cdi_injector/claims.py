"""Kubernetes allocation as the kubelet does it now: transient claim specs and devices the
runtime injected itself (docs/developer/kubernetes-allocation.md). Pure, except ``on_miss``,
the bounded re-read for a name the registry does not know yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from cdi.cache import Snapshot
from nri_plugin.nri import adjustment as adj
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.versions import RuntimeInfo
from nri_plugin.nri.wire import Code
from nri_plugin.plugins.cdi_injector.plan import InjectionError, lookup_devices
from nri_plugin.plugins.cdi_injector.policy import Policy
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.plugins.cdi_injector.requests import DeviceRequest
from nri_plugin.plugins.cdi_injector.vendor import EditFilter, Registry

# Called with the names the registry does not know; returns the registry after a bounded
# re-read of the spec folders (None: the re-read did not finish in time).
OnMiss = Callable[[Sequence[str]], Registry | None]
# Called when every name is known; returns a newer registry once spec removals already
# made are applied (a bounded wait, no file I/O), None when none is pending.
OnHit = Callable[[], Registry | None]
# Set-ups to warn about once connected (the daemon: one broken for DRA claims).
StartWarning = Callable[[RuntimeInfo], str | None]

CDI_DEVICES_SOURCE = "CRI CDIDevices (runtime-injected)"
NODE_SOURCE = "device node in the container (runtime-injected)"


def unknown_names(names: Iterable[str], snapshot: Snapshot) -> list[str]:
    """The names ``snapshot`` has no device for (a dict lookup each: no I/O)."""
    return [n for n in names if n not in snapshot.devices]


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


def runtime_cdi_requests(container: nri_pb2.Container) -> list[DeviceRequest]:
    """What NRI >= 0.10 says the runtime injected from CRI CDIDevices (empty before)."""
    return [DeviceRequest(d.name, CDI_DEVICES_SOURCE) for d in container.CDI_devices]


def plugin_injected_cri(policy: Policy, cri: Sequence[DeviceRequest], namespace: str,
                        privileged: bool) -> list[DeviceRequest]:
    """CRI CDIDevices the runtime did not act on (its CDI off), for the plugin to inject:
    the kubelet's, so under the policy's container-annotation source (a denial raises)."""
    if not cri:
        return []
    policy.check_source("containerAnnotations", namespace, privileged,
                        asked_by="CRI CDIDevices")
    return [DeviceRequest(r.name, "CRI CDIDevices") for r in cri]


def node_matched(container: nri_pb2.Container, snapshot: Snapshot) -> list[DeviceRequest]:
    """The registry's devices whose every device node the container already has (found
    through ``Snapshot.by_device_node``); one name per device node set, the first in
    name order. Used only where the runtime's own CDI is on and the names are not shown
    (a kubelet >= 1.31 on an NRI older than 0.10)."""
    present = {d.path for d in container.linux.devices}
    found: list[DeviceRequest] = []
    for path in sorted(present):
        for name in snapshot.by_device_node.get(path, ()):
            nodes = {n.path for n in snapshot.devices[name].edits.device_nodes}
            if nodes <= present:
                found.append(DeviceRequest(name, NODE_SOURCE))
                break
    return found


def removes_runtime_mounts(runtime: RuntimeInfo) -> bool:
    """Whether NRI mount removals reach the mounts the runtime's own CDI injected: seen
    with containerd 2.1.9; containerd 1.7.24 accepts the removals and keeps the mounts."""
    return not (runtime.is_containerd and runtime.version is not None
                and runtime.version < (2, 0, 0))


def capability_removals(snapshot: Snapshot, names: Sequence[str], edit_filter: EditFilter,
                        container: nri_pb2.Container) -> nri_pb2.ContainerAdjustment | None:
    """Remove from a container the mounts the runtime's CDI gave it for ``names`` that
    ``edit_filter`` would not have given (a vendor's filter variable not asking for them);
    NRI lets a plugin remove mounts by destination. None: nothing to remove."""
    known = [n for n in names if n in snapshot.devices]
    if not known:
        return None
    edits = snapshot.resolve(known)
    kept = {m.container_path for m in edit_filter.apply(edits).mounts}
    present = {m.destination for m in container.mounts}
    drop = sorted({m.container_path for m in edits.mounts if m.container_path not in kept}
                  & present)
    if not drop:
        return None
    adjustment = nri_pb2.ContainerAdjustment()
    for path in drop:
        adj.remove_mount(adjustment, path)
    return adjustment
