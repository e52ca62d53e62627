"""The shipped plugin: CDI device requests in annotations → a ContainerAdjustment.

``plan_injection`` is pure (a snapshot, the requests, what the runtime can do → an
adjustment or an InjectionError); ``CdiInjector`` is the thin Plugin around it. Nothing
here reads files: the registry snapshot was loaded ahead and is swapped in by a refresher.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from cdi.cache import Snapshot
from cdi.device import Device
from cdi.edits import merge
from cdi.errors import AnnotationError, UnresolvedDevicesError
from cdi.model import ContainerEdits

from .adjust import to_adjustment, unsupported_edits
from .api import nri_pb2
from .plugin import Plugin
from .requests import DeviceRequest, requested_devices
from .runtime import RuntimeInfo

log = logging.getLogger("nri_cdi.injector")


class InjectionError(Exception):
    """The container must not be created; the message says what and why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Injection:
    adjustment: nri_pb2.ContainerAdjustment
    devices: tuple[str, ...]  # injected by us
    delegated: tuple[str, ...]  # handed to the runtime's own CDI resolver


def plan_injection(
    snapshot: Snapshot,
    requests: list[DeviceRequest],
    runtime: RuntimeInfo,
    *,
    uid: int = 0,
    gid: int = 0,
) -> Injection:
    devices = _lookup(snapshot, requests)
    by_spec: dict[str, list[Device]] = {}
    for device in devices:
        by_spec.setdefault(device.spec.path, []).append(device)
    ours: list[Device] = []
    delegated: list[Device] = []
    for path, group in by_spec.items():
        edits = _merged(snapshot, path, group)
        reasons = unsupported_edits(edits, runtime)
        if not reasons:
            ours += group
        elif runtime.supports_cdi_devices:
            delegated += group  # the runtime's own CDI applies what NRI cannot carry
        else:
            names = ", ".join(d.qualified_name for d in group)
            raise InjectionError(
                f"CDI devices {names} need edits that NRI cannot apply on "
                f"{runtime.describe()}: {'; '.join(reasons)}; a runtime that resolves "
                "CDI_devices itself (containerd >= 2.1 or >= 1.7.30, CRI-O >= 1.34) can")
    edits = snapshot.resolve(d.qualified_name for d in ours) if ours else ContainerEdits()
    adjustment = to_adjustment(edits, runtime=runtime, uid=uid, gid=gid)
    for device in delegated:
        adjustment.CDI_devices.add(name=device.qualified_name)
    return Injection(adjustment=adjustment,
                     devices=tuple(d.qualified_name for d in ours),
                     delegated=tuple(d.qualified_name for d in delegated))


def _lookup(snapshot: Snapshot, requests: list[DeviceRequest]) -> list[Device]:
    try:
        return snapshot.lookup(r.name for r in requests)
    except UnresolvedDevicesError as exc:
        source = {r.name: r.source for r in requests}
        detail = "; ".join(f"{name} (from {source[name]}): {why}"
                           for name, why in exc.reasons.items())
        raise InjectionError(f"unresolvable CDI devices: {detail}") from None


def _merged(snapshot: Snapshot, spec_path: str, group: list[Device]) -> ContainerEdits:
    return merge([snapshot.specs[spec_path].edits, *(d.edits for d in group)])


class CdiInjector(Plugin):
    """Injects the CDI devices that pods and containers ask for."""

    # Pods of one deployment ask for the same devices again and again: a small cache of
    # finished plans, keyed by everything a plan depends on, makes repeats nearly free.
    PLAN_CACHE_SIZE = 512

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot  # returns the current registry snapshot; never does I/O
        self.runtime = RuntimeInfo()
        self._plans: OrderedDict[tuple[object, ...], Injection] = OrderedDict()

    def configure(self, config: str, runtime_name: str, runtime_version: str) -> None:
        self.runtime = RuntimeInfo.from_configure(runtime_name, runtime_version)
        self._plans.clear()
        log.info("connected to %s", self.runtime.describe())

    def plan(self, requests: list[DeviceRequest], uid: int, gid: int) -> Injection:
        snapshot = self._snapshot()
        key = (snapshot.generation, id(snapshot), tuple(r.name for r in requests), uid, gid)
        cached = self._plans.get(key)
        if cached is not None:
            self._plans.move_to_end(key)
            return cached
        injection = plan_injection(snapshot, requests, self.runtime, uid=uid, gid=gid)
        self._plans[key] = injection
        if len(self._plans) > self.PLAN_CACHE_SIZE:
            self._plans.popitem(last=False)
        return injection

    def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.ContainerAdjustment | None:
        start = time.perf_counter_ns()
        try:
            requests = requested_devices(pod.annotations, container.name, container.annotations)
            if not requests:
                return None
            user = container.user if container.HasField("user") else None
            injection = self.plan(requests, user.uid if user else 0, user.gid if user else 0)
        except (AnnotationError, InjectionError) as exc:
            log.warning("refused container %s of pod %s/%s: %s", container.name,
                        pod.namespace, pod.name, exc)
            raise
        micros = (time.perf_counter_ns() - start) // 1000
        log.info("injected container=%s pod=%s/%s devices=%s delegated=%s us=%d",
                 container.name, pod.namespace, pod.name, ",".join(injection.devices) or "-",
                 ",".join(injection.delegated) or "-", micros)
        return injection.adjustment
