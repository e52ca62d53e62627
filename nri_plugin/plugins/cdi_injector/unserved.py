"""Fail-closed, finding: the live containers that asked for devices and lack them, judged
as the injector's decision would judge them. Pure. The rest of fail-closed: ``eviction``
(stopping and reporting them), ``startguard`` (when they are checked);
docs/developer/fail-closed.md.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cdi.annotations import ANNOTATION_PREFIX
from cdi.cache import Device, Snapshot
from cdi.errors import UnresolvedDevicesError
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.versions import NativeCdi
from nri_plugin.plugins.cdi_injector.already import all_nodes_present, wanted
from nri_plugin.plugins.cdi_injector.asked import read_asked
from nri_plugin.plugins.cdi_injector.context import NRI_PLUGINS_DOMAIN, check_sources
from nri_plugin.plugins.cdi_injector.injector import CdiInjector
from nri_plugin.plugins.cdi_injector.policy import Policy, PolicyDenied
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.plugins.cdi_injector.vendor import VendorRules

# Created (not started: the init process waits) and running containers can be used;
# stopped ones have run (a Job's, say) and are only reported.
_LISTED_STATES = (nri_pb2.CONTAINER_CREATED, nri_pb2.CONTAINER_RUNNING,
                  nri_pb2.CONTAINER_PAUSED, nri_pb2.CONTAINER_STOPPED)
# The annotations the kubelet puts on every container: where the container's termination
# message goes, and its name.
TERMINATION_PATH_ANNOTATION = "io.kubernetes.container.terminationMessagePath"
CONTAINER_NAME_ANNOTATION = "io.kubernetes.container.name"


@dataclass(frozen=True, slots=True, kw_only=True)
class Unserved:
    """A container that asked for devices it does not have."""

    container_id: str
    name: str
    pod: str  # namespace/name
    pid: int
    started: bool  # its process ran (running or paused), not only created
    exited: bool = False  # it ran and has stopped: nothing left to stop, only to say
    missing: tuple[str, ...]
    reason: str
    cgroups_path: str = ""
    # The host file the kubelet reads the container's termination message from ("" none).
    termination_file: str = ""


def find_unserved(pods: Sequence[nri_pb2.PodSandbox], containers: Sequence[nri_pb2.Container],
                  injector: CdiInjector,
                  native_cdi: NativeCdi = NativeCdi.UNKNOWN) -> list[Unserved]:
    """Listed containers that asked for devices they do not have (live ones, and stopped
    ones as ``exited``), by ``injector``'s policy, vendors and registry. ``native_cdi``:
    whether the runtime's own CDI injects what container cdi.k8s.io annotations (and, on,
    CRI CDIDevices) ask for (``already``)."""
    policy, vendors = injector.policy, injector.vendors
    by_id = {p.id: p for p in pods}
    keys = (ANNOTATION_PREFIX, NRI_PLUGINS_DOMAIN,
            *(p for v in vendors for p in v.annotation_prefixes))
    asking_pods = {p.id for p in pods if any(k.startswith(keys) for k in p.annotations)}
    # A vendor's env entries count where one of its env sources that reads devices is on.
    env_asks = tuple(prefix for v in vendors if _enabled(policy, v, "env")
                     for prefix in v.env_request_prefixes)
    mounts_ask = any(_enabled(policy, v, "mounts") for v in vendors)
    out = []
    for container in containers:
        if container.state not in _LISTED_STATES:
            continue
        # Cheap test first: most containers ask for nothing by any source.
        if (container.pod_sandbox_id not in asking_pods
                and not any(k.startswith(keys) for k in container.annotations)
                and not (mounts_ask and container.mounts)
                and not (env_asks and any(e.startswith(env_asks) for e in container.env))
                and not (native_cdi is NativeCdi.OFF and container.CDI_devices)):
            continue
        found = container_unserved(by_id.get(container.pod_sandbox_id), container, injector,
                                   native_cdi)
        if found is not None:
            out.append(found)
    return out


def _enabled(policy: Policy, vendor: VendorRules, read_from: str) -> bool:
    return any(policy.rule(s.name, s.default).enabled for s in vendor.sources
               if s.read_from == read_from and s.read is not None)


def container_unserved(pod: nri_pb2.PodSandbox | None, container: nri_pb2.Container,
                       injector: CdiInjector,
                       native_cdi: NativeCdi = NativeCdi.UNKNOWN) -> Unserved | None:
    """Whether one live container lacks devices it asked for (None: it does not), judged by
    the injector's own first steps: what it asks for (``asked``) and what of it is already
    in the container (``already``). Of what the injector would add, a device is missing
    only where the container shows it lacks it (``_shows``): no container is stopped on a
    guess."""
    policy, registry = injector.policy, injector.registry()
    snapshot = registry.snapshot
    try:
        context = read_asked(pod, container, registry, policy, injector.vendors)
        want = wanted(context, container, snapshot, native_cdi, policy)
    except Refusal as exc:
        return _item(pod, container, (), f"its request is invalid: {exc}")
    if not want.to_add:
        return None
    env = _final_env(snapshot, [r.name for r in context.requests])
    missing = tuple(r.name for r in want.to_add
                    if not _shows(container, snapshot.devices.get(r.name), env))
    if not missing:
        return None
    unknown = [n for n in missing if n not in snapshot.devices]
    known = [n for n in missing if n in snapshot.devices]
    parts = []
    if unknown:
        parts.append(f"it asked for {', '.join(unknown)}, which no CDI spec on the node "
                     "defines")
    if known:
        parts.append(f"it asked for {', '.join(known)} and does not have "
                     f"{'it' if len(known) == 1 else 'them'}")
    reason = "; ".join(parts)
    try:
        check_sources(context, policy)
    except PolicyDenied as denied:
        reason += f"; the policy would have refused it: {denied}"
    return _item(pod, container, missing, reason)


def _item(pod: nri_pb2.PodSandbox | None, container: nri_pb2.Container,
          missing: tuple[str, ...], reason: str) -> Unserved:
    return Unserved(container_id=container.id, name=container.name,
                    pod=f"{pod.namespace}/{pod.name}" if pod is not None
                    else container.pod_sandbox_id, pid=container.pid,
                    started=container.state in (nri_pb2.CONTAINER_RUNNING,
                                                nri_pb2.CONTAINER_PAUSED),
                    exited=container.state == nri_pb2.CONTAINER_STOPPED,
                    missing=missing, reason=reason,
                    cgroups_path=container.linux.cgroups_path,
                    termination_file=termination_file(pod, container))


def termination_file(pod: nri_pb2.PodSandbox | None, container: nri_pb2.Container) -> str:
    """The host file the kubelet made for this container's termination message ("": none):
    only the kubelet's own mount, in its own layout (docs/developer/fail-closed.md)."""
    target = container.annotations.get(TERMINATION_PATH_ANNOTATION, "")
    name = container.annotations.get(CONTAINER_NAME_ANNOTATION, container.name)
    if not target or pod is None or not pod.uid:
        return ""
    for mount in container.mounts:
        if mount.destination != target:
            continue
        parts = mount.source.split("/")
        if (len(parts) >= 5 and parts[-5:-1] == ["pods", pod.uid, "containers", name]
                and os.path.isabs(mount.source) and ".." not in parts):
            return mount.source
    return ""


def _final_env(snapshot: Snapshot, names: Sequence[str]) -> dict[str, str]:
    """The env the devices give together: a later device's (or spec's) value of a name
    replaces an earlier one, so an env-only device is seen by its names' final values."""
    env: dict[str, str] = {}
    with contextlib.suppress(UnresolvedDevicesError):
        for entry in snapshot.resolve(n for n in names if n in snapshot.devices).env:
            key, _, value = entry.partition("=")
            env[key] = value
    return env


def _shows(container: nri_pb2.Container, device: Device | None,
           final_env: Mapping[str, str]) -> bool:
    """Whether the container shows it has ``device`` although the injector would add it:
    its device nodes are all there (a privileged container has every host node), else its
    env names have the values all requested devices give them together. A device we cannot
    look up counts as missing; one with nothing to see it by does not."""
    if device is None:
        return False
    if device.edits.device_nodes:
        return all_nodes_present(device, {d.path for d in container.linux.devices})
    names = [e.partition("=")[0] for e in device.edits.env]
    if names:
        return {f"{n}={final_env.get(n, '')}" for n in names} <= set(container.env)
    return True  # nothing to see it by: do not stop it on a guess
