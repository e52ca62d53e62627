"""``MeteredInjector``: the CdiInjector with metrics (a subclass, chosen by the daemon).

It times each CreateContainer that asked for devices and counts it by outcome
(``injected``; ``delegated`` when only the runtime's own CDI resolves the devices;
``refused`` when the request is turned down, with the rule from the Refusal's structured
reason; ``error`` for anything unexpected), and tells the metrics when
the runtime connection (re)starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.api.events import EventMask
from nri_plugin.nri.dispatch import RpcError
from nri_plugin.plugins.cdi_injector.claims import OnHit, OnMiss, StartWarning
from nri_plugin.plugins.cdi_injector.counters import Counters
from nri_plugin.plugins.cdi_injector.delegation import RuntimeCdiConfig
from nri_plugin.plugins.cdi_injector.injector import CdiInjector
from nri_plugin.plugins.cdi_injector.policy import Policy
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.plugins.cdi_injector.vendor import Registry, VendorRules


class InjectionMetrics(Protocol):
    """What the injector reports (``nri_plugin.ops.metrics.Metrics`` implements it)."""

    def connected(self, runtime: str) -> None: ...
    def denial(self, rule: str) -> None: ...
    def injection(self, outcome: str, seconds: float) -> None: ...


class MeteredInjector(CdiInjector):
    def __init__(self, registry: Callable[[], Registry], metrics: InjectionMetrics, *,
                 vendors: Sequence[VendorRules] = (), policy: Policy | None = None,
                 runtime_cdi: RuntimeCdiConfig | None = None,
                 counters: Counters | None = None, on_miss: OnMiss | None = None,
                 on_hit: OnHit | None = None,
                 on_start_warning: StartWarning | None = None) -> None:
        super().__init__(registry, vendors=vendors, policy=policy, runtime_cdi=runtime_cdi,
                         counters=counters, on_miss=on_miss, on_hit=on_hit,
                         on_start_warning=on_start_warning)
        self.metrics = metrics

    def configure(self, config: str, runtime_name: str,
                  runtime_version: str) -> EventMask | None:
        mask = super().configure(config, runtime_name, runtime_version)
        self.metrics.connected(self.runtime.describe())
        return mask

    def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.ContainerAdjustment | None:
        start = time.perf_counter()
        try:
            adjustment = super().create_container(pod, container)
        except RpcError as exc:  # a refusal when its cause is a Refusal
            if isinstance(exc.__cause__, Refusal):
                self.metrics.denial(exc.__cause__.reason.rule)
            self.metrics.injection("refused", time.perf_counter() - start)
            raise
        except Exception:
            self.metrics.injection("error", time.perf_counter() - start)
            raise
        if adjustment is not None:
            only_runtime = len(adjustment.CDI_devices) > 0 and not (
                adjustment.linux.devices or adjustment.mounts or adjustment.env)
            self.metrics.injection("delegated" if only_runtime else "injected",
                                   time.perf_counter() - start)
        return adjustment
