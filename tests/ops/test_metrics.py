"""Metrics object, its HTTP endpoints, and the JSON log format."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

from nri_plugin.ops.logformat import JsonFormatter, log_formatter
from nri_plugin.ops.metrics import Metrics
from nri_plugin.ops.settings import parse_address
from nri_plugin.plugins.cdi_injector.injector import Counters


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_counts_and_endpoints() -> None:
    counters = Counters()
    m = Metrics(counters)
    server = m.serve("127.0.0.1:0")
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert _get(base + "/healthz")[0] == 503  # not connected yet
        assert _get(base + "/livez")[0] == 200
        m.connected("containerd v1.7.30")
        m.injection("injected", 0.0003)
        m.injection("refused", 0.001)
        m.denial("namespace-allowlist")
        counters.unserved_evicted += 1  # fail-closed counts in the one set of counters
        counters.unserved_found += 3
        m.registry(SimpleNamespace(devices={"a": 1, "b": 2}, specs={"s": 1},
                                   errors={"bad.yaml": ("x",)}, generation=4))
        m.disconnected()
        m.connected("containerd v1.7.30")
        status, body = _get(base + "/healthz")
        health = json.loads(body)
        assert status == 200 and health["registry"]["devices"] == 2
        text = _get(base + "/metrics")[1]
        for line in ['nri_cdi_injections_total{outcome="injected"} 1.0',
                     'nri_cdi_injections_total{outcome="delegated"} 0.0',
                     'nri_cdi_denials_total{rule="namespace-allowlist"} 1.0',
                     "nri_cdi_unserved_evicted_total 1.0",
                     "nri_cdi_unserved_found_total 3.0", "nri_cdi_reconnects_total 1.0",
                     "nri_cdi_registry_file_errors 1.0", "nri_cdi_registry_generation 4.0",
                     'nri_cdi_injection_seconds_bucket{le="0.0005"} 1.0',
                     "nri_cdi_injection_seconds_count 2.0"]:
            assert line in text, line
        assert _get(base + "/nope")[0] == 404
    finally:
        server.close()


def test_health_shows_the_plugin_counters() -> None:
    counters = Counters()
    m = Metrics(counters)
    counters.injected += 2
    counters.unserved_evicted += 1
    health = m.health()
    assert health["counters"]["injected"] == 2 and health["counters"]["unserved_evicted"] == 1


def test_parse_address() -> None:
    assert parse_address(":9464") == ("0.0.0.0", 9464)
    assert parse_address("[::1]:80") == ("::1", 80)
    with pytest.raises(ValueError):
        parse_address("9464")


def test_json_log_lines() -> None:
    record = logging.LogRecord("nri_cdi", logging.WARNING, __file__, 1, "hello %s", ("x",),
                               None)
    entry = json.loads(JsonFormatter().format(record))
    assert entry["level"] == "warning" and entry["message"] == "hello x"
    assert entry["logger"] == "nri_cdi" and entry["time"].endswith("Z")
    assert not isinstance(log_formatter("text"), JsonFormatter)
