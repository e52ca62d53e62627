"""The start guard on a connection of its own, open only while a container may be in
doubt (nri_plugin/plugins/cdi_injector/startguard.py,
nri_plugin/nri/second_connection.py), against the test runtime peer on
a real socket: it is in
place before the injector registers, it closes once nothing is in doubt, and it comes back
first after the injector's connection is lost."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from cdi.cache import Snapshot, SpecCache
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.api.events import EventMask
from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.second_connection import SecondConnection
from nri_plugin.nri.stub import Callback, CloseCallback, Stub, StubOptions
from nri_plugin.plugins.cdi_injector.injector import CdiInjector
from nri_plugin.plugins.cdi_injector.startguard import (
    GuardSettings,
    StartGuard,
    guarded_connections,
)
from nri_plugin.plugins.cdi_injector.vendor import Registry
from tests.helpers import write_specs
from tests.nri_plugin.test_failclosed_guard import ASK, SPEC
from tests.nri_plugin.test_stub import ENV, run
from tests.nri_runtime_peer import RuntimePeer

POD = nri_pb2.PodSandbox(id="p", name="pod", namespace="default")
WAIT = 10.0  # bound for what must happen; never reached when it works
LINGER = 0.2  # the guard's stay once nothing is in doubt (the daemon's: 10 s)


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

    async def nothing_arrives(self, within: float) -> bool:
        try:
            await asyncio.wait_for(self.arrivals.get(), within)
        except asyncio.TimeoutError:
            return True
        return False


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


def serving(tmp_path: Path, pending_limit: float = 60.0,
            ) -> tuple[StartGuard, Callable[[], SecondConnection]]:
    specs = write_specs(tmp_path / "cdi", {"v.yaml": SPEC})
    snapshot: Snapshot = SpecCache([str(specs)]).refresh()
    (tmp_path / "cgroup" / "pids").mkdir(parents=True)
    guard = StartGuard(CdiInjector(lambda: Registry(snapshot)), GuardSettings(
        own_connection=True, cgroup_root=str(tmp_path / "cgroup"), pending_limit=pending_limit,
        linger=LINGER))
    path = str(tmp_path / "nri.sock")

    def make_stub(plugin: Plugin, name: str | None, closed: CloseCallback | None,
                  before: Callback | None) -> Stub:
        return Stub(plugin, StubOptions(name=name, socket_path=path, env=ENV, on_close=closed,
                    before_connect=before, poll_interval=0.02))

    return guard, lambda: guarded_connections(guard, guard, make_stub, None)


def scenario(tmp_path: Path,
             body: Callable[[Runtime, SecondConnection, StartGuard], Awaitable[None]],
             pending_limit: float = 60.0) -> None:
    async def main() -> None:
        runtime = await Runtime(str(tmp_path / "nri.sock")).start()
        guard, make = serving(tmp_path, pending_limit)
        connections = make()
        task = asyncio.create_task(connections.run())
        try:
            await body(runtime, connections, guard)
        finally:
            connections.stop()
            await asyncio.wait_for(task, WAIT)
            assert runtime.server is not None
            runtime.server.close()

    run(main(), timeout=60)


def test_guard_is_in_place_before_the_injector_and_closes_when_nothing_is_in_doubt(
        tmp_path: Path) -> None:
    async def body(runtime: Runtime, connections: SecondConnection, _: StartGuard) -> None:
        name, guard_peer, stream = await runtime.next()
        assert name == "cdi-guard"
        # Until the guard has synchronized, the injector does not even connect.
        assert await runtime.nothing_arrives(within=0.5)
        mask = await accept_plugin(guard_peer, stream)
        assert mask == (EventMask.POST_CREATE_CONTAINER | EventMask.START_CONTAINER
                        | EventMask.REMOVE_CONTAINER)
        name, peer, stream = await runtime.next()
        assert name == "cdi"
        mask = await accept_plugin(peer, stream)
        # Nothing inside a container's creation and start but CreateContainer.
        assert mask == EventMask.CREATE_CONTAINER | EventMask.REMOVE_CONTAINER
        # Nothing in doubt: the guard's connection goes.
        assert await guard_peer.at_eof(timeout=WAIT)
        assert not connections.second_open

    scenario(tmp_path, body)


def test_guard_comes_back_first_when_the_injector_connection_is_lost(tmp_path: Path) -> None:
    async def body(runtime: Runtime, connections: SecondConnection, _: StartGuard) -> None:
        for _round in range(2):
            name, guard_peer, stream = await runtime.next()
            assert name == "cdi-guard"
            await accept_plugin(guard_peer, stream)
            name, peer, stream = await runtime.next()
            assert name == "cdi"
            await accept_plugin(peer, stream)
            assert await guard_peer.at_eof(timeout=WAIT)
            peer.close()  # the runtime drops the injector (a missed deadline, a restart)

    scenario(tmp_path, body)


def test_guard_stays_while_a_container_created_without_us_has_not_started(
        tmp_path: Path) -> None:
    async def body(runtime: Runtime, connections: SecondConnection, guard: StartGuard) -> None:
        name, guard_peer, stream = await runtime.next()
        assert name == "cdi-guard"
        await accept_plugin(guard_peer, stream, [unserved("early")])
        _, peer, stream = await runtime.next()
        # Created while the guard was already there, before the injector: in doubt too.
        await accept_plugin(peer, stream, [unserved("early"), unserved("between")])
        assert guard.needed
        assert await runtime.nothing_arrives(within=0.3) and connections.second_open
        await start_is_refused_and_killed(guard_peer, "early")
        assert guard.needed and connections.second_open  # "between" is still owed
        removed = nri_pb2.StateChangeEvent(event=11, pod=POD, container=unserved("between"))
        reply = await guard_peer.response_to(guard_peer.send_request("StateChange", removed))
        assert reply.status.code == 0
        assert await guard_peer.at_eof(timeout=WAIT)
        assert not guard.needed

    scenario(tmp_path, body)


def test_a_creation_straddling_the_injectors_registration_is_caught_by_its_post_create(
        tmp_path: Path) -> None:
    """Past NRI but not yet stored when the injector synchronized: no Synchronize lists it.
    Its PostCreateContainer, inside the guard's linger, makes it owed a check."""
    async def body(runtime: Runtime, connections: SecondConnection, guard: StartGuard) -> None:
        _, guard_peer, stream = await runtime.next()
        await accept_plugin(guard_peer, stream)
        _, peer, stream = await runtime.next()
        await accept_plugin(peer, stream)
        assert not guard.needed  # lingering: still open
        created = nri_pb2.ContainerEventRequest(pod=POD, container=unserved("straddler"))
        reply = await guard_peer.response_to(
            guard_peer.send_request("PostCreateContainer", created))
        assert reply.status.code == 0 and guard.needed
        with pytest.raises(asyncio.TimeoutError):  # owed a check: it does not close
            await guard_peer.at_eof(timeout=LINGER * 3)
        await start_is_refused_and_killed(guard_peer, "straddler")
        assert await guard_peer.at_eof(timeout=WAIT)  # nothing owed: gone after the linger

    scenario(tmp_path, body)


def test_a_refused_start_leaves_nothing_owed_and_the_guard_closes(tmp_path: Path) -> None:
    """The kubelet keeps a pod's last dead container and sends no RemoveContainer for it: a
    container whose start the guard refused must not keep the guard's connection open (it
    is never started again)."""
    async def body(runtime: Runtime, connections: SecondConnection, guard: StartGuard) -> None:
        _, guard_peer, stream = await runtime.next()
        await accept_plugin(guard_peer, stream, [unserved("refused")])
        _, peer, stream = await runtime.next()
        await accept_plugin(peer, stream, [unserved("refused")])
        assert guard.needed
        # containerd: no process yet at StartContainer; the start is refused all the same.
        started = nri_pb2.ContainerEventRequest(pod=POD, container=unserved("refused"))
        reply = await guard_peer.response_to(guard_peer.send_request("StartContainer", started))
        assert reply.status.code != 0 and "nri-cdi: " in reply.status.message
        assert not guard.needed
        assert await guard_peer.at_eof(timeout=WAIT)  # no RemoveContainer needed

    scenario(tmp_path, body)


def test_a_created_container_that_never_starts_is_let_go(tmp_path: Path) -> None:
    """Listed as created by a Synchronize (containerd 1.7 and 2.1 list a container whose
    start failed so, for as long as the kubelet keeps it): owed a check only for a while."""
    async def body(runtime: Runtime, connections: SecondConnection, guard: StartGuard) -> None:
        _, guard_peer, stream = await runtime.next()
        await accept_plugin(guard_peer, stream, [unserved("dead")])
        _, peer, stream = await runtime.next()
        await accept_plugin(peer, stream, [unserved("dead")])
        assert await guard_peer.at_eof(timeout=WAIT)
        assert not guard.needed

    scenario(tmp_path, body, pending_limit=0.5)
