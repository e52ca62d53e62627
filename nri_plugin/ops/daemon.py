"""``nri-cdi plugin``: the NRI plugin daemon, the composition root: the spec cache kept
fresh by a background refresher, the injector, its start guard and metrics, and the stubs
that talk NRI (docs/developer/architecture.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from cdi.cache import Snapshot, SpecCache
from cdi.errors import printable
from cdi.watch import AutoRefresh, Timing
from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.second_connection import SecondConnection
from nri_plugin.nri.stub import Callback, CloseCallback, Stub, StubOptions, plugin_identity
from nri_plugin.nri.versions import PLUGIN_IDX_ENV, PLUGIN_NAME_ENV, PLUGIN_SOCKET_ENV
from nri_plugin.ops.logformat import BoundedLog, log_to
from nri_plugin.ops.logwriter import NonBlockingHandler
from nri_plugin.ops.metrics import Metrics, Server
from nri_plugin.ops.podresources import PodResourcesWatch
from nri_plugin.ops.policy_reload import PolicyReloader
from nri_plugin.ops.runtime_cdi import runtime_cdi_config, start_warning
from nri_plugin.ops.settings import (
    Settings,
    add_config_argument,
    add_setting_flags,
    command_settings,
    parse_address,
    settings_from_args,
)
from nri_plugin.ops.status import LAUNCHED_SOCKET, StatusFile, set_ready
from nri_plugin.plugins.cdi_injector.asked import OnHit, OnMiss
from nri_plugin.plugins.cdi_injector.injector import CdiInjector, Counters, Wiring
from nri_plugin.plugins.cdi_injector.policy import Policy, PolicyError, load_policy, parse_policy
from nri_plugin.plugins.cdi_injector.startguard import (
    FAILCLOSED_LOGGER,
    GuardConnection,
    GuardSettings,
    StartGuard,
)
from nri_plugin.plugins.cdi_injector.vendor import Registry, RegistryHolder, VendorRules
from nri_plugin.vendors.nvidia.rules import NvidiaRules

# Only ``nri-cdi plugin`` imports this module (nri_plugin/ops/cli.py imports a subcommand's
# module when it is chosen), so everything the daemon runs on is imported here, at the top.
log = logging.getLogger("nri_cdi")


def add_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plugin", help="run the NRI plugin that injects CDI devices",
        description="The NRI plugin that injects CDI devices into containers. "
                    "Documentation: docs/usage/ (policy: docs/usage/policy.md).")
    add_config_argument(parser)
    add_setting_flags(parser, "plugin.socket", "plugin.name", "plugin.index",
                      "plugin.spec_dirs", "plugin.rescan_interval", "plugin.status_dir",
                      "plugin.ready_file",
                      "plugin.pod_resources_socket", "plugin.pod_resources_interval",
                      "log.level", "log.format", "metrics.address",
                      "runtime_cdi.containerd_config", "runtime_cdi.enabled")
    parser.add_argument("--policy", metavar="FILE",
                        help="authorization policy (YAML; docs/usage/policy.md); default: "
                             "the config file's policy section, else the built-in secure "
                             "defaults")
    parser.set_defaults(func=cmd_plugin)


def cmd_plugin(args: argparse.Namespace) -> int:
    settings = command_settings(args, "plugin")
    if settings is None:
        return 2
    output = NonBlockingHandler(sys.stderr.fileno())
    # Bounded lines, repeats rate-limited; but fail-closed names every container it acts on.
    output.addFilter(BoundedLog(unlimited=(FAILCLOSED_LOGGER,)))
    log_to(output, settings.log.level, settings.log.format)
    try:
        # The vendors whose rules the plugin applies (and whose request sources and
        # default denials its policy knows).
        vendors: tuple[VendorRules, ...] = (NvidiaRules(),)
        policy = _load_policy(args.policy, settings, vendors)
        if policy is None:
            return 2
        return asyncio.run(serve(args, policy, settings, vendors))
    finally:
        output.close()


def _identity(args: argparse.Namespace, settings: Settings) -> tuple[str | None, str | None]:
    """Flags win; then the runtime's NRI_PLUGIN_* (the Stub reads those); then the config."""
    name = getattr(args, "plugin.name") or (
        None if PLUGIN_NAME_ENV in os.environ else settings.plugin.name)
    idx = getattr(args, "plugin.index") or (
        None if PLUGIN_IDX_ENV in os.environ else settings.plugin.index)
    return name, idx


def _load_policy(path: str | None, settings: Settings,
                 vendors: Sequence[VendorRules]) -> Policy | None:
    """The policy from ``path``, else the config file's ``policy`` section, else the
    built-in defaults; None after logging every problem."""
    try:
        policy = (load_policy(path, vendors) if path is not None
                  else _config_policy(settings, vendors))
    except PolicyError as exc:
        log.error("%s", exc)
        where = f"{settings.source} (policy section)" if path is None else path
        for problem in exc.problems:
            log.error("policy %s: %s", where, problem)
        return None
    log.info("policy loaded from %s", policy.origin)
    return policy


def _config_policy(settings: Settings, vendors: Sequence[VendorRules]) -> Policy:
    if not settings.policy:
        return Policy.defaults(vendors)
    return parse_policy(dict(settings.policy), origin=f"{settings.source} (policy section)",
                        vendors=vendors)


async def serve(args: argparse.Namespace, policy: Policy, settings: Settings,
                vendors: tuple[VendorRules, ...]) -> int:
    """The composition root: every part built once, by its constructor, in order."""
    loop = asyncio.get_running_loop()
    plugin_settings = settings.plugin
    cache = SpecCache(plugin_settings.spec_dirs,
                      permissions=plugin_settings.spec_permissions)
    # The registry the injector reads: each new snapshot with the vendors' facts (NVIDIA:
    # the sidecars) loaded for it, swapped in together by the refresher thread.
    registry = RegistryHolder(vendors)
    injector_counters = Counters()
    address = settings.metrics.address  # metrics are off by default
    metrics = Metrics(injector_counters) if address else None
    refresher = AutoRefresh(cache, Timing(rescan_interval=plugin_settings.rescan_interval),
                            on_refresh=_Refreshed(registry, metrics)).start()
    # Who holds which device, by the kubelet: a device asked for past the scheduler must
    # not be another pod's (off where the setting is "").
    allocations = (PodResourcesWatch(plugin_settings.pod_resources_socket,
                                     plugin_settings.pod_resources_interval).start()
                   if plugin_settings.pod_resources_socket else None)
    injector = CdiInjector(registry.get, vendors=vendors, policy=policy, wiring=Wiring(
        runtime_cdi=runtime_cdi_config(settings),
        counters=injector_counters,
        on_miss=miss_reader(refresher, registry),
        on_hit=removals_applied(refresher, registry),
        on_start_warning=start_warning,
        after_reply=loop.call_soon,
        allocations=allocations.current if allocations else None,
        metrics=metrics))
    # Launched by the runtime, we have one connection (its fd): the guard rides on it.
    # Otherwise its checks get a connection of their own, open only while needed.
    launched = PLUGIN_SOCKET_ENV in os.environ
    # The start guard checks every container whose creation did not pass through us
    # (fail-closed); it wraps the injector. What Synchronize finds is stopped after its
    # reply (the runtime holds its lock until it has it).
    guard = StartGuard(injector, GuardSettings(own_connection=not launched),
                       defer=loop.call_soon)
    name, idx = _identity(args, settings)
    # For nri-cdi doctor: connected to which runtime, since when (nri_plugin/ops/status.py).
    own_name, own_index = plugin_identity(name, idx, os.environ, sys.argv[0])  # the Stub's
    # The node's status file and metrics address are the plugin's that holds the status
    # lock: during an upgrade's overlap, the older one's until it ends.
    endpoint = _MetricsEndpoint(metrics, address)
    status = StatusFile(plugin_settings.status_dir, name=own_name, index=own_index,
                        socket=LAUNCHED_SOCKET if launched else plugin_settings.socket
                        ).start(on_owner=endpoint.open)
    ready_file = plugin_settings.ready_file
    set_ready(ready_file, False)  # one a killed predecessor in this pod left

    def connected(stub: Stub) -> None:
        status.connected(stub.configuration)
        set_ready(ready_file, True)

    def on_close(stub: Stub, error: BaseException | None) -> None:
        set_ready(ready_file, False)
        status.disconnected(error)
        if metrics is not None:
            metrics.disconnected()

    def make_stub(plugin: Plugin, plugin_name: str | None, closed: CloseCallback | None,
                  before_connect: Callback | None) -> Stub:
        # The guard's connection logs under a logger of its own.
        is_main = not isinstance(plugin, GuardConnection)
        logger = logging.getLogger("nri_plugin.nri.stub" + ("" if is_main else ".guard"))
        return Stub(plugin, StubOptions(
                    name=plugin_name, idx=idx, socket_path=plugin_settings.socket,
                    # Registered, then synchronized: NRI 0.6 (containerd 1.7) sends no
                    # Synchronize to a plugin it launched at its own start.
                    on_connected=connected if is_main else None,
                    on_synchronized=connected if is_main else None,
                    on_close=closed, before_connect=before_connect, logger=logger))

    runner: Stub | SecondConnection = (
        make_stub(guard, name, on_close, None) if launched
        else SecondConnection(guard, guard, make_stub, name, on_close))
    log.info("plugin %s-%s starting; spec dirs %s; policy %s; vendors %s", own_index,
             own_name, ", ".join(cache.spec_dirs), policy.origin,
             ", ".join(f"{v.name} (hooks: {', '.join(v.hooks) or 'none'})" for v in vendors)
             or "none")
    reloader = _policy_reloader(args, settings, injector).start(loop)
    try:
        await _run(runner)
    finally:
        set_ready(ready_file, False)
        reloader.stop(loop)
        endpoint.close()  # before the lock goes: a successor binds the address at once
        status.stopped()
        refresher.stop()
        if allocations is not None:
            allocations.stop()
    log.info("plugin stopped")
    return 0


async def _run(stub: Stub | SecondConnection) -> None:
    """Serve until SIGTERM or SIGINT."""
    task = asyncio.ensure_future(stub.run())

    def shutdown() -> None:
        log.info("shutting down")
        stub.stop()
        task.cancel()  # also ends a reconnect back-off sleep at once

    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, shutdown)
    with contextlib.suppress(asyncio.CancelledError):  # our own shutdown
        await task


BIND_RETRY_S = 0.1
BIND_ATTEMPTS = 50  # a predecessor's exit closes its socket and lock in no set order


class _MetricsEndpoint:
    """The metrics and health server, opened when this plugin owns the node's status lock
    (at once where there is no other plugin, or when the older one ends)."""

    def __init__(self, metrics: Metrics | None, address: str) -> None:
        self._metrics, self._address = metrics, address
        self._server: Server | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()  # open() runs on the status lock's thread

    def open(self) -> None:
        if self._metrics is None:
            return
        for attempt in range(BIND_ATTEMPTS):
            try:
                server = self._metrics.serve(self._address)
                break
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or attempt == BIND_ATTEMPTS - 1:
                    log.error("metrics and health: cannot listen on %s: %s", self._address,
                              exc.strerror or exc)
                    return
            if self._closed.wait(BIND_RETRY_S):
                return
        with self._lock:
            if self._closed.is_set():
                server.close()
                return
            self._server = server
        log.info("metrics and health on http://%s:%d/metrics",
                 parse_address(self._address)[0], server.port)

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            server, self._server = self._server, None
        if server is not None:
            server.close()


class _Refreshed:
    """The refresher's callback: swap the registry in, log it, tell the metrics."""

    def __init__(self, registry: RegistryHolder, metrics: Metrics | None) -> None:
        self._registry = registry
        self._metrics = metrics
        self._swap = threading.Lock()
        self._errors: Mapping[str, tuple[str, ...]] = {}
        self._warnings: Mapping[str, tuple[str, ...]] = {}

    def __call__(self, snapshot: Snapshot) -> None:
        # Two threads refresh (the watcher; a container's miss): never an older one last.
        with self._swap:
            if snapshot.generation <= self._registry.get().snapshot.generation:
                return
            self._registry.update(snapshot)
        self._log(snapshot)
        if self._metrics is not None:
            self._metrics.registry(snapshot)

    def _log(self, snapshot: Snapshot) -> None:
        """One line per refresh; every spec-file error again when the set of errors
        changes; a path's warnings when they change."""
        log.info("CDI registry generation %d: %d devices from %d specs, %d files with "
                 "errors", snapshot.generation, len(snapshot.devices), len(snapshot.specs),
                 len(snapshot.errors))
        if dict(snapshot.errors) != dict(self._errors):
            for path, messages in sorted(snapshot.errors.items()):
                for message in messages:
                    log.warning("%s: %s", printable(path), printable(message))
        for path, messages in sorted(snapshot.warnings.items()):
            if self._warnings.get(path) != messages:
                for message in messages:
                    log.warning("%s: %s", printable(path), message)
        self._errors, self._warnings = snapshot.errors, snapshot.warnings


MISS_TIMEOUT_S = 1.0  # of the runtime's 2 s for a CreateContainer


def miss_reader(refresher: AutoRefresh, registry: RegistryHolder) -> OnMiss:
    """The injector's ``on_miss``: a bounded re-read of the spec folders (or a wait for
    the refresh under way), then the registry with it."""
    def on_miss(names: Sequence[str]) -> Registry:
        started = time.monotonic()
        snapshot = refresher.refresh_now(MISS_TIMEOUT_S)
        log.info("devices %s not in the registry: spec folders read again in %.0f ms%s",
                 ",".join(names), (time.monotonic() - started) * 1000,
                 "" if snapshot is not None else " (a refresh under way did not finish)")
        return registry.get()
    return on_miss


def removals_applied(refresher: AutoRefresh, registry: RegistryHolder) -> OnHit:
    """The injector's ``on_hit``: where a spec file was removed and the registry does not
    show it yet, wait (bounded) until it does, so a deleted claim never serves."""
    def on_hit() -> Registry | None:
        if not refresher.removals_pending():
            return None
        if not refresher.wait_removals(MISS_TIMEOUT_S):
            log.warning("a spec removal was not applied within %.1f s; using the registry "
                        "as it is", MISS_TIMEOUT_S)
        return registry.get()
    return on_hit


def _policy_reloader(args: argparse.Namespace, settings: Settings,
                     injector: CdiInjector) -> PolicyReloader:
    """Watches the policy's file (``--policy``, else the config file, whose ``policy``
    section it is) and swaps a new valid policy into ``injector``; SIGHUP forces a
    reload."""
    vendors, path = injector.vendors, args.policy
    if path is not None:
        return PolicyReloader(path, lambda: load_policy(path, vendors), injector.set_policy)
    source = settings.source
    return PolicyReloader(source if os.path.isfile(source) else None,
                          lambda: _config_policy(settings_from_args(args), vendors),
                          injector.set_policy)
