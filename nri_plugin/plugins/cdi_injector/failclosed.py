"""Fail-closed: no container runs without the devices it asked for because the plugin was
away. All of it is here: finding such containers (pure), the start guard, the one way they
are stopped or reported, and the second NRI connection the guard rides on. How and why:
docs/developer/fail-closed.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from cdi.annotations import ANNOTATION_PREFIX
from cdi.cache import Snapshot
from cdi.errors import UnresolvedDevicesError
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.api.events import EventMask
from nri_plugin.nri.crio import own_annotations
from nri_plugin.nri.dispatch import RpcError
from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.stub import Callback, CloseCallback, Stub
from nri_plugin.nri.versions import RuntimeInfo
from nri_plugin.nri.wire import Code
from nri_plugin.plugins.cdi_injector.context import check_sources, read_context
from nri_plugin.plugins.cdi_injector.counters import Counters
from nri_plugin.plugins.cdi_injector.injector import CdiInjector
from nri_plugin.plugins.cdi_injector.policy import Policy, PolicyDenied
from nri_plugin.plugins.cdi_injector.refusal import USER_PREFIX, Refusal
from nri_plugin.plugins.cdi_injector.requests import (
    NRI_PLUGINS_DOMAIN,
    TooManyNamesError,
    check_name_count,
    container_requests,
)
from nri_plugin.plugins.cdi_injector.sources import all_sources
from nri_plugin.plugins.cdi_injector.vendor import Registry, VendorRules, env_read

FAILCLOSED_LOGGER = "nri_cdi.failclosed"
log = logging.getLogger(FAILCLOSED_LOGGER)

# Created (not started: the init process waits) and running containers can be used.
_LIVE_STATES = (nri_pb2.CONTAINER_CREATED, nri_pb2.CONTAINER_RUNNING, nri_pb2.CONTAINER_PAUSED)
# The annotations the kubelet puts on every container: where the container's termination
# message goes, and its name.
TERMINATION_PATH_ANNOTATION = "io.kubernetes.container.terminationMessagePath"
CONTAINER_NAME_ANNOTATION = "io.kubernetes.container.name"
CGROUP_ROOT = "/sys/fs/cgroup"
# cgroup v1 hierarchies that hold every task of a container, most likely first.
_V1_CONTROLLERS = ("pids", "freezer", "memory", "cpu,cpuacct", "cpu", "devices", "systemd")


# --- finding them (pure) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Unserved:
    """A container that asked for devices it does not have."""

    container_id: str
    name: str
    pod: str  # namespace/name
    pid: int
    started: bool  # its process ran (running or paused), not only created
    missing: tuple[str, ...]
    reason: str
    cgroups_path: str = ""
    # The host file the kubelet reads the container's termination message from ("" none).
    termination_file: str = ""


def find_unserved(pods: Sequence[nri_pb2.PodSandbox], containers: Sequence[nri_pb2.Container],
                  policy: Policy, vendors: Sequence[VendorRules], registry: Registry, *,
                  native_cdi: bool = False) -> list[Unserved]:
    """Live containers that asked for devices they do not have. With ``native_cdi`` (the
    runtime's own CDI is on) devices named in container cdi.k8s.io annotations are the
    runtime's: it injected them, or it did not create the container."""
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
        if container.state not in _LIVE_STATES:
            continue
        # Cheap test first: most containers ask for nothing by any source.
        if (container.pod_sandbox_id not in asking_pods
                and not any(k.startswith(keys) for k in container.annotations)
                and not (mounts_ask and container.mounts)
                and not (env_asks and any(e.startswith(env_asks) for e in container.env))):
            continue
        found = container_unserved(by_id.get(container.pod_sandbox_id), container, policy,
                                   vendors, registry, native_cdi)
        if found is not None:
            out.append(found)
    return out


def _enabled(policy: Policy, vendor: VendorRules, read_from: str) -> bool:
    return any(policy.rule(s.name, s.default).enabled for s in vendor.sources
               if s.read_from == read_from and s.read is not None)


def container_unserved(pod: nri_pb2.PodSandbox | None, container: nri_pb2.Container,
                       policy: Policy, vendors: Sequence[VendorRules], registry: Registry,
                       native_cdi: bool = False) -> Unserved | None:
    """Whether one live container lacks devices it asked for (None: it does not)."""
    annotations: Mapping[str, str] = pod.annotations if pod is not None else {}
    prefixes = tuple(p for v in vendors for p in v.env_request_prefixes)
    snapshot = registry.snapshot
    try:
        check_name_count(annotations, container, prefixes)
        context = read_context(pod, container, all_sources(registry.paired(vendors)), policy,
                               snapshot, env_read(vendors))
    except (TooManyNamesError, Refusal) as exc:
        return _item(pod, container, (), f"its request is invalid: {exc}")
    if not context.requests:
        return None
    requests = [r.name for r in context.requests]
    if native_cdi:
        # the container's own (CRI-O shows the pod's among them, and does not inject those)
        theirs = {r.name for r in container_requests(own_annotations(container))}
        requests = [n for n in requests if n not in theirs]
    env = _final_env(snapshot, requests)
    missing = tuple(n for n in requests if not _has(container, n, snapshot, env))
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
    return True  # nothing to see it by: do not stop it on a guess


# --- stopping them (the one way) -----------------------------------------------------------


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


def stop_processes(pid: int, cgroups_path: str, root: str = CGROUP_ROOT) -> str | None:
    """SIGKILL a container's processes without asking the runtime: its whole cgroup when
    we can see it, else its init ``pid``. How it was done, or None when there was nothing
    to signal (no cgroup folder, pid 0, already gone). Raises OSError when not allowed."""
    folder = cgroup_dir(cgroups_path, root)
    if folder is not None:
        try:
            if os.path.exists(f"{folder}/cgroup.kill"):  # cgroup v2, Linux >= 5.14
                with open(f"{folder}/cgroup.kill", "w") as handle:
                    handle.write("1")
                return f"cgroup {folder}"
            with open(f"{folder}/cgroup.procs") as handle:
                pids = [int(line) for line in handle if line.strip()]
        except FileNotFoundError:
            pids = []  # removed meanwhile
        signalled = 0
        for each in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGKILL)
                signalled += 1
        if signalled:
            return f"{signalled} process(es) of {folder}"
    if pid > 0:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return f"pid {pid}"
    return None


def write_termination_message(path: str, message: str) -> str:
    """Write ``message`` into the kubelet's termination-message file ``path`` (an existing
    regular file, never through a link); "" when done, else why not."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
    try:
        if not os.path.isfile(f"/proc/self/fd/{fd}"):
            return "not a regular file"
        os.write(fd, message.encode()[:4096])
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        os.close(fd)
    return ""


# --- the guard -----------------------------------------------------------------------------


# How long a container created without the plugin is owed a check at its start
# (docs/developer/fail-closed.md).
PENDING_LIMIT = 60.0


@dataclass(slots=True)
class _Pending:
    item: Unserved
    until: float


class StartGuard(Plugin):
    """The plugin the stub runs: the injector's handlers plus the fail-closed checks."""

    REMEMBER = 65536  # containers remembered as served, oldest dropped first
    # The events the guard needs on every runtime, whatever the injector subscribes to.
    GUARD_EVENTS = (EventMask.POST_CREATE_CONTAINER | EventMask.START_CONTAINER
                    | EventMask.POST_START_CONTAINER | EventMask.REMOVE_CONTAINER)
    # containerd fails a container's start when a plugin's StartContainer fails (every
    # release with NRI): there StartContainer alone keeps a container from running.
    CONTAINERD_GUARD_EVENTS = EventMask.START_CONTAINER | EventMask.REMOVE_CONTAINER

    def __init__(self, injector: CdiInjector, *,
                 defer: Callable[[Callable[[], None]], object] | None = None,
                 cgroup_root: str = CGROUP_ROOT, own_connection: bool = False,
                 pending_limit: float = PENDING_LIMIT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``defer``: runs the stopping of what Synchronize found after its reply has left
        (the runtime holds its lock until then); None: at once. ``own_connection``: the
        start checks are served by ``GuardConnection``, not by this connection."""
        self.injector = injector
        self.counters: Counters = injector.counters
        self._defer = defer
        self.cgroup_root = cgroup_root
        self.own_connection = own_connection
        self.pending_limit = pending_limit
        self._clock = clock
        # Told when ``needed`` changes (GuardedConnections): called from inside a handler.
        self._need_listener: Callable[[], None] | None = None
        self._served: OrderedDict[str, None] = OrderedDict()
        self._pending: dict[str, _Pending] = {}
        # Containers already stopped, refused or reported: the guard's Synchronize and the
        # injector's both list them, and each is acted on (and named) once.
        self._done: OrderedDict[str, None] = OrderedDict()
        self._injector_synced = False
        self._was_needed = True
        self._runtime = RuntimeInfo()  # as the last Configure (either connection's) named it

    # --- whether checks are owed ---

    @property
    def needed(self) -> bool:
        """Whether a container may be in doubt: the injector's connection has not
        synchronized since it (re)connected, or one created without us is still owed a
        check at its start."""
        self._expire_pending()
        return not self._injector_synced or bool(self._pending)

    def on_need_changed(self, listener: Callable[[], None]) -> None:
        self._need_listener = listener

    def _need_may_have_changed(self) -> None:
        now = self.needed
        if now != self._was_needed:
            self._was_needed = now
            if self._need_listener is not None:
                self._need_listener()

    def next_expiry(self) -> float | None:
        """Seconds until the next pending container is let go (None: none pending)."""
        if not self._pending:
            return None
        return max(0.0, min(p.until for p in self._pending.values()) - self._clock())

    def _expire_pending(self) -> None:
        now = self._clock()
        for cid, pending in list(self._pending.items()):
            if pending.until <= now:
                del self._pending[cid]
                item = pending.item
                log.warning("fail-closed: container %s (%s) of pod %s, created without its "
                            "devices while the plugin was away, has not started within "
                            "%.0f s of being found; its start is no longer waited for (a "
                            "container whose start failed stays listed as created): %s",
                            item.name, item.container_id, item.pod, self.pending_limit,
                            item.reason)

    def injector_connection_lost(self) -> None:
        """The injector's connection ended: until it synchronizes again, containers are
        created without us."""
        self._injector_synced = False
        self._need_may_have_changed()

    def _remember(self, table: OrderedDict[str, None], key: str) -> None:
        table[key] = None
        table.move_to_end(key)
        while len(table) > self.REMEMBER:
            table.popitem(last=False)

    # --- the injector's connection ---

    def configure(self, config: str, runtime_name: str,
                  runtime_version: str) -> EventMask | None:
        self._injector_synced = False
        mask = self.injector.configure(config, runtime_name, runtime_version)
        self._runtime = self.injector.runtime
        if mask is None:
            return None
        if self.own_connection:
            # RemoveContainer only, to forget what we remember: outside every container's
            # creation and start.
            return mask | EventMask.REMOVE_CONTAINER
        return mask | guard_events(runtime_name)

    def synchronize(self, pods: Sequence[nri_pb2.PodSandbox],
                    containers: Sequence[nri_pb2.Container]) -> None:
        self._judge_listed(pods, containers, self.injector.runtime)
        self._injector_synced = True
        self._need_may_have_changed()

    def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.ContainerAdjustment | nri_pb2.CreateContainerResponse | None:
        result = self.injector.create_container(pod, container)
        # Every container whose creation we answered, adjusted or not: at its start it is
        # then one dict lookup.
        self._remember(self._served, container.id)
        return result

    def post_create_container(self, pod: nri_pb2.PodSandbox,
                              container: nri_pb2.Container) -> None:
        self.check(pod, container, "post-create")

    def start_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> None:
        self.check(pod, container, "start")

    def post_start_container(self, pod: nri_pb2.PodSandbox,
                             container: nri_pb2.Container) -> None:
        self.check(pod, container, "post-start")

    def remove_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> None:
        self.injector.remove_container(pod, container)
        self.forget(container.id)

    def forget(self, container_id: str) -> None:
        """The container is gone: nothing about it is owed or kept."""
        self._served.pop(container_id, None)
        self._pending.pop(container_id, None)
        self._done.pop(container_id, None)
        self._need_may_have_changed()

    # --- the guard's own connection ---

    def guard_configured(self, runtime_name: str, runtime_version: str) -> EventMask:
        """The guard's own connection is to this runtime: the events it needs there, and
        PostCreateContainer on every runtime (docs/developer/fail-closed.md)."""
        self._runtime = self.injector.runtime_of(runtime_name, runtime_version)
        return guard_events(runtime_name) | EventMask.POST_CREATE_CONTAINER

    def guard_synchronize(self, pods: Sequence[nri_pb2.PodSandbox],
                          containers: Sequence[nri_pb2.Container]) -> None:
        """The guard's own Synchronize: what the injector's would find, judged first."""
        self._judge_listed(pods, containers, self._runtime)
        self._need_may_have_changed()

    # --- the checks ---

    def _judge_listed(self, pods: Sequence[nri_pb2.PodSandbox],
                      containers: Sequence[nri_pb2.Container], runtime: RuntimeInfo) -> None:
        core = self.injector
        unserved = find_unserved(pods, containers, core.policy, core.vendors, core.registry(),
                                 native_cdi=runtime.native_cdi is True)
        now = []
        for item in unserved:
            if item.container_id in self._done or item.container_id in self._pending:
                continue  # the other connection's Synchronize found it first
            self.counters.unserved_found += 1
            self._served.pop(item.container_id, None)  # answered too late: owed still
            if item.started:
                now.append(item)
                continue
            self._pending[item.container_id] = _Pending(item, self._clock() + self.pending_limit)
            log.warning("fail-closed: container %s (%s) of pod %s, created without its "
                        "devices while the plugin was away, is created but not started; it is "
                        "checked when it starts: %s", item.name, item.container_id,
                        item.pod, item.reason)
        for item in now:
            self._remember(self._done, item.container_id)
        if now and self._defer is not None:
            self._defer(lambda: self._act_now(now))
        elif now:
            self._act_now(now)

    def _act_now(self, items: Sequence[Unserved]) -> None:
        for item in items:
            self._act(item, "reconnection")

    def check(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container, stage: str) -> None:
        """The start check of one container at ``stage`` (raises to fail its start)."""
        try:
            self._check_once(pod, container, stage)
        finally:
            self._need_may_have_changed()

    def _check_once(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container,
                    stage: str) -> None:
        cid = container.id
        if cid in self._served or cid in self._done:
            return  # answered at creation, or acted on already: nothing owed
        pending = self._pending.get(cid)
        if pending is not None:
            item: Unserved | None = pending.item
        else:
            core = self.injector
            item = container_unserved(pod, container, core.policy, core.vendors,
                                      core.registry(), self._runtime.native_cdi is True)
        log.debug("%s check of container %s (%s): %s", stage, container.name, cid,
                  "unserved" if item else "ok")
        if item is None:
            self._pending.pop(cid, None)
            return
        if stage == "post-create":
            if pending is None:
                self.counters.unserved_found += 1
                self._pending[cid] = _Pending(item, self._clock() + self.pending_limit)
                log.warning("fail-closed: container %s (%s) of pod %s was created without "
                            "passing through the plugin; it is checked when it starts: %s",
                            item.name, cid, item.pod, item.reason)
            return
        if pending is None and stage == "start":
            self.counters.unserved_found += 1
        item = replace(item, pid=container.pid,
                       cgroups_path=container.linux.cgroups_path or item.cgroups_path)
        stopped = self._act(item, stage)
        evict = self.injector.policy.fail_closed_action != "report"
        if evict and not stopped and stage == "start":
            # A runtime that may start it all the same: stopped as it starts, if it does.
            self._pending[cid] = _Pending(item, self._clock() + self.pending_limit)
        else:
            # A container is started once: nothing about it stays owed.
            self._pending.pop(cid, None)
            self._remember(self._done, cid)
        if evict and stage == "start":
            # containerd fails the start: the container never runs.
            raise RpcError(Code.FAILED_PRECONDITION,
                           f"{USER_PREFIX}container {item.name} was created while the plugin "
                           f"was away, without its devices: {item.reason}")

    def _act(self, item: Unserved, stage: str) -> bool:
        """Report or stop one container, as the policy's failClosed.action says; counted
        and named in the log. True when it is stopped (or its start is to be refused).
        ``stage``: start, post-start or reconnection."""
        when = _WHEN[stage]
        if self.injector.policy.fail_closed_action == "report":
            self.counters.unserved_reported += 1
            log.warning("fail-closed report: container %s (%s) of pod %s runs without its "
                        "devices (%s; policy failClosed.action: report, not stopped): %s",
                        item.name, item.container_id, item.pod, when, item.reason)
            return False
        refuses_start = stage == "start" and self._runtime.is_containerd
        message = (f"{USER_PREFIX}stopped: the container was created while the plugin was "
                   f"away, without its devices: {item.reason}\n")
        if refuses_start:
            # The start error says why (the kubelet shows it, and would append this too).
            note = "none: the start error says why"
        elif item.termination_file:
            note = write_termination_message(item.termination_file, message) or "written"
        else:
            note = "no termination-message file"
        try:
            how = stop_processes(item.pid, item.cgroups_path, self.cgroup_root)
        except OSError as exc:
            how, error = None, exc.strerror or str(exc)
        else:
            error = "" if how else "no process found"
        if how is None and not refuses_start:
            log.error("fail-closed: container %s (%s) of pod %s must not run without its "
                      "devices but could not be stopped %s (%s)%s: %s", item.name,
                      item.container_id, item.pod, when, error,
                      "; its start is refused and it is stopped as it starts, if it does"
                      if stage == "start" else "", item.reason)
            return False
        self.counters.unserved_evicted += 1
        what = "refused the start of" if refuses_start else "stopped"
        log.warning("fail-closed evict: %s container %s (%s) of pod %s, %s (%s; message for "
                    "the kubelet: %s): %s", what, item.name, item.container_id, item.pod,
                    when, how or "nothing to signal yet", note, item.reason)
        return True


_WHEN = {"start": "at its start, before it ran", "post-start": "as it started",
         "reconnection": "found running when the plugin came back"}


def guard_events(runtime_name: str) -> EventMask:
    """The events the start guard needs on this runtime (see StartGuard)."""
    if runtime_name == "containerd":
        return StartGuard.CONTAINERD_GUARD_EVENTS
    return StartGuard.GUARD_EVENTS


class GuardConnection(Plugin):
    """The start guard's own NRI connection: only the lifecycle events the checks need,
    served by the ``StartGuard`` it belongs to. ``on_synchronized`` is told when its
    Synchronize is answered (the guard is in place from then on)."""

    def __init__(self, guard: StartGuard, on_synchronized: Callable[[], None]) -> None:
        self.guard = guard
        self._on_synchronized = on_synchronized

    def configure(self, config: str, runtime_name: str,
                  runtime_version: str) -> EventMask | None:
        return self.guard.guard_configured(runtime_name, runtime_version)

    def synchronize(self, pods: Sequence[nri_pb2.PodSandbox],
                    containers: Sequence[nri_pb2.Container]) -> None:
        self.guard.guard_synchronize(pods, containers)
        self._on_synchronized()

    def post_create_container(self, pod: nri_pb2.PodSandbox,
                              container: nri_pb2.Container) -> None:
        self.guard.check(pod, container, "post-create")

    def start_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> None:
        self.guard.check(pod, container, "start")

    def post_start_container(self, pod: nri_pb2.PodSandbox,
                             container: nri_pb2.Container) -> None:
        self.guard.check(pod, container, "post-start")

    def remove_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> None:
        self.guard.forget(container.id)


# --- the guard's connection, open only while needed ----------------------------------------


# How long the injector's connection waits for the guard's, and how long the guard's stays
# once nothing is in doubt (docs/developer/fail-closed.md).
GUARD_READY_TIMEOUT = 5.0
GUARD_LINGER = 10.0
GUARD_SUFFIX = "-guard"

# Builds a Stub for one of our plugins: (plugin, name, on_close, before_connect).
StubFactory = Callable[[Plugin, str | None, CloseCallback | None, Callback | None], Stub]


class GuardedConnections:
    """Runs the injector's connection (``main``: the guard, or the metrics around it), and
    the guard's around it: on every (re)connection the guard's goes first, and it is closed
    ``GUARD_LINGER`` after nothing is in doubt (docs/developer/fail-closed.md)."""

    def __init__(self, guard: StartGuard, main: Plugin, make_stub: StubFactory,
                 name: str | None, *, on_close: CloseCallback | None = None,
                 ready_timeout: float = GUARD_READY_TIMEOUT,
                 linger: float = GUARD_LINGER) -> None:
        self.guard = guard
        self._make_stub = make_stub
        self._on_close = on_close
        self._ready_timeout = ready_timeout
        self._linger = linger
        self._closing: asyncio.TimerHandle | None = None  # the close after the linger
        self._expiry: asyncio.TimerHandle | None = None  # the next pending let go
        self._ready = asyncio.Event()
        self._guard_stub: Stub | None = None
        self._guard_task: asyncio.Task[None] | None = None
        self._stopping = False
        # Opened only from the injector's before-connect on: after its connection is lost,
        # the Stub waits for the runtime's new socket first, and a guard opened at once
        # would register with the dying runtime and hold the injector back.
        self._may_open = False
        guard.on_need_changed(self._need_changed)
        self.main = make_stub(main, name, self._main_closed, self._guard_first)
        self._guard_name = self.main.name + GUARD_SUFFIX  # same index, so next to it

    @property
    def guard_open(self) -> bool:
        """Whether the guard's connection is running (connecting or connected)."""
        return self._guard_task is not None

    async def run(self) -> None:
        """Serve until ``stop()``: the injector's connection, the guard's while needed."""
        try:
            await self.main.run()
        finally:
            self._stopping = True
            await self._close_guard()

    def stop(self) -> None:
        self._stopping = True
        self.main.stop()
        if self._guard_stub is not None:
            self._guard_stub.stop()

    async def _guard_first(self, _main: Stub) -> None:
        """Before the injector connects: the guard's connection in place (bounded)."""
        self._may_open = True
        self._update()
        if self._guard_task is None or self._ready.is_set():
            return
        try:
            await asyncio.wait_for(self._ready.wait(), self._ready_timeout)
        except asyncio.TimeoutError:
            log.warning("the start guard's connection is not in place after %.0f s; "
                        "connecting the injector all the same (its Synchronize still "
                        "finds what was created meanwhile)", self._ready_timeout)

    async def _main_closed(self, stub: Stub, error: BaseException | None) -> None:
        self._may_open = False
        self.guard.injector_connection_lost()
        if self._on_close is not None:
            result = self._on_close(stub, error)
            if asyncio.iscoroutine(result):
                await result

    def _need_changed(self) -> None:
        # Called from inside a handler: open or close only after its reply has left.
        if not self._stopping:
            asyncio.get_running_loop().call_soon(self._update)

    def _update(self) -> None:
        if self._stopping:
            return
        loop = asyncio.get_running_loop()
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self.guard.needed:
            self._cancel_close()
            if self._guard_task is None and self._may_open:
                self._open_guard()
            wait = self.guard.next_expiry()
            if wait is not None:  # a pending container let go changes ``needed``
                self._expiry = loop.call_later(wait + 0.01, self._update)
        elif self._guard_task is not None and self._closing is None:
            self._closing = loop.call_later(self._linger, self._close_if_idle)

    def _cancel_close(self) -> None:
        if self._closing is not None:
            self._closing.cancel()
            self._closing = None

    def _close_if_idle(self) -> None:
        self._closing = None
        if self._stopping or self.guard.needed or self._guard_task is None:
            return
        log.info("nothing in doubt: closing the start guard's connection (the runtime "
                 "asks nothing at container start from now on)")
        if self._guard_stub is not None:
            self._guard_stub.stop()

    def _open_guard(self) -> None:
        self._ready.clear()
        plugin = GuardConnection(self.guard, self._guard_synchronized)
        stub = self._make_stub(plugin, self._guard_name, self._guard_closed, None)
        self._guard_stub = stub
        task = asyncio.get_running_loop().create_task(stub.run())
        self._guard_task = task
        task.add_done_callback(self._guard_ended)
        log.info("start guard connection opening (containers may be in doubt)")

    def _guard_synchronized(self) -> None:
        # The runtime adds the plugin to those it asks right after our reply.
        loop = asyncio.get_running_loop()
        loop.call_soon(self._ready.set)
        loop.call_soon(self._update)

    def _guard_closed(self, _stub: Stub, _error: BaseException | None) -> None:
        self._ready.clear()

    def _guard_ended(self, task: asyncio.Task[None]) -> None:
        if task is self._guard_task:
            self._guard_task = None
            self._guard_stub = None
            self._ready.clear()
        if not task.cancelled() and task.exception() is not None:
            log.error("the start guard's connection failed: %s", task.exception())
        if not self._stopping:  # needed again while it was closing: open a new one
            asyncio.get_running_loop().call_soon(self._update)

    async def _close_guard(self) -> None:
        self._cancel_close()
        if self._expiry is not None:
            self._expiry.cancel()
        if self._guard_stub is not None:
            self._guard_stub.stop()
        task = self._guard_task
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
