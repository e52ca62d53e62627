"""The plugin under faults, on a real containerd: containerd restarted (SIGTERM and SIGKILL)
and the plugin SIGKILLed while containers that ask for a device are being created, in the
default fail-closed mode. Nothing may hang, the plugin must be back on the NRI socket each
time (how soon is checked on the stub's own clock, tests/nri_plugin/test_reconnect.py),
and no container that asked for the device may be left running without it.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nri_cdi_testbed.waiting import DEFAULT_TIMEOUT, wait_until
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient
from tests.e2e.images import BUSYBOX_IMAGE
from tests.e2e.plugin import REPO, PluginProcess
from tests.helpers import make_char_device

KIND = "faults.example/gpu"
DEVICE = "/dev/faultgpu0"
ASK = {"cdi.k8s.io/gpu": f"{KIND}=0"}
SLEEP = ["sleep", "600"]
CONNECTED = "connected to containerd"  # registered and configured
LINKED = "; registering"  # the plugin's own connect() to the new socket succeeded


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory, e2e_ready: None) -> Path:
    root = tmp_path_factory.mktemp("faults")
    make_char_device(root / "gpu0", major=241, minor=7)
    (root / "cdi").mkdir()
    (root / "cdi" / "faults.yaml").write_text(
        f"cdiVersion: 0.5.0\nkind: {KIND}\ndevices:\n- name: \"0\"\n  containerEdits:\n"
        f"    deviceNodes: [{{path: {DEVICE}, hostPath: {root}/gpu0}}]\n"
        "    env: [FAULT_GPU=0]\n")
    return root


@pytest.fixture(scope="module")
def ctrd(containerd: ContainerdFactory) -> Containerd:
    return containerd()


def start_plugin(ctrd: Containerd, specs: Path, log: str) -> PluginProcess:
    return PluginProcess(ctrd.nri_socket, [specs / "cdi"], specs / log).start()


def state(cri: CriClient, cid: str) -> tuple[int, int]:
    status = cri.container_status(cid).status
    return int(status.state), int(status.started_at)


def has_device(cri: CriClient, cid: str) -> bool:
    devices = cri.runtime_spec(cid)["linux"].get("devices", [])
    return any(d["path"] == DEVICE for d in devices)


def wait_not_running(cri: CriClient, cid: str) -> tuple[int, int]:
    """The container's (state, started_at) once it is not running (a stop takes a while)."""
    return wait_until(lambda: (got := state(cri, cid))[0] != cri.pb.CONTAINER_RUNNING and got,
                      f"container {cid} not running", seen=lambda: state(cri, cid))


def test_container_created_while_plugin_was_down_is_stopped_when_it_starts(
    ctrd: Containerd, specs: Path
) -> None:
    """Defect 2: pid 0 at Synchronize; stopped at StartContainer, before it runs."""
    with ctrd.cri() as cri, cri.cleanup():
        pod = cri.run_pod("down", annotations=ASK)
        waiting = cri.create_container(pod, "waiting", BUSYBOX_IMAGE, command=SLEEP)
        assert not has_device(cri, waiting)  # NRI is fail-open: created without it
        plugin = start_plugin(ctrd, specs, "defect2.log")
        try:
            plugin.wait_for_log(f"({waiting}) of pod default/down, created without its "
                                "devices while the plugin was away, is created but not started")
            try:
                cri.start_container(waiting)
                start_error = ""
            except cri.grpc.RpcError as exc:
                start_error = exc.details()
            got, started_at = wait_not_running(cri, waiting)
            assert got != cri.pb.CONTAINER_RUNNING, plugin.log()[-3000:]
            plugin.wait_for_log(f"fail-closed evict: refused the start of container waiting "
                                f"({waiting}) of pod default/down")
            print(f"start error: {start_error!r}; state {got}, started_at {started_at}")
            # The start was refused: containerd never ran the process, and says why.
            assert "nri-cdi: container waiting was created while the plugin was away" in \
                start_error
        finally:
            plugin.kill()


CLOSED = "nothing in doubt: closing the start guard's connection"


def test_start_guard_is_connected_only_while_a_container_is_in_doubt(
    ctrd: Containerd, specs: Path
) -> None:
    """The guard's own connection (plugins/cdi_injector/startguard.py) on a real containerd: gone
    once nothing is in doubt, so a container's start asks the plugin nothing; back (and
    registered before the injector) while a container created without us waits."""
    guard_closed = 'connection to plugin "10-nri-cdi-guard" closed'

    def runtime_log() -> str:  # containerd's, since the plugin started (quotes unescaped)
        with ctrd.log_path.open("rb") as handle:
            handle.seek(mark)
            return handle.read().decode(errors="replace").replace('\\"', '"')

    with ctrd.cri() as cri, cri.cleanup():
        mark = ctrd.log_path.stat().st_size
        plugin = start_plugin(ctrd, specs, "ondemand.log")
        try:
            plugin.wait_for_log(CLOSED)  # after the guard's 10 s linger
            wait_until(lambda: guard_closed in runtime_log(),
                       "containerd to see the guard's connection close",
                       seen=lambda: runtime_log()[-3000:])
            log = runtime_log()
            # The guard registered (and synchronized) before the injector did.
            assert log.index('"10-nri-cdi-guard" connected') < log.index(
                'registered as "10-nri-cdi"'), log[-3000:]
            pod = cri.run_pod("ondemand", annotations=ASK)
            served = cri.run_container(pod, "served", BUSYBOX_IMAGE, command=SLEEP)
            assert has_device(cri, served)
            plugin.kill()
            waiting = cri.create_container(pod, "waiting", BUSYBOX_IMAGE, command=SLEEP)
            after = plugin.log_size()
            plugin.start()
            plugin.wait_for_log(f"({waiting}) of pod default/ondemand, created without its "
                                "devices while the plugin was away, is created but not started",
                                after=after)
            assert CLOSED not in plugin.log(after)  # a container is in doubt: it stays
            with pytest.raises(cri.grpc.RpcError, match="created while the plugin was away"):
                cri.start_container(waiting)
            plugin.wait_for_log(CLOSED, after=after)  # no doubt: it goes
        finally:
            plugin.kill()


# --- a creation that straddles our (re)connection (defect 3) ----------------------------------

SLOW_PLUGIN = """
import sys, time
from pathlib import Path
from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.stub import Stub, StubOptions
import asyncio

flags = Path(sys.argv[2])

class Slow(Plugin):
    def create_container(self, pod, container):
        (flags / "creating").touch()  # the test links our plugin in now
        time.sleep(1.5)  # holds the runtime's NRI lock: what a slow plugin does
        return None

asyncio.run(Stub(Slow(), StubOptions(name="slow", idx="05", socket_path=sys.argv[1],
                 on_connected=lambda stub: (flags / "registered").touch())).run())
"""


def test_creation_straddling_the_connection_is_stopped_at_start(
    ctrd: Containerd, specs: Path, tmp_path: Path
) -> None:
    """Defect 3: CreateContainer starts before we register, so neither it nor (racing)
    Synchronize shows us the container; the check at start must stop it."""
    flags = tmp_path / "slow-flags"
    flags.mkdir()
    slow = subprocess.Popen([sys.executable, "-c", SLOW_PLUGIN, ctrd.nri_socket, str(flags)],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Our plugin waits on a socket path that does not exist yet; a symlink to the real
    # socket lets it in at the moment we choose: while the creation is in progress.
    link = tmp_path / "nri.sock"
    plugin = PluginProcess(str(link), [specs / "cdi"], specs / "defect3.log")
    try:
        wait_until((flags / "registered").exists, "the slow plugin to register",
                   seen=lambda: f"slow plugin exit status {slow.poll()}")
        with ctrd.cri() as cri, cri.cleanup():
            pod = cri.run_pod("straddle", annotations=ASK)
            plugin.spawn()
            plugin.wait_for_log("cannot connect to")
            created: list[str] = []
            creator = threading.Thread(target=lambda: created.append(cri.create_container(
                pod, "straddler", BUSYBOX_IMAGE, command=SLEEP)))
            creator.start()
            # Inside the slow plugin's hold. On a machine slow enough that we register
            # only after it, Synchronize shows the container instead: still stopped.
            wait_until((flags / "creating").exists, "the creation to reach the slow plugin",
                       seen=lambda: f"created {created}")
            link.symlink_to(ctrd.nri_socket)
            plugin.wait_for_log(CONNECTED)
            creator.join(timeout=DEFAULT_TIMEOUT)
            assert created, "the creation did not return"
            cid = created[0]
            assert not has_device(cri, cid)  # created without us
            with pytest.raises(cri.grpc.RpcError, match="created while the plugin was away"):
                cri.start_container(cid)
            assert state(cri, cid) == (cri.pb.CONTAINER_EXITED, 0)  # never started
            log = plugin.wait_for_log(f"refused the start of container straddler ({cid}) of "
                                      "pod default/")
            print("straddle seen by:", "Synchronize" if "is created but not started" in log
                  else "PostCreateContainer" if "without passing through" in log
                  else "StartContainer only")
    finally:
        plugin.kill()
        slow.kill()
        slow.wait()


# --- bursts under restarts ------------------------------------------------------------------

RESTART_TIMEOUT = 120.0

@dataclass
class Burst:
    """Creates and starts containers that ask for the device, in a thread, until stopped."""

    ctrd: Containerd
    interval: float = 0.15
    created: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    pod: str | None = None

    def run(self) -> None:
        # A call that outlasts this hangs: containerd bounds a plugin's part (2 s here).
        with CriClient(self.ctrd.address, timeout=DEFAULT_TIMEOUT) as cri:
            for i in range(100000):
                if self.stop.is_set():
                    return
                try:
                    if self.pod is None:
                        self.pod = cri.run_pod("burst", annotations=ASK)
                    cid = cri.create_container(self.pod, f"c{i}", BUSYBOX_IMAGE, command=SLEEP)
                    self.created.append(cid)
                    cri.start_container(cid)
                except cri.grpc.RpcError as exc:
                    (self.hangs if exc.code() == cri.grpc.StatusCode.DEADLINE_EXCEEDED
                     else self.failed).append(f"c{i}: {exc.code().name}: {exc.details()[:200]}")
                time.sleep(self.interval)

    def __enter__(self) -> Burst:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def more(self, count: int) -> None:
        """Until the burst has created ``count`` more containers."""
        target = len(self.created) + count
        wait_until(lambda: len(self.created) >= target, f"{count} more containers created",
                   seen=self.summary)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=2 * DEFAULT_TIMEOUT)

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for failure in self.failed:
            kind = failure.split(": ", 2)[1]
            kinds[kind] = kinds.get(kind, 0) + 1
        return f"{len(self.created)} created, CRI calls failed: {kinds or 0}"

    def remove(self, cri: CriClient) -> None:
        if self.pod is not None:
            cri.delete_pod(self.pod)


def none_runs_without_device(cri: CriClient, ids: list[str]) -> dict[str, int]:
    """Every container either has the device or is not running (waits for pending stops)."""
    def tally() -> dict[str, int]:
        counts = {"with device": 0, "never started": 0, "stopped after it ran": 0,
                  "running without": 0}
        for cid in ids:
            current, started_at = state(cri, cid)
            if has_device(cri, cid):
                counts["with device"] += 1
            elif current == cri.pb.CONTAINER_RUNNING:
                counts["running without"] += 1
            elif started_at == 0:
                counts["never started"] += 1
            else:  # created and started while no plugin was connected (NRI is fail-open)
                counts["stopped after it ran"] += 1
        return counts

    return wait_until(lambda: (counts := tally())["running without"] == 0 and counts,
                      "no container running without its device", interval=0.2,
                      seen=lambda: [cid for cid in ids if not has_device(cri, cid)
                                    and state(cri, cid)[0] == cri.pb.CONTAINER_RUNNING])


class Watch:
    """Polls (every 5 ms) the NRI socket's identity and the plugin log: when a new socket
    appears and when the plugin logs its next connection."""

    def __init__(self, socket_path: str, plugin: PluginProcess) -> None:
        self.socket_path, self.plugin = socket_path, plugin
        self.sockets: list[float] = []  # times a new socket file appeared
        self.connects: list[float] = []  # times a new "connected" line appeared
        self.links: list[float] = []  # times a new "registering" line appeared
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        last = None
        seen = self.plugin.log().count(CONNECTED)
        offset = self.plugin.log_size()
        while not self._stop.is_set():
            try:
                st = os.stat(self.socket_path)
                ident = (st.st_ino, st.st_ctime_ns)
            except FileNotFoundError:
                ident = None
            now = time.monotonic()
            if ident is not None and ident != last and last is not None:
                self.sockets.append(now)
            if ident is not None:
                last = ident
            text = self.plugin.log(offset)
            count = text.count(CONNECTED)
            self.links.extend([now] * text.count(LINKED))
            if count > 0:
                self.connects.extend([now] * count)
            offset += len(text.encode(errors="replace"))
            seen += count
            time.sleep(0.005)

    def close(self) -> None:
        self._stop.set()
        self.thread.join()

    def reconnect_times(self) -> list[float]:
        """For each new socket: seconds until the plugin is connected to it (its part)."""
        return self._after_each_socket(self.links)

    def registered_times(self) -> list[float]:
        """For each new socket: seconds until registered and configured (this also waits
        for containerd, which answers only once its CRI is up again)."""
        return self._after_each_socket(self.connects)

    def _after_each_socket(self, events: list[float]) -> list[float]:
        return [min((c for c in events if c >= s), default=float("inf")) - s
                for s in self.sockets]


def test_containerd_restarts_during_a_burst(ctrd: Containerd, specs: Path) -> None:
    plugin = start_plugin(ctrd, specs, "restarts.log")
    watch = Watch(ctrd.nri_socket, plugin)
    restarts = 12
    try:
        with Burst(ctrd) as burst:
            for i in range(restarts):
                burst.more(2)  # some creations between restarts
                before = len(watch.connects)
                # containerd's own outage grows with what it finds at start: a SIGKILL in
                # the middle of a creation leaks shims, and containerd 1.7 then spends ~5 s
                # on each before it serves CRI again. What is measured here is the plugin,
                # from the NRI socket accepting to registered, so containerd gets its time.
                if i % 2:
                    ctrd.kill_daemon()
                    ctrd.start(timeout=RESTART_TIMEOUT)
                else:
                    ctrd.restart(timeout=RESTART_TIMEOUT)  # SIGTERM
                wait_until(lambda before=before: len(watch.connects) > before,
                           f"the plugin connected after restart #{i + 1}",
                           seen=lambda: plugin.log()[-3000:])
            burst.more(2)
        watch.close()
        times, registered = watch.reconnect_times(), watch.registered_times()
        for what, values in (("connected", times), ("registered", registered)):
            print(f"\n{what} after {len(values)} containerd restarts (6 SIGTERM, 6 SIGKILL): "
                  f"median {statistics.median(values) * 1e3:.0f} ms, "
                  f"max {max(values) * 1e3:.0f} ms; "
                  f"all: {', '.join(f'{v * 1e3:.0f}' for v in values)} ms")
        # Connected to every new socket. How soon (within a poll interval of the socket
        # accepting) is the stub's own clock's business: tests/nri_plugin/test_reconnect.py
        # checks it exactly; the figures above are what this machine made of it.
        assert len(times) == restarts
        assert max(times) < RESTART_TIMEOUT
        assert max(registered) < RESTART_TIMEOUT
        assert burst.hangs == []
        with ctrd.cri() as cri:
            tally = none_runs_without_device(cri, burst.created)
            print(f"{burst.summary()}; {tally}")
            burst.remove(cri)
        assert tally["with device"] > 0
    finally:
        watch.close()
        plugin.kill()


def test_plugin_killed_mid_burst_and_restarted(ctrd: Containerd, specs: Path) -> None:
    plugin = start_plugin(ctrd, specs, "killed.log")
    try:
        with ctrd.cri() as cri, cri.cleanup():
            pod = cri.run_pod("kill", annotations=ASK)
            early = cri.create_container(pod, "early", BUSYBOX_IMAGE, command=SLEEP)
            with Burst(ctrd) as burst:
                for round_ in range(3):
                    burst.more(2)
                    plugin.kill()  # SIGKILL, mid-burst
                    late = cri.create_container(pod, f"late{round_}", BUSYBOX_IMAGE,
                                                command=SLEEP)  # while we are down
                    plugin.start()
                    with pytest.raises(cri.grpc.RpcError,
                                       match="created while the plugin was away"):
                        cri.start_container(late)
                    assert state(cri, late) == (cri.pb.CONTAINER_EXITED, 0)
                burst.more(2)
            # Created through the first plugin, started under the fourth: not stopped.
            cri.start_container(early)
            assert has_device(cri, early)
            assert state(cri, early)[0] == cri.pb.CONTAINER_RUNNING
            tally = none_runs_without_device(cri, burst.created)
            print(f"\nduring 3 plugin kills: {burst.summary()}; {tally}")
            assert burst.hangs == []
            burst.remove(cri)
    finally:
        plugin.kill()
