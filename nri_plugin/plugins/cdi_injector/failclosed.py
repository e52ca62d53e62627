"""Fail-closed: containers created while the plugin was away that lack their devices.

NRI is fail-open (containerd#11217, nri#316): while the plugin is down, restarting or too
slow, containers are created without its adjustments. Each (re)connection starts with a
Synchronize listing every container; ``find_unserved`` (pure) picks the live ones that
asked for devices and do not have them, and ``act`` evicts or reports them.

Eviction: we send the NRI eviction (UpdateContainers ``evict``), which is the protocol's
way. Released NRI adaptations log that request and drop the eviction list (only the
updates are applied), so we also stop the container ourselves: SIGKILL to its init
process (``Container.pid``, a host pid; the plugin must run in the host pid namespace).
The orchestrator then restarts it, now through the plugin. Where the runtime can refuse
creation itself, that closes the gap earlier: containerd >= 2.2 with
``[plugins."io.containerd.nri.v1.nri".default_validator] enable = true`` and
``required_plugins = ["nri-cdi"]`` fails every container created while we are absent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cdi.annotations import ANNOTATION_PREFIX
from cdi.cache import Snapshot
from cdi.errors import AnnotationError, UnresolvedDevicesError
from nri_plugin.api import nri_pb2
from nri_plugin.plugins.cdi_injector.policy import Policy
from nri_plugin.plugins.cdi_injector.requests import container_requests
from nri_plugin.plugins.cdi_injector.sources import gather, is_privileged
from nri_plugin.vendors.nvidia.nodefacts import NodeFacts
from nri_plugin.vendors.nvidia.requirements import env_map
from nri_plugin.vendors.nvidia.visible_devices import VisibleDevicesError

log = logging.getLogger("nri_cdi.failclosed")
# Created (not started: the init process waits) and running containers can be used.
_LIVE_STATES = (nri_pb2.CONTAINER_CREATED, nri_pb2.CONTAINER_RUNNING, nri_pb2.CONTAINER_PAUSED)


_ENV_PREFIXES = ("NVIDIA_VISIBLE_DEVICES=", "CUDA_VERSION=")


def _any_request_key(annotations: Mapping[str, str]) -> bool:
    return any(k.startswith(ANNOTATION_PREFIX) for k in annotations)


@dataclass(frozen=True, slots=True, kw_only=True)
class Unserved:
    container_id: str
    name: str
    pod: str  # namespace/name
    pid: int
    missing: tuple[str, ...]
    reason: str


def find_unserved(pods: Sequence[nri_pb2.PodSandbox], containers: Sequence[nri_pb2.Container],
                  policy: Policy, snapshot: Snapshot, facts: NodeFacts, *,
                  native_cdi: bool = False) -> list[Unserved]:
    """Live containers that asked for devices they do not have. Pure. With ``native_cdi``
    (the runtime's own CDI is on) devices named in container cdi.k8s.io annotations are the
    runtime's: it injected them, or it did not create the container."""
    by_id = {p.id: p for p in pods}
    asking_pods = {p.id for p in pods if _any_request_key(p.annotations)}
    env_on = policy.sources["visibleDevicesEnv"].enabled
    out = []
    for container in containers:
        if container.state not in _LIVE_STATES:
            continue
        # Cheap test first: most containers ask for nothing by any source.
        if (container.pod_sandbox_id not in asking_pods
                and not _any_request_key(container.annotations)
                and not (env_on and any(e.startswith(_ENV_PREFIXES) for e in container.env))):
            continue
        pod = by_id.get(container.pod_sandbox_id)
        found = _unserved(pod, container, policy, snapshot, facts, native_cdi)
        if found is not None:
            out.append(found)
    return out


def _unserved(pod: nri_pb2.PodSandbox | None, container: nri_pb2.Container, policy: Policy,
              snapshot: Snapshot, facts: NodeFacts, native_cdi: bool) -> Unserved | None:
    annotations: Mapping[str, str] = pod.annotations if pod is not None else {}
    namespace = pod.namespace if pod is not None else ""
    try:
        gathered = gather(policy, namespace=namespace, container_name=container.name,
                          pod_annotations=annotations,
                          container_annotations=container.annotations,
                          env=env_map(container.env), privileged=is_privileged(container),
                          snapshot=snapshot, facts=facts)
    except (AnnotationError, VisibleDevicesError) as exc:
        return _item(pod, container, (), f"its request is invalid ({exc})")
    if not gathered.requests:
        return None
    requests = [r.name for r in gathered.requests]
    if native_cdi:
        theirs = {r.name for r in container_requests(container.annotations)}
        requests = [n for n in requests if n not in theirs]
    env = _final_env(snapshot, requests)
    missing = tuple(n for n in requests if not _has(container, n, snapshot, env))
    if not missing:
        return None
    reason = f"asked for {', '.join(missing)} and does not have them"
    if gathered.denied:
        reason += f"; the policy would have refused it: {gathered.denied}"
    return _item(pod, container, missing, reason)


def _item(pod: nri_pb2.PodSandbox | None, container: nri_pb2.Container,
          missing: tuple[str, ...], reason: str) -> Unserved:
    where = f"{pod.namespace}/{pod.name}" if pod is not None else container.pod_sandbox_id
    return Unserved(container_id=container.id, name=container.name, pod=where,
                    pid=container.pid, missing=missing, reason=reason)


def _final_env(snapshot: Snapshot, names: Sequence[str]) -> dict[str, str]:
    """The env the devices give together: a later device's (or spec's) value of a name
    replaces an earlier one, so an env-only device is seen by its names' final values."""
    env: dict[str, str] = {}
    with contextlib.suppress(UnresolvedDevicesError):
        for entry in snapshot.resolve(n for n in names if n in snapshot.devices).env:
            key, _, value = entry.partition("=")
            env[key] = value
    return env


def _has(container: nri_pb2.Container, name: str, snapshot: Snapshot,
         final_env: Mapping[str, str]) -> bool:
    """Whether the container shows the device: named in CDI_devices, or its device nodes
    (else its env names, with the values all requested devices give them together) are
    there. A device we cannot look up counts as missing."""
    if any(d.name == name for d in container.CDI_devices):
        return True
    device = snapshot.devices.get(name)
    if device is None:
        return False
    nodes = {n.path for n in device.edits.device_nodes}
    if nodes:
        return nodes <= {d.path for d in container.linux.devices}
    names = [e.partition("=")[0] for e in device.edits.env]
    if names:
        return {f"{n}={final_env.get(n, '')}" for n in names} <= set(container.env)
    return True  # nothing to see it by: do not evict on a guess


def evictions(unserved: Sequence[Unserved]) -> list[nri_pb2.ContainerEviction]:
    return [nri_pb2.ContainerEviction(container_id=u.container_id,
                                      reason=f"nri-cdi: {u.reason}") for u in unserved]


def kill(unserved: Sequence[Unserved]) -> list[str]:
    """SIGKILL each container's init process; the ids that could not be stopped."""
    failed = []
    for item in unserved:
        if item.pid <= 0:
            failed.append(item.container_id)
            continue
        try:
            os.kill(item.pid, signal.SIGKILL)
        except ProcessLookupError:
            continue  # already gone
        except OSError as exc:
            log.error("cannot stop container %s (pid %d): %s", item.container_id, item.pid,
                      exc.strerror)
            failed.append(item.container_id)
    return failed


async def act(stub: object, unserved: Sequence[Unserved], action: str,
              counters: dict[str, int] | None = None) -> None:
    """Evict (NRI eviction, then SIGKILL) or only report, as the policy says."""
    counters = counters if counters is not None else {}
    if action == "report":
        counters["unserved_reported"] = counters.get("unserved_reported", 0) + len(unserved)
        for item in unserved:
            log.warning("fail-closed report: container %s of pod %s: %s (policy failClosed."
                        "action: report; not stopped)", item.name, item.pod, item.reason)
        return
    update = getattr(stub, "update_containers", None)
    if update is not None:
        with contextlib.suppress(Exception):  # a runtime without evictions: we still kill
            await update([], evictions(unserved), timeout=5.0)
    failed = set(kill(unserved))
    for item in unserved:
        if item.container_id in failed:
            continue
        counters["unserved_evicted"] = counters.get("unserved_evicted", 0) + 1
        log.warning("fail-closed evict: stopped container %s (%s) of pod %s: %s",
                    item.name, item.container_id, item.pod, item.reason)
