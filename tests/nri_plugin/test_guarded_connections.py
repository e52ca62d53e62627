"""The start guard on a connection of its own, open only while a container may be in
doubt (nri_plugin/plugins/cdi_injector/startguard.py,
nri_plugin/nri/second_connection.py), against the test runtime peer on
a real socket: it is in
place before the injector registers, it closes a linger after nothing is in doubt, and it
comes back first after the injector's connection is lost. The guard's clock and the
connections' timers are a virtual clock the test moves: the linger and the guard's
rechecks pass without real waiting, and "not yet closed" is judged at a virtual time."""

from __future__ import annotations

import asyncio
import heapq
import inspect
import itertools
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

from cdi.cache import Snapshot, SpecCache
from nri_cdi_testbed.waiting import wait_until_async
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.api.events import EventMask
from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.second_connection import SecondConnection
from nri_plugin.nri.stub import Callback, CloseCallback, Stub, StubOptions
from nri_plugin.plugins.cdi_injector.injector import CdiInjector
from nri_plugin.plugins.cdi_injector.startguard import (
    GuardSettings,
    StartGuard,
)
from nri_plugin.plugins.cdi_injector.vendor import Registry
from tests.helpers import write_specs
from tests.nri_plugin.test_failclosed_guard import ASK, SPEC
from tests.nri_plugin.test_stub import ENV, run
from tests.nri_runtime_peer import RuntimePeer

POD = nri_pb2.PodSandbox(id="p", name="pod", namespace="default")
WAIT = 10.0  # bound for what must happen; never reached when it works
LINGER = 10.0  # the guard's stay once nothing is in doubt, in virtual seconds
PENDING_LIMIT = 60.0  # how long a container created without us is owed a check


class _Timer:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """Time that moves only by ``advance``: ``now`` is the guard's clock and ``call_later``
    the connections' timers; a timer's callback runs inside ``advance``, in time order."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self._timers: list[tuple[float, int, _Timer]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self.now_s

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(self.now_s + delay, callback)
        heapq.heappush(self._timers, (timer.when, next(self._order), timer))
        return timer

    def waiting(self) -> list[float]:
        """Seconds until each timer not cancelled runs, soonest first."""
        return sorted(t.when - self.now_s for _, _, t in self._timers if not t.cancelled)

    def advance(self, seconds: float) -> None:
        """Move time ``seconds`` on, running each timer due by then (those its callbacks
        set included) at its own time."""
        end = self.now_s + seconds
        while self._timers and self._timers[0][0] <= end:
            when, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                self.now_s = when
                timer.callback()
        self.now_s = end


class World:
    """What a scenario's body works with: the runtime, the connections, the guard, the
    virtual clock, and the injector connection's steps (``before-connect``: it waits for
    the guard's; ``connecting``: it goes on)."""

    def __init__(self, runtime: Runtime, connections: SecondConnection, guard: StartGuard,
                 clock: VirtualClock, steps: list[str]) -> None:
        self.runtime, self.connections, self.guard = runtime, connections, guard
        self.clock, self.steps = clock, steps

    async def closes_after_the_linger(self, guard_peer: RuntimePeer) -> None:
        """Nothing in doubt: the guard's close is set a linger away, it is still open just
        before, and its connection ends once the linger has passed."""
        await wait_until_async(lambda: self.clock.waiting() == [LINGER],
                               "the guard's close set a linger away", seen=self.clock.waiting)
        self.clock.advance(LINGER / 2)
        assert self.connections.second_open and self.clock.waiting() == [LINGER / 2]
        self.clock.advance(LINGER / 2)
        assert await guard_peer.at_eof(timeout=WAIT)
        await wait_until_async(lambda: not self.connections.second_open,
                               "the guard's connection ended")

    def stays_open(self, seconds: float) -> None:
        """``seconds`` pass (the guard's rechecks run) and the guard's connection stays,
        with no close set."""
        self.clock.advance(seconds)
        assert self.connections.second_open and self.guard.needed
        assert all(w != LINGER for w in self.clock.waiting())


def unserved(cid: str, pid: int = 0) -> nri_pb2.Container:
    """A container created while we were away: it asks for a device it does not have."""
    return nri_pb2.Container(id=cid, pod_sandbox_id="p", name=f"n-{cid}", pid=pid,
                             annotations=ASK, state=nri_pb2.CONTAINER_CREATED)


async def start_is_refused_and_killed(guard_peer: RuntimePeer, cid: str) -> None:
    """StartContainer of an unserved container (its process: a real one) fails, and the
    guard has SIGKILLed the process: it must not run without its devices."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        started = nri_pb2.ContainerEventRequest(pod=POD, container=unserved(cid, proc.pid))
        reply = await guard_peer.response_to(guard_peer.send_request("StartContainer", started))
        assert reply.status.code != 0
        assert proc.wait(timeout=WAIT) == -9
    finally:
        proc.kill()


class Runtime:
    """The runtime's side: each connection's registration, in arrival order."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.arrivals: asyncio.Queue[tuple[str, RuntimePeer, int]] = asyncio.Queue()
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> Runtime:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = RuntimePeer(reader, writer)
            stream, registered = await peer.expect_register()
            await self.arrivals.put((registered.plugin_name, peer, stream))

        self.server = await asyncio.start_unix_server(accept, path=self.path)
        return self

    async def next(self, timeout: float = WAIT) -> tuple[str, RuntimePeer, int]:
        return await asyncio.wait_for(self.arrivals.get(), timeout)


async def accept_plugin(peer: RuntimePeer, stream: int,
                        containers: list[nri_pb2.Container] | None = None,
                        version: str = "2.1.9") -> int:
    """Registration reply, Configure, Synchronize (with ``containers``): the events mask."""
    peer.reply(stream)
    configure = nri_pb2.ConfigureRequest(runtime_name="containerd", runtime_version=version,
                                         registration_timeout=5000, request_timeout=2000)
    reply = await peer.call("Configure", configure, nri_pb2.ConfigureResponse)
    assert isinstance(reply, nri_pb2.ConfigureResponse)
    await peer.call("Synchronize", nri_pb2.SynchronizeRequest(
        pods=[POD], containers=containers or []), nri_pb2.SynchronizeResponse)
    return int(reply.events)


def serving(tmp_path: Path, clock: VirtualClock, steps: list[str],
            pending_limit: float = 60.0) -> tuple[StartGuard, Callable[[], SecondConnection]]:
    specs = write_specs(tmp_path / "cdi", {"v.yaml": SPEC})
    snapshot: Snapshot = SpecCache([str(specs)]).refresh()
    (tmp_path / "cgroup" / "pids").mkdir(parents=True)
    guard = StartGuard(CdiInjector(lambda: Registry(snapshot)), GuardSettings(
        own_connection=True, cgroup_root=str(tmp_path / "cgroup"), pending_limit=pending_limit,
        linger=LINGER), clock=clock.now, call_later=clock.call_later)
    path = str(tmp_path / "nri.sock")

    def make_stub(plugin: Plugin, name: str | None, closed: CloseCallback | None,
                  before: Callback | None) -> Stub:
        async def held(stub: Stub) -> None:  # the injector's: waits for the guard's first
            assert before is not None
            steps.append("before-connect")
            result = before(stub)
            if inspect.isawaitable(result):
                await result
            steps.append("connecting")

        return Stub(plugin, StubOptions(name=name, socket_path=path, env=ENV, on_close=closed,
                    before_connect=held if before is not None else None, poll_interval=0.02))

    return guard, lambda: SecondConnection(guard, guard, make_stub, None)


def scenario(tmp_path: Path, body: Callable[[World], Awaitable[None]],
             pending_limit: float = 60.0) -> None:
    async def main() -> None:
        runtime = await Runtime(str(tmp_path / "nri.sock")).start()
        clock, steps = VirtualClock(), []
        guard, make = serving(tmp_path, clock, steps, pending_limit)
        connections = make()
        task = asyncio.create_task(connections.run())
        try:
            await body(World(runtime, connections, guard, clock, steps))
        finally:
            connections.stop()
            await asyncio.wait_for(task, WAIT)
            assert runtime.server is not None
            runtime.server.close()

    run(main(), timeout=60)


def test_guard_is_in_place_before_the_injector_and_closes_when_nothing_is_in_doubt(
        tmp_path: Path) -> None:
    async def body(w: World) -> None:
        name, guard_peer, stream = await w.runtime.next()
        assert name == "cdi-guard"
        # Until the guard has synchronized, the injector waits before it connects.
        assert w.steps == ["before-connect"] and w.runtime.arrivals.empty()
        mask = await accept_plugin(guard_peer, stream)
        assert mask == (EventMask.POST_CREATE_CONTAINER | EventMask.START_CONTAINER
                        | EventMask.REMOVE_CONTAINER)
        name, peer, stream = await w.runtime.next()
        assert name == "cdi" and w.steps == ["before-connect", "connecting"]
        mask = await accept_plugin(peer, stream)
        # Nothing inside a container's creation and start but CreateContainer.
        assert mask == EventMask.CREATE_CONTAINER | EventMask.REMOVE_CONTAINER
        await w.closes_after_the_linger(guard_peer)

    scenario(tmp_path, body)


def test_guard_comes_back_first_when_the_injector_connection_is_lost(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        for _round in range(2):
            name, guard_peer, stream = await w.runtime.next()
            assert name == "cdi-guard"
            await accept_plugin(guard_peer, stream)
            name, peer, stream = await w.runtime.next()
            assert name == "cdi"
            await accept_plugin(peer, stream)
            await w.closes_after_the_linger(guard_peer)
            peer.close()  # the runtime drops the injector (a missed deadline, a restart)

    scenario(tmp_path, body)


def test_guard_stays_while_a_container_created_without_us_has_not_started(
        tmp_path: Path) -> None:
    async def body(w: World) -> None:
        name, guard_peer, stream = await w.runtime.next()
        assert name == "cdi-guard"
        await accept_plugin(guard_peer, stream, [unserved("early")])
        _, peer, stream = await w.runtime.next()
        # Created while the guard was already there, before the injector: in doubt too.
        await accept_plugin(peer, stream, [unserved("early"), unserved("between")])
        assert w.guard.needed
        w.stays_open(LINGER * 2)  # longer than the linger, within the pending limit
        await start_is_refused_and_killed(guard_peer, "early")
        w.stays_open(LINGER * 2)  # "between" is still owed
        removed = nri_pb2.StateChangeEvent(event=11, pod=POD, container=unserved("between"))
        reply = await guard_peer.response_to(guard_peer.send_request("StateChange", removed))
        assert reply.status.code == 0
        await w.closes_after_the_linger(guard_peer)
        assert not w.guard.needed

    scenario(tmp_path, body)


def test_a_creation_straddling_the_injectors_registration_is_caught_by_its_post_create(
        tmp_path: Path) -> None:
    """Past NRI but not yet stored when the injector synchronized: no Synchronize lists it.
    Its PostCreateContainer, inside the guard's linger, makes it owed a check."""
    async def body(w: World) -> None:
        _, guard_peer, stream = await w.runtime.next()
        await accept_plugin(guard_peer, stream)
        _, peer, stream = await w.runtime.next()
        await accept_plugin(peer, stream)
        await wait_until_async(lambda: w.clock.waiting() == [LINGER],
                               "the guard's close set a linger away", seen=w.clock.waiting)
        w.clock.advance(LINGER / 2)
        assert not w.guard.needed and w.connections.second_open  # lingering: still open
        created = nri_pb2.ContainerEventRequest(pod=POD, container=unserved("straddler"))
        reply = await guard_peer.response_to(
            guard_peer.send_request("PostCreateContainer", created))
        assert reply.status.code == 0 and w.guard.needed
        # Owed a check: its close is called off, and it outlives the linger many times over.
        await wait_until_async(lambda: LINGER / 2 not in w.clock.waiting(),
                               "the guard's close called off", seen=w.clock.waiting)
        w.stays_open(LINGER * 3)
        await start_is_refused_and_killed(guard_peer, "straddler")
        await w.closes_after_the_linger(guard_peer)  # nothing owed: gone after the linger

    scenario(tmp_path, body)


def test_a_refused_start_leaves_nothing_owed_and_the_guard_closes(tmp_path: Path) -> None:
    """The kubelet keeps a pod's last dead container and sends no RemoveContainer for it: a
    container whose start the guard refused must not keep the guard's connection open (it
    is never started again)."""
    async def body(w: World) -> None:
        _, guard_peer, stream = await w.runtime.next()
        await accept_plugin(guard_peer, stream, [unserved("refused")])
        _, peer, stream = await w.runtime.next()
        await accept_plugin(peer, stream, [unserved("refused")])
        assert w.guard.needed
        # containerd: no process yet at StartContainer; the start is refused all the same.
        started = nri_pb2.ContainerEventRequest(pod=POD, container=unserved("refused"))
        reply = await guard_peer.response_to(guard_peer.send_request("StartContainer", started))
        assert reply.status.code != 0 and "nri-cdi: " in reply.status.message
        assert not w.guard.needed
        await w.closes_after_the_linger(guard_peer)  # no RemoveContainer needed

    scenario(tmp_path, body)


def test_a_created_container_that_never_starts_is_let_go(tmp_path: Path) -> None:
    """Listed as created by a Synchronize (containerd 1.7 and 2.1 list a container whose
    start failed so, for as long as the kubelet keeps it): owed a check only for a while."""
    async def body(w: World) -> None:
        _, guard_peer, stream = await w.runtime.next()
        await accept_plugin(guard_peer, stream, [unserved("dead")])
        _, peer, stream = await w.runtime.next()
        await accept_plugin(peer, stream, [unserved("dead")])
        w.stays_open(PENDING_LIMIT - 1)
        w.clock.advance(1)  # the pending limit reached: let go
        assert not w.guard.needed
        await w.closes_after_the_linger(guard_peer)

    scenario(tmp_path, body, pending_limit=PENDING_LIMIT)
