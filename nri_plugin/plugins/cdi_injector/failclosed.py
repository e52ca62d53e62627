"""Fail-closed: containers created while the plugin was away that lack their devices.

NRI is fail-open (containerd#11217, nri#316): while the plugin is down, restarting or too
slow, containers are created without its adjustments. Two checks close it:

* each (re)connection starts with a Synchronize listing every container;
  ``find_unserved`` (pure) picks the live ones that asked for devices and do not have
  them, and ``act`` stops or reports them;
* ``StartGuard`` checks every container whose creation did not pass through us when it
  starts (StartContainer; on runtimes other than containerd, which fails a start whose
  StartContainer fails, PostCreateContainer and PostStartContainer too): one that lacks
  its devices (it straddled our reconnection, or was created while we were away and not
  started yet, pid 0 at Synchronize) is stopped before its process runs. The others are
  answered with one lookup.

Stopping never goes through the runtime. The NRI eviction (UpdateContainers ``evict``)
is dropped by every released NRI adaptation (v0.2.0-v0.12.x relay only the updates),
and the call itself can deadlock containerd against concurrent CRI requests
(containerd#13733, fixed by containerd/nri#301 after v0.12.2), so we never send it.
Instead we SIGKILL the container's processes ourselves: every pid in its cgroup
(``cgroup.kill`` on cgroup v2, else ``cgroup.procs``; from ``linux.cgroups_path``), or its
init pid (``Container.pid``, a host pid: the plugin runs in the host pid namespace with
CAP_KILL). At StartContainer the task exists but is not started (runc init waits on its
exec fifo), so the start then fails; the orchestrator retries, now through the plugin.
Where the runtime can refuse creation itself, that closes the gap earlier: containerd >=
2.2 with ``[plugins."io.containerd.nri.v1.nri".default_validator] enable = true`` and
``required_plugins = ["nri-cdi"]`` fails every container created while we are absent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdi.annotations import ANNOTATION_PREFIX
from cdi.cache import Snapshot
from cdi.errors import UnresolvedDevicesError
from nri_plugin.api import nri_pb2
from nri_plugin.api.events import EventMask
from nri_plugin.dispatch import RpcError
from nri_plugin.errors import Refusal
from nri_plugin.plugins.cdi_injector.policy import Policy
from nri_plugin.plugins.cdi_injector.requests import container_requests
from nri_plugin.plugins.cdi_injector.sources import (
    container_mounts,
    env_map,
    gather,
    is_privileged,
)
from nri_plugin.plugins.cdi_injector.vendor import Registry, VendorRules
from nri_plugin.wire import Code

log = logging.getLogger("nri_cdi.failclosed")
# Created (not started: the init process waits) and running containers can be used.
_LIVE_STATES = (nri_pb2.CONTAINER_CREATED, nri_pb2.CONTAINER_RUNNING, nri_pb2.CONTAINER_PAUSED)


# The other injectors' pod annotation keys are request keys too (nri-plugins', NVIDIA's).
_REQUEST_KEY_PREFIXES = (ANNOTATION_PREFIX, "cdi.nri.io", "nvidia.cdi.k8s.io/")


def _any_request_key(annotations: Mapping[str, str]) -> bool:
    return any(k.startswith(_REQUEST_KEY_PREFIXES) for k in annotations)


@dataclass(frozen=True, slots=True, kw_only=True)
class Unserved:
    container_id: str
    name: str
    pod: str  # namespace/name
    pid: int
    missing: tuple[str, ...]
    reason: str
    cgroups_path: str = ""


def find_unserved(pods: Sequence[nri_pb2.PodSandbox], containers: Sequence[nri_pb2.Container],
                  policy: Policy, vendors: Sequence[VendorRules], registry: Registry, *,
                  native_cdi: bool = False) -> list[Unserved]:
    """Live containers that asked for devices they do not have. Pure. With ``native_cdi``
    (the runtime's own CDI is on) devices named in container cdi.k8s.io annotations are the
    runtime's: it injected them, or it did not create the container."""
    by_id = {p.id: p for p in pods}
    asking_pods = {p.id for p in pods if _any_request_key(p.annotations)}
    env_prefixes = tuple(prefix for v in vendors if policy.sources[v.env_source].enabled
                         for prefix in v.env_request_prefixes)
    mounts_ask = policy.sources["volumeMounts"].enabled  # device-plugin volume mounts
    out = []
    for container in containers:
        if container.state not in _LIVE_STATES:
            continue
        # Cheap test first: most containers ask for nothing by any source.
        if (container.pod_sandbox_id not in asking_pods
                and not _any_request_key(container.annotations)
                and not (mounts_ask and container.mounts)
                and not (env_prefixes and any(e.startswith(env_prefixes)
                                              for e in container.env))):
            continue
        pod = by_id.get(container.pod_sandbox_id)
        found = _unserved(pod, container, policy, vendors, registry, native_cdi)
        if found is not None:
            out.append(found)
    return out


# Device names one container may ask for, all sources together. Parsing is linear but not
# cheap: 300,000 names in one 4 MB annotation took 4.4 s (over the runtime's 2 s request
# timeout: the container is then created without us) and 230 MiB. Real requests name a
# few devices (8 GPUs x 7 MIG instances is 56).
MAX_NAMES = 1024


def too_many_names(pod_annotations: Mapping[str, str], container: nri_pb2.Container,
                   env_prefixes: tuple[str, ...] = ()) -> str | None:
    """Why the request names more than MAX_NAMES devices, or None. Cheap: counts commas,
    before anything is parsed. ``env_prefixes``: the vendors' env requests ("NAME=")."""
    count = 0
    for where, found in (("pod", pod_annotations), ("container", container.annotations)):
        for key, value in found.items():
            if key.startswith(ANNOTATION_PREFIX):
                count += value.count(",") + 1
                if count > MAX_NAMES:
                    return (f"{where} annotation {key[:80]!r} brings the devices asked for "
                            f"over {MAX_NAMES} (a container may name at most {MAX_NAMES})")
    for entry in container.env:
        if env_prefixes and entry.startswith(env_prefixes) and entry.count(",") >= MAX_NAMES:
            return f"{entry.partition('=')[0]} names more than {MAX_NAMES} devices"
    return None


def _env_prefixes(vendors: Sequence[VendorRules]) -> tuple[str, ...]:
    return tuple(prefix for vendor in vendors for prefix in vendor.env_request_prefixes)


def _unserved(pod: nri_pb2.PodSandbox | None, container: nri_pb2.Container, policy: Policy,
              vendors: Sequence[VendorRules], registry: Registry,
              native_cdi: bool = False) -> Unserved | None:
    annotations: Mapping[str, str] = pod.annotations if pod is not None else {}
    namespace = pod.namespace if pod is not None else ""
    excess = too_many_names(annotations, container, _env_prefixes(vendors))
    if excess is not None:
        return _item(pod, container, (), f"its request is invalid ({excess})")
    try:
        gathered = gather(policy, vendors, registry, namespace=namespace,
                          container_name=container.name, pod_annotations=annotations,
                          container_annotations=container.annotations,
                          env=env_map(container.env), privileged=is_privileged(container),
                          mounts=container_mounts(container))
    except Refusal as exc:
        return _item(pod, container, (), f"its request is invalid ({exc})")
    if not gathered.requests:
        return None
    snapshot = registry.snapshot
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
                    pid=container.pid, missing=missing, reason=reason,
                    cgroups_path=container.linux.cgroups_path)


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


CGROUP_ROOT = "/sys/fs/cgroup"
# cgroup v1 hierarchies that hold every task of a container, most likely first.
_V1_CONTROLLERS = ("pids", "freezer", "memory", "cpu,cpuacct", "cpu", "devices", "systemd")


def cgroup_relpath(cgroups_path: str) -> str:
    """The cgroup folder of ``linux.cgroups_path``, relative to a hierarchy's root.

    cgroupfs drivers give a path (``/kubepods/besteffort/pod1/ID``); the systemd driver
    gives ``slice:prefix:name``, which lives in ``a.slice/a-b.slice/prefix-name.scope``.
    """
    if ":" not in cgroups_path:
        return cgroups_path.strip("/")
    slice_name, prefix, name = [*cgroups_path.split(":"), "", ""][:3]
    parts = []
    if slice_name and slice_name != "-.slice":
        words = slice_name.removesuffix(".slice").split("-")
        parts = ["-".join(words[: i + 1]) + ".slice" for i in range(len(words))]
    parts.append(f"{prefix}-{name}.scope" if prefix else f"{name}.scope")
    return "/".join(parts)


def cgroup_dir(cgroups_path: str, root: str = CGROUP_ROOT) -> str | None:
    """The container's cgroup folder on this host (v2, else the first v1 hierarchy that
    has it), or None."""
    if not cgroups_path:
        return None
    rel = cgroup_relpath(cgroups_path)
    if os.path.exists(f"{root}/cgroup.controllers"):
        candidates = [f"{root}/{rel}"]
    else:
        candidates = [f"{root}/{c}/{rel}" for c in _V1_CONTROLLERS]
    return next((c for c in candidates if rel and os.path.isdir(c)), None)


def kill_cgroup(folder: str) -> int:
    """SIGKILL every process in the cgroup ``folder``; how many were signalled (-1: all,
    through cgroup.kill). Raises OSError when it cannot."""
    if os.path.exists(f"{folder}/cgroup.kill"):  # cgroup v2, Linux >= 5.14
        # (Opening it for writing where it does not exist fails with EACCES, not ENOENT.)
        with open(f"{folder}/cgroup.kill", "w") as handle:
            handle.write("1")
        return -1
    with open(f"{folder}/cgroup.procs") as handle:
        pids = [int(line) for line in handle if line.strip()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    return len(pids)


def stop_processes(pid: int, cgroups_path: str, root: str = CGROUP_ROOT) -> str | None:
    """SIGKILL a container's processes without asking the runtime: its whole cgroup when
    we can see it, else its init ``pid``. How it was done, or None when there was nothing
    to signal (no cgroup folder, pid 0, already gone). Raises OSError when not allowed."""
    folder = cgroup_dir(cgroups_path, root)
    if folder is not None:
        try:
            count = kill_cgroup(folder)
        except FileNotFoundError:
            count = 0  # removed meanwhile
        if count:
            return f"cgroup {folder}" if count < 0 else f"{count} process(es) of {folder}"
    if pid > 0:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return f"pid {pid}"
    return None


def kill(unserved: Sequence[Unserved], root: str = CGROUP_ROOT) -> list[str]:
    """Stop each container's processes; the ids that could not be stopped."""
    failed = []
    for item in unserved:
        try:
            how = stop_processes(item.pid, item.cgroups_path, root)
        except OSError as exc:
            log.error("cannot stop container %s (%s): %s", item.name, item.container_id,
                      exc.strerror or exc)
            failed.append(item.container_id)
            continue
        if how is None and item.pid <= 0:
            failed.append(item.container_id)  # nothing running to stop yet
    return failed


async def act(stub: object, unserved: Sequence[Unserved], action: str,
              counters: dict[str, int] | None = None) -> None:
    """Stop (SIGKILL, never through the runtime: see the module doc) or only report, as
    the policy says. ``stub`` is unused (kept for callers)."""
    counters = counters if counters is not None else {}
    if action == "report":
        counters["unserved_reported"] = counters.get("unserved_reported", 0) + len(unserved)
        for item in unserved:
            log.warning("fail-closed report: container %s (%s) of pod %s: %s (policy "
                        "failClosed.action: report; not stopped)", item.name,
                        item.container_id, item.pod, item.reason)
        return
    failed = set(kill(unserved))
    for item in unserved:
        if item.container_id in failed:
            continue
        counters["unserved_evicted"] = counters.get("unserved_evicted", 0) + 1
        log.warning("fail-closed evict: stopped container %s (%s) of pod %s: %s",
                    item.name, item.container_id, item.pod, item.reason)


class StartGuard:
    """Mixin for ``CdiInjector`` (put it first in the bases): the second check.

    Remembers the containers whose creation it answered, and at StartContainer (and
    PostCreateContainer, PostStartContainer where subscribed) checks any other container
    that asks for devices: if it lacks them it is stopped before its process runs (StartContainer:
    the task exists, not started) or right after (PostStartContainer), or only reported
    under ``failClosed.action: report``. Containers Synchronize found created but not
    started (pid 0) are remembered by ``defer_unserved`` and stopped the same way.
    Everything it keeps is bounded (``REMEMBER``) and forgotten at RemoveContainer.
    """

    REMEMBER = 65536  # containers remembered as served / pending, oldest dropped first

    # Provided by CdiInjector.
    policy: Any
    counters: dict[str, int]
    vendors: tuple[VendorRules, ...]
    runtime: Any
    _registry: Callable[[], Registry]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._served: OrderedDict[str, None] = OrderedDict()
        self._pending: OrderedDict[str, Unserved] = OrderedDict()
        self._reported: OrderedDict[str, None] = OrderedDict()
        self.cgroup_root = CGROUP_ROOT
        self.on_stopped: Callable[[int], None] | None = None  # metrics: count stops

    # --- what we remember ---

    def _remember(self, table: OrderedDict[str, Any], key: str, value: Any = None) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > self.REMEMBER:
            table.popitem(last=False)

    def create_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> Any:
        excess = too_many_names(pod.annotations, container, _env_prefixes(self.vendors))
        if excess is not None:  # refused before any parsing: bounded time and memory
            log.warning("refused container %s of pod %s/%s: %s", container.name,
                        pod.namespace, pod.name, excess)
            raise RpcError(Code.INVALID_ARGUMENT, f"CreateContainer: {excess}")
        result = super().create_container(pod, container)  # type: ignore[misc]
        # Every container whose creation we answered, adjusted or not: at Start it is then
        # one dict lookup, and only those created without us are judged.
        self._remember(self._served, container.id)
        return result

    # The events the guard needs on every runtime, whatever the injector subscribes to.
    GUARD_EVENTS = (EventMask.POST_CREATE_CONTAINER | EventMask.START_CONTAINER
                    | EventMask.POST_START_CONTAINER | EventMask.REMOVE_CONTAINER)

    # containerd fails a container's start when a plugin's StartContainer fails (every
    # release with NRI: "NRI container start failed", checked in 1.7.24, 1.7.30, 2.1.9,
    # 2.2.1, 2.3.4), so there StartContainer alone keeps a container created without us
    # from running: PostCreate and PostStart would only be two more round trips inside
    # every container's creation and start.
    CONTAINERD_GUARD_EVENTS = EventMask.START_CONTAINER | EventMask.REMOVE_CONTAINER

    def configure(self, config: str, runtime_name: str, runtime_version: str) -> Any:
        mask = super().configure(config, runtime_name, runtime_version)  # type: ignore[misc]
        if mask is None:
            return None
        return mask | guard_events(runtime_name)

    def remove_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> None:
        super().remove_container(pod, container)  # type: ignore[misc]
        for table in (self._served, self._pending, self._reported):
            table.pop(container.id, None)

    def defer_unserved(self, unserved: Sequence[Unserved]) -> list[Unserved]:
        """Split what Synchronize found: containers not started yet (pid 0: nothing to
        stop) are remembered and stopped when they start; the rest is returned."""
        now = []
        for item in unserved:
            if item.pid > 0:
                now.append(item)
                continue
            # answered by us too late (the runtime went on without the reply): owed still
            self._served.pop(item.container_id, None)
            self._remember(self._pending, item.container_id, item)
            if self.policy.fail_closed_action != "report":
                log.warning("fail-closed: container %s (%s) of pod %s is created but not "
                            "started; it will be stopped when it starts: %s", item.name,
                            item.container_id, item.pod, item.reason)
        return now

    # --- the checks ---

    def post_create_container(self, pod: nri_pb2.PodSandbox,
                              container: nri_pb2.Container) -> None:
        super().post_create_container(pod, container)  # type: ignore[misc]
        self._check(pod, container, "post-create")

    def start_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> None:
        super().start_container(pod, container)  # type: ignore[misc]
        self._check(pod, container, "start")

    def post_start_container(self, pod: nri_pb2.PodSandbox,
                             container: nri_pb2.Container) -> None:
        self._check(pod, container, "post-start")

    def _judge(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> Unserved | None:
        if container.id in self._served:
            return None
        pending = self._pending.get(container.id)
        if pending is not None:
            return pending
        return _unserved(pod, container, self.policy, self.vendors, self._registry(),
                         self.runtime.native_cdi is True)

    def _check(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container, stage: str) -> None:
        if container.id in self._served:
            return  # nothing owed: answered at once, no work
        item = self._judge(pod, container)
        log.debug("%s check of container %s (%s): pid %d, cgroup %r, %d devices: %s", stage,
                  container.name, container.id, container.pid, container.linux.cgroups_path,
                  len(container.linux.devices), "unserved" if item else "ok")
        if item is None:
            return
        if self.policy.fail_closed_action == "report":
            if container.id not in self._reported:
                self._remember(self._reported, container.id)
                self.counters["unserved_reported"] = self.counters.get(
                    "unserved_reported", 0) + 1
                log.warning("fail-closed report: container %s (%s) of pod %s was not served "
                            "by the plugin (seen at %s): %s (policy failClosed.action: "
                            "report; not stopped)", item.name, item.container_id, item.pod,
                            stage, item.reason)
            return
        if stage == "post-create":
            if container.id not in self._pending:
                self._remember(self._pending, container.id, item)
                log.warning("fail-closed: container %s (%s) of pod %s was created without "
                            "passing through the plugin; it will be stopped when it starts: "
                            "%s", item.name, item.container_id, item.pod, item.reason)
            return
        self._stop(container, item, stage)

    def _stop(self, container: nri_pb2.Container, item: Unserved, stage: str) -> None:
        try:
            how = stop_processes(container.pid, container.linux.cgroups_path or
                                 item.cgroups_path, self.cgroup_root)
        except OSError as exc:
            how, error = None, exc.strerror or str(exc)
        else:
            error = ""
        when = "before it ran" if stage == "start" else "as it started"
        if how is not None:
            self._pending.pop(container.id, None)
            self.counters["unserved_evicted"] = self.counters.get("unserved_evicted", 0) + 1
            if self.on_stopped is not None:
                self.on_stopped(1)
            log.warning("fail-closed evict: stopped container %s (%s) of pod %s %s (%s): %s",
                        item.name, item.container_id, item.pod, when, how, item.reason)
        else:
            self._remember(self._pending, container.id, item)
            log.error("fail-closed: container %s (%s) of pod %s must not run without its "
                      "devices but could not be stopped at %s (%s); %s", item.name,
                      item.container_id, item.pod, stage, error or "no process found",
                      "trying again after it starts" if stage == "start" else "giving up")
        if stage == "start":
            # Where the runtime honours it (containerd >= 1.7.30, 2.x), this fails the
            # start outright; elsewhere it is only logged, and the kill above did it.
            raise RpcError(Code.FAILED_PRECONDITION,
                           f"nri-cdi: container {item.name} ({item.container_id}) was "
                           f"created without the plugin: {item.reason}")


def guard_events(runtime_name: str) -> EventMask:
    """The events the start guard needs on this runtime (see StartGuard)."""
    if runtime_name == "containerd":
        return StartGuard.CONTAINERD_GUARD_EVENTS
    return StartGuard.GUARD_EVENTS
