"""Fail-closed, when: the start guard's state machine. Every container whose creation did not
pass through this plugin process is checked when it starts; what the runtime's Synchronize
lists is judged at once (``unserved``) and acted on (``eviction``). Its connection, open
only while needed, is ``nri_plugin.nri.second_connection``; docs/developer/fail-closed.md.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.api.events import EventMask
from nri_plugin.nri.dispatch import RpcError
from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.second_connection import CallLater
from nri_plugin.nri.versions import RuntimeInfo
from nri_plugin.nri.wire import Code
from nri_plugin.plugins.cdi_injector.eviction import (
    CGROUP_ROOT,
    cgroup_has_processes,
    stop_processes,
    write_termination_message,
)
from nri_plugin.plugins.cdi_injector.injector import CdiInjector, Counters
from nri_plugin.plugins.cdi_injector.refusal import USER_PREFIX
from nri_plugin.plugins.cdi_injector.unserved import Unserved, container_unserved, find_unserved

FAILCLOSED_LOGGER = "nri_cdi.failclosed"
log = logging.getLogger(FAILCLOSED_LOGGER)

GUARD_SUFFIX = "-guard"  # the guard's own connection's name: the injector's, and this


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardSettings:
    """The start guard's set-up; the timings are docs/developer/fail-closed.md's."""

    # The start checks ride on a connection of the guard's own (a ``SecondConnection``),
    # not on the injector's.
    own_connection: bool = False
    cgroup_root: str = CGROUP_ROOT
    # How long a container created without the plugin is owed a check at its start, and
    # how often, meanwhile, its cgroup is looked at for a start the guard was not asked
    # about: longer than the runtime's default request timeout, so a StartContainer held
    # up by a slow plugin before us has reached us by the next look.
    pending_limit: float = 60.0
    recheck: float = 3.0
    # How long the injector's connection waits for the guard's, and how long the guard's
    # stays once nothing is in doubt.
    ready_timeout: float = 5.0
    linger: float = 10.0


@dataclass(slots=True)
class _Pending:
    item: Unserved
    until: float  # let go then, if still not started
    check_at: float  # its cgroup is next looked at then
    # Processes were in its cgroup at the last look: the runtime made its task. Seen at two
    # looks in a row, its start has passed the guard by (one look could fall between the
    # task's creation and the StartContainer that is still on its way to the guard).
    had_processes: bool = False


class StartGuard(Plugin):
    """The plugin the stub runs: the injector's handlers plus the fail-closed checks."""

    REMEMBER = 65536  # containers remembered as served, oldest dropped first
    # Its own connection, as the second around the injector's (``Need`` of a
    # ``SecondConnection``): open while ``needed`` (docs/developer/fail-closed.md).
    suffix = GUARD_SUFFIX
    label = "start guard"
    logger = log

    def __init__(self, injector: CdiInjector, settings: GuardSettings | None = None, *,
                 defer: Callable[[Callable[[], None]], object] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 call_later: CallLater | None = None) -> None:
        """``defer``: runs the stopping of what Synchronize found after its reply has left
        (the runtime holds its lock until then); None: at once. ``call_later``: what times
        its connection's linger and the rechecks, on ``clock`` (None: the event loop)."""
        self.call_later = call_later
        self.settings = settings if settings is not None else GuardSettings()
        self.ready_timeout, self.linger = self.settings.ready_timeout, self.settings.linger
        self.injector = injector
        self.counters: Counters = injector.counters
        self._defer = defer or (lambda act: act())
        self._clock = clock
        # Told when ``needed`` may have changed (SecondConnection): called inside a handler.
        self._need_may_have_changed: Callable[[], None] = lambda: None
        self._served: OrderedDict[str, None] = OrderedDict()
        self._pending: dict[str, _Pending] = {}
        # Containers already stopped, refused or reported: the guard's Synchronize and the
        # injector's both list them, and each is acted on (and named) once.
        self._done: OrderedDict[str, None] = OrderedDict()
        self._injector_synced = False
        self.runtime = RuntimeInfo()  # as the last Configure (either connection's) named it

    # --- whether checks are owed ---

    @property
    def needed(self) -> bool:
        """Whether a container may be in doubt: the injector's connection has not
        synchronized since it (re)connected, or one created without us is still owed a
        check at its start."""
        self._expire_pending()
        return not self._injector_synced or bool(self._pending)

    def on_need_changed(self, listener: Callable[[], None]) -> None:
        self._need_may_have_changed = listener

    def next_due(self) -> float | None:
        """Seconds until ``due`` has a pending container to look at (None: none pending)."""
        if not self._pending:
            return None
        return max(0.0, min(min(p.check_at, p.until) for p in self._pending.values())
                   - self._clock())

    def due(self) -> None:
        """Look again at each pending container whose time has come: one started without
        its StartContainer reaching the guard (``_Pending.had_processes``; containerd can
        dispatch a start just before the guard's registration completes) is acted on as
        one found running. One not started by its limit is let go."""
        now = self._clock()
        for cid, pending in list(self._pending.items()):
            if pending.check_at <= now:
                pending.check_at = now + self.settings.recheck
                had = pending.had_processes
                pending.had_processes = cgroup_has_processes(pending.item.cgroups_path,
                                                             self.settings.cgroup_root)
                if had and pending.had_processes:
                    del self._pending[cid]
                    self._remember(self._done, cid)
                    self._act(pending.item, "unseen-start")
        self._expire_pending()

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
                            item.name, item.container_id, item.pod, self.settings.pending_limit,
                            item.reason)

    def _add_pending(self, item: Unserved) -> None:
        now, settings = self._clock(), self.settings
        self._pending[item.container_id] = _Pending(item, now + settings.pending_limit,
                                                    now + settings.recheck)

    def second_plugin(self, synchronized: Callable[[], None]) -> Plugin:
        """The plugin of the guard's own connection."""
        return GuardConnection(self, synchronized)

    def main_connection_lost(self) -> None:
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
        self.runtime = self.injector.runtime
        if mask is None:
            return None
        if self.settings.own_connection:
            # RemoveContainer only, to forget what we remember: outside every container's
            # creation and start.
            return mask | EventMask.REMOVE_CONTAINER
        return mask | guard_events(runtime_name)

    def synchronize(self, pods: Sequence[nri_pb2.PodSandbox],
                    containers: Sequence[nri_pb2.Container]) -> None:
        self._injector_synced = True
        self.judge_listed(pods, containers)

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

    # --- the checks ---

    def judge_listed(self, pods: Sequence[nri_pb2.PodSandbox],
                     containers: Sequence[nri_pb2.Container]) -> None:
        """What a Synchronize lists, either connection's (the guard's is judged first)."""
        now, exited = [], []
        for item in find_unserved(pods, containers, self.injector, self.runtime.native_cdi):
            cid = item.container_id
            if cid in self._done or cid in self._pending:
                continue  # the other connection's Synchronize found it first
            self.counters.unserved_found += 1
            self._served.pop(cid, None)  # answered too late: owed still
            if item.exited:
                exited.append(item)
            elif item.started:
                now.append(item)
            else:
                self._add_pending(item)
                log.warning("fail-closed: container %s (%s) of pod %s, created without its "
                            "devices while the plugin was away, is created but not started; "
                            "it is checked when it starts: %s", item.name, cid, item.pod,
                            item.reason)
                continue
            self._remember(self._done, cid)  # started already: acted on (or said) once
        if exited:
            # Too late to stop: say so, since a pod with restartPolicy Never (a Job's)
            # failed or ran without its devices, and nothing will create it again.
            log.warning("fail-closed: %d container(s) ran without their devices while the "
                        "plugin was away and have exited (a Job's or restartPolicy Never "
                        "pod's is not run again): %s", len(exited),
                        "; ".join(f"{i.name} ({i.container_id}) of pod {i.pod}: {i.reason}"
                                  for i in exited))
        if now:
            self._defer(lambda: self._act_now(now))
        self._need_may_have_changed()

    def _act_now(self, items: Sequence[Unserved]) -> None:
        for item in items:
            self._act(item, "reconnection")

    def check(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container, stage: str) -> None:
        """The start check of one container at ``stage`` (raises to fail its start)."""
        try:
            cid = container.id
            if cid in self._served or cid in self._done:
                return  # answered at creation, or acted on already: nothing owed
            pending = self._pending.get(cid)
            item = pending.item if pending is not None else container_unserved(
                pod, container, self.injector, self.runtime.native_cdi)
            log.debug("%s check of container %s (%s): %s", stage, container.name, cid,
                      "unserved" if item else "ok")
            if item is None:
                self._pending.pop(cid, None)
                return
            if stage == "post-create":
                if pending is None:
                    self.counters.unserved_found += 1
                    self._add_pending(item)
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
                self._add_pending(item)
            else:
                # A container is started once: nothing about it stays owed.
                self._pending.pop(cid, None)
                self._remember(self._done, cid)
            if evict and stage == "start":
                # containerd fails the start: the container never runs.
                raise RpcError(Code.FAILED_PRECONDITION,
                               f"{USER_PREFIX}container {item.name} was created while the plugin "
                               f"was away, without its devices: {item.reason}")
        finally:
            self._need_may_have_changed()

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
        refuses_start = stage == "start" and self.runtime.is_containerd
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
            how = stop_processes(item.pid, item.cgroups_path, self.settings.cgroup_root)
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
         "unseen-start": "found running, its start not seen by the guard",
         "reconnection": "found running when the plugin came back"}


def guard_events(runtime_name: str) -> EventMask:
    """The events the start guard needs on this runtime, whatever the injector subscribes
    to. containerd fails a container's start when a plugin's StartContainer fails (every
    release with NRI): there StartContainer alone keeps a container from running."""
    if runtime_name == "containerd":
        return EventMask.START_CONTAINER | EventMask.REMOVE_CONTAINER
    return (EventMask.POST_CREATE_CONTAINER | EventMask.START_CONTAINER
            | EventMask.POST_START_CONTAINER | EventMask.REMOVE_CONTAINER)


class GuardConnection(Plugin):
    """The start guard's own NRI connection: only the lifecycle events the checks need,
    served by the ``StartGuard`` it belongs to. ``on_synchronized`` is told when its
    Synchronize is answered (the guard is in place from then on)."""

    def __init__(self, guard: StartGuard, on_synchronized: Callable[[], None]) -> None:
        self.guard = guard
        self._on_synchronized = on_synchronized

    def configure(self, config: str, runtime_name: str,
                  runtime_version: str) -> EventMask | None:
        # The events the guard needs on this runtime, and PostCreateContainer on every
        # runtime (docs/developer/fail-closed.md).
        self.guard.runtime = self.guard.injector.runtime_of(runtime_name, runtime_version)
        return guard_events(runtime_name) | EventMask.POST_CREATE_CONTAINER

    def synchronize(self, pods: Sequence[nri_pb2.PodSandbox],
                    containers: Sequence[nri_pb2.Container]) -> None:
        self.guard.judge_listed(pods, containers)
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

