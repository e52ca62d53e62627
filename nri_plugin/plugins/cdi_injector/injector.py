"""The shipped plugin: CDI device requests → a ContainerAdjustment.

One pass per container (``CdiInjector.adjustment_for``): the container is read once into an
immutable ``ContainerContext`` (identity, env, annotations, mounts, and the requests of
every source the policy lets it use), the policy's device rules are checked, the devices
are looked up once, each vendor gives its one verdict (``vendor.VendorRules.verdict``: a
refusal, or a filter of the edits), and ``plan_devices`` decides first whether the devices
go to the runtime's own CDI and then builds the adjustment. Errors are raised where they
are found. Vendor-neutral: nothing here knows a vendor. Nothing here reads files: the
registry (snapshot plus the vendors' facts for it) and the policy were loaded ahead and
are swapped in whole by a refresher.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from cdi.cache import Snapshot
from cdi.device import Device
from cdi.edits import merge
from cdi.errors import UnresolvedDevicesError
from cdi.libpath import LIBRARY_PATH_ENV
from cdi.model import ContainerEdits
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.api.events import EventMask
from nri_plugin.nri.dispatch import RpcError
from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.versions import RuntimeInfo
from nri_plugin.nri.wire import Code
from nri_plugin.plugins.cdi_injector.access import hand_over_for_access
from nri_plugin.plugins.cdi_injector.adjust import (
    as_native_file_modes,
    to_adjustment,
    unsupported_edits,
)
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
from nri_plugin.plugins.cdi_injector.delegation import (
    DelegationTracker,
    RuntimeCdiConfig,
    delegation_problems,
    spec_device_nodes,
)
from nri_plugin.plugins.cdi_injector.failclosed import (
    Unserved,
    env_prefixes,
    find_unserved,
    too_many_names,
)
from nri_plugin.plugins.cdi_injector.native import injected_by_runtime, log_runtime_facts
from nri_plugin.plugins.cdi_injector.policy import Policy
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.plugins.cdi_injector.requests import DeviceRequest, unique_requests
from nri_plugin.plugins.cdi_injector.shape import Key, RequestShape
from nri_plugin.plugins.cdi_injector.sources import NEUTRAL_ANNOTATION_PREFIXES, all_sources
from nri_plugin.plugins.cdi_injector.vendor import (
    EditFilter,
    Registry,
    RequestSource,
    VendorRules,
    env_read,
)

log = logging.getLogger("nri_cdi.injector")


class InjectionError(Refusal):
    """The container must not be created; the message says what and why."""

    default_rule = "injection"


class TooManyNamesError(InjectionError):
    """The request names more devices than any container may ask for (MAX_NAMES)."""

    default_rule = "nameLimit"


@dataclass(frozen=True, slots=True, kw_only=True)
class Injection:
    adjustment: nri_pb2.ContainerAdjustment
    devices: tuple[str, ...]  # injected by us
    delegated: tuple[str, ...]  # handed to the runtime's own CDI resolver
    # additionalGids left out (policy additionalGids: drop) where neither NRI nor the
    # runtime's own CDI could apply them: narrower than the spec, never wider.
    dropped_gids: tuple[int, ...] = ()


def plan_injection(snapshot: Snapshot, requests: Sequence[DeviceRequest], runtime: RuntimeInfo,
                   *, uid: int = 0, gid: int = 0, edit_filter: EditFilter | None = None,
                   library_path: str = "", drop_gids: bool = False) -> Injection:
    """``plan_devices`` for the devices ``requests`` name."""
    return plan_devices(snapshot, lookup_devices(snapshot, requests), runtime, uid=uid,
                        gid=gid, edit_filter=edit_filter, library_path=library_path,
                        drop_gids=drop_gids)


def plan_devices(
    snapshot: Snapshot,
    devices: Sequence[Device],
    runtime: RuntimeInfo,
    *,
    uid: int = 0,
    gid: int = 0,
    edit_filter: EditFilter | None = None,
    library_path: str = "",
    drop_gids: bool = False,
) -> Injection:
    """The adjustment for ``devices`` (looked up, in request order). ``edit_filter``: the
    vendors' filter of the resolved edits (e.g. the driver mounts of capabilities not asked
    for); None keeps everything. ``library_path``: the container's own LD_LIBRARY_PATH,
    which hook-free specs append their folders to. ``drop_gids``: where additionalGids are
    all that NRI cannot carry and the runtime's own CDI cannot take the devices either,
    inject without them instead of refusing."""
    delegate, dropped = decide_delegation(snapshot, devices, runtime, drop_gids)
    if not delegate and devices and hand_over_for_access(
            snapshot.merged_edits(devices), devices, runtime, edit_filter):
        delegate = True  # access NRI cannot grant (mknod): the runtime's own CDI can
    ours = () if delegate else tuple(devices)
    delegated = tuple(devices) if delegate else ()
    edits = snapshot.merged_edits(ours) if ours else ContainerEdits()
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
                     dropped_gids=dropped)


def decide_delegation(snapshot: Snapshot, devices: Sequence[Device], runtime: RuntimeInfo,
                      drop_gids: bool) -> tuple[bool, tuple[int, ...]]:
    """(whether every device goes to the runtime's own CDI, the additionalGids left out).

    All or nothing: NRI applies our edits before the runtime's CDI, so a mix merges env,
    mounts and device rules in another order than native CDI would (and NRI's rw rule for
    a device we add could widen a read-only one of the same number). Raises InjectionError
    for edits neither can apply, or devices the runtime's CDI would fail on."""
    delegate = False
    dropped: set[int] = set()
    for group in _by_spec(devices).values():
        edits = _merged(snapshot, group[0].spec.path, group)
        reasons = unsupported_edits(edits, runtime)
        if not reasons:
            continue
        # additionalGids are all NRI cannot carry: without them, nothing would be left.
        gids_only = drop_gids and not unsupported_edits(
            edits._replace(additional_gids=()), runtime)
        if runtime.supports_cdi_devices and not (
                gids_only and delegation_problems(group, runtime)):
            delegate = True  # the runtime's own CDI applies what NRI cannot carry
        elif gids_only:
            dropped.update(g for g in edits.additional_gids if g != 0)
        else:
            names = ", ".join(d.qualified_name for d in group)
            raise InjectionError(
                f"CDI devices {names} need edits that NRI cannot apply on "
                f"{runtime.describe()}: {'; '.join(reasons)}; a runtime that resolves "
                "CDI_devices itself (containerd >= 2.1 or >= 1.7.30, CRI-O >= 1.34) can",
                rule="unsupportedEdits", device=group[0].qualified_name)
    if delegate:
        _check_delegation(devices, runtime)
    return delegate, tuple(sorted(dropped))


def _by_spec(devices: Sequence[Device]) -> dict[str, list[Device]]:
    by_spec: dict[str, list[Device]] = {}
    for device in devices:
        by_spec.setdefault(device.spec.path, []).append(device)
    return by_spec


def _check_delegation(delegated: Sequence[Device], runtime: RuntimeInfo) -> None:
    problems = delegation_problems(delegated, runtime)
    if problems:
        raise InjectionError(
            "CDI devices that only the runtime's own CDI can inject "
            f"({', '.join(d.qualified_name for d in delegated)}) would fail there: "
            + "; ".join(problems))


def lookup_devices(snapshot: Snapshot, requests: Sequence[DeviceRequest]) -> list[Device]:
    """The requested devices, in request order; InjectionError naming each unknown one and
    the source that asked for it."""
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


@dataclass(frozen=True, slots=True)
class Decision:
    """What the policy's device rules and the vendors' verdicts leave of a request."""

    devices: tuple[Device, ...]  # looked up, in request order
    edit_filter: EditFilter | None  # the vendors' filters, in vendor order


class CdiInjector(Plugin):
    """Injects the CDI devices that pods and containers ask for, as the policy allows."""

    # Its answers are kept (by request shape) and returned again as they are: never
    # changed once made, so the dispatcher may keep their encoding too.
    adjustments_immutable = True

    # Pods of one deployment ask for the same devices again and again: a small cache of
    # finished plans, keyed by everything a plan depends on, makes repeats nearly free.
    PLAN_CACHE_SIZE = 512

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
        # Runs the per-container log line; the daemon makes it "after the reply has left"
        # (loop.call_soon): with cold caches, as between two containers they are, the log
        # call was a quarter of the handler's time (bench_plugin.py (e): 125 us inline,
        # 94 us deferred), all of it inside the runtime's CreateContainer. Default: at
        # once (tests, other hosts).
        self.defer: Callable[[Callable[[], object]], object] = _at_once
        self._plans: OrderedDict[tuple[object, ...], Injection] = OrderedDict()
        # Policy + vendor decisions, same idea: keyed by all they read.
        self._decisions: OrderedDict[tuple[object, ...], Decision] = OrderedDict()
        self._env_names = env_read(self.vendors, LIBRARY_PATH_ENV)
        self._name_prefixes = env_prefixes(self.vendors)  # the vendors' env requests
        # Whole answers by request shape (None: no device asked), with whether the request
        # named devices; kept for one registry and policy (``adjustment_for``).
        self._shape = RequestShape.of(NEUTRAL_ANNOTATION_PREFIXES, self._env_names,
                                      [s for v in self.vendors for s in v.sources],
                                      self.vendors)
        self._answers: OrderedDict[Key, tuple[Injection | None, bool]] = OrderedDict()
        self._answered_under: tuple[Registry | None, Policy | None] = (None, None)
        self._sources_of: tuple[Registry | None, tuple[tuple[RequestSource, object], ...]] = (
            None, ())

    def registry(self) -> Registry:
        """The registry in force now (what one container's decision reads, once)."""
        return self._registry()

    def set_policy(self, policy: Policy) -> None:
        """Put a new (validated) policy in force; decisions made under the old one go."""
        self.policy = policy
        self._decisions.clear()

    def runtime_of(self, runtime_name: str, runtime_version: str) -> RuntimeInfo:
        """The runtime Configure names, with what the settings say of its own CDI."""
        runtime = RuntimeInfo.from_configure(runtime_name, runtime_version)
        cdi = self.runtime_cdi
        return cdi.applied_to(runtime) if cdi is not None else runtime

    def configure(self, config: str, runtime_name: str,
                  runtime_version: str) -> EventMask | None:
        self.runtime = self.runtime_of(runtime_name, runtime_version)
        cdi = self.runtime_cdi
        self._plans.clear()
        self._answers.clear()  # answered for another runtime
        self.delegations = DelegationTracker()  # events of an earlier connection are lost
        log.info("connected to %s; %s", self.runtime.describe(),
                 cdi.describe(self.runtime) if cdi is not None else "runtime's own CDI: unknown")
        log_runtime_facts(self.runtime)
        if self.on_start_warning is not None and (line := self.on_start_warning(self.runtime)):
            log.warning("%s", line)
        if not self.runtime.supports_cdi_devices:
            return EventMask.CREATE_CONTAINER  # nothing is delegated: nothing to follow up
        # RemoveContainer tells a handed-over creation that failed (containerd undoes it)
        # from one that did; it is outside every container's creation and start, where a
        # StartContainer round trip (once used to confirm success) would cost each one.
        return EventMask.CREATE_CONTAINER | EventMask.REMOVE_CONTAINER

    def plan(self, requests: Sequence[DeviceRequest], uid: int, gid: int,
             edit_filter: EditFilter | None = None, *, library_path: str = "",
             registry: Registry | None = None,
             devices: Sequence[Device] | None = None) -> Injection:
        """The plan for ``requests`` (cached); ``devices``: already looked up for them."""
        snapshot = (registry or self._registry()).snapshot
        drop_gids = self.policy.additional_gids == "drop"
        key = (snapshot.generation, id(snapshot), tuple(r.name for r in requests), uid, gid,
               None if edit_filter is None else edit_filter.cache_key, library_path, drop_gids)
        cached = self._plans.get(key)
        if cached is not None:
            self._plans.move_to_end(key)
            return cached
        if devices is None:
            devices = lookup_devices(snapshot, requests)
        injection = plan_devices(snapshot, devices, self.runtime, uid=uid, gid=gid,
                                 edit_filter=edit_filter, library_path=library_path,
                                 drop_gids=drop_gids)
        self._plans[key] = injection
        if len(self._plans) > self.PLAN_CACHE_SIZE:
            self._plans.popitem(last=False)
        return injection

    def find_unserved(self, pods: Sequence[nri_pb2.PodSandbox],
                      containers: Sequence[nri_pb2.Container],
                      runtime: RuntimeInfo | None = None) -> list[Unserved]:
        """The containers Synchronize lists that were created while we were away and lack
        the devices they asked for (counted and logged; acting on them is the guard's).
        ``runtime``: the one that sent them, where it is not the injector's (yet)."""
        native = (runtime or self.runtime).native_cdi is True
        unserved = find_unserved(pods, containers, self.policy, self.vendors,
                                 self._registry(), native_cdi=native)
        self.counters.unserved_found += len(unserved)
        for item in unserved:
            log.warning("container %s (%s) of pod %s was created without its devices while "
                        "the plugin was away: %s", item.name, item.container_id, item.pod,
                        item.reason)
        return unserved

    def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.ContainerAdjustment | None:
        start = time.perf_counter_ns()
        try:
            injection = self.adjustment_for(pod, container)
        except Refusal as exc:
            self.counters.refused += 1
            log.warning("refused container %s of pod %s/%s: %s", container.name,
                        pod.namespace, pod.name, exc)
            # An expected answer, not a bug: an error status with the reason (the same text
            # the dispatcher would send), without its bug path's traceback in the log.
            raise RpcError(Code.UNKNOWN, f"CreateContainer: {type(exc).__name__}: {exc}") from exc
        if injection is None:
            return None
        self.counters.injected += 1
        micros = (time.perf_counter_ns() - start) // 1000
        if injection.delegated:
            # Not injected yet: the runtime's CDI resolves them after this reply.
            self.delegations.delegated(container.id, _label(pod, container),
                                       injection.delegated)
        # Even the line's words are put together after the reply has left (cold, the
        # formatting alone was 19 us inside the runtime's CreateContainer).
        self.defer(functools.partial(self._log_served, pod, container, injection, micros))
        return injection.adjustment

    def _log_served(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container,
                    injection: Injection, micros: int) -> None:
        label = _label(pod, container)
        if injection.dropped_gids:
            log.warning("%s: additionalGids %s left out: neither NRI nor the runtime's own CDI "
                        "can apply them on %s, so only root or members of those groups can "
                        "open the device nodes that need them (policy additionalGids: drop; "
                        "'refuse' fails such containers instead)", label,
                        ",".join(map(str, injection.dropped_gids)), self.runtime.describe())
        if injection.delegated:
            log.info("adjusted %s devices=%s; handed to the runtime's own CDI: %s us=%d",
                     label, ",".join(injection.devices) or "-", ",".join(injection.delegated),
                     micros)
        else:
            log.info("injected %s devices=%s us=%d", label, ",".join(injection.devices),
                     micros)

    def remove_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> None:
        entry = self.delegations.undone(container.id)
        if entry is not None and was_created(container):
            # created (the runtime's store has it): its CDI did inject them
            log.info("the runtime's own CDI injected %s into %s", ",".join(entry[1]), entry[0])
        elif entry is not None:
            self.counters.delegation_failed += 1
            log.warning("the runtime did not create %s: its own CDI could not inject %s (its "
                        "log says why, e.g. 'CDI device injection failed: unresolvable CDI "
                        "devices'); nri-cdi doctor checks that it reads the plugin's spec "
                        "folders", entry[0], ",".join(entry[1]))

    def adjustment_for(self, pod: nri_pb2.PodSandbox,
                       container: nri_pb2.Container) -> Injection | None:
        """The whole decision for one container, in one pass; raises a Refusal with the
        reason. No I/O, but for a device the registry does not know (a DRA claim's spec
        written a moment ago: ``on_miss``, see ``claims``). The registry and the policy are
        read once: every step sees the same snapshot, facts and rules. A request shaped as
        one answered before under them (``shape``) gets that answer again."""
        registry, policy = self._registry(), self.policy
        key = self._answer_key(pod, container, registry, policy)
        if key is not None and (known := self._answers.get(key)) is not None:
            answer, asks = known
            # A claim spec deleted a moment ago must not serve, repeat or not.
            newer = self.on_hit() if asks and self.on_hit is not None else None
            if newer is None or newer is registry:
                self._answers.move_to_end(key)
                return answer
            registry = newer  # decided afresh below, and not kept (an older registry's key)
        # Counted before anything parses them (bounded time and memory); a repeat's were
        # counted when its shape was first answered (a refusal is never kept).
        excess = too_many_names(pod.annotations, container, self._name_prefixes)
        if excess is not None:
            raise TooManyNamesError(excess)
        answer, reusable, asks = self._answer(pod, container, registry, policy)
        if key is not None and reusable and registry is self._answered_under[0]:
            self._answers[key] = (answer, asks)
            if len(self._answers) > self.PLAN_CACHE_SIZE:
                self._answers.popitem(last=False)
        return answer

    def _answer_key(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container,
                    registry: Registry, policy: Policy) -> Key | None:
        """The request's shape key; the answers kept so far go when the registry or the
        policy in force is another than theirs."""
        under = self._answered_under
        if under[0] is not registry or under[1] is not policy:
            self._answers.clear()
            self._answered_under = (registry, policy)
        return self._shape.key(pod, container)

    def _answer(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container,
                registry: Registry, policy: Policy) -> tuple[Injection | None, bool, bool]:
        """(the answer, whether a request of the same shape gets the same one under this
        registry and policy, whether it names devices). Not the same: where the spec
        folders were read again for it, or where the runtime's own CDI injected devices
        (their trimming reads every mount's destination)."""
        first = registry
        context = self._context(pod, container, registry, policy)
        cri = runtime_cdi_requests(container)
        names = [r.name for r in context.requests] + [r.name for r in cri]
        unknown = unknown_names(names, registry.snapshot) if self.on_miss is not None else []
        newer = None
        if unknown and self.on_miss is not None:
            # The one path that reads files: a claim spec written moments ago.
            newer = self.on_miss(unknown) or registry
        elif names and self.on_hit is not None:
            newer = self.on_hit()  # a claim spec deleted a moment ago must not serve
        if newer is not None and newer is not registry:
            registry = newer
            context = self._context(pod, container, registry, policy)
        asked = context.requests
        native = self.runtime.native_cdi
        if native is False:
            # The runtime's CDI is off, so it did not inject what CRI CDIDevices named
            # (NRI >= 0.10 shows them): the plugin does, as a container annotation's.
            mine = plugin_injected_cri(policy, cri, context.namespace, context.privileged)
            asked, cri = tuple(unique_requests([*asked, *mine])), []
        requests = not_yet_injected(asked, container, registry.snapshot, context.privileged,
                                    native_cdi=native)
        if unknown:
            refusal = rechecked_refusal(registry.snapshot, requests)
            if refusal is not None:
                raise refusal
        injected = self._runtime_injected(asked, requests, cri, container, registry.snapshot,
                                          context.privileged)
        # No device, but the env may ask for edits of none (a vendor's extras_env).
        extras = not requests and self._asks_extras(context)
        reusable = not unknown and registry is first and not injected
        asks = bool(names)
        if not requests and not extras and not injected:
            return None, reusable, asks
        decision = self._decide(context, unique_requests([*requests, *injected]), registry,
                                policy)
        if not requests and not extras:
            return self._trimmed(injected, decision.edit_filter, context.env, container,
                                 registry.snapshot), False, asks
        if not requests and decision.edit_filter is None:
            return None, reusable, asks
        wanted = {r.name for r in requests}
        injection = self.plan(requests, context.uid, context.gid, decision.edit_filter,
                              library_path=context.env.get(LIBRARY_PATH_ENV, ""),
                              registry=registry,
                              devices=[d for d in decision.devices
                                       if d.qualified_name in wanted])
        if injected:
            injection = self._with_trimmed(injection, injected, decision.edit_filter,
                                           context.env, container, registry.snapshot)
        if not requests and not injection.adjustment.ListFields():
            return None, reusable, asks
        return injection, reusable, asks

    def _context(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container,
                 registry: Registry, policy: Policy) -> ContainerContext:
        """What every source asked for; raises the first source's denial."""
        context = read_context(pod, container, self._sources(registry), policy,
                               registry.snapshot, self._env_names)
        check_sources(context, policy)
        return context

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
        return node_matched(container, snapshot)

    def _with_trimmed(self, injection: Injection, injected: Sequence[DeviceRequest],
                      edit_filter: EditFilter | None, env: Mapping[str, str],
                      container: nri_pb2.Container, snapshot: Snapshot) -> Injection:
        """``injection`` plus the removals ``_trimmed`` finds (a cached plan is copied,
        never changed)."""
        trimmed = self._trimmed(injected, edit_filter, env, container, snapshot)
        if trimmed is None:
            return injection
        adjustment = nri_pb2.ContainerAdjustment()
        adjustment.CopyFrom(injection.adjustment)
        adjustment.MergeFrom(trimmed.adjustment)
        return replace(injection, adjustment=adjustment)

    def _trimmed(self, injected: Sequence[DeviceRequest], edit_filter: EditFilter | None,
                 env: Mapping[str, str], container: nri_pb2.Container,
                 snapshot: Snapshot) -> Injection | None:
        """The mounts to take back from what the runtime's CDI injected, where a vendor's
        filter variable is set (e.g. its driver-capabilities variable); None: none."""
        chain = edit_filter if self._filtering(env) else None
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

    def _sources(self, registry: Registry) -> tuple[tuple[RequestSource, object], ...]:
        """Every source with its vendor's facts, made once per registry."""
        made_for, sources = self._sources_of
        if made_for is not registry:
            sources = all_sources(registry.paired(self.vendors))
            self._sources_of = (registry, sources)
        return sources

    def _asks_extras(self, context: ContainerContext) -> bool:
        env = context.env
        return any(env.get(name) for vendor in self.vendors for name in vendor.extras_env)

    def _decide(self, context: ContainerContext, requests: Sequence[DeviceRequest],
                registry: Registry, policy: Policy) -> Decision:
        """Device rules, the lookup, then each vendor's verdict; raises on a denial. Only
        successes are cached: a refusal is rare and its message must stay exact."""
        snapshot = registry.snapshot
        names = tuple(r.name for r in requests)
        key = (id(snapshot), snapshot.generation, id(policy), context.namespace,
               context.privileged, names, self._verdict_key(context.env))
        cached = self._decisions.get(key)
        if cached is not None:
            self._decisions.move_to_end(key)
            return cached
        policy.check_devices(names, context.namespace, context.privileged)
        devices = lookup_devices(snapshot, requests)  # unknown: said before any verdict
        filters = tuple(f for f in (vendor.verdict(context, names, policy, snapshot, facts)
                                    for vendor, facts in registry.paired(self.vendors))
                        if f is not None)
        decision = Decision(tuple(devices), _combined(filters))
        self._decisions[key] = decision
        if len(self._decisions) > self.PLAN_CACHE_SIZE:
            self._decisions.popitem(last=False)
        return decision

    def _verdict_key(self, env: Mapping[str, str]) -> tuple[object, ...]:
        """The env entries the vendors' verdicts read, per vendor."""
        return tuple(tuple(sorted((k, v) for k, v in env.items()
                                  if k.startswith(vendor.verdict_env)))
                     for vendor in self.vendors)


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
    if not done and not present:
        return list(requests)  # the usual case: nothing is in the container yet
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
    undid). containerd before 2.3 gives a created one a state; 2.3 (NRI 0.12, commit
    695c91324) gives an exited one no state (UNKNOWN, only a reason) but its creation time,
    from its store; an undone creation is in no store: no state, no creation time."""
    return container.state != nri_pb2.CONTAINER_UNKNOWN or container.created_at != 0


def _label(pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> str:
    return f"container={container.name} pod={pod.namespace}/{pod.name}"


def _at_once(call: Callable[[], object]) -> object:
    return call()
