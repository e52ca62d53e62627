"""Fail-closed without the runtime: the StartGuard's checks, stopping by cgroup or pid (real
processes, a real cgroup.procs file layout), the termination message the kubelet shows,
bounded messages, and fail-closed's log lines that no limiter drops."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest

from cdi.cache import Snapshot, SpecCache
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.dispatch import RpcError
from nri_plugin.nri.wire import bound_message, clip
from nri_plugin.ops.logformat import BoundedLog
from nri_plugin.plugins.cdi_injector.asked import (
    MAX_NAMES,
    TooManyNamesError,
    check_name_count,
)
from nri_plugin.plugins.cdi_injector.eviction import (
    cgroup_has_processes,
    cgroup_relpath,
    stop_processes,
)
from nri_plugin.plugins.cdi_injector.injector import CdiInjector
from nri_plugin.plugins.cdi_injector.policy import Policy
from nri_plugin.plugins.cdi_injector.startguard import (
    FAILCLOSED_LOGGER,
    GuardSettings,
    StartGuard,
)
from nri_plugin.plugins.cdi_injector.unserved import find_unserved, termination_file
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


def guard(snapshot: Snapshot, root: Path, policy: Policy | None = None, *,
          runtime: str = "cri-o", clock: list[float] | None = None) -> StartGuard:
    """A guard whose runtime is ``runtime`` (cri-o: a failed start is only logged, so the
    guard stops processes itself; containerd: it fails the start)."""
    injector = CdiInjector(lambda: Registry(snapshot), vendors=[NvidiaRules()], policy=policy)
    now = clock if clock is not None else [0.0]
    plugin = StartGuard(injector, GuardSettings(cgroup_root=str(root)), clock=lambda: now[0])
    plugin.configure("", runtime, "2.1.9" if runtime == "containerd" else "1.34.0")
    return plugin


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
    folder.mkdir(parents=True, exist_ok=True)
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
    plugin.post_create_container(pod(), ctr)  # created without us: owed a check
    assert "it is checked when it starts" in caplog.text
    with pytest.raises(RpcError, match=r"^nri-cdi: container n-straddler was created while "
                                       r"the plugin was away, without its devices: it asked "
                                       r"for vendor.com/gpu=0 and does not have it$"):
        plugin.start_container(pod(), ctr)
    assert all(killed(p) for p in procs)
    assert ("fail-closed evict: stopped container n-straddler (straddler) of pod default/pod, "
            "at its start, before it ran (2 process(es)") in caplog.text
    assert plugin.counters.unserved_evicted == 1
    assert not plugin._pending  # started once: nothing stays owed


def test_on_containerd_a_refused_start_stops_it_and_leaves_nothing_owed(
    snapshot: Snapshot, cgroup_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """containerd fails a start its plugin refuses: with no process found (its init not
    visible yet) the refusal alone stops it, and the container is never started again, so
    the guard owes it nothing (the kubelet keeps it, dead, without a RemoveContainer)."""
    plugin = guard(snapshot, cgroup_root, runtime="containerd")
    found = find_unserved([pod()], [container("waiting")], plugin.injector)
    plugin.synchronize([pod()], [container("waiting")])
    assert [f.container_id for f in found] == ["waiting"] and plugin.needed
    with pytest.raises(RpcError):
        plugin.start_container(pod(), container("waiting"))
    assert "fail-closed evict: refused the start of container n-waiting (waiting)" in \
        caplog.text and "could not be stopped" not in caplog.text
    assert not plugin.needed
    assert plugin.counters.unserved_evicted == 1


def test_pid_zero_at_synchronize_is_stopped_when_it_starts(
    snapshot: Snapshot, cgroup_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = guard(snapshot, cgroup_root)
    plugin.synchronize([pod()], [container("waiting")])
    assert ("container n-waiting (waiting) of pod default/pod, created without its devices "
            "while the plugin was away, is created but not started") in caplog.text
    proc = sleeper()
    with pytest.raises(RpcError):
        plugin.start_container(pod(), container("waiting", pid=proc.pid))  # no cgroup: pid
    assert killed(proc)


def test_a_created_container_is_owed_a_check_only_for_a_while(
    snapshot: Snapshot, cgroup_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A container listed as created that never starts (its start failed before we came
    back) is let go after ``pending_limit``, saying so."""
    now = [100.0]
    plugin = guard(snapshot, cgroup_root, clock=now)
    plugin.synchronize([pod()], [container("dead")])
    assert plugin.needed and plugin.next_due() == plugin.settings.recheck
    while plugin.needed:  # its cgroup is looked at, empty each time, until the limit
        assert now[0] < 100.0 + plugin.settings.pending_limit
        next_due = plugin.next_due()
        assert next_due is not None
        now[0] += next_due
        plugin.due()
    assert now[0] == 100.0 + plugin.settings.pending_limit
    assert "has not started within 60 s of being found" in caplog.text
    assert plugin.counters.unserved_evicted == 0


def test_a_pending_container_whose_start_the_guard_never_saw_is_stopped(
    snapshot: Snapshot, cgroup_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Listed as created at the guard's Synchronize, then started without its
    StartContainer reaching the guard (containerd 1.7 dispatched it before the guard's
    registration completed): its cgroup shows processes at two looks in a row, and it is
    stopped as one found running, with the kubelet told why."""
    now = [100.0]
    plugin = guard(snapshot, cgroup_root, runtime="containerd", clock=now)
    plugin.configure("", "containerd", "1.7.24")
    proc = sleeper()
    k8s_pod, ctr, log = kubelet_container(tmp_path, "c8", 0)
    ctr.state = nri_pb2.CONTAINER_CREATED
    ctr.linux.cgroups_path = "/k8s.io/c8"
    in_cgroup(cgroup_root, ctr.linux.cgroups_path, [])
    plugin.judge_listed([k8s_pod], [ctr])
    assert "is created but not started; it is checked when it starts" in caplog.text

    def look() -> None:
        next_due = plugin.next_due()
        assert next_due is not None
        now[0] += next_due
        plugin.due()

    look()  # no task yet: nothing in its cgroup
    in_cgroup(cgroup_root, ctr.linux.cgroups_path, [proc.pid])
    look()  # its task is there: the StartContainer may still be on its way
    assert proc.poll() is None and plugin.needed
    look()  # still there, and no StartContainer came: it started past the guard
    assert killed(proc)
    assert plugin.next_due() is None  # nothing pending
    assert plugin.counters.unserved_evicted == 1
    assert "found running, its start not seen by the guard" in caplog.text
    assert log.read_text().startswith("nri-cdi: stopped: the container was created while "
                                      "the plugin was away, without its devices")
    assert now[0] < 100.0 + plugin.settings.pending_limit  # well before it would have been let go
    plugin.start_container(k8s_pod, ctr)  # a late StartContainer: nothing owed any more


def test_a_pending_container_whose_start_reaches_the_guard_is_refused_there(
    snapshot: Snapshot, cgroup_root: Path
) -> None:
    """One look at processes is no start seen: the StartContainer that follows the task's
    creation is what refuses it (the start error says why)."""
    now = [0.0]
    plugin = guard(snapshot, cgroup_root, runtime="containerd", clock=now)
    in_cgroup(cgroup_root, "/k8s.io/w", [])
    plugin.judge_listed([pod()], [container("w", cgroup="/k8s.io/w")])
    proc = sleeper()
    in_cgroup(cgroup_root, "/k8s.io/w", [proc.pid])
    now[0] += plugin.settings.recheck
    plugin.due()
    assert plugin.next_due() == plugin.settings.recheck and plugin.counters.unserved_evicted == 0
    with pytest.raises(RpcError, match="created while the plugin was away"):
        plugin.start_container(pod(), container("w", cgroup="/k8s.io/w"))
    assert plugin.next_due() is None and plugin.counters.unserved_evicted == 1
    assert killed(proc)  # its cgroup's processes, killed as its start is refused


def test_cgroup_processes_are_read_from_cgroup_procs(cgroup_root: Path) -> None:
    in_cgroup(cgroup_root, "/k8s.io/full", [4242])
    in_cgroup(cgroup_root, "/k8s.io/empty", [])
    assert cgroup_has_processes("/k8s.io/full", str(cgroup_root))
    assert not cgroup_has_processes("/k8s.io/empty", str(cgroup_root))
    assert not cgroup_has_processes("/k8s.io/absent", str(cgroup_root))
    assert not cgroup_has_processes("", str(cgroup_root))


def test_running_containers_found_at_synchronize_are_stopped_after_the_reply(
        snapshot: Snapshot, cgroup_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    deferred: list[object] = []
    injector = CdiInjector(lambda: Registry(snapshot), vendors=[NvidiaRules()])
    plugin = StartGuard(injector, GuardSettings(cgroup_root=str(cgroup_root)),
                        defer=deferred.append)
    proc = sleeper()
    running = container("running", pid=proc.pid)
    running.state = nri_pb2.CONTAINER_RUNNING
    plugin.synchronize([pod()], [running])
    assert proc.poll() is None and len(deferred) == 1  # nothing before the reply
    deferred[0]()  # type: ignore[operator]
    assert killed(proc)
    plugin.synchronize([pod()], [running])  # the other connection lists it too: once
    assert len(deferred) == 1 and plugin.counters.unserved_evicted == 1


def test_post_start_stops_what_start_could_not(snapshot: Snapshot, cgroup_root: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    plugin = guard(snapshot, cgroup_root)  # cri-o: a failed start is only logged
    with pytest.raises(RpcError):
        plugin.start_container(pod(), container("late"))  # pid 0, no cgroup: nothing yet
    assert "stopped as it starts, if it does" in caplog.text
    proc = sleeper()
    plugin.post_start_container(pod(), container("late", pid=proc.pid))
    assert killed(proc)
    assert ("fail-closed evict: stopped container n-late (late) of pod default/pod, as it "
            "started (pid") in caplog.text


def test_report_mode_names_every_container_once_and_stops_nothing(
    snapshot: Snapshot, cgroup_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = guard(snapshot, cgroup_root, nvidia_policy({"failClosed": {"action": "report"}}))
    proc = sleeper()
    ctr = container("rep", pid=proc.pid)
    plugin.start_container(pod(), ctr)
    plugin.post_start_container(pod(), ctr)
    assert proc.poll() is None
    assert caplog.text.count("fail-closed report: container n-rep (rep)") == 1
    running = [container(f"sync{i}", pid=proc.pid) for i in range(40)]
    for each in running:
        each.state = nri_pb2.CONTAINER_RUNNING
    plugin.synchronize([pod()], running)
    assert all(f"fail-closed report: container n-sync{i} (sync{i})" in caplog.text
               for i in range(40))
    assert plugin.counters.unserved_reported == 41
    proc.kill()
    proc.wait()


def test_fail_closed_lines_pass_the_log_limiter_whatever_their_number() -> None:
    """No rate limit between a fail-closed action and its record: 18 containers stopped
    in a burst are 18 lines (the limiter keeps 20 per call site for everything else)."""
    limiter = BoundedLog(burst=3, window=10, clock=lambda: 0.0, unlimited=(FAILCLOSED_LOGGER,))
    lines = [logging.LogRecord(FAILCLOSED_LOGGER, logging.WARNING, __file__, 1,
                               "fail-closed: container %s", (f"c{i}",), None)
             for i in range(18)]
    assert all(limiter.filter(r) for r in lines)
    others = [logging.LogRecord("nri_cdi.injector", logging.WARNING, __file__, 1,
                                "refused %s", (f"c{i}",), None) for i in range(18)]
    assert sum(limiter.filter(r) for r in others) == 3


def test_remove_forgets(snapshot: Snapshot, cgroup_root: Path) -> None:
    plugin = guard(snapshot, cgroup_root)
    plugin.REMEMBER = 3
    for i in range(10):
        plugin.create_container(pod(), container(f"c{i}"))
    assert list(plugin._served) == ["c7", "c8", "c9"]  # bounded
    plugin.remove_container(pod(), container("c9"))
    assert "c9" not in plugin._served


def kubelet_container(tmp_path: Path, cid: str, pid: int) -> tuple[nri_pb2.PodSandbox,
                                                                    nri_pb2.Container, Path]:
    """A container as the kubelet makes one: its termination-message file mounted from
    the pod's folder at the path its annotation names."""
    uid = "0f1e2d3c-aaaa-bbbb-cccc-1234567890ab"
    folder = tmp_path / "kubelet" / "pods" / uid / "containers" / "app"
    folder.mkdir(parents=True)
    log = folder / "4f1b2c3d"
    log.write_text("")
    k8s_pod = nri_pb2.PodSandbox(id="p", name="train", namespace="ml", uid=uid)
    ctr = container(cid, pid=pid)
    ctr.annotations["io.kubernetes.container.terminationMessagePath"] = "/dev/termination-log"
    ctr.annotations["io.kubernetes.container.name"] = "app"
    ctr.mounts.add(destination="/dev/termination-log", source=str(log), type="bind")
    ctr.state = nri_pb2.CONTAINER_RUNNING
    return k8s_pod, ctr, log


def test_the_kubelet_shows_why_a_container_was_stopped(snapshot: Snapshot, cgroup_root: Path,
                                                      tmp_path: Path) -> None:
    proc = sleeper()
    k8s_pod, ctr, log = kubelet_container(tmp_path, "stopped", proc.pid)
    plugin = guard(snapshot, cgroup_root)
    plugin.synchronize([k8s_pod], [ctr])
    assert killed(proc)
    assert log.read_text() == ("nri-cdi: stopped: the container was created while the plugin "
                               "was away, without its devices: it asked for vendor.com/gpu=0 "
                               "and does not have it\n")


def test_only_the_kubelets_own_termination_file_is_written(tmp_path: Path) -> None:
    k8s_pod, ctr, log = kubelet_container(tmp_path, "x", 0)
    assert termination_file(k8s_pod, ctr) == str(log)
    elsewhere = tmp_path / "etc-shadow"
    elsewhere.write_text("secret")
    for source in (str(elsewhere), f"{log.parent}/../../../{k8s_pod.uid}/containers/app/x",
                   str(log).replace(k8s_pod.uid, "another-pod")):
        ctr.mounts[0].source = source
        assert termination_file(k8s_pod, ctr) == ""
    ctr.mounts[0].source = str(log)
    del ctr.annotations["io.kubernetes.container.terminationMessagePath"]
    assert termination_file(k8s_pod, ctr) == ""  # not the kubelet's container


def test_a_link_in_place_of_the_termination_file_is_not_followed(
        snapshot: Snapshot, cgroup_root: Path, tmp_path: Path) -> None:
    proc = sleeper()
    k8s_pod, ctr, log = kubelet_container(tmp_path, "linked", proc.pid)
    target = tmp_path / "target"
    target.write_text("untouched")
    log.unlink()
    os.symlink(target, log)
    guard(snapshot, cgroup_root).synchronize([k8s_pod], [ctr])
    assert killed(proc) and target.read_text() == "untouched"


def test_an_unknown_device_is_named_as_such(snapshot: Snapshot) -> None:
    ctr = container("unknown", **{"cdi.k8s.io/x": "vendor.com/gpu=7"})
    ctr.state = nri_pb2.CONTAINER_RUNNING
    [found] = find_unserved([pod()], [ctr], CdiInjector(lambda: Registry(snapshot),
                                                        policy=Policy()))
    assert found.reason == "it asked for vendor.com/gpu=7, which no CDI spec on the node defines"


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
    a pod's and a container's, or in a vendor's env variable."""
    def names(count: int) -> str:
        return ",".join(f"vendor.com/gpu={i}" for i in range(count))

    def refused(pod_annotations: dict[str, str], ctr: nri_pb2.Container) -> bool:
        try:
            check_name_count(pod_annotations, ctr, ("NVIDIA_VISIBLE_DEVICES=",))
        except TooManyNamesError:
            return True
        return False

    at_cap = nri_pb2.Container(annotations={"cdi.k8s.io/a": names(MAX_NAMES)})
    assert not refused({}, at_cap)
    over = nri_pb2.Container(annotations={"cdi.k8s.io/a": names(MAX_NAMES - 1)})
    assert refused({"cdi.k8s.io/p": names(2)}, over)
    assert not refused({"other.io/p": names(2)}, over)
    ids = ",".join("0" for _ in range(MAX_NAMES + 1))
    assert refused({}, nri_pb2.Container(env=[f"NVIDIA_VISIBLE_DEVICES={ids}"]))
    fewer = ",".join("0" for _ in range(MAX_NAMES))
    assert not refused({}, nri_pb2.Container(env=[f"NVIDIA_VISIBLE_DEVICES={fewer}"]))
    assert not refused({}, nri_pb2.Container(env=[f"OTHER={ids}"]))


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


def test_a_reply_the_runtime_did_not_wait_for_is_still_owed(
        snapshot: Snapshot, cgroup_root: Path) -> None:
    # answered by us, but the runtime went on without the reply (fail-open): Synchronize
    # finds it created without its devices; its start must still be stopped
    plugin = guard(snapshot, cgroup_root)
    assert plugin.create_container(pod(), container("late-reply")) is not None
    plugin.synchronize([pod()], [container("late-reply")])
    proc = sleeper()
    with pytest.raises(RpcError):
        plugin.start_container(pod(), container("late-reply", pid=proc.pid))
    assert killed(proc)


def test_a_refused_start_leaves_the_termination_message_to_the_start_error(
        snapshot: Snapshot, cgroup_root: Path, tmp_path: Path) -> None:
    """containerd fails a start its plugin refuses, and the kubelet shows that error with
    the termination message appended: the reason is said once, by the start error."""
    k8s_pod, ctr, log = kubelet_container(tmp_path, "refused", 0)
    ctr.state = nri_pb2.CONTAINER_CREATED
    plugin = guard(snapshot, cgroup_root, runtime="containerd")
    with pytest.raises(RpcError, match="was created while the plugin was away"):
        plugin.start_container(k8s_pod, ctr)
    assert log.read_text() == ""


def test_the_refusal_keeps_the_nodes_folders_for_the_log(snapshot: Snapshot) -> None:
    from nri_plugin.plugins.cdi_injector.asked import rechecked_refusal
    from nri_plugin.plugins.cdi_injector.context import DeviceRequest

    refusal = rechecked_refusal(snapshot, [DeviceRequest("vendor.com/gpu=7", "s")])
    assert refusal is not None
    assert refusal.user_message().endswith("(the node's spec folders were read again just now)")
    assert snapshot.spec_dirs[0] not in refusal.user_message()
    assert snapshot.spec_dirs[0] in refusal.log_message()
