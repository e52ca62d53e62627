"""``Metered``: a plugin with metrics, by composition: it passes every event on and counts
each CreateContainer by outcome, timed (docs/operations/metrics.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.api.events import EventMask
from nri_plugin.nri.dispatch import implemented_events
from nri_plugin.nri.plugin import Plugin
from nri_plugin.plugins.cdi_injector.injector import RefusedError


class InjectionMetrics(Protocol):
    """What is reported (``nri_plugin.ops.metrics.Metrics`` implements it)."""

    def connected(self, runtime: str) -> None: ...
    def denial(self, rule: str) -> None: ...
    def injection(self, outcome: str, seconds: float) -> None: ...


class Metered(Plugin):
    def __init__(self, plugin: Plugin, metrics: InjectionMetrics) -> None:
        self.plugin = plugin
        self.metrics = metrics

    def configure(self, config: str, runtime_name: str,
                  runtime_version: str) -> EventMask | None:
        mask = self.plugin.configure(config, runtime_name, runtime_version)
        self.metrics.connected(f"{runtime_name} {runtime_version}")
        # None means "every event the plugin implements": its own, not this wrapper's.
        return implemented_events(self.plugin) if mask is None else mask

    def synchronize(self, pods: Sequence[nri_pb2.PodSandbox],
                    containers: Sequence[nri_pb2.Container]) -> None:
        self.plugin.synchronize(pods, containers)

    def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.ContainerAdjustment | nri_pb2.CreateContainerResponse | None:
        start = time.perf_counter()
        try:
            result = self.plugin.create_container(pod, container)
        except RefusedError as exc:
            self.metrics.denial(exc.reason.rule)
            self.metrics.injection("refused", time.perf_counter() - start)
            raise
        except Exception:
            self.metrics.injection("error", time.perf_counter() - start)
            raise
        if isinstance(result, nri_pb2.ContainerAdjustment):
            only_runtime = len(result.CDI_devices) > 0 and not (
                result.linux.devices or result.mounts or result.env)
            self.metrics.injection("delegated" if only_runtime else "injected",
                                   time.perf_counter() - start)
        return result

    def post_create_container(self, pod: nri_pb2.PodSandbox,
                              container: nri_pb2.Container) -> None:
        self.plugin.post_create_container(pod, container)

    def start_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> None:
        self.plugin.start_container(pod, container)

    def post_start_container(self, pod: nri_pb2.PodSandbox,
                             container: nri_pb2.Container) -> None:
        self.plugin.post_start_container(pod, container)

    def remove_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> None:
        self.plugin.remove_container(pod, container)
