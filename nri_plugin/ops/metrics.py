"""The plugin's Prometheus metrics and health endpoints (docs/operations/metrics.md).

``Metrics``' updates do no I/O (safe on the CreateContainer path); ``serve`` answers in a
thread of its own. prometheus-client is imported when a ``Metrics`` is made: only the
plugin with ``metrics.address`` set needs the ``metrics`` extra.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cdi.extras import MissingDependencyError
from nri_plugin.ops.settings import parse_address
from nri_plugin.plugins.cdi_injector.injector import Counters

# CreateContainer must answer within the runtime's 2 s request timeout.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.0)
OUTCOMES = ("injected", "delegated", "refused", "error")
# The registry's figures: a gauge each (nri_cdi_registry_<name>) and the health JSON.
REGISTRY_FIGURES = {"devices": "CDI devices in the registry", "specs": "spec files loaded",
                    "file_errors": "spec files with errors",
                    "generation": "registry refresh count"}


class Metrics:
    def __init__(self, counters: Counters) -> None:
        """``counters``: the plugin's own (injector and guard), shown in the health JSON."""
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError as exc:
            raise MissingDependencyError("prometheus_client", "metrics.address") from exc

        self.registry_ = CollectorRegistry(auto_describe=True)
        r = self.registry_
        self._injections = Counter("nri_cdi_injections", "CreateContainer requests that "
                                   "asked for CDI devices, by outcome", ["outcome"], registry=r)
        self._latency = Histogram("nri_cdi_injection_seconds", "time to answer a "
                                  "CreateContainer that asked for CDI devices",
                                  buckets=LATENCY_BUCKETS, registry=r)
        self._denials = Counter("nri_cdi_denials", "requests refused by a policy rule",
                                ["rule"], registry=r)
        self._reconnects = Counter("nri_cdi_reconnects", "connections to the runtime after "
                                   "the first", registry=r)
        self._connected = Gauge("nri_cdi_connected", "1 while connected to the runtime",
                                registry=r)
        self._registry = {name: Gauge(f"nri_cdi_registry_{name}", text, registry=r)
                          for name, text in REGISTRY_FIGURES.items()}
        self._counters = counters
        r.register(_CountersCollector(counters))
        self._lock = threading.Lock()
        self._state: dict[str, Any] = {"connected": False, "runtime": None, "registry": None}
        for outcome in OUTCOMES:  # present from the start, so rate() works at once
            self._injections.labels(outcome)

    # --- calls from the plugin ----------------------------------------------------------------

    def injection(self, outcome: str, seconds: float) -> None:
        self._injections.labels(outcome).inc()
        self._latency.observe(seconds)

    def denial(self, rule: str) -> None:
        self._denials.labels(rule).inc()

    def registry(self, snapshot: Any) -> None:
        """A new registry snapshot (``cdi.cache.Snapshot``) was swapped in."""
        figures = {"devices": len(snapshot.devices), "specs": len(snapshot.specs),
                   "file_errors": len(snapshot.errors), "generation": snapshot.generation}
        for name, value in figures.items():
            self._registry[name].set(value)
        with self._lock:
            self._state["registry"] = figures

    def connected(self, runtime: str) -> None:
        """Configure arrived: connected (again) to ``runtime``."""
        with self._lock:
            again = self._state["runtime"] is not None
            self._state.update(connected=True, runtime=runtime)
        if again:
            self._reconnects.inc()
        self._connected.set(1)

    def disconnected(self) -> None:
        with self._lock:
            self._state["connected"] = False
        self._connected.set(0)

    # --- reading ------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        with self._lock:
            state = dict(self._state)
        state["status"] = "ok" if state["connected"] else "disconnected"
        state["counters"] = dataclasses.asdict(self._counters)
        return state

    def serve(self, address: str) -> Server:
        server = Server(parse_address(address), _Handler)
        server.metrics = self
        threading.Thread(target=server.serve_forever, name="nri-cdi-metrics",
                         daemon=True).start()
        return server


# The plugin's counters (``Counters``) as Prometheus counters: one set of counters, bumped
# where things happen and read here at each scrape.
COUNTER_HELP = {
    "injected": "CreateContainer requests answered with devices",
    "refused": "CreateContainer requests refused (policy, requirements, bad request)",
    "delegation_failed": "containers whose devices the runtime's own CDI failed to inject",
    "unserved_found": "containers found created without their devices while the plugin "
                      "was away (fail-closed)",
    "unserved_reported": "such containers only reported (failClosed.action: report)",
    "unserved_evicted": "such containers stopped, or their start refused (failClosed.action: "
                        "evict)",
    "gids_dropped": "containers given their devices without the spec's additionalGids",
}


class _CountersCollector:
    def __init__(self, counters: Counters) -> None:
        self._counters = counters

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        for name, value in dataclasses.asdict(self._counters).items():
            yield CounterMetricFamily(f"nri_cdi_{name}", COUNTER_HELP.get(name, name),
                                      value=value)


class Server(ThreadingHTTPServer):
    """The endpoints of ``metrics``, each request answered in a thread of its own."""

    daemon_threads = True
    metrics: Metrics

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def close(self) -> None:
        self.shutdown()  # returns once serve_forever has
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: Server

    def do_GET(self) -> None:
        path, metrics = self.path.split("?", 1)[0], self.server.metrics
        if path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest  # by Metrics()

            self._reply(200, generate_latest(metrics.registry_), CONTENT_TYPE_LATEST)
        elif path in ("/healthz", "/livez"):
            health = metrics.health()
            ok = path == "/livez" or health["connected"]
            self._reply(200 if ok else 503, json.dumps(health).encode() + b"\n",
                        "application/json")
        else:
            self._reply(404, b"not found: try /metrics, /healthz or /livez\n", "text/plain")

    def _reply(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes every few seconds would drown the plugin's own log
