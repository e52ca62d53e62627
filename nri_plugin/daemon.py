"""``nri-cdi plugin``: the NRI plugin daemon.

Wires the pieces: a SpecCache kept fresh by a background refresher (inotify + periodic
rescan), the CdiInjector plugin reading only the current snapshot, and the Stub that
talks NRI. Logging goes through a queue so that a log call on the CreateContainer path
never waits on stderr or journald.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from cdi.dirs import DEFAULT_SPEC_DIRS

if TYPE_CHECKING:
    import asyncio
    import logging.handlers

    from .stub import Stub

# asyncio, the stub and the registry are imported when the daemon starts, not when the
# nri-cdi command builds its parser: other subcommands (generate, hooks) start faster.
DEFAULT_SOCKET_PATH = "/var/run/nri/nri.sock"
DEFAULT_NAME = "nri-cdi"
DEFAULT_INDEX = "10"
log = logging.getLogger("nri_cdi")


def add_command(subparsers: Any) -> None:
    parser = subparsers.add_parser("plugin", help="run the NRI plugin that injects CDI devices")
    parser.add_argument("--socket", default=DEFAULT_SOCKET_PATH,
                        help=f"NRI socket of the runtime (default {DEFAULT_SOCKET_PATH}); "
                             "ignored when the runtime launched us (NRI_PLUGIN_SOCKET)")
    parser.add_argument("--name", help=f"plugin name (default: NRI_PLUGIN_NAME or {DEFAULT_NAME})")
    parser.add_argument("--idx", help=f"plugin index, two digits (default: NRI_PLUGIN_IDX or "
                                      f"{DEFAULT_INDEX})")
    parser.add_argument("--spec-dir", dest="spec_dirs", action="append", metavar="DIR",
                        help="CDI spec directory; repeat for several, later ones win "
                             f"(default: {' then '.join(DEFAULT_SPEC_DIRS)})")
    parser.add_argument("--rescan-interval", type=float, default=60.0, metavar="SECONDS",
                        help="full rescan of the spec directories besides inotify (default 60)")
    parser.add_argument("--policy", metavar="FILE",
                        help="authorization policy (YAML; see README 'Policy, requirements "
                             "and fail-closed'); default: the built-in secure defaults")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=cmd_plugin)


def cmd_plugin(args: argparse.Namespace) -> int:
    import asyncio

    listener = _setup_logging(args.log_level)
    try:
        policy = _load_policy(args.policy)
        if policy is None:
            return 2
        return asyncio.run(serve(args, policy))
    finally:
        listener.stop()


def _setup_logging(level: str) -> logging.handlers.QueueListener:
    import logging.handlers
    import queue

    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [logging.handlers.QueueHandler(records)]
    root.setLevel(level.upper())
    listener = logging.handlers.QueueListener(records, handler)
    listener.start()
    return listener


def _identity(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """Flags win; then the runtime's NRI_PLUGIN_* (the Stub reads those); then defaults."""
    launched = "NRI_PLUGIN_NAME" in os.environ
    name = args.name or (None if launched else DEFAULT_NAME)
    idx = args.idx or (None if "NRI_PLUGIN_IDX" in os.environ else DEFAULT_INDEX)
    return name, idx


def _load_policy(path: str | None) -> Any:
    """The policy from ``path`` (None: built-in defaults); None after logging an error."""
    from .policy import Policy, PolicyError, load_policy

    if path is None:
        return Policy()
    try:
        policy = load_policy(path)
    except PolicyError as exc:
        log.error("%s", exc)
        for problem in exc.problems:
            log.error("policy %s: %s", path, problem)
        return None
    log.info("policy loaded from %s", path)
    return policy


async def serve(args: argparse.Namespace, policy: Any = None) -> int:
    import asyncio
    import signal

    from cdi.cache import SpecCache
    from cdi.watch import AutoRefresh

    from .failclosed import act
    from .injector import CdiInjector
    from .nodefacts import FactsHolder
    from .stub import Stub

    cache = SpecCache(args.spec_dirs)
    facts = FactsHolder(lambda: cache.snapshot)

    def refreshed(snapshot: Any) -> None:
        _log_refresh(snapshot)
        facts.reload(snapshot)  # sidecar metadata, loaded next to the specs

    refresher = AutoRefresh(cache, rescan_interval=args.rescan_interval,
                            on_refresh=refreshed).start()
    loop = asyncio.get_running_loop()
    plugin = CdiInjector(lambda: cache.snapshot, facts=facts.get, policy=policy)
    name, idx = _identity(args)
    stub = Stub(plugin, name=name, idx=idx, socket_path=args.socket)
    # Synchronize finds containers created while we were away; acting on them waits for
    # the Synchronize reply (the runtime holds its lock until then), hence a task.
    tasks: set[asyncio.Task[None]] = set()  # the loop keeps only weak references

    def on_unserved(unserved: Any) -> None:
        task = loop.create_task(act(stub, unserved, plugin.policy.fail_closed_action,
                                    plugin.counters))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    plugin.on_unserved = on_unserved
    log.info("plugin %s-%s starting; spec dirs %s; policy %s", stub.idx, stub.name,
             ", ".join(cache.spec_dirs), plugin.policy.origin)
    task = asyncio.ensure_future(stub.run())
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _shutdown, stub, task)
    try:
        await task
    except asyncio.CancelledError:
        pass
    finally:
        refresher.stop()
    log.info("plugin stopped")
    return 0


def _shutdown(stub: Stub, task: asyncio.Future[None]) -> None:
    log.info("shutting down")
    stub.stop()
    task.cancel()  # also ends a reconnect back-off sleep at once


_last_errors: dict[str, tuple[str, ...]] = {}


def _log_refresh(snapshot: Any) -> None:
    """One line per refresh, plus every spec-file error when the set of errors changes."""
    log.info("CDI registry generation %d: %d devices from %d specs, %d files with errors",
             snapshot.generation, len(snapshot.devices), len(snapshot.specs),
             len(snapshot.errors))
    errors = dict(snapshot.errors)
    if errors != _last_errors:
        for path, messages in sorted(errors.items()):
            for message in messages:
                log.warning("%s: %s", path, message)
        _last_errors.clear()
        _last_errors.update(errors)
