"""The shipped plugin: CDI device requests → a ContainerAdjustment.

``plan_injection`` is pure (a snapshot, the requests, what the runtime can do → an
adjustment or an InjectionError); ``CdiInjector`` is the thin Plugin around it: it gathers
the requests from the sources the policy allows, checks the policy's device rules, then
asks each vendor's rules (``vendor.VendorRules``: for NVIDIA, NVIDIA_REQUIRE_* against the
node facts and NVIDIA_DRIVER_CAPABILITIES as an edit filter). Vendor-neutral: nothing here
knows a vendor. Nothing here reads files: the registry (snapshot plus the vendors' facts
for it) and the policy were loaded ahead and are swapped in whole by a refresher.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cdi.cache import Snapshot
from cdi.device import Device
from cdi.edits import merge
from cdi.errors import UnresolvedDevicesError
from cdi.model import ContainerEdits
from nri_plugin.api import nri_pb2
from nri_plugin.api.events import EventMask
from nri_plugin.dispatch import RpcError
from nri_plugin.errors import Refusal
from nri_plugin.plugin import Plugin
from nri_plugin.plugins.cdi_injector.adjust import (
    as_native_file_modes,
    to_adjustment,
    unsupported_edits,
)
from nri_plugin.plugins.cdi_injector.claims import (
    OnHit,
    OnMiss,
    capability_removals,
    node_matched,
    nodes_index,
    plugin_injected_cri,
    rechecked_refusal,
    removes_runtime_mounts,
    runtime_cdi_requests,
    unknown_names,
)
from nri_plugin.plugins.cdi_injector.delegation import (
    DelegationTracker,
    RuntimeCdiConfig,
    delegation_problems,
    spec_device_nodes,
)
from nri_plugin.plugins.cdi_injector.failclosed import Unserved, find_unserved
from nri_plugin.plugins.cdi_injector.native import injected_by_runtime, log_runtime_facts
from nri_plugin.plugins.cdi_injector.policy import Policy
from nri_plugin.plugins.cdi_injector.requests import DeviceRequest, unique_requests
from nri_plugin.plugins.cdi_injector.sources import (
    container_mounts,
    env_map,
    gather,
    is_privileged,
)
from nri_plugin.plugins.cdi_injector.vendor import EditFilter, Registry, VendorRules
from nri_plugin.runtime import RuntimeInfo
from nri_plugin.wire import Code

log = logging.getLogger("nri_cdi.injector")


class InjectionError(Refusal):
    """The container must not be created; the message says what and why."""

    default_rule = "injection"


@dataclass(frozen=True, slots=True, kw_only=True)
class Injection:
    adjustment: nri_pb2.ContainerAdjustment
    devices: tuple[str, ...]  # injected by us
    delegated: tuple[str, ...]  # handed to the runtime's own CDI resolver
    # additionalGids left out (policy additionalGids: drop) where neither NRI nor the
    # runtime's own CDI could apply them: narrower than the spec, never wider.
    dropped_gids: tuple[int, ...] = ()


def plan_injection(
    snapshot: Snapshot,
    requests: list[DeviceRequest],
    runtime: RuntimeInfo,
    *,
    uid: int = 0,
    gid: int = 0,
    edit_filter: EditFilter | None = None,
    library_path: str = "",
    drop_gids: bool = False,
) -> Injection:
    """``edit_filter``: the vendor rules' filter of the resolved edits (e.g. the driver
    mounts of capabilities not asked for); None keeps everything. ``library_path``: the
    container's own LD_LIBRARY_PATH, which hook-free specs append their folders to.
    ``drop_gids``: where additionalGids are all that NRI cannot carry and the runtime's own
    CDI cannot take the devices either, inject without them instead of refusing."""
    devices = _lookup(snapshot, requests)
    by_spec: dict[str, list[Device]] = {}
    for device in devices:
        by_spec.setdefault(device.spec.path, []).append(device)
    ours: list[Device] = []
    delegated: list[Device] = []
    dropped: set[int] = set()
    for path, group in by_spec.items():
        edits = _merged(snapshot, path, group)
        reasons = unsupported_edits(edits, runtime)
        # additionalGids are all NRI cannot carry: without them, nothing would be left.
        gids_only = drop_gids and bool(reasons) and not unsupported_edits(
            edits._replace(additional_gids=()), runtime)
        if not reasons:
            ours += group
        elif runtime.supports_cdi_devices and not (
                gids_only and delegation_problems(group, runtime)):
            delegated += group  # the runtime's own CDI applies what NRI cannot carry
        elif gids_only:
            ours += group
            dropped.update(g for g in edits.additional_gids if g != 0)
        else:
            names = ", ".join(d.qualified_name for d in group)
            raise InjectionError(
                f"CDI devices {names} need edits that NRI cannot apply on "
                f"{runtime.describe()}: {'; '.join(reasons)}; a runtime that resolves "
                "CDI_devices itself (containerd >= 2.1 or >= 1.7.30, CRI-O >= 1.34) can",
                rule="unsupportedEdits", device=group[0].qualified_name)
    if delegated:
        # All or nothing: NRI applies our edits before the runtime's CDI, so a mix merges
        # env, mounts and device rules in another order than native CDI would (and NRI's
        # rw rule for a device we add could widen a read-only one of the same number).
        ours, delegated = [], list(devices)
    else:
        ours = list(devices)  # request order, as native CDI merges
    _check_delegation(delegated, runtime)
    edits = snapshot.resolve(d.qualified_name for d in ours) if ours else ContainerEdits()
    if dropped:
        edits = edits._replace(additional_gids=())
    edits = as_native_file_modes(edits, spec_device_nodes(snapshot, ours), runtime)
    if edit_filter is not None:
        edits = edit_filter.apply(edits)
    adjustment = to_adjustment(edits, runtime=runtime, uid=uid, gid=gid,
                               image_library_path=library_path)
    for device in delegated:
        adjustment.CDI_devices.add(name=device.qualified_name)
    return Injection(adjustment=adjustment,
                     devices=tuple(d.qualified_name for d in ours),
                     delegated=tuple(d.qualified_name for d in delegated),
                     dropped_gids=tuple(sorted(dropped)))


def _check_delegation(delegated: list[Device], runtime: RuntimeInfo) -> None:
    problems = delegation_problems(delegated, runtime)
    if problems:
        raise InjectionError(
            "CDI devices that only the runtime's own CDI can inject "
            f"({', '.join(d.qualified_name for d in delegated)}) would fail there: "
            + "; ".join(problems))


def _lookup(snapshot: Snapshot, requests: Sequence[DeviceRequest]) -> list[Device]:
    try:
        return snapshot.lookup(r.name for r in requests)
    except UnresolvedDevicesError as exc:
        source = {r.name: r.source for r in requests}
        detail = "; ".join(f"{name} (from {source[name]}): {why}"
                           for name, why in exc.reasons.items())
        raise InjectionError(f"unresolvable CDI devices: {detail}",
                             rule="unresolvable", device=next(iter(exc.reasons), None)) from None


def _merged(snapshot: Snapshot, spec_path: str, group: list[Device]) -> ContainerEdits:
    return merge([snapshot.specs[spec_path].edits, *(d.edits for d in group)])


class CdiInjector(Plugin):
    """Injects the CDI devices that pods and containers ask for, as the policy allows."""

    # Pods of one deployment ask for the same devices again and again: a small cache of
    # finished plans, keyed by everything a plan depends on, makes repeats nearly free.
    PLAN_CACHE_SIZE = 512

    def __init__(
        self,
        registry: Callable[[], Registry],
        *,
        vendors: Sequence[VendorRules] = (),
        policy: Policy | None = None,
        on_unserved: Callable[[list[Unserved]], None] | None = None,
        runtime_cdi: RuntimeCdiConfig | None = None,
        on_miss: OnMiss | None = None,
        on_hit: OnHit | None = None,
        on_start_warning: Callable[[RuntimeInfo], str | None] | None = None,
    ) -> None:
        # Returns the current registry (snapshot + the vendors' facts for it, in the order
        # of ``vendors``), replaced whole by the refresher; never does I/O.
        self._registry = registry
        self.vendors = tuple(vendors)
        self.policy = policy or Policy()
        self.on_unserved = on_unserved  # gets the containers Synchronize found unserved
        self.runtime = RuntimeInfo()
        # The runtime's own CDI set-up (the daemon reads it); None: unknown, so annotations
        # are not assumed injected by the runtime and delegation is not checked ahead.
        self.runtime_cdi = runtime_cdi
        self.delegations = DelegationTracker()
        # A bounded re-read of the spec folders for names the registry does not know yet
        # (a DRA claim spec written moments ago); None: refuse at once (no reader wired).
        self.on_miss = on_miss
        # For a container naming only known devices: the registry after any spec removal
        # already made has been applied (None: nothing pending). No file I/O.
        self.on_hit = on_hit
        # Set-ups to warn about once connected (the daemon: one broken for DRA claims).
        self.on_start_warning = on_start_warning
        self._nodes_index: tuple[int, dict[str, tuple[str, ...]]] = (0, {})
        self._plans: OrderedDict[tuple[object, ...], Injection] = OrderedDict()
        # Policy + vendor decisions, same idea: keyed by all they read.
        self._decisions: OrderedDict[tuple[object, ...], tuple[EditFilter, ...]] = OrderedDict()
        # Counters for logs and metrics; plain ints, read without locking.
        self.counters: dict[str, int] = {"injected": 0, "refused": 0, "unserved_found": 0}

    def set_policy(self, policy: Policy) -> None:
        """Put a new (validated) policy in force; decisions made under the old one go."""
        self.policy = policy
        self._decisions.clear()

    def configure(self, config: str, runtime_name: str,
                  runtime_version: str) -> EventMask | None:
        runtime = RuntimeInfo.from_configure(runtime_name, runtime_version)
        cdi = self.runtime_cdi
        self.runtime = cdi.applied_to(runtime) if cdi is not None else runtime
        self._plans.clear()
        self.delegations = DelegationTracker()  # events of an earlier connection are lost
        log.info("connected to %s; %s", self.runtime.describe(),
                 cdi.describe(runtime) if cdi is not None else "runtime's own CDI: unknown")
        log_runtime_facts(self.runtime)
        if self.on_start_warning is not None and (line := self.on_start_warning(self.runtime)):
            log.warning("%s", line)
        if not self.runtime.supports_cdi_devices:
            return EventMask.CREATE_CONTAINER  # nothing is delegated: nothing to follow up
        return (EventMask.CREATE_CONTAINER | EventMask.POST_CREATE_CONTAINER
                | EventMask.REMOVE_CONTAINER)

    def plan(self, requests: Sequence[DeviceRequest], uid: int, gid: int,
             edit_filter: EditFilter | None = None, *, library_path: str = "",
             registry: Registry | None = None) -> Injection:
        snapshot = (registry or self._registry()).snapshot
        drop_gids = self.policy.additional_gids == "drop"
        key = (snapshot.generation, id(snapshot), tuple(r.name for r in requests), uid, gid,
               None if edit_filter is None else edit_filter.cache_key, library_path, drop_gids)
        cached = self._plans.get(key)
        if cached is not None:
            self._plans.move_to_end(key)
            return cached
        injection = plan_injection(snapshot, list(requests), self.runtime, uid=uid, gid=gid,
                                   edit_filter=edit_filter, library_path=library_path,
                                   drop_gids=drop_gids)
        self._plans[key] = injection
        if len(self._plans) > self.PLAN_CACHE_SIZE:
            self._plans.popitem(last=False)
        return injection

    def synchronize(self, pods: Sequence[nri_pb2.PodSandbox],
                    containers: Sequence[nri_pb2.Container]) -> None:
        """Fail-closed: find the containers created while we were away that asked for
        devices they did not get, and hand them to ``on_unserved`` (evict or report). The
        reply must go first (the runtime holds its lock until it has it), so acting on them
        is left to the callback, which schedules it."""
        unserved = find_unserved(pods, containers, self.policy, self.vendors,
                                 self._registry(), native_cdi=self.runtime.native_cdi is True)
        self.counters["unserved_found"] += len(unserved)
        for item in unserved:
            log.warning("container %s (%s) of pod %s was created without its devices while "
                        "the plugin was away: %s", item.name, item.container_id, item.pod,
                        item.reason)
        if unserved and self.on_unserved is not None:
            self.on_unserved(unserved)
        return None

    def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.ContainerAdjustment | None:
        start = time.perf_counter_ns()
        try:
            injection = self.adjustment_for(pod, container)
        except Refusal as exc:
            self.counters["refused"] += 1
            log.warning("refused container %s of pod %s/%s: %s", container.name,
                        pod.namespace, pod.name, exc)
            # An expected answer, not a bug: an error status with the reason (the same text
            # the dispatcher would send), without its bug path's traceback in the log.
            raise RpcError(Code.UNKNOWN, f"CreateContainer: {type(exc).__name__}: {exc}") from exc
        if injection is None:
            return None
        self.counters["injected"] += 1
        micros = (time.perf_counter_ns() - start) // 1000
        label = f"container={container.name} pod={pod.namespace}/{pod.name}"
        if injection.dropped_gids:
            log.warning("%s: additionalGids %s left out: neither NRI nor the runtime's own CDI "
                        "can apply them on %s, so only root or members of those groups can "
                        "open the device nodes that need them (policy additionalGids: drop; "
                        "'refuse' fails such containers instead)", label,
                        ",".join(map(str, injection.dropped_gids)), self.runtime.describe())
        if injection.delegated:
            # Not injected yet: the runtime's CDI resolves them after this reply.
            self.delegations.delegated(container.id, label, injection.delegated)
            log.info("adjusted %s devices=%s; handed to the runtime's own CDI: %s us=%d",
                     label, ",".join(injection.devices) or "-",
                     ",".join(injection.delegated), micros)
        else:
            log.info("injected %s devices=%s us=%d", label, ",".join(injection.devices),
                     micros)
        return injection.adjustment

    def post_create_container(self, pod: nri_pb2.PodSandbox,
                              container: nri_pb2.Container) -> None:
        entry = self.delegations.created(container.id)
        if entry is not None:
            log.info("the runtime's own CDI injected %s into %s", ",".join(entry[1]), entry[0])

    def remove_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> None:
        entry = self.delegations.undone(container.id)
        if entry is not None:
            self.counters["delegation_failed"] = self.counters.get("delegation_failed", 0) + 1
            log.warning("the runtime did not create %s: its own CDI could not inject %s (its "
                        "log says why, e.g. 'CDI device injection failed: unresolvable CDI "
                        "devices'); nri-cdi doctor checks that it reads the plugin's spec "
                        "folders", entry[0], ",".join(entry[1]))

    def adjustment_for(self, pod: nri_pb2.PodSandbox,
                       container: nri_pb2.Container) -> Injection | None:
        """The whole decision for one container (no I/O, but for a device the registry does
        not know: see ``claims``); raises a Refusal with the reason. The registry is read
        once: every step sees the same snapshot and facts."""
        registry, policy = self._registry(), self.policy
        env = env_map(container.env)
        privileged = is_privileged(container)

        def gathered_from(registry: Registry) -> tuple[DeviceRequest, ...]:
            gathered = gather(policy, self.vendors, registry, namespace=pod.namespace,
                              container_name=container.name,
                              pod_annotations=pod.annotations,
                              container_annotations=container.annotations, env=env,
                              privileged=privileged, mounts=container_mounts(container))
            if gathered.denied is not None:
                raise gathered.denied
            return gathered.requests

        asked = gathered_from(registry)
        cri = runtime_cdi_requests(container)
        names = [r.name for r in asked] + [r.name for r in cri]
        rechecked = False
        if self.on_miss is not None and unknown_names(names, registry.snapshot):
            # The one path that reads files: a claim spec written moments ago.
            registry = self.on_miss(unknown_names(names, registry.snapshot)) or registry
            rechecked = True
            asked = gathered_from(registry)
        elif names and self.on_hit is not None:
            newer = self.on_hit()  # a claim spec deleted a moment ago must not serve
            if newer is not None and newer is not registry:
                registry = newer
                asked = gathered_from(registry)
        native = self.runtime.native_cdi
        if native is False:
            # The runtime's CDI is off, so it did not inject what CRI CDIDevices named
            # (NRI >= 0.10 shows them): the plugin does, as a container annotation's.
            mine = plugin_injected_cri(policy, cri, pod.namespace, privileged)
            asked, cri = tuple(unique_requests([*asked, *mine])), []
        requests = not_yet_injected(asked, container, registry.snapshot, privileged,
                                    native_cdi=native)
        if rechecked:
            refusal = rechecked_refusal(registry.snapshot, requests)
            if refusal is not None:
                raise refusal
        injected = self._runtime_injected(asked, requests, cri, container, registry.snapshot,
                                          privileged)
        # No device, but the env may ask for edits of none (NVIDIA: the driver alone).
        extras = not requests and any(v.asks_extras(env) for v in self.vendors)
        if not requests and not extras and not injected:
            return None
        filters = self._decide(unique_requests([*requests, *injected]), pod.namespace,
                               privileged, env, registry)
        if not requests and not extras:
            return self._trimmed(injected, filters, env, container, registry.snapshot)
        if not requests and not filters:
            return None
        user = container.user if container.HasField("user") else None
        injection = self.plan(requests, user.uid if user else 0, user.gid if user else 0,
                              _combined(filters), library_path=env.get("LD_LIBRARY_PATH", ""),
                              registry=registry)
        if injected:
            trimmed = self._trimmed(injected, filters, env, container, registry.snapshot)
            if trimmed is not None:
                adjustment = nri_pb2.ContainerAdjustment()
                adjustment.CopyFrom(injection.adjustment)  # a cached plan: never changed
                adjustment.MergeFrom(trimmed.adjustment)
                injection = Injection(adjustment=adjustment, devices=injection.devices,
                                      delegated=injection.delegated,
                                      dropped_gids=injection.dropped_gids)
        if not requests and not injection.adjustment.ListFields():
            return None
        return injection

    def _runtime_injected(self, asked: Sequence[DeviceRequest], requests: list[DeviceRequest],
                          cri: list[DeviceRequest], container: nri_pb2.Container,
                          snapshot: Snapshot, privileged: bool) -> list[DeviceRequest]:
        """The devices the runtime's own CDI injected that the registry knows, to be checked
        like the plugin's own: by name (CRI CDIDevices on NRI >= 0.10, annotations), else,
        with its CDI on, by the device nodes the container already has."""
        left = {r.name for r in requests}
        named = [r for r in [*asked, *cri] if r.name not in left and r.name in snapshot.devices]
        if named or privileged or self.runtime.native_cdi is not True or requests:
            return unique_requests(named)
        if not container.linux.devices:
            return []
        if self._nodes_index[0] != id(snapshot):
            self._nodes_index = (id(snapshot), nodes_index(snapshot))
        return node_matched(container, snapshot, self._nodes_index[1])

    def _trimmed(self, injected: Sequence[DeviceRequest], filters: tuple[EditFilter, ...],
                 env: Mapping[str, str], container: nri_pb2.Container,
                 snapshot: Snapshot) -> Injection | None:
        """The mounts to take back from what the runtime's CDI injected, where a vendor's
        filter variable is set (e.g. NVIDIA_DRIVER_CAPABILITIES=utility); None: none."""
        chain = _combined(filters) if self._filtering(env) else None
        if chain is None or not injected:
            return None
        removals = capability_removals(snapshot, [r.name for r in injected], chain, container)
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

    def _filtering(self, env: Mapping[str, str]) -> bool:
        return any(k in env for v in self.vendors for k in v.filter_env)

    def _decide(self, requests: Sequence[DeviceRequest], namespace: str, privileged: bool,
                env: Mapping[str, str], registry: Registry) -> tuple[EditFilter, ...]:
        """Device rules, then each vendor's rules; raises on a denial. Only successes are
        cached: a refusal is rare and its message must stay exact."""
        snapshot = registry.snapshot
        names = tuple(r.name for r in requests)
        key = (id(snapshot), snapshot.generation, id(self.policy), namespace, privileged,
               names, tuple(v.decision_key(env) for v in self.vendors))
        if key in self._decisions:
            self._decisions.move_to_end(key)
            return self._decisions[key]
        self.policy.check_devices(names, namespace, privileged)
        _lookup(snapshot, list(requests))  # unknown devices: say so before any vendor check
        filters = tuple(f for f in (vendor.check(self.policy, names, env, snapshot, facts,
                                                 namespace=namespace, privileged=privileged)
                                    for vendor, facts in registry.paired(self.vendors))
                        if f is not None)
        self._decisions[key] = filters
        if len(self._decisions) > self.PLAN_CACHE_SIZE:
            self._decisions.popitem(last=False)
        return filters


class _FilterChain:
    """Several vendors' edit filters applied in order."""

    def __init__(self, filters: tuple[EditFilter, ...]) -> None:
        self.filters = filters
        self.cache_key = tuple(f.cache_key for f in filters)

    def apply(self, edits: ContainerEdits) -> ContainerEdits:
        for edit_filter in self.filters:
            edits = edit_filter.apply(edits)
        return edits


def _combined(filters: tuple[EditFilter, ...]) -> EditFilter | None:
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
