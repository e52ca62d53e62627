"""Replaying a real kubelet's CRI calls (recorded by tests/e2e/cri_recorder.py, trimmed into
tests/data/kubelet-*/) against a private containerd, in the order the kubelet sent them.

A recording names its session's folders by placeholders: ``{node}`` (the kubelet's root
and pod-log folders: /etc/hosts and /dev/termination-log files, pod log folders),
``{cgroup}`` (the kubelet's cgroup root), ``{containerd}`` (the private containerd's folder)
and ``{simnode}`` (the simulated node). ``Replay`` puts them in a test folder of its own,
makes the host files the kubelet had made before each CreateContainer, and maps the
recorded pod and container ids onto the ones containerd gives now. Harness marks
(``#mark``: the plugin killed, started again) go to ``on_mark``; after "plugin started"
the replay waits, bounded, until the containers created and started while the plugin was
away are no longer running (fail-closed), as the kubelet saw their exit before it created
them again.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from tests.e2e.cri import CriClient
from tests.e2e.cri_recorder import MARK, Call, read_recording, substitute

PLACEHOLDERS = ("{node}", "{cgroup}", "{containerd}", "{simnode}")
# Files the kubelet makes for a container (everything else under {node} is a folder).
HOST_FILES = ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/dev/termination-log")
# How long a container created while the plugin was away may take to be stopped once the
# plugin is back (it synchronizes, then kills): generous, for a loaded machine.
EVICTION_WAIT = 30.0
STOPS = ("StopContainer", "StopPodSandbox", "RemoveContainer", "RemovePodSandbox")

# GPU pods and GPU Jobs a real control plane created (issue 54; its README): one recording
# per node, named by the node's containerd, replayed on the e2e set-up's containerd below
# (node cp-nb ran 2.2.1, built from source; the set-up's 2.x is 2.1).
CONTROL_PLANE = Path(__file__).parents[1] / "data" / "kubelet-1.35.6" / "control-plane"
CONTROL_PLANE_REPLAYED_ON = {"1.7": "1.7", "2.2": "2.1"}
# The labels the Job controller gives a Job's pod: what tells a Job's pod in CRI (its
# restartPolicy never reaches the runtime).
JOB_NAME = "batch.kubernetes.io/job-name"
JOB_UID = "batch.kubernetes.io/controller-uid"


@dataclass
class Outcome:
    call: Call
    code: str  # what containerd answered now ("OK", "UNKNOWN", ...), or "SKIPPED"
    message: str = ""
    container_id: str = ""  # CreateContainer: the id containerd gave now

    @property
    def matches(self) -> bool:
        """Whether the call ended as in the recording: the same status code and, for an
        error, the same message once the paths and ids that belong to one run are taken
        out."""
        return self.code == "SKIPPED" or (
            self.code == self.call.code and comparable(self.message) == comparable(
                self.call.message))


# an absolute path or a recording's placeholder, not the "/" inside a device name
PATH = re.compile(r"(\{[a-z]+\}|(?<![\w.])/)[\w.@+-]*(/[\w.@+-]*)*")
CONTAINER_ID = re.compile(r"\b[0-9a-f]{64}\b")


def comparable(message: str) -> str:
    """An error message without what differs between runs: host paths (placeholders
    included) and container ids."""
    return CONTAINER_ID.sub("<id>", PATH.sub("<path>", message))


@dataclass
class Replay:
    cri: CriClient
    calls: list[Call]
    node: Path  # {node}
    cgroup_root: str  # {cgroup}: a cgroup path of this test ("/nri-cdi-replay-...")
    on_mark: Callable[[Call], None] = lambda call: None
    extra_names: Mapping[str, str] = field(default_factory=dict)
    pods: dict[str, str] = field(default_factory=dict)  # recorded -> replayed sandbox id
    containers: dict[str, str] = field(default_factory=dict)  # recorded -> replayed id
    outcomes: list[Outcome] = field(default_factory=list)
    position: int = 0
    plugin_away: bool = False
    created_while_away: list[str] = field(default_factory=list)  # replayed ids
    # After each "plugin started": the containers created while it was away that were
    # running then, and their state once the wait was over (CONTAINER_* or -1: gone).
    evictions: list[dict[str, int]] = field(default_factory=list)

    @classmethod
    def of(cls, path: Path, cri: CriClient, node: Path, cgroup_root: str,
           **kwargs: Any) -> Replay:
        return cls(cri, read_recording(path), node, cgroup_root, **kwargs)

    @property
    def names(self) -> dict[str, str]:
        return {"{node}": str(self.node), "{cgroup}": self.cgroup_root, **self.extra_names}

    # --- running ----------------------------------------------------------------------------

    def run(self, until: Callable[[Call], bool] | None = None) -> list[Outcome]:
        """Replays from where the last run stopped up to (not including) the first call for
        which ``until`` is true, or to the end. Returns the outcomes of this stretch."""
        start = len(self.outcomes)
        while self.position < len(self.calls):
            call = self.calls[self.position]
            if until is not None and until(call):
                break
            self.position += 1
            self.outcomes.append(self.step(call))
        return self.outcomes[start:]

    def step(self, call: Call) -> Outcome:
        if call.method == MARK:
            self._mark(call)
            return Outcome(call, "OK")
        request = substitute(copy.deepcopy(dict(call.request)), self.names)
        short = call.short
        if short == "RunPodSandbox":
            self._prepare_pod(request["config"])
        elif short == "CreateContainer":
            if call.request["pod_sandbox_id"] not in self.pods:
                return Outcome(call, "SKIPPED", "its pod was never replayed")
            request["pod_sandbox_id"] = self.pods[call.request["pod_sandbox_id"]]
            self._prepare_pod(request["sandbox_config"])
            self._prepare_container(request["config"])
        else:
            for key, table in (("container_id", self.containers),
                               ("pod_sandbox_id", self.pods)):
                if key in request:
                    if request[key] not in table:
                        return Outcome(call, "SKIPPED", f"{key} never created here")
                    request[key] = table[request[key]]
        return self._send(call, request)

    def _send(self, call: Call, request: dict[str, Any]) -> Outcome:
        pb = self.cri.pb
        message = json_format.ParseDict(request, getattr(pb, f"{call.short}Request")())
        try:
            reply = getattr(self.cri.runtime, call.short)(message, timeout=self.cri.timeout)
        except self.cri.grpc.RpcError as error:
            return Outcome(call, error.code().name, str(error.details()))
        outcome = Outcome(call, "OK")
        if call.short == "RunPodSandbox":
            self.pods[call.response["pod_sandbox_id"]] = str(reply.pod_sandbox_id)
        elif call.short == "CreateContainer":
            outcome.container_id = str(reply.container_id)
            if "container_id" in call.response:
                self.containers[call.response["container_id"]] = outcome.container_id
            if self.plugin_away:
                self.created_while_away.append(outcome.container_id)
        return outcome

    def _mark(self, call: Call) -> None:
        event = call.request.get("event")
        if event == "plugin killed":
            self.plugin_away = True
        self.on_mark(call)
        if event == "plugin started":
            self.plugin_away = False
            self._await_evictions()

    def _await_evictions(self) -> None:
        started = [c for c in self.created_while_away
                   if self.state(c) == self.cri.pb.CONTAINER_RUNNING]
        deadline = time.monotonic() + EVICTION_WAIT
        while any(self.state(c) == self.cri.pb.CONTAINER_RUNNING for c in started):
            if time.monotonic() > deadline:
                break  # the test's own assertions say what was left running
            time.sleep(0.1)
        self.evictions.append({c: self.state(c) for c in started})
        self.created_while_away.clear()

    # --- host files the kubelet made ------------------------------------------------------

    def _prepare_pod(self, config: dict[str, Any]) -> None:
        log_dir = config.get("log_directory")
        if log_dir:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
        # The recording's images are the kubelet's; containerd resolves the name.

    def _prepare_container(self, config: dict[str, Any]) -> None:
        image = config.get("image", {})
        if image.get("user_specified_image"):
            image["image"] = image["user_specified_image"]
        # the container's termination message file, wherever its pod spec puts it
        files = {*HOST_FILES, config.get("annotations", {}).get(
            "io.kubernetes.container.terminationMessagePath", "/dev/termination-log")}
        for mount in config.get("mounts", []):
            host = Path(mount.get("host_path", ""))
            if self.node not in host.parents:
                continue
            if mount["container_path"] in files:
                host.parent.mkdir(parents=True, exist_ok=True)
                if not host.exists():
                    host.write_text("127.0.0.1 localhost\n"
                                    if mount["container_path"] == "/etc/hosts" else "")
            else:
                host.mkdir(parents=True, exist_ok=True)

    # --- what happened -----------------------------------------------------------------------

    def state(self, container_id: str) -> int:
        try:
            return int(self.cri.container_status(container_id).status.state)
        except self.cri.grpc.RpcError:
            return -1

    def mismatches(self) -> list[str]:
        return [f"#{o.call.seq} {o.call.short}: recorded {o.call.code} "
                f"{o.call.message[:200]!r}, now {o.code} {o.message[:300]!r}"
                for o in self.outcomes if not o.matches]

    def created(self, pod: str, container: str = "app") -> list[Outcome]:
        """The CreateContainer outcomes of a pod's container, in order."""
        return [o for o in self.outcomes if o.call.short == "CreateContainer"
                and o.call.request["sandbox_config"]["metadata"]["name"] == pod
                and o.call.request["config"]["metadata"]["name"] == container]

    def live(self, pod: str, container: str = "app") -> str:
        """The id of the pod's last container created now."""
        made = [o.container_id for o in self.created(pod, container) if o.container_id]
        if not made:
            raise AssertionError(f"no container of pod {pod} was created in the replay: "
                                 f"{[(o.code, o.message) for o in self.created(pod)]}")
        return made[-1]


def control_plane_recording(version: str) -> Path:
    """The control plane's recording replayed on the e2e set-up's containerd ``version``."""
    for recorded, replayed_on in CONTROL_PLANE_REPLAYED_ON.items():
        if replayed_on == version:
            return CONTROL_PLANE / f"gpu-load-containerd-{recorded}.jsonl"
    raise ValueError(f"no control-plane recording is replayed on containerd {version}")


def pod_calls(calls: Sequence[Call], pod: str) -> list[Call]:
    """The calls of one pod of a recording: its RunPodSandbox and every call naming its
    sandbox or one of its containers (by the recorded ids)."""
    sandboxes: set[str] = set()
    containers: set[str] = set()
    out = []
    for call in calls:
        request = call.request
        if call.short == "RunPodSandbox":
            mine = request["config"]["metadata"]["name"] == pod
            if mine and "pod_sandbox_id" in call.response:
                sandboxes.add(call.response["pod_sandbox_id"])
        elif call.short == "CreateContainer":
            mine = request["pod_sandbox_id"] in sandboxes
            if mine and "container_id" in call.response:
                containers.add(call.response["container_id"])
        else:
            mine = (request.get("container_id") in containers
                    or request.get("pod_sandbox_id") in sandboxes)
        if mine:
            out.append(call)
    return out


def sandbox_labels(calls: Sequence[Call]) -> dict[str, dict[str, str]]:
    """Each pod's name -> the labels of its (first) RunPodSandbox."""
    out: dict[str, dict[str, str]] = {}
    for call in calls:
        if call.short == "RunPodSandbox":
            config = call.request["config"]
            out.setdefault(config["metadata"]["name"], dict(config.get("labels", {})))
    return out


def job_pods(calls: Sequence[Call]) -> list[str]:
    """The names of the pods a Job made (the Job controller's labels on the sandbox)."""
    return [name for name, labels in sandbox_labels(calls).items() if JOB_NAME in labels]


def remove_cgroup_tree(cgroup_root: str, base: Path = Path("/sys/fs/cgroup")) -> list[str]:
    """Removes ``cgroup_root`` (and what the replay's pods left under it) from every
    hierarchy, deepest first; returns what could not be removed."""
    left = []
    for hierarchy in (p for p in base.iterdir() if p.is_dir()):
        top = hierarchy / cgroup_root.strip("/")
        if not top.is_dir():
            continue
        for folder in sorted((p for p in top.rglob("*") if p.is_dir()),
                             key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                folder.rmdir()
        try:
            top.rmdir()
        except OSError as error:
            left.append(f"{top}: {error}")
    return left


def unmount_under(folder: Path) -> None:
    """Detaches every mount under ``folder`` (none are expected; a leftover must not keep
    the test's folder busy)."""
    libc = ctypes.CDLL(None, use_errno=True)
    prefix = str(folder) + "/"
    with open("/proc/self/mountinfo") as mountinfo:
        points = [line.split()[4] for line in mountinfo]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        libc.umount2(point.encode(), 2)


def methods(outcomes: Iterable[Outcome]) -> list[str]:
    return [o.call.short for o in outcomes]
