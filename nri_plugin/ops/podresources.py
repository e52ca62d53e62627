"""The kubelet's pod-resources API as the plugin reads it: a thread asks the kubelet what
each pod's containers hold (``List``: device plugin ids, DRA claims' CDI devices) every
interval, and keeps the answer for the injector, which reads it with no I/O
(``allocations.KubeletAllocations``; docs/usage/policy.md, "Devices the kubelet allocated").

No socket at the path: no kubelet on this node, nothing to check. A socket that does not
answer, or an answer older than a few intervals: the allocations are unknown, and the
injector refuses what it cannot check (fail-closed) until the kubelet answers again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from nri_plugin.ops.kubelet_api import podresources_pb2 as pb
from nri_plugin.plugins.cdi_injector.allocations import Holding, KubeletAllocations

log = logging.getLogger("nri_cdi.podresources")

LIST_METHOD = "/v1.PodResourcesLister/List"


def holdings(response: pb.ListPodResourcesResponse) -> tuple[Holding, ...]:
    """Each container's device plugin allocations and DRA claims, one Holding each."""
    out: list[Holding] = []
    for pod in response.pod_resources:
        owner = f"{pod.namespace}/{pod.name}"
        for container in pod.containers:
            for devices in container.devices:
                if devices.device_ids:
                    out.append(Holding(pod=owner, container=container.name,
                                       resource=devices.resource_name,
                                       device_ids=tuple(devices.device_ids)))
            for claim in container.dynamic_resources:
                names = tuple(d.name for r in claim.claim_resources for d in r.cdi_devices)
                if names:
                    out.append(Holding(pod=owner, container=container.name,
                                       claim=f"{claim.claim_namespace}/{claim.claim_name}",
                                       cdi_devices=names))
    return tuple(out)


class PodResourcesWatch:
    """Reads the kubelet's allocations every ``interval`` seconds in a thread of its own;
    ``current`` is what the injector calls on each container (no I/O)."""

    def __init__(self, socket_path: str, interval: float, *, timeout: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.socket_path = socket_path
        self.interval = interval
        self.timeout = timeout
        # An answer older than this no longer says who holds what.
        self.stale_after = 3 * interval + timeout
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._channel: Any = None
        # (the kubelet's socket is there, the last answer, when it came, the last error);
        # replaced whole, so the injector's thread reads one consistent tuple.
        self._state: tuple[bool, KubeletAllocations | None, float, str] = (
            os.path.exists(socket_path), None, 0.0, "no answer from the kubelet yet")

    def current(self) -> KubeletAllocations | None:
        """The allocations as last read; None where there is no kubelet; ``unknown`` set
        where its answer is missing or stale."""
        present, allocations, at, error = self._state
        if not present:
            return None
        if allocations is None or self._clock() - at > self.stale_after:
            return KubeletAllocations(unknown=f"{self.socket_path}: {error}")
        return allocations

    def read_once(self) -> None:
        """One look: is the socket there, and what does ``List`` answer (I/O)."""
        present, allocations, at, previous_error = self._state
        if not os.path.exists(self.socket_path):
            if present:
                log.warning("the kubelet's pod-resources socket %s is gone: devices asked "
                            "for by annotation are not checked against its allocations",
                            self.socket_path)
            self._state = (False, None, 0.0, "no socket")
            return
        if not present:
            log.info("the kubelet's pod-resources socket %s is there: devices asked for by "
                     "annotation are checked against its allocations", self.socket_path)
        try:
            response = self._list()
        except Exception as exc:  # grpc's errors, a missing grpcio: said, never raised
            error = describe_rpc_error(exc)
            # A new channel next time: grpc's own reconnection backs off for minutes, a
            # restarted kubelet answers at once.
            self._close_channel()
            if error != previous_error:  # once per change, not once a second
                log.warning("the kubelet's pod-resources API (%s) failed: %s; devices "
                            "asked for by annotation are refused until it answers",
                            self.socket_path, error)
            self._state = (True, allocations, at, error)
            return
        if previous_error:
            log.info("the kubelet's pod-resources API answers (%s)", self.socket_path)
        self._state = (True, KubeletAllocations(holdings=holdings(response)), self._clock(),
                       "")

    def _list(self) -> pb.ListPodResourcesResponse:
        import grpc  # the kubelet extra; imported in this thread, once

        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
        call = self._channel.unary_unary(
            LIST_METHOD, request_serializer=pb.ListPodResourcesRequest.SerializeToString,
            response_deserializer=pb.ListPodResourcesResponse.FromString)
        response: pb.ListPodResourcesResponse = call(pb.ListPodResourcesRequest(),
                                                      timeout=self.timeout)
        return response

    def start(self) -> PodResourcesWatch:
        self._thread = threading.Thread(target=self._run, name="nri-cdi-podresources",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 1)
        self._close_channel()

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.read_once()
            self._stop.wait(self.interval)


def describe_rpc_error(exc: Exception) -> str:
    """What a grpc call raised (or the import of a missing grpcio), in one line."""
    if isinstance(exc, ImportError):
        return "grpcio is not installed (pip install 'nri-cdi[kubelet]'; the image has it)"
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if not (callable(code) and callable(details)):
        return f"{type(exc).__name__}: {exc}"
    status = code()  # None: a failed future may carry none
    if status is not None and status.name == "DEADLINE_EXCEEDED":
        return "no answer in time"
    return f"{status.name if status else 'error'}: {details() or ''}".rstrip(": ")
