"""The shipped plugin: CDI device requests → a ContainerAdjustment, in one pass
(``CdiInjector.decide``; its steps: docs/developer/architecture.md). Vendor-neutral; nothing
here reads files but ``on_miss``.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from cdi.cache import Device
from cdi.libpath import LD_LIBRARY_PATH_ENV
from cdi.model import ContainerEdits
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.api.events import EventMask
from nri_plugin.nri.dispatch import RpcError
from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.versions import RuntimeInfo
from nri_plugin.plugins.cdi_injector.allocations import KubeletAllocations, check_not_held
from nri_plugin.plugins.cdi_injector.already import Wanted, wanted
from nri_plugin.plugins.cdi_injector.asked import Asker, OnHit, OnMiss, rechecked_refusal
from nri_plugin.plugins.cdi_injector.context import ContainerContext, unique_requests
from nri_plugin.plugins.cdi_injector.delegation import RuntimeCdiConfig
from nri_plugin.plugins.cdi_injector.plan import (
    Injection,
    PlanCache,
    PlanFor,
    lookup_devices,
    mount_removals,
)
from nri_plugin.plugins.cdi_injector.policy import Policy
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.plugins.cdi_injector.vendor import EditFilter, Registry, VendorRules


@dataclass(slots=True)
class Counters:
    """The plugin's counters, for its log and metrics: one object, shared by the injector
    and the fail-closed guard; the metrics export every field. Plain ints, bumped on the
    event loop and read without locking."""

    injected: int = 0  # CreateContainer answered with devices
    refused: int = 0  # CreateContainer refused (policy, requirements, bad request)
    delegation_failed: int = 0  # handed to the runtime's own CDI, which failed them
    unserved_found: int = 0  # found by Synchronize without their devices
    unserved_reported: int = 0  # fail-closed action "report"
    unserved_evicted: int = 0  # fail-closed action "evict": stopped, or its start refused
    gids_dropped: int = 0  # containers given their devices without the spec's additionalGids


class InjectionMetrics(Protocol):
    """What is reported (``nri_plugin.ops.metrics.Metrics`` implements it)."""

    def connected(self, runtime: str) -> None: ...
    def denial(self, rule: str) -> None: ...
    def injection(self, outcome: str, seconds: float) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Wiring:
    """What the daemon connects a ``CdiInjector`` to; each None: not connected."""

    # The runtime's own CDI set-up (the daemon reads it); None: unknown, so annotations
    # are not assumed injected by the runtime and delegation is not checked ahead.
    runtime_cdi: RuntimeCdiConfig | None = None
    counters: Counters | None = None  # None: counters of its own
    # A bounded re-read of the spec folders for names the registry does not know yet
    # (a DRA claim spec written moments ago; None: refuse at once, no reader wired) and,
    # for a container naming only known devices, the registry after any spec removal
    # already made (None: nothing pending; no file I/O).
    on_miss: OnMiss | None = None
    on_hit: OnHit | None = None
    # Set-ups to warn about once connected (the daemon: one broken for DRA claims).
    on_start_warning: Callable[[RuntimeInfo], str | None] | None = None
    # Runs the per-container log line once the reply has left (the daemon: the event
    # loop's call_soon; the runtime waits for the reply, not for the line).
    after_reply: Callable[[Callable[[], None]], object] = lambda line: line()
    # What the kubelet allocated to each pod, kept current by the daemon (no I/O here);
    # None, or a call that returns None: no kubelet to ask, nothing checked.
    allocations: Callable[[], KubeletAllocations | None] | None = None
    # Each connection and each CreateContainer by outcome, timed (docs/operations/metrics.md).
    metrics: InjectionMetrics | None = None


log = logging.getLogger("nri_cdi.injector")
DELEGATIONS_KEPT = 1024


class CdiInjector(Plugin):
    """Injects the CDI devices that pods and containers ask for, as the policy allows."""

    def __init__(
        self,
        registry: Callable[[], Registry],
        *,
        vendors: Sequence[VendorRules] = (),
        policy: Policy | None = None,
        wiring: Wiring | None = None,
    ) -> None:
        # The registry in force, swapped whole by the refresher; never does I/O.
        self.registry = registry
        self.vendors = tuple(vendors)
        self.policy = policy or Policy.defaults(self.vendors)
        self.runtime = RuntimeInfo()
        self._wiring = wiring = wiring or Wiring()
        self.counters = wiring.counters if wiring.counters is not None else Counters()
        # Containers whose devices were handed to the runtime's CDI (container id -> label,
        # names), until RemoveContainer says how it went (``was_created``); the oldest
        # forgotten first, past DELEGATIONS_KEPT.
        self.delegations: OrderedDict[str, tuple[str, tuple[str, ...]]] = OrderedDict()
        self._asker = Asker(self.vendors, wiring.on_miss, wiring.on_hit)
        self._plans = PlanCache()
        # Group sets already warned about on this connection (one line each, not one per
        # container: the counters and metrics count every container).
        self._gids_warned: set[tuple[int, ...]] = set()

    def set_policy(self, policy: Policy) -> None:
        """Put a new (validated) policy in force, from the next container on."""
        self.policy = policy

    def runtime_of(self, runtime_name: str, runtime_version: str) -> RuntimeInfo:
        """The runtime Configure names, with what the settings say of its own CDI."""
        runtime = RuntimeInfo.from_configure(runtime_name, runtime_version)
        cdi = self._wiring.runtime_cdi
        return cdi.applied_to(runtime) if cdi is not None else runtime

    # --- the NRI events ---

    def configure(self, config: str, runtime_name: str,
                  runtime_version: str) -> EventMask | None:
        self.runtime = self.runtime_of(runtime_name, runtime_version)
        cdi, warning = self._wiring.runtime_cdi, self._wiring.on_start_warning
        self.delegations.clear()  # events of an earlier connection are lost
        self._gids_warned.clear()
        log.info("connected to %s; %s", self.runtime.describe(),
                 cdi.describe(self.runtime) if cdi is not None else
                 "the runtime's own CDI set-up is unknown (not read)")
        if (self.runtime.cdi_version is not None
                and not self.runtime.native_mount_order_by_name):
            log.info("%s keeps spec order within one mount depth; NRI re-sorts a container's "
                     "mounts by (depth, path) whenever a plugin adds mounts, so same-depth "
                     "mounts (which never nest) may be listed in another order than with "
                     "native CDI", self.runtime.describe_cdi())
        if warning is not None and (line := warning(self.runtime)):
            log.warning("%s", line)
        if self._wiring.metrics is not None:
            self._wiring.metrics.connected(f"{runtime_name} {runtime_version}")
        if not self.runtime.supports_cdi_devices:
            return EventMask.CREATE_CONTAINER  # nothing is handed over: nothing to follow up
        # RemoveContainer tells a handed-over creation that failed (containerd undoes it)
        # from one that did; it is outside every container's creation and start.
        return EventMask.CREATE_CONTAINER | EventMask.REMOVE_CONTAINER

    def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.ContainerAdjustment | None:
        start = time.perf_counter()
        label = f"container={container.name} pod={pod.namespace}/{pod.name}"
        try:
            injection = self.decide(pod, container)
        except Refusal as exc:
            self.counters.refused += 1
            log.warning("refused %s: %s", label, exc.log_message())
            self._measure("refused", start, exc.reason.rule)
            # Answered with the refusal's code and the words its user reads.
            raise RpcError(exc.code, exc.user_message()) from exc
        except Exception:
            self._measure("error", start)
            raise
        if injection is None:
            return None
        self.counters.injected += 1
        if injection.delegated:
            # Not injected yet: the runtime's CDI resolves them after this reply.
            self.delegations[container.id] = (label, injection.delegated)
            if len(self.delegations) > DELEGATIONS_KEPT:
                self.delegations.popitem(last=False)
        if injection.dropped_gids:
            self.counters.gids_dropped += 1
        self._measure("delegated" if injection.delegated else "injected", start)
        self._wiring.after_reply(lambda: self._log_answer(label, injection))
        return injection.adjustment

    def _measure(self, outcome: str, start: float, rule: str = "") -> None:
        metrics = self._wiring.metrics
        if metrics is not None:
            if rule:
                metrics.denial(rule)
            metrics.injection(outcome, time.perf_counter() - start)

    def _log_answer(self, label: str, injection: Injection) -> None:
        if injection.delegated:
            log.info("adjusted %s devices=%s; handed to the runtime's own CDI: %s", label,
                     ",".join(injection.devices) or "-", ",".join(injection.delegated))
        else:
            log.info("injected %s devices=%s", label, ",".join(injection.devices) or "-")
        if injection.dropped_gids:
            self._warn_dropped_gids(injection)

    def remove_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> None:
        entry = self.delegations.pop(container.id, None)
        if entry is None:
            return
        if was_created(container):  # the runtime's store has it: its CDI did inject them
            log.info("the runtime's own CDI injected %s into %s", ",".join(entry[1]), entry[0])
            return
        self.counters.delegation_failed += 1
        log.warning("the runtime did not create %s: its own CDI could not inject %s (its log "
                    "says why, e.g. 'CDI device injection failed: unresolvable CDI devices'); "
                    "nri-cdi doctor checks that it reads the plugin's spec folders",
                    entry[0], ",".join(entry[1]))

    # --- the decision ---

    def decide(self, pod: nri_pb2.PodSandbox,
               container: nri_pb2.Container) -> Injection | None:
        """The whole decision for one container (None: nothing to change); raises a
        Refusal. The registry and the policy are read once: every step sees the same."""
        policy = self.policy
        # 1. What it asks for, by every source, under a registry that knows the names; no
        # device another pod holds asked for past the scheduler.
        context, registry, reread = self._asker.read(pod, container, self.registry(), policy)
        if self._wiring.allocations is not None:
            check_not_held(context, registry, self.vendors, self._wiring.allocations)
        # 2. What of it is already in the container (the runtime's CDI, an earlier plugin).
        want = wanted(context, container, registry.snapshot, self.runtime.native_cdi, policy)
        if reread and (refusal := rechecked_refusal(registry.snapshot, want.to_add)):
            raise refusal
        # A vendor's env may ask for edits of no device (its extras_env).
        extras = not want.to_add and any(context.env.get(n) for v in self.vendors
                                         for n in v.extras_env)
        if not want.to_add and not want.there and not extras:
            return None  # exit: nothing asked for (nothing to add, nothing there)
        # 3. The policy's device rules, the lookup, each vendor's verdict.
        devices, edit_filter = self._checked(context, want, registry, policy)
        # 4. The plan: what the plugin adds, and what it takes back of the runtime's.
        trimmed = self._trimmed(want, edit_filter, context, container, registry)
        if not want.to_add and not extras:
            return trimmed  # exit: only what was there, less what its env did not ask for
        if not want.to_add and edit_filter is None:
            return None  # exit: extras asked for, and no vendor has edits for them
        injection = self._plans.plan(
            registry.snapshot, [devices[r.name] for r in want.to_add], self.runtime,
            PlanFor(uid=context.uid, gid=context.gid, edit_filter=edit_filter,
                    library_path=context.env.get(LD_LIBRARY_PATH_ENV, ""),
                    drop_gids=policy.additional_gids == "drop"))
        return _with_removals(injection, trimmed, adds=bool(want.to_add))

    def _checked(self, context: ContainerContext, want: Wanted, registry: Registry,
                 policy: Policy) -> tuple[dict[str, Device], EditFilter | None]:
        """Every device to be added or already there, against the policy's device rules,
        the registry (an unknown name is said before any verdict) and each vendor's
        verdict: the devices by name, and the vendors' edit filter (None: none)."""
        checked = unique_requests([*want.to_add, *want.there])
        names = [r.name for r in checked]
        policy.check_devices(names, context.namespace, context.privileged)
        devices = {d.qualified_name: d for d in lookup_devices(registry.snapshot, checked)}
        filters = [f for vendor, facts in registry.paired(self.vendors)
                   if (f := vendor.verdict(context, names, policy, registry.snapshot, facts))
                   is not None]
        return devices, (_FilterChain(filters) if len(filters) > 1 else
                         filters[0] if filters else None)

    def _trimmed(self, want: Wanted, edit_filter: EditFilter | None,
                 context: ContainerContext, container: nri_pb2.Container,
                 registry: Registry) -> Injection | None:
        """The mounts to take back from what the runtime's CDI injected, where a vendor's
        filter variable is set (e.g. its driver-capabilities variable); None: none."""
        filtering = any(k in context.env for v in self.vendors for k in v.filter_env)
        if edit_filter is None or not want.there or not filtering:
            return None
        removals = mount_removals(registry.snapshot, [r.name for r in want.there],
                                  edit_filter, container)
        if removals is None:
            return None
        # NRI mount removals reach the mounts the runtime's own CDI injected: seen with
        # containerd 2.1.9; containerd 1.7.24 accepts the removals and keeps the mounts.
        version = self.runtime.version
        if self.runtime.is_containerd and version is not None and version < (2, 0, 0):
            log.warning("container %s: %d driver mount(s) its env did not ask for (e.g. %s) "
                        "stay: %s keeps the mounts its own CDI injected whatever NRI "
                        "removes", container.name, len(removals.mounts),
                        removals.mounts[0].destination[1:], self.runtime.describe())
            return None
        log.info("container %s: removing %d mount(s) the runtime's CDI added that its env "
                 "did not ask for", container.name, len(removals.mounts))
        return Injection(adjustment=removals, devices=(), delegated=())

    def _warn_dropped_gids(self, injection: Injection) -> None:
        if injection.dropped_gids in self._gids_warned:
            return
        self._gids_warned.add(injection.dropped_gids)
        why = (f"handing the devices to the runtime's own CDI, which would add them, would "
               f"lose the plugin's own work ({injection.kept_because})"
               if injection.kept_because else
               f"NRI cannot add supplementary groups on {self.runtime.describe()}")
        log.warning("devices %s: additionalGids %s left out (%s), so only root or members of "
                    "those groups open the device nodes that need them (policy "
                    "additionalGids: drop; 'refuse' fails such containers instead). Said "
                    "once per group set; the counters count every container",
                    ",".join(injection.devices),
                    ",".join(map(str, injection.dropped_gids)), why)


class _FilterChain:
    """Several vendors' edit filters applied in order."""

    def __init__(self, filters: Sequence[EditFilter]) -> None:
        self.filters = tuple(filters)
        self.cache_key = tuple(f.cache_key for f in self.filters)

    def apply(self, edits: ContainerEdits) -> ContainerEdits:
        for edit_filter in self.filters:
            edits = edit_filter.apply(edits)
        return edits


def _with_removals(injection: Injection, trimmed: Injection | None, *,
                   adds: bool) -> Injection | None:
    """``injection`` with ``trimmed``'s removals; None when it changes nothing and adds no
    device (extras that came to nothing)."""
    if trimmed is not None:  # the plan is kept (``PlanCache``): add to a copy
        adjustment = nri_pb2.ContainerAdjustment()
        adjustment.CopyFrom(injection.adjustment)
        adjustment.MergeFrom(trimmed.adjustment)
        injection = replace(injection, adjustment=adjustment)
    if not adds and not injection.adjustment.ListFields():
        return None
    return injection


def was_created(container: nri_pb2.Container) -> bool:
    """Whether a container at RemoveContainer is one the runtime created (not a creation it
    undid). containerd before 2.3 gives a created one a state; 2.3 (NRI 0.12) gives an
    exited one no state (UNKNOWN, only a reason) but its creation time, from its store; an
    undone creation is in no store: no state, no creation time."""
    return container.state != nri_pb2.CONTAINER_UNKNOWN or container.created_at != 0
