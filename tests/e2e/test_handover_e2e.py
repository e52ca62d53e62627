"""An upgrade's hand-over on a real containerd: the plugin that replaces another starts
while the older one still serves, and the older one ends only once the newer one is ready
(the chart's surge roll-out, docs/developer/upgrades.md). GPU Jobs are created and run to
completion all along (``restartPolicy: Never``: a container run without its device is a
failed Job, which nothing creates again), each from the requests a real kubelet sent for a
GPU Job's pod on a control plane (tests/data/kubelet-1.35.6/control-plane), rewritten as
another Job's. None may be created without its device or fail, and the newer plugin must
end up owning the node's status file and metrics address.

It also holds the premise the hand-over rests on, on each version: with two plugins
connected, NRI hands the second the container as the first adjusted it, and the second
leaves it alone, so a container comes out exactly as with one plugin.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nri_cdi_testbed.waiting import DEFAULT_TIMEOUT, wait_until
from nri_plugin.ops.status import CONNECTED, read_status
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient
from tests.e2e.cri_recorder import Call, read_recording
from tests.e2e.images import BUSYBOX_IMAGE
from tests.e2e.kubelet_replay import (
    JOB_NAME,
    JOB_UID,
    STOPS,
    Replay,
    control_plane_recording,
    job_pods,
    pod_calls,
    remove_cgroup_tree,
)
from tests.e2e.plugin import PluginProcess
from tests.helpers import generate_link_modes, make_char_device

# The device the recorded Job asks for (pod annotation cdi.k8s.io/gpu: nvidia.com/gpu=0)
# and checks for (exit 3 without /dev/nvidia0): this module's spec gives that name and that
# path (a character device of its own), so the kubelet's requests run as recorded.
KIND = "nvidia.com/gpu"
DEVICE = "/dev/nvidia0"
ASK = {"cdi.k8s.io/gpu": f"{KIND}=0"}


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory, e2e_ready: None) -> Path:
    root = tmp_path_factory.mktemp("handover")
    make_char_device(root / "gpu0", major=241, minor=9)
    (root / "lib").mkdir()
    (root / "cdi").mkdir()
    (root / "cdi" / "handover.yaml").write_text(
        f"cdiVersion: 0.5.0\nkind: {KIND}\n"
        "containerEdits:\n"
        "  hooks: [{hookName: createContainer, path: /bin/true, args: ['true', handover]}]\n"
        "devices:\n- name: \"0\"\n  containerEdits:\n"
        f"    deviceNodes: [{{path: {DEVICE}, hostPath: {root}/gpu0}}]\n"
        "    env: [HAND_GPU=0]\n"
        f"    mounts: [{{hostPath: {root}/lib, containerPath: /usr/lib/hand, "
        "options: [ro, nosuid, nodev, bind]}]\n")
    return root


@pytest.fixture(scope="module")
def ctrd(containerd: ContainerdFactory) -> Containerd:
    return containerd()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _plugin(ctrd: Containerd, specs: Path, name: str, status: Path, port: int) -> PluginProcess:
    log = specs / f"{name}-{ctrd.version}.log".replace(" ", "-")
    return PluginProcess(ctrd.nri_socket, [specs / "cdi"], log,
                         ["--status-dir", str(status), "--metrics-address", f"127.0.0.1:{port}",
                          "--ready-file", str(log.with_suffix(".ready"))])


def _edits(spec: dict[str, Any]) -> dict[str, Any]:
    """All a CDI device's edits can change in a container's OCI spec."""
    return {"env": spec["process"]["env"], "mounts": spec["mounts"],
            "devices": spec["linux"].get("devices"),
            "cgroup": spec["linux"].get("resources", {}).get("devices"),
            "hooks": spec.get("hooks"), "gids": spec["process"]["user"].get("additionalGids")}


def test_two_plugins_connected_give_the_container_one_plugin_gives(
        ctrd: Containerd, specs: Path) -> None:
    port = _free_port()
    first = _plugin(ctrd, specs, "first", specs / f"st-{ctrd.version}", port).start()
    try:
        with ctrd.cri() as cri, cri.cleanup():
            pod = cri.run_pod("one", annotations=ASK)
            alone = _edits(cri.runtime_spec(cri.create_container(pod, "alone", BUSYBOX_IMAGE,
                                                                 command=["sleep", "60"])))
            second = _plugin(ctrd, specs, "second", specs / f"st-{ctrd.version}", port).start()
            try:
                both = _edits(cri.runtime_spec(cri.create_container(
                    pod, "both", BUSYBOX_IMAGE, command=["sleep", "60"])))
            finally:
                second.kill()
            assert both == alone
            assert [m["destination"] for m in both["mounts"]].count("/usr/lib/hand") == 1
            assert both["env"].count("HAND_GPU=0") == 1
            # One of them injected it; the other found it done and said nothing of it.
            said = [p.log().count("injected container=both") for p in (first, second)]
            assert sorted(said) == [0, 1], said
    finally:
        first.kill()


def recorded_job(version: str) -> list[Call]:
    """What the kubelet sent to create and start a GPU Job's pod on the control plane (its
    RunPodSandbox, CreateContainer and StartContainer), in the recording of the node that is
    replayed on containerd ``version``."""
    calls = read_recording(control_plane_recording(version))
    (pod,) = job_pods(calls)
    return [c for c in pod_calls(calls, pod) if c.short not in STOPS]


def another_job(recorded: Sequence[Call], job: str) -> dict[str, str]:
    """The rewrites (recorded -> now) that make the recorded Job's pod Job ``job``'s, as the
    API server and the Job controller name a new one: the Job's name (and so its pod's,
    the Job's name and the recorded suffix), the pod's uid, the Job's uid (fresh UUIDs).
    The pod's uid names its cgroup, log folder and files too. Nothing else is rewritten:
    its annotation, command, labels and the kubelet's annotations are as recorded."""
    config = recorded[0].request["config"]
    labels = config["labels"]
    return {config["metadata"]["uid"]: str(uuid.uuid4()), labels[JOB_UID]: str(uuid.uuid4()),
            labels[JOB_NAME]: job}


@dataclass
class Jobs:
    """Creates and starts GPU Jobs, a pod each, until stopped: each the recorded Job's pod
    (``recorded_job``), replayed rewritten as another Job's (``another_job``)."""

    ctrd: Containerd
    node: Path  # the replay's {node}: the kubelet's pod folders
    cgroup_root: str  # the replay's {cgroup}
    pods: list[str] = field(default_factory=list)  # the Jobs' sandboxes
    created: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        recorded = recorded_job(self.ctrd.version)
        with CriClient(self.ctrd.address, timeout=DEFAULT_TIMEOUT) as cri:
            for i in range(100000):
                if self.stop.is_set():
                    return
                job = f"job{i}"
                replay = Replay(cri, recorded, self.node, self.cgroup_root,
                                extra_names=another_job(recorded, job))
                for outcome in replay.run():
                    if outcome.container_id:
                        self.created.append(outcome.container_id)
                    if outcome.code not in ("OK", "SKIPPED"):  # skipped: after a failure
                        self.failed.append(f"{job}: {outcome.call.short}: {outcome.code}: "
                                           f"{outcome.message[:200]}")
                self.pods += replay.pods.values()
                time.sleep(0.05)

    def __enter__(self) -> Jobs:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def more(self, count: int) -> None:
        target = len(self.created) + count
        wait_until(lambda: len(self.created) >= target, f"{count} more Jobs created",
                   seen=lambda: f"{len(self.created)} created, failed: {self.failed}")

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=2 * DEFAULT_TIMEOUT)


def _outcomes(cri: CriClient, ids: list[str]) -> dict[str, list[str]]:
    """Each Job by outcome, once none is still running."""
    def done() -> dict[str, list[str]] | None:
        out: dict[str, list[str]] = {"succeeded": [], "failed": [], "without device": []}
        for cid in ids:
            status = cri.container_status(cid).status
            if status.state != cri.pb.CONTAINER_EXITED:
                return None
            if not any(d["path"] == DEVICE
                       for d in cri.runtime_spec(cid)["linux"].get("devices", [])):
                out["without device"].append(cid)
            out["succeeded" if status.exit_code == 0 else "failed"].append(cid)
        return out

    got: dict[str, list[str]] = wait_until(done, "every Job has exited")
    return got


def _jobs_across(ctrd: Containerd, specs: Path, name: str,
                 roll: Callable[[Jobs, PluginProcess, PluginProcess], None]
                 ) -> tuple[Jobs, dict[str, list[str]]]:
    """Jobs created all along while ``roll`` replaces plugin ``old`` by plugin ``new``
    (same status folder and metrics address, as two pods of the DaemonSet on one node);
    the Jobs and their outcomes."""
    port = _free_port()
    old = _plugin(ctrd, specs, f"{name}-old", specs / f"{name}-status-{ctrd.version}", port)
    new = _plugin(ctrd, specs, f"{name}-new", specs / f"{name}-status-{ctrd.version}", port)
    node = specs / f"{name}-kubelet-{ctrd.version}".replace(" ", "-")
    cgroup_root = f"/nri-cdi-handover-{uuid.uuid4().hex[:8]}"
    try:
        old.start()
        with ctrd.cri() as cri:
            jobs = Jobs(ctrd, node, cgroup_root)
            try:
                with jobs:
                    jobs.more(5)
                    roll(jobs, old, new)
                outcome = _outcomes(cri, jobs.created)
                # Each a Job's pod of its own, as the rewrites named it.
                mine = [p for p in cri.list_pods() if p.id in jobs.pods]
                assert len(mine) == len(jobs.pods) >= len(jobs.created)
                assert len({(p.labels[JOB_NAME], p.labels[JOB_UID], p.metadata.uid)
                            for p in mine}) == len(mine)
                print(f"\n{len(jobs.created)} Jobs across {name}: "
                      f"{ {k: len(v) for k, v in outcome.items()} }; CRI failures {jobs.failed}")
            finally:
                for pod in jobs.pods:
                    with contextlib.suppress(cri.grpc.RpcError):
                        cri.delete_pod(pod)
        assert not remove_cgroup_tree(cgroup_root)
        return jobs, outcome
    finally:
        old.kill()
        new.kill()


def test_an_upgrade_hands_over_with_no_container_unserved(ctrd: Containerd, specs: Path) -> None:
    def hand_over(jobs: Jobs, old: PluginProcess, new: PluginProcess) -> None:
        new.spawn()  # the surge pod: its plugin starts beside the old one
        new.wait_for_log("serves this node")  # the status lock is the old one's
        # The kubelet's readiness probe: the new plugin's own ready file.
        wait_until(Path(_ready_file(new)).exists, "the new plugin is ready")
        jobs.more(5)  # both serve
        assert old.terminate() == 0  # the DaemonSet ends the old pod
        new.wait_for_log("are this one's now")
        jobs.more(10)
        # The node's status file and metrics address are the new plugin's now.
        reading = read_status(_status_dir(new), "nri-cdi", "10")
        assert reading.status is not None and reading.alive
        assert new.process is not None
        assert (reading.status.pid, reading.status.state) == (new.process.pid, CONNECTED)
        address = _metrics_address(new)
        new.wait_for_log(f"metrics and health on http://{address}/metrics")
        with urllib.request.urlopen(f"http://{address}/healthz", timeout=10) as reply:
            assert json.load(reply)["connected"] is True

    jobs, outcome = _jobs_across(ctrd, specs, "the hand-over", hand_over)
    assert jobs.failed == []
    assert outcome["without device"] == [] and outcome["failed"] == []
    assert len(outcome["succeeded"]) == len(jobs.created) >= 20


def test_a_restart_with_no_overlap_is_what_the_hand_over_avoids(
        ctrd: Containerd, specs: Path) -> None:
    """The old roll-out (old plugin ended, then the new one started), under the same Jobs:
    the figures to compare with the hand-over's, and the check that a Job without its
    device does fail (so the hand-over's all-succeeded means something)."""
    def restart(jobs: Jobs, old: PluginProcess, new: PluginProcess) -> None:
        assert old.terminate() == 0
        jobs.more(3)  # no plugin at all: NRI is fail-open
        new.start()
        jobs.more(5)

    _, outcome = _jobs_across(ctrd, specs, "a restart with no overlap", restart)
    assert outcome["without device"], "no Job was created while no plugin was connected"
    # Each of them failed (or was refused its start by fail-closed): none succeeded.
    assert not set(outcome["without device"]) & set(outcome["succeeded"])


def _flag(plugin: PluginProcess, flag: str) -> str:
    return plugin.extra_args[plugin.extra_args.index(flag) + 1]


def _ready_file(plugin: PluginProcess) -> str:
    return _flag(plugin, "--ready-file")


def _status_dir(plugin: PluginProcess) -> str:
    return _flag(plugin, "--status-dir")


def _metrics_address(plugin: PluginProcess) -> str:
    return _flag(plugin, "--metrics-address")


@pytest.fixture(scope="module")
def nvidia_node(tmp_path_factory: pytest.TempPathFactory, e2e_ready: None) -> Path:
    """A simulated 2-GPU node's spec, generated in each link mode."""
    from nri_cdi_testbed.simnode import NodeLayout, build_node

    root = tmp_path_factory.mktemp("handover-nvidia")
    built = build_node(root / "node", NodeLayout.uniform(2))
    generate_link_modes(root, built.driver_root)
    (root / "policy.yaml").write_text(
        "sources: {visibleDevicesEnv: {enabled: true, privilegedOnly: false}}\n")
    return root


@pytest.mark.parametrize("mode", ["hooks", "mounts"])
@pytest.mark.parametrize("capabilities", ["all", "compute,utility", "graphics"])
def test_two_plugins_give_an_nvidia_container_what_one_gives(
        ctrd: Containerd, nvidia_node: Path, mode: str, capabilities: str) -> None:
    """NVIDIA's rules with two plugins connected: capability trims, hooks or mounts for
    the driver's links, requirement checks: the same container as with one plugin."""
    env = {"NVIDIA_VISIBLE_DEVICES": "1", "NVIDIA_DRIVER_CAPABILITIES": capabilities}

    def plugin(name: str) -> PluginProcess:
        return PluginProcess(ctrd.nri_socket, [nvidia_node / mode],
                             nvidia_node / f"{name}-{mode}-{ctrd.version}.log",
                             ["--policy", str(nvidia_node / "policy.yaml"),
                              "--status-dir", str(nvidia_node / f"st-{name}")])

    def container(cri: CriClient, pod: str, name: str) -> dict[str, Any]:
        return _edits(cri.runtime_spec(cri.create_container(
            pod, name, BUSYBOX_IMAGE, command=["sleep", "60"], env=env)))

    first = plugin("first").start()
    try:
        with ctrd.cri() as cri, cri.cleanup():
            pod = cri.run_pod(f"nv-{mode}-{capabilities.replace(',', '-')}")
            alone = container(cri, pod, "alone")
            second = plugin("second").start()
            try:
                both = container(cri, pod, "both")
            finally:
                second.kill()
    finally:
        first.kill()
    assert any(d["path"] == "/dev/nvidia1" for d in alone["devices"])
    assert both == alone
