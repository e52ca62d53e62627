"""Fail-closed without the runtime: the StartGuard's second check, stopping by cgroup or
pid (real processes, a real cgroup.procs file layout), bounded messages and logs."""

from __future__ import annotations

import asyncio
import logging
import subprocess
from pathlib import Path

import pytest

from cdi.cache import Snapshot, SpecCache
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.dispatch import RpcError
from nri_plugin.nri.wire._bounded import bound_message, clip
from nri_plugin.ops.logformat import BoundedLog
from nri_plugin.plugins.cdi_injector.counters import Counters
from nri_plugin.plugins.cdi_injector.failclosed import (
    MAX_NAMES,
    act,
    cgroup_relpath,
    find_unserved,
    stop_processes,
    too_many_names,
)
from nri_plugin.plugins.cdi_injector.guard import StartGuard
from nri_plugin.plugins.cdi_injector.injector import CdiInjector
from nri_plugin.plugins.cdi_injector.policy import Policy
from nri_plugin.plugins.cdi_injector.vendor import Registry
from nri_plugin.vendors.nvidia.rules import NvidiaRules
from tests.helpers import nvidia_policy, write_specs

SPEC = """\
cdiVersion: 0.5.0
kind: vendor.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes: [{path: /dev/vgpu0, type: c, major: 241, minor: 0}]
"""
ASK = {"cdi.k8s.io/dp_0": "vendor.com/gpu=0"}


@pytest.fixture
def snapshot(tmp_path: Path) -> Snapshot:
    return SpecCache([str(write_specs(tmp_path / "cdi", {"v.yaml": SPEC}))]).refresh()


@pytest.fixture
def cgroup_root(tmp_path: Path) -> Path:
    """A cgroup v1 layout (cgroup.procs, no cgroup.kill) in a plain folder."""
    root = tmp_path / "cgroup"
    (root / "pids").mkdir(parents=True)
    return root


def guard(snapshot: Snapshot, root: Path, policy: Policy | None = None) -> StartGuard:
    injector = CdiInjector(lambda: Registry(snapshot), vendors=[NvidiaRules()], policy=policy)
    return StartGuard(injector, cgroup_root=str(root))


def pod() -> nri_pb2.PodSandbox:
    return nri_pb2.PodSandbox(id="p", name="pod", namespace="default")


def container(cid: str, pid: int = 0, cgroup: str = "", **annotations: str) -> nri_pb2.Container:
    ctr = nri_pb2.Container(id=cid, pod_sandbox_id="p", name=f"n-{cid}", pid=pid,
                            annotations=annotations or ASK, state=nri_pb2.CONTAINER_CREATED)
    ctr.linux.cgroups_path = cgroup
    return ctr


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "60"])


def in_cgroup(root: Path, path: str, pids: list[int]) -> None:
    folder = root / "pids" / path.strip("/")
    folder.mkdir(parents=True)
    (folder / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))


def killed(proc: subprocess.Popen[bytes]) -> bool:
    try:
        return proc.wait(timeout=60) == -9
    except subprocess.TimeoutExpired:
        proc.kill()
        return False


def test_served_container_is_left_alone_at_start(snapshot: Snapshot, cgroup_root: Path) -> None:
    plugin = guard(snapshot, cgroup_root)
    proc = sleeper()
    ctr = container("served", pid=proc.pid)
    assert plugin.create_container(pod(), ctr) is not None  # we injected it
    plugin.start_container(pod(), ctr)  # no devices in this message, but we served it
    plugin.post_start_container(pod(), ctr)
    assert proc.poll() is None
    proc.kill()
    proc.wait()


def test_container_with_its_devices_is_left_alone(snapshot: Snapshot,
                                                  cgroup_root: Path) -> None:
    plugin = guard(snapshot, cgroup_root)  # e.g. served by a previous plugin process
    proc = sleeper()
    ctr = container("had-them", pid=proc.pid)
    ctr.linux.devices.add(path="/dev/vgpu0", type="c", major=241, minor=0)
    plugin.start_container(pod(), ctr)
    plugin.post_start_container(pod(), ctr)
    assert proc.poll() is None
    proc.kill()
    proc.wait()


def test_unserved_container_is_killed_by_cgroup_at_start_and_start_fails(
    snapshot: Snapshot, cgroup_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = guard(snapshot, cgroup_root)
    procs = [sleeper(), sleeper()]
    in_cgroup(cgroup_root, "/k8s.io/straddler", [p.pid for p in procs])
    ctr = container("straddler", cgroup="/k8s.io/straddler")
    plugin.post_create_container(pod(), ctr)  # created without us: remembered
    assert "will be stopped when it starts" in caplog.text
    with pytest.raises(RpcError, match=r"straddler \(straddler\) was created without"):
        plugin.start_container(pod(), ctr)
    assert all(killed(p) for p in procs)
    assert "stopped container n-straddler (straddler) of pod default/pod before it ran" \
        in caplog.text
    assert plugin.counters.unserved_evicted == 1


def test_pid_zero_at_synchronize_is_stopped_when_it_starts(
    snapshot: Snapshot, cgroup_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = guard(snapshot, cgroup_root)
    found = find_unserved([pod()], [container("waiting")], plugin.injector.policy,
                          plugin.injector.vendors, Registry(snapshot))
    assert plugin.defer_unserved(found) == []  # nothing to stop yet
    assert "(waiting) of pod default/pod is created but not started" in caplog.text
    proc = sleeper()
    with pytest.raises(RpcError):
        plugin.start_container(pod(), container("waiting", pid=proc.pid))  # no cgroup: pid
    assert killed(proc)


def test_post_start_stops_what_start_could_not(snapshot: Snapshot, cgroup_root: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    plugin = guard(snapshot, cgroup_root)
    with pytest.raises(RpcError):
        plugin.start_container(pod(), container("late"))  # pid 0, no cgroup: nothing yet
    assert "trying again after it starts" in caplog.text
    proc = sleeper()
    plugin.post_start_container(pod(), container("late", pid=proc.pid))
    assert killed(proc)
    assert "stopped container n-late (late) of pod default/pod as it started" in caplog.text


def test_report_mode_names_the_id_and_stops_nothing(
    snapshot: Snapshot, cgroup_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = guard(snapshot, cgroup_root, nvidia_policy({"failClosed": {"action": "report"}}))
    proc = sleeper()
    ctr = container("rep", pid=proc.pid)
    plugin.start_container(pod(), ctr)
    plugin.post_start_container(pod(), ctr)
    assert proc.poll() is None
    assert caplog.text.count("fail-closed report: container n-rep (rep)") == 1
    found = find_unserved([pod()], [container("sync", pid=proc.pid)], plugin.injector.policy,
                          plugin.injector.vendors, Registry(snapshot))
    asyncio.run(act(found, "report", Counters()))
    assert "fail-closed report: container n-sync (sync) of pod default/pod" in caplog.text
    proc.kill()
    proc.wait()


def test_remove_forgets(snapshot: Snapshot, cgroup_root: Path) -> None:
    plugin = guard(snapshot, cgroup_root)
    plugin.REMEMBER = 3
    for i in range(10):
        plugin.create_container(pod(), container(f"c{i}"))
    assert list(plugin._served) == ["c7", "c8", "c9"]  # bounded
    plugin.remove_container(pod(), container("c9"))
    assert "c9" not in plugin._served


def test_act_stops_by_signal_without_the_runtime(snapshot: Snapshot) -> None:
    # act has no handle on the runtime (the NRI eviction is never sent): it signals.
    proc = sleeper()
    found = find_unserved([pod()], [container("s", pid=proc.pid)], Policy(), [],
                          Registry(snapshot))
    counters = Counters()
    assert asyncio.run(act(found, "evict", counters)) == 1
    assert killed(proc) and counters == Counters(unserved_evicted=1)


@pytest.mark.parametrize("path, rel", [
    ("/k8s.io/abc", "k8s.io/abc"),
    ("kubepods-besteffort-pod12.slice:cri-containerd:abc",
     "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12.slice/"
     "cri-containerd-abc.scope"),
    ("system.slice:cri-containerd:abc", "system.slice/cri-containerd-abc.scope"),
])
def test_cgroup_paths(path: str, rel: str) -> None:
    assert cgroup_relpath(path) == rel


def test_stop_processes_with_nothing_to_stop(cgroup_root: Path) -> None:
    assert stop_processes(0, "/k8s.io/gone", str(cgroup_root)) is None


# --- bounded text ------------------------------------------------------------------------------

def test_bound_message_summarizes_lists_and_cuts() -> None:
    names = "; ".join(f"v.com/g=u{i}: unknown" for i in range(60000))
    message = bound_message(f"unresolvable CDI devices: {names}")
    assert len(message) <= 2048 and message.endswith("... and 59995 more")
    long = bound_message("bad " + "x" * 3_000_000 + " in annotation 'a'")
    assert len(long) == 2048 and long.endswith("in annotation 'a'")
    assert "more characters" in long
    assert clip("short", 10) == "short"


def test_rpc_error_messages_are_bounded() -> None:
    assert len(RpcError(2, "y" * 10_000_000).message) <= 2048


def test_log_lines_are_cut_and_repeats_dropped_with_a_count() -> None:
    now = [0.0]
    limiter = BoundedLog(max_chars=100, burst=3, window=10, clock=lambda: now[0])
    records = [logging.LogRecord("x", logging.WARNING, __file__, 1, "refused %s", (f"{i}" * 500,),
                                 None) for i in range(10)]
    passed = [r for r in records if limiter.filter(r)]
    assert len(passed) == 3 and all(len(r.getMessage()) <= 100 for r in passed)
    now[0] = 11
    later = logging.LogRecord("x", logging.WARNING, __file__, 1, "refused %s", ("z",), None)
    assert limiter.filter(later)
    assert later.getMessage() == "refused z [7 similar line(s) dropped in the last 10 s]"
    other = logging.LogRecord("x", logging.WARNING, __file__, 2, "other", (), None)
    assert limiter.filter(other)  # another call site has its own budget


def test_plain_containers_are_not_touched(snapshot: Snapshot, cgroup_root: Path) -> None:
    plugin = guard(snapshot, cgroup_root)
    proc = sleeper()
    plain = nri_pb2.Container(id="plain", pod_sandbox_id="p", name="plain", pid=proc.pid)
    plugin.start_container(pod(), plain)  # asks for nothing
    plugin.post_start_container(pod(), plain)
    assert proc.poll() is None
    proc.kill()
    proc.wait()


def test_too_many_names_are_refused_before_parsing(snapshot: Snapshot,
                                                   cgroup_root: Path) -> None:
    plugin = guard(snapshot, cgroup_root)
    many = ",".join(f"vendor.com/gpu={i}" for i in range(300_000))
    with pytest.raises(RpcError, match="over 1024"):
        plugin.create_container(pod(), container("many", **{"cdi.k8s.io/x": many}))
    # Created while we were away with such a request: stopped at start like any other.
    proc = sleeper()
    with pytest.raises(RpcError, match="its request is invalid"):
        plugin.start_container(pod(), container("many2", pid=proc.pid,
                                                **{"cdi.k8s.io/x": many}))
    assert killed(proc)


def test_the_name_cap_counts_every_annotation_and_env_request() -> None:
    """MAX_NAMES names pass and one more is refused, whether in one annotation, spread over
    a pod's and a container's, or in a vendor's env variable (checked by length first)."""
    def names(count: int) -> str:
        return ",".join(f"vendor.com/gpu={i}" for i in range(count))

    env = ("NVIDIA_VISIBLE_DEVICES=",)
    at_cap = nri_pb2.Container(annotations={"cdi.k8s.io/a": names(MAX_NAMES)})
    assert too_many_names({}, at_cap, env) is None
    over = nri_pb2.Container(annotations={"cdi.k8s.io/a": names(MAX_NAMES - 1)})
    assert too_many_names({"cdi.k8s.io/p": names(2)}, over, env) is not None
    assert too_many_names({"other.io/p": names(2)}, over, env) is None
    ids = ",".join("0" for _ in range(MAX_NAMES + 1))
    assert "NVIDIA_VISIBLE_DEVICES" in str(too_many_names(
        {}, nri_pb2.Container(env=[f"NVIDIA_VISIBLE_DEVICES={ids}"]), env))
    fewer = ",".join("0" for _ in range(MAX_NAMES))
    assert too_many_names({}, nri_pb2.Container(env=[f"NVIDIA_VISIBLE_DEVICES={fewer}"]),
                          env) is None
    assert too_many_names({}, nri_pb2.Container(env=[f"OTHER={ids}"]), env) is None


# --- cost: the events the guard subscribes to, and answers without work -----------------------

def test_on_containerd_only_start_is_guarded(snapshot: Snapshot, cgroup_root: Path) -> None:
    from nri_plugin.nri.api.events import EventMask

    # containerd fails a start whose StartContainer fails: PostCreate and PostStart would
    # be two more round trips in every container's path for nothing
    for version in ("1.7.24", "2.1.9", "2.3.4"):
        mask = guard(snapshot, cgroup_root).configure("", "containerd", version)
        assert mask & EventMask.START_CONTAINER
        assert not mask & (EventMask.POST_CREATE_CONTAINER | EventMask.POST_START_CONTAINER)
    crio = guard(snapshot, cgroup_root).configure("", "cri-o", "1.34.0")
    assert crio & EventMask.POST_START_CONTAINER and crio & EventMask.START_CONTAINER


def test_start_of_a_container_created_through_us_does_no_work(
        snapshot: Snapshot, cgroup_root: Path) -> None:
    plugin = guard(snapshot, cgroup_root)

    def judged(*args: object) -> None:
        raise AssertionError("judged a container we created")

    plain = nri_pb2.Container(id="plain", pod_sandbox_id="p", name="plain")
    assert plugin.create_container(pod(), plain) is None  # asked nothing: still ours
    plugin._judge = judged  # type: ignore[method-assign]
    plugin.start_container(pod(), plain)


def test_a_reply_the_runtime_did_not_wait_for_is_still_owed(
        snapshot: Snapshot, cgroup_root: Path) -> None:
    # answered by us, but the runtime went on without the reply (fail-open): Synchronize
    # finds it created without its devices; its start must still be stopped
    plugin = guard(snapshot, cgroup_root)
    assert plugin.create_container(pod(), container("late-reply")) is not None
    found = find_unserved([pod()], [container("late-reply")], plugin.injector.policy,
                          plugin.injector.vendors, Registry(snapshot))
    assert plugin.defer_unserved(found) == []
    proc = sleeper()
    with pytest.raises(RpcError):
        plugin.start_container(pod(), container("late-reply", pid=proc.pid))
    assert killed(proc)
