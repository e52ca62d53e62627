"""Fail-closed: containers created while the plugin was away that lack their devices.

NRI is fail-open (containerd#11217, nri#316): while the plugin is down, restarting or too
slow, containers are created without its adjustments. Two checks close it:

* each (re)connection starts with a Synchronize listing every container;
  ``find_unserved`` (pure) picks the live ones that asked for devices and do not have
  them, and ``act`` stops or reports them;
* ``guard.StartGuard`` checks every container whose creation did not pass through us when it
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cdi.annotations import ANNOTATION_PREFIX
from cdi.cache import Snapshot
from cdi.errors import UnresolvedDevicesError
from nri_plugin.nri.api import nri_pb2
from nri_plugin.plugins.cdi_injector.context import check_sources, read_context
from nri_plugin.plugins.cdi_injector.counters import Counters
from nri_plugin.plugins.cdi_injector.policy import Policy, PolicyDenied
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.plugins.cdi_injector.requests import NRI_PLUGINS_DOMAIN, container_requests
from nri_plugin.plugins.cdi_injector.sources import all_sources
from nri_plugin.plugins.cdi_injector.vendor import Registry, VendorRules, env_read

log = logging.getLogger("nri_cdi.failclosed")
# Created (not started: the init process waits) and running containers can be used.
_LIVE_STATES = (nri_pb2.CONTAINER_CREATED, nri_pb2.CONTAINER_RUNNING, nri_pb2.CONTAINER_PAUSED)


# The other injectors' pod annotation keys are request keys too (nri-plugins', and those
# the vendors declare).
_REQUEST_KEY_PREFIXES = (ANNOTATION_PREFIX, NRI_PLUGINS_DOMAIN)


def _request_key_prefixes(vendors: Sequence[VendorRules]) -> tuple[str, ...]:
    return _REQUEST_KEY_PREFIXES + tuple(p for v in vendors for p in v.annotation_prefixes)


def _any_request_key(annotations: Mapping[str, str], prefixes: tuple[str, ...]) -> bool:
    return any(k.startswith(prefixes) for k in annotations)


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
    keys = _request_key_prefixes(vendors)
    asking_pods = {p.id for p in pods if _any_request_key(p.annotations, keys)}
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
                and not _any_request_key(container.annotations, keys)
                and not (mounts_ask and container.mounts)
                and not (env_asks and any(e.startswith(env_asks)
                                              for e in container.env))):
            continue
        pod = by_id.get(container.pod_sandbox_id)
        found = container_unserved(pod, container, policy, vendors, registry, native_cdi)
        if found is not None:
            out.append(found)
    return out


def _enabled(policy: Policy, vendor: VendorRules, read_from: str) -> bool:
    return any(policy.rule(s.name, s.default).enabled for s in vendor.sources
               if s.read_from == read_from and s.read is not None)


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
        # Keys, then a lookup: a protobuf map's items() is a Python-level generator.
        for key in found:
            if key.startswith(ANNOTATION_PREFIX):
                count += found[key].count(",") + 1
                if count > MAX_NAMES:
                    return (f"{where} annotation {key[:80]!r} brings the devices asked for "
                            f"over {MAX_NAMES} (a container may name at most {MAX_NAMES})")
    # Only an entry longer than MAX_NAMES can hold MAX_NAMES commas: the longest first, in
    # one pass of C code (Kubernetes gives containers many short service variables).
    env = container.env
    if not env_prefixes or max(map(len, env), default=0) <= MAX_NAMES:
        return None
    for entry in env:
        if (len(entry) > MAX_NAMES and entry.startswith(env_prefixes)
                and entry.count(",") >= MAX_NAMES):
            return f"{entry.partition('=')[0]} names more than {MAX_NAMES} devices"
    return None


def env_prefixes(vendors: Sequence[VendorRules]) -> tuple[str, ...]:
    return tuple(prefix for vendor in vendors for prefix in vendor.env_request_prefixes)


def container_unserved(pod: nri_pb2.PodSandbox | None, container: nri_pb2.Container,
                       policy: Policy, vendors: Sequence[VendorRules], registry: Registry,
                       native_cdi: bool = False) -> Unserved | None:
    """Whether one live container lacks devices it asked for (None: it does not)."""
    annotations: Mapping[str, str] = pod.annotations if pod is not None else {}
    excess = too_many_names(annotations, container, env_prefixes(vendors))
    if excess is not None:
        return _item(pod, container, (), f"its request is invalid ({excess})")
    snapshot = registry.snapshot
    try:
        context = read_context(pod, container, all_sources(registry.paired(vendors)), policy,
                               snapshot, env_read(vendors))
    except Refusal as exc:
        return _item(pod, container, (), f"its request is invalid ({exc})")
    if not context.requests:
        return None
    requests = [r.name for r in context.requests]
    if native_cdi:
        theirs = {r.name for r in container_requests(container.annotations)}
        requests = [n for n in requests if n not in theirs]
    env = _final_env(snapshot, requests)
    missing = tuple(n for n in requests if not _has(container, n, snapshot, env))
    if not missing:
        return None
    reason = f"asked for {', '.join(missing)} and does not have them"
    try:
        check_sources(context, policy)
    except PolicyDenied as denied:
        reason += f"; the policy would have refused it: {denied}"
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


async def act(unserved: Sequence[Unserved], action: str, counters: Counters) -> int:
    """Stop (SIGKILL, never through the runtime: see the module doc) or only report, as
    the policy's ``action`` says; how many were stopped. A task, so that it runs after the
    Synchronize reply (the runtime holds its lock until it has it)."""
    if action == "report":
        counters.unserved_reported += len(unserved)
        for item in unserved:
            log.warning("fail-closed report: container %s (%s) of pod %s: %s (policy "
                        "failClosed.action: report; not stopped)", item.name,
                        item.container_id, item.pod, item.reason)
        return 0
    failed = set(kill(unserved))
    stopped = 0
    for item in unserved:
        if item.container_id in failed:
            continue
        stopped += 1
        counters.unserved_evicted += 1
        log.warning("fail-closed evict: stopped container %s (%s) of pod %s: %s",
                    item.name, item.container_id, item.pod, item.reason)
    return stopped
