"""The shipped plugin: CDI device requests → a ContainerAdjustment, in one pass
(``CdiInjector.decide``; its steps: docs/developer/architecture.md). Vendor-neutral, and
nothing here reads files but ``on_miss``: the registry and the policy were loaded ahead and
are swapped in whole by a refresher.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from cdi.cache import Snapshot
from cdi.libpath import LD_LIBRARY_PATH_ENV
from cdi.model import ContainerEdits
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.api.events import EventMask
from nri_plugin.nri.dispatch import RpcError
from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.versions import RuntimeInfo
from nri_plugin.plugins.cdi_injector.allocations import KubeletAllocations, check_not_held
from nri_plugin.plugins.cdi_injector.claims import (
    OnHit,
    OnMiss,
    StartWarning,
    capability_removals,
    node_matched,
    plugin_injected_cri,
    rechecked_refusal,
    removes_runtime_mounts,
    runtime_cdi_requests,
    unknown_names,
)
from nri_plugin.plugins.cdi_injector.context import (
    ContainerContext,
    check_sources,
    read_context,
)
from nri_plugin.plugins.cdi_injector.counters import Counters
from nri_plugin.plugins.cdi_injector.delegation import DelegationTracker, RuntimeCdiConfig
from nri_plugin.plugins.cdi_injector.native import injected_by_runtime, log_runtime_facts
from nri_plugin.plugins.cdi_injector.plan import Injection, PlanCache, lookup_devices
from nri_plugin.plugins.cdi_injector.policy import Policy
from nri_plugin.plugins.cdi_injector.refusal import Reason, Refusal
from nri_plugin.plugins.cdi_injector.requests import (
    DeviceRequest,
    check_name_count,
    unique_requests,
)
from nri_plugin.plugins.cdi_injector.sources import all_sources
from nri_plugin.plugins.cdi_injector.vendor import EditFilter, Registry, VendorRules, env_read

log = logging.getLogger("nri_cdi.injector")


class RefusedError(RpcError):
    """The status a refused CreateContainer is answered with: the refusal's code and the
    user's message (``Refusal.user_message``), with its structured reason for metrics."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.code, refusal.user_message())
        self.reason: Reason = refusal.reason


class CdiInjector(Plugin):
    """Injects the CDI devices that pods and containers ask for, as the policy allows."""

    def __init__(
        self,
        registry: Callable[[], Registry],
        *,
        vendors: Sequence[VendorRules] = (),
        policy: Policy | None = None,
        runtime_cdi: RuntimeCdiConfig | None = None,
        counters: Counters | None = None,
        on_miss: OnMiss | None = None,
        on_hit: OnHit | None = None,
        on_start_warning: StartWarning | None = None,
        after_reply: Callable[[Callable[[], None]], object] | None = None,
        allocations: Callable[[], KubeletAllocations | None] | None = None,
    ) -> None:
        # Returns the current registry (snapshot + the vendors' facts for it, in the order
        # of ``vendors``), replaced whole by the refresher; never does I/O.
        self._registry = registry
        self.vendors = tuple(vendors)
        self.policy = policy or Policy.defaults(self.vendors)
        self.runtime = RuntimeInfo()
        # The runtime's own CDI set-up (the daemon reads it); None: unknown, so annotations
        # are not assumed injected by the runtime and delegation is not checked ahead.
        self.runtime_cdi = runtime_cdi
        self.counters = counters if counters is not None else Counters()
        self.delegations = DelegationTracker()
        # A bounded re-read of the spec folders for names the registry does not know yet
        # (a DRA claim spec written moments ago); None: refuse at once (no reader wired).
        self.on_miss = on_miss
        # For a container naming only known devices: the registry after any spec removal
        # already made has been applied (None: nothing pending). No file I/O.
        self.on_hit = on_hit
        # Set-ups to warn about once connected (the daemon: one broken for DRA claims).
        self.on_start_warning = on_start_warning
        # Runs the per-container log line once the reply has left (the daemon: the event
        # loop's call_soon; the runtime waits for the reply, not for the line). None: now.
        self._after_reply = after_reply
        # What the kubelet allocated to each pod, kept current by the daemon (no I/O here);
        # None, or a call that returns None: no kubelet to ask, nothing checked.
        self._allocations = allocations
        self._env_names = env_read(self.vendors, LD_LIBRARY_PATH_ENV)
        self._plans = PlanCache()
        self._env_request_prefixes = tuple(p for v in self.vendors
                                           for p in v.env_request_prefixes)
        # Group sets already warned about on this connection (one line each, not one per
        # container: the counters and metrics count every container).
        self._gids_warned: set[tuple[int, ...]] = set()

    def registry(self) -> Registry:
        """The registry in force now (what one container's decision reads, once)."""
        return self._registry()

    def set_policy(self, policy: Policy) -> None:
        """Put a new (validated) policy in force, from the next container on."""
        self.policy = policy

    def runtime_of(self, runtime_name: str, runtime_version: str) -> RuntimeInfo:
        """The runtime Configure names, with what the settings say of its own CDI."""
        runtime = RuntimeInfo.from_configure(runtime_name, runtime_version)
        cdi = self.runtime_cdi
        return cdi.applied_to(runtime) if cdi is not None else runtime

    # --- the NRI events ---

    def configure(self, config: str, runtime_name: str,
                  runtime_version: str) -> EventMask | None:
        self.runtime = self.runtime_of(runtime_name, runtime_version)
        cdi = self.runtime_cdi
        self.delegations = DelegationTracker()  # events of an earlier connection are lost
        self._gids_warned.clear()
        log.info("connected to %s; %s", self.runtime.describe(),
                 cdi.describe(self.runtime) if cdi is not None else
                 "the runtime's own CDI set-up is unknown (not read)")
        log_runtime_facts(self.runtime)
        if self.on_start_warning is not None and (line := self.on_start_warning(self.runtime)):
            log.warning("%s", line)
        if not self.runtime.supports_cdi_devices:
            return EventMask.CREATE_CONTAINER  # nothing is handed over: nothing to follow up
        # RemoveContainer tells a handed-over creation that failed (containerd undoes it)
        # from one that did; it is outside every container's creation and start.
        return EventMask.CREATE_CONTAINER | EventMask.REMOVE_CONTAINER

    def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.ContainerAdjustment | None:
        label = f"container={container.name} pod={pod.namespace}/{pod.name}"
        try:
            injection = self.decide(pod, container)
        except Refusal as exc:
            self.counters.refused += 1
            log.warning("refused %s: %s", label, exc.log_message())
            raise RefusedError(exc) from exc
        if injection is None:
            return None
        self.counters.injected += 1
        if injection.delegated:
            # Not injected yet: the runtime's CDI resolves them after this reply.
            self.delegations.delegated(container.id, label, injection.delegated)
        if injection.dropped_gids:
            self.counters.gids_dropped += 1
        if self._after_reply is None:
            self._log_answer(label, injection)
        else:
            self._after_reply(lambda: self._log_answer(label, injection))
        return injection.adjustment

    def _log_answer(self, label: str, injection: Injection) -> None:
        if injection.delegated:
            log.info("adjusted %s devices=%s; handed to the runtime's own CDI: %s", label,
                     ",".join(injection.devices) or "-", ",".join(injection.delegated))
        else:
            log.info("injected %s devices=%s", label, ",".join(injection.devices) or "-")
        if injection.dropped_gids:
            self._warn_dropped_gids(injection)

    def remove_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> None:
        entry = self.delegations.undone(container.id)
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
        Refusal with the reason. The registry and the policy are read once: every step
        sees the same snapshot, facts and rules."""
        registry, policy = self._registry(), self.policy
        check_name_count(pod.annotations, container, self._env_request_prefixes)
        context = self._read(pod, container, registry, policy)
        cri = runtime_cdi_requests(container)
        names = [r.name for r in (*context.requests, *cri)]

        # A name the registry does not know may be a claim spec written a moment ago; a
        # known one may belong to a spec deleted a moment ago.
        unknown = unknown_names(names, registry.snapshot) if self.on_miss is not None else []
        newer = None
        if unknown and self.on_miss is not None:
            newer = self.on_miss(unknown)
        elif names and self.on_hit is not None:
            newer = self.on_hit()
        if newer is not None and newer is not registry:
            registry = newer
            context = self._read(pod, container, registry, policy)
        snapshot = registry.snapshot
        # A device asked for past the scheduler must not be another pod's.
        if self._allocations is not None:
            check_not_held(context, registry, self.vendors, self._allocations)

        # What the runtime's own CDI did already.
        asked = list(context.requests)
        native = self.runtime.native_cdi
        if native is False:
            # Its CDI is off, so it did not inject what CRI CDIDevices named (NRI >= 0.10
            # shows them): the plugin does, as a container annotation's.
            asked = unique_requests([*asked, *plugin_injected_cri(
                policy, cri, context.namespace, context.privileged)])
            cri = []
        requests = not_yet_injected(asked, container, snapshot, context.privileged,
                                    native_cdi=native)
        if unknown and (refusal := rechecked_refusal(snapshot, requests)) is not None:
            raise refusal
        injected = self._runtime_injected(asked, requests, cri, container, registry,
                                          context.privileged)
        # No device, but the env may ask for edits of no device (a vendor's extras_env).
        extras = not requests and any(context.env.get(n) for v in self.vendors
                                      for n in v.extras_env)
        if not requests and not extras and not injected:
            return None

        # The policy's device rules, the lookup, each vendor's verdict.
        checked = unique_requests([*requests, *injected])
        checked_names = [r.name for r in checked]
        policy.check_devices(checked_names, context.namespace, context.privileged)
        # An unknown name is said before any verdict.
        devices = {d.qualified_name: d for d in lookup_devices(snapshot, checked)}
        edit_filter = _combined([f for vendor, facts in registry.paired(self.vendors)
                                 if (f := vendor.verdict(context, checked_names, policy,
                                                         snapshot, facts)) is not None])

        # The plan: what the plugin adds, and what it takes back of the runtime's.
        trimmed = self._trimmed(injected, edit_filter, context.env, container, registry)
        if not requests and not extras:
            return trimmed
        if not requests and edit_filter is None:
            return None
        injection = self._plans.plan(
            snapshot, [devices[r.name] for r in requests], self.runtime, uid=context.uid,
            gid=context.gid, edit_filter=edit_filter,
            library_path=context.env.get(LD_LIBRARY_PATH_ENV, ""),
            drop_gids=policy.additional_gids == "drop")
        if trimmed is not None:  # the plan is kept: add to a copy
            adjustment = nri_pb2.ContainerAdjustment()
            adjustment.CopyFrom(injection.adjustment)
            adjustment.MergeFrom(trimmed.adjustment)
            injection = replace(injection, adjustment=adjustment)
        if not requests and not injection.adjustment.ListFields():
            return None
        return injection

    def _read(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container,
              registry: Registry, policy: Policy) -> ContainerContext:
        """What every source asked for; raises the first source's denial."""
        context = read_context(pod, container, all_sources(registry.paired(self.vendors)),
                               policy, registry.snapshot, self._env_names)
        check_sources(context, policy)
        return context

    def _runtime_injected(self, asked: Sequence[DeviceRequest], requests: list[DeviceRequest],
                          cri: list[DeviceRequest], container: nri_pb2.Container,
                          registry: Registry, privileged: bool) -> list[DeviceRequest]:
        """The devices the runtime's own CDI injected that the registry knows, to be checked
        like the plugin's own: by name (CRI CDIDevices on NRI >= 0.10, annotations), else,
        with its CDI on, by the device nodes the container already has."""
        snapshot = registry.snapshot
        left = {r.name for r in requests}
        named = [r for r in [*asked, *cri] if r.name not in left and r.name in snapshot.devices]
        if named or privileged or self.runtime.native_cdi is not True or requests:
            return unique_requests(named)
        if not container.linux.devices:
            return []
        return node_matched(container, snapshot)

    def _trimmed(self, injected: Sequence[DeviceRequest], edit_filter: EditFilter | None,
                 env: Mapping[str, str], container: nri_pb2.Container,
                 registry: Registry) -> Injection | None:
        """The mounts to take back from what the runtime's CDI injected, where a vendor's
        filter variable is set (e.g. its driver-capabilities variable); None: none."""
        filtering = any(k in env for v in self.vendors for k in v.filter_env)
        if edit_filter is None or not injected or not filtering:
            return None
        removals = capability_removals(registry.snapshot, [r.name for r in injected],
                                       edit_filter, container)
        if removals is None:
            return None
        if not removes_runtime_mounts(self.runtime):
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


def _combined(filters: Sequence[EditFilter]) -> EditFilter | None:
    if not filters:
        return None
    return filters[0] if len(filters) == 1 else _FilterChain(filters)


def not_yet_injected(requests: Sequence[DeviceRequest], container: nri_pb2.Container,
                     snapshot: Snapshot, privileged: bool, *,
                     native_cdi: bool | None = None) -> list[DeviceRequest]:
    """Drop what the runtime already injected itself: names in ``CDI_devices`` (filled by
    containerd 2.3+ from CRI CDIDevices, which it injects only with its own CDI on: not
    trusted when ``native_cdi`` is known False), with ``native_cdi`` every device named in
    the container's cdi.k8s.io annotations (see ``injected_by_runtime``), and devices
    whose every node is already in the container. Privileged containers get every host
    node, so there only the names count."""
    done = set() if native_cdi is False else {d.name for d in container.CDI_devices}
    if native_cdi:
        done |= injected_by_runtime(container, snapshot, privileged)
    present = set() if privileged else {d.path for d in container.linux.devices}
    out = []
    for request in requests:
        if request.name in done:
            continue
        device = snapshot.devices.get(request.name)
        nodes = device.edits.device_nodes if device is not None else ()
        if nodes and all(n.path in present for n in nodes):
            continue
        out.append(request)
    return out


def was_created(container: nri_pb2.Container) -> bool:
    """Whether a container at RemoveContainer is one the runtime created (not a creation it
    undid). containerd before 2.3 gives a created one a state; 2.3 (NRI 0.12) gives an
    exited one no state (UNKNOWN, only a reason) but its creation time, from its store; an
    undone creation is in no store: no state, no creation time."""
    return container.state != nri_pb2.CONTAINER_UNKNOWN or container.created_at != 0
