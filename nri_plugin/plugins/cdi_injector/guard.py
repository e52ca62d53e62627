"""``StartGuard``: fail-closed around the injector, by composition (failclosed.py says why).

It is the plugin the stub runs: every handler goes to the injector it wraps, and the guard
adds the second check. It remembers the containers whose creation the injector answered,
and at StartContainer (on runtimes other than containerd also at PostCreateContainer and
PostStartContainer) checks any other container that asks for devices: if it lacks them it
is stopped before its process runs (StartContainer: the task exists, not started) or right
after (PostStartContainer), or only reported under ``failClosed.action: report``. A
container whose creation we answered is answered at once, with one lookup. Synchronize
hands the containers created while we were away to ``act`` (which schedules
``failclosed.act``); those created but not started (pid 0) are remembered and stopped the
same way when they start.
Everything it keeps is bounded (``REMEMBER``) and forgotten at RemoveContainer.

Those start checks are owed only while a container may be in doubt: until the injector's
connection has synchronized (every container created before it is then judged), and while
one created without us has neither started nor gone. With ``own_connection`` the guard's
events go on a second NRI connection of their own (``GuardConnection``), which the daemon
opens before the injector's connects and closes once nothing is in doubt
(``needed``): the runtime then asks the plugin nothing at a container's start, which is
one round trip less inside every Create+Start.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TypeVar

from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.api.events import EventMask
from nri_plugin.nri.dispatch import RpcError
from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.versions import RuntimeInfo
from nri_plugin.nri.wire import Code
from nri_plugin.plugins.cdi_injector.failclosed import (
    CGROUP_ROOT,
    Unserved,
    container_unserved,
    stop_processes,
)
from nri_plugin.plugins.cdi_injector.injector import CdiInjector

log = logging.getLogger("nri_cdi.failclosed")
_V = TypeVar("_V")

# Acts on what Synchronize found (the containers, the policy's failClosed.action).
Act = Callable[[list[Unserved], str], None]


class StartGuard(Plugin):
    """The plugin the stub runs: the injector's handlers plus the fail-closed checks."""

    adjustments_immutable = True  # it returns the injector's answers as they are
    REMEMBER = 65536  # containers remembered as served / pending, oldest dropped first
    # The events the guard needs on every runtime, whatever the injector subscribes to.
    GUARD_EVENTS = (EventMask.POST_CREATE_CONTAINER | EventMask.START_CONTAINER
                    | EventMask.POST_START_CONTAINER | EventMask.REMOVE_CONTAINER)
    # containerd fails a container's start when a plugin's StartContainer fails (every
    # release with NRI: "NRI container start failed", checked in 1.7.24, 1.7.30, 2.1.9,
    # 2.2.1, 2.3.4), so there StartContainer alone keeps a container created without us
    # from running: PostCreate and PostStart would only be two more round trips inside
    # every container's creation and start.
    CONTAINERD_GUARD_EVENTS = EventMask.START_CONTAINER | EventMask.REMOVE_CONTAINER

    def __init__(self, injector: CdiInjector, *, act: Act | None = None,
                 on_stopped: Callable[[int], None] | None = None,
                 cgroup_root: str = CGROUP_ROOT, own_connection: bool = False,
                 on_need_changed: Callable[[bool], None] | None = None) -> None:
        """``act``: what to do with the started containers Synchronize found unserved
        (None: only log them); ``on_stopped``: told how many the guard stopped itself;
        ``own_connection``: the start checks are served by ``GuardConnection`` on a
        connection of their own, not by this one; ``on_need_changed``: told when
        ``needed`` changes (from inside a handler: act after its reply)."""
        self.injector = injector
        self.counters = injector.counters
        self._act = act
        self._on_stopped = on_stopped
        self.cgroup_root = cgroup_root
        self.own_connection = own_connection
        self.on_need_changed = on_need_changed
        self._served: OrderedDict[str, None] = OrderedDict()
        self._pending: OrderedDict[str, Unserved] = OrderedDict()
        self._reported: OrderedDict[str, None] = OrderedDict()
        # Started containers already handed to ``act``: the guard's Synchronize and the
        # injector's both list them, and one kill is enough.
        self._acted: OrderedDict[str, None] = OrderedDict()
        self._injector_synced = False
        self._was_needed = True
        # The runtime as the last Configure (either connection's) named it.
        self._runtime = RuntimeInfo()

    @property
    def needed(self) -> bool:
        """Whether a container may be in doubt: the injector's connection has not
        synchronized since it (re)connected, or one created without us is still owed a
        check at its start."""
        return not self._injector_synced or bool(self._pending)

    def _need_may_have_changed(self) -> None:
        now = self.needed
        if now != self._was_needed:
            self._was_needed = now
            if self.on_need_changed is not None:
                self.on_need_changed(now)

    def injector_connection_lost(self) -> None:
        """The injector's connection ended: until it synchronizes again, containers are
        created without us."""
        self._injector_synced = False
        self._need_may_have_changed()

    def _remember(self, table: OrderedDict[str, _V], key: str, value: _V) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > self.REMEMBER:
            table.popitem(last=False)

    # --- the injector's handlers, with the guard's part ---

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
        """Fail-closed: the containers created while we were away without their devices.
        The reply must go first (the runtime holds its lock until it has it), so acting
        on them is left to ``act``, which schedules it."""
        self._judge_listed(self.injector.find_unserved(pods, containers))
        self._injector_synced = True
        self._need_may_have_changed()

    def guard_configured(self, runtime_name: str, runtime_version: str) -> EventMask:
        """The guard's own connection is to this runtime: the events it needs there, and
        PostCreateContainer on every runtime. A creation that began before the injector
        registered is shown to no Synchronize when it is still in the runtime's hands (past
        NRI, not yet in its store); its PostCreateContainer comes once it is, and marks it
        owed a check, which keeps this connection open until it starts or goes. Only on
        this connection, so it costs a round trip only while it is open."""
        self._runtime = self.injector.runtime_of(runtime_name, runtime_version)
        return guard_events(runtime_name) | EventMask.POST_CREATE_CONTAINER

    def guard_synchronize(self, pods: Sequence[nri_pb2.PodSandbox],
                          containers: Sequence[nri_pb2.Container]) -> None:
        """The guard's own Synchronize: what the injector's would find, judged first."""
        self._judge_listed(self.injector.find_unserved(pods, containers, self._runtime))
        self._need_may_have_changed()

    def _judge_listed(self, unserved: list[Unserved]) -> None:
        now = [item for item in self.defer_unserved(unserved)
               if item.container_id not in self._acted]
        for item in now:
            self._remember(self._acted, item.container_id, None)
        if now and self._act is not None:
            self._act(now, self.injector.policy.fail_closed_action)

    def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.ContainerAdjustment | None:
        result = self.injector.create_container(pod, container)
        # Every container whose creation we answered, adjusted or not: at Start it is then
        # one dict lookup, and only those created without us are judged.
        self._remember(self._served, container.id, None)
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
        self._reported.pop(container_id, None)
        self._acted.pop(container_id, None)
        self._need_may_have_changed()

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
            if self.injector.policy.fail_closed_action != "report":
                log.warning("fail-closed: container %s (%s) of pod %s is created but not "
                            "started; it will be stopped when it starts: %s", item.name,
                            item.container_id, item.pod, item.reason)
        return now

    # --- the checks ---

    def _judge(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> Unserved | None:
        if container.id in self._served:
            return None
        pending = self._pending.get(container.id)
        if pending is not None:
            return pending
        injector = self.injector
        return container_unserved(pod, container, injector.policy, injector.vendors,
                                  injector.registry(), self._runtime.native_cdi is True)

    def check(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container, stage: str) -> None:
        """The start check of one container at ``stage`` (raises to fail its start)."""
        try:
            self._check_once(pod, container, stage)
        finally:
            self._need_may_have_changed()

    def _check_once(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container,
                    stage: str) -> None:
        if container.id in self._served:
            return  # nothing owed: answered at once, no work
        item = self._judge(pod, container)
        log.debug("%s check of container %s (%s): pid %d, cgroup %r, %d devices: %s", stage,
                  container.name, container.id, container.pid, container.linux.cgroups_path,
                  len(container.linux.devices), "unserved" if item else "ok")
        if item is None:
            return
        if self.injector.policy.fail_closed_action == "report":
            if container.id not in self._reported:
                self._remember(self._reported, container.id, None)
                self.counters.unserved_reported += 1
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
            self.counters.unserved_evicted += 1
            if self._on_stopped is not None:
                self._on_stopped(1)
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


class GuardConnection(Plugin):
    """The start guard's own NRI connection: only the lifecycle events the checks need
    (``guard_events``), served by the ``StartGuard`` it belongs to. Its Synchronize judges
    what is listed, like the injector's; ``on_synchronized`` is told when it has (the
    guard is in place from the reply on)."""

    def __init__(self, guard: StartGuard, on_synchronized: Callable[[], None] | None = None,
                 ) -> None:
        self.guard = guard
        self._on_synchronized = on_synchronized

    def configure(self, config: str, runtime_name: str,
                  runtime_version: str) -> EventMask | None:
        return self.guard.guard_configured(runtime_name, runtime_version)

    def synchronize(self, pods: Sequence[nri_pb2.PodSandbox],
                    containers: Sequence[nri_pb2.Container]) -> None:
        self.guard.guard_synchronize(pods, containers)
        if self._on_synchronized is not None:
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
