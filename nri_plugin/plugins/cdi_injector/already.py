"""What is already in the container, by the runtime's own CDI or by an earlier NRI plugin
(during an upgrade the new instance sees the old one's work and must leave it alone): the
one place the injector and fail-closed learn what the plugin still has to add. Pure
(logging aside). With its CDI on, the runtime injects the devices of ``cdi.k8s.io/``
container annotations before NRI (again would run their hooks twice) but names them only
from containerd 2.3: the plugin relies on ``native_cdi``, checking that the devices' nodes
are there (docs/reference/runtime-cdi.md).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from cdi.cache import Device, Snapshot
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.versions import NativeCdi
from nri_plugin.plugins.cdi_injector.context import ContainerContext, DeviceRequest, unique_requests
from nri_plugin.plugins.cdi_injector.policy import Policy

log = logging.getLogger("nri_cdi.injector")
_warned: set[str] = set()

CDI_DEVICES_SOURCE = "CRI CDIDevices (runtime-injected)"
NODE_SOURCE = "device node in the container (runtime-injected)"


@dataclass(frozen=True, slots=True)
class Wanted:
    """The devices asked for, split by whether they are in the container already."""

    # Not there yet: the plugin's to add.
    to_add: tuple[DeviceRequest, ...]
    # Known devices already there (named, or found by their nodes): checked like the
    # plugin's own, and their mounts trimmed where a vendor's filter says so.
    there: tuple[DeviceRequest, ...]


def all_nodes_present(device: Device | None, present: Collection[str]) -> bool:
    """Whether ``device`` has device nodes and every one is in ``present`` (the paths of
    the container's device nodes)."""
    nodes = device.edits.device_nodes if device is not None else ()
    return bool(nodes) and all(n.path in present for n in nodes)


def wanted(context: ContainerContext, container: nri_pb2.Container, snapshot: Snapshot,
           native: NativeCdi, policy: Policy) -> Wanted:
    """Split what ``context`` asked for, with the CRI CDIDevices NRI >= 0.10 shows, into
    what the plugin adds and what is already there. With the runtime's CDI known off, it
    did not act on CRI CDIDevices: the plugin adds them, as a container annotation's (the
    policy's source rule for those applies; a denial raises)."""
    asked = list(context.requests)
    cri = [DeviceRequest(d.name, CDI_DEVICES_SOURCE) for d in container.CDI_devices]
    if native is NativeCdi.OFF:
        if cri:
            policy.check_source("containerAnnotations", context.namespace,
                                context.privileged, asked_by="CRI CDIDevices")
            asked = unique_requests([*asked, *(DeviceRequest(r.name, "CRI CDIDevices")
                                               for r in cri)])
        cri = []
    to_add = not_yet_in(asked, context, container, snapshot, native)
    # The known devices there: by name (CRI CDIDevices on NRI >= 0.10, annotations), else,
    # with the runtime's CDI on and nothing else asked, by the device nodes it has.
    left = {r.name for r in to_add}
    there = unique_requests([r for r in [*asked, *cri]
                             if r.name not in left and r.name in snapshot.devices])
    if not there and not to_add and not context.privileged and native is NativeCdi.ON:
        there = by_nodes(container, snapshot)
    return Wanted(tuple(to_add), tuple(there))


def not_yet_in(requests: Sequence[DeviceRequest], context: ContainerContext,
               container: nri_pb2.Container, snapshot: Snapshot,
               native: NativeCdi) -> list[DeviceRequest]:
    """``requests`` but what is in the container already: names in ``CDI_devices`` (filled
    by containerd 2.3+ from CRI CDIDevices, which it injects only with its own CDI on: not
    trusted when known off), with the runtime's CDI on every device named in the
    container's cdi.k8s.io annotations (``annotations_injected``), and devices whose every
    node is there. Privileged containers get every host node, so there only names count."""
    done = set() if native is NativeCdi.OFF else {d.name for d in container.CDI_devices}
    if native is NativeCdi.ON:
        done |= annotations_injected(context, container, snapshot)
    present = set() if context.privileged else {d.path for d in container.linux.devices}
    return [r for r in requests if r.name not in done
            and not all_nodes_present(snapshot.devices.get(r.name), present)]


def annotations_injected(context: ContainerContext, container: nri_pb2.Container,
                         snapshot: Snapshot) -> frozenset[str]:
    """The devices the runtime's own CDI (known to be on) injected from the container's
    own ``cdi.k8s.io/`` annotations (CRI-O shows the pod's among them and resolves only
    the container's): those ``context`` read; empty when the container shows it did not
    run."""
    names = [r.name for group in context.groups
             if group.source.name == "containerAnnotations" for r in group.requests]
    if not names or context.privileged:
        return frozenset(names)
    present = {d.path for d in container.linux.devices}
    for name in names:
        device = snapshot.devices.get(name)
        if device is not None and device.edits.device_nodes and \
                not all_nodes_present(device, present):
            if not _warned:
                _warned.add("off")
                log.warning("container %s: the runtime's own CDI is set as on, but %s's device "
                            "nodes are not in the container, so it did not inject its "
                            "cdi.k8s.io annotations: the plugin injects them (check "
                            "runtime_cdi.enabled against the runtime's configuration: "
                            "containerd's enable_cdi; CRI-O's CDI is always on)",
                            container.name, name)
            return frozenset()
    return frozenset(names)


def by_nodes(container: nri_pb2.Container, snapshot: Snapshot) -> list[DeviceRequest]:
    """The registry's devices whose every device node the container already has (found
    through ``Snapshot.by_device_node``); one name per device node set, the first in
    name order. Used only where the runtime's own CDI is on and the names are not shown
    (a kubelet >= 1.31 on an NRI older than 0.10)."""
    present = {d.path for d in container.linux.devices}
    found: list[DeviceRequest] = []
    for path in sorted(present):
        for name in snapshot.by_device_node.get(path, ()):
            if all_nodes_present(snapshot.devices[name], present):
                found.append(DeviceRequest(name, NODE_SOURCE))
                break
    return found
