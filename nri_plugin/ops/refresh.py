"""``nri-cdi watch`` and ``nri-cdi refresh``: keep the generated spec in step with the node.

The watcher polls what a driver upgrade, a module reload, a MIG change or new device
majors change (procfs and sysfs send no inotify events), waits for ``settle``, and runs the
generator in a child process with ``--if-changed``, whose fingerprint decides whether
anything is written; what is watched and why: docs/usage/keeping-specs-current.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from cdi.nvidia.discover import Roots
from cdi.nvidia.options import OPTIONS
from cdi.nvidia.sidecar import read_sidecar
from nri_plugin.ops.logformat import log_to
from nri_plugin.ops.settings import (
    Settings,
    add_config_argument,
    add_setting_flags,
    command_settings,
    keys_of,
)

log = logging.getLogger("nri_cdi.refresh")

_LIBRARY_PREFIXES = ("libnvidia-ml.so", "libcuda.so")
_DEFAULT_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                     "/usr/lib", "/lib64")


# --- what the node looks like ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeState:
    """What the poll compares. Equal states mean: no reason to run the generator."""

    driver: tuple[Any, ...]
    mig: tuple[str, ...]
    devices: tuple[str, ...]

    def changes(self, other: NodeState) -> list[str]:
        """Human names of what differs, for the log."""
        names = {"driver": "driver", "mig": "MIG layout", "devices": "device majors"}
        return [names[f.name] for f in fields(self)
                if getattr(self, f.name) != getattr(other, f.name)]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _libraries(driver_root: Path, lib_dirs: Sequence[str]) -> tuple[Any, ...]:
    found = []
    for folder in lib_dirs:
        host = driver_root / folder.lstrip("/")
        try:
            names = sorted(n for n in os.listdir(host) if n.startswith(_LIBRARY_PREFIXES))
        except OSError:
            continue
        found += [(folder, name, _identity(host / name)) for name in names]
    return tuple(found)


def _tree(folder: Path) -> tuple[str, ...]:
    entries = []
    for top, dirs, _files in os.walk(folder):
        rel = os.path.relpath(top, folder)
        entries += [os.path.join(rel, d) for d in dirs]
    return tuple(sorted(entries))


def probe(roots: Roots, lib_dirs: Sequence[str]) -> NodeState:
    release = os.uname().release
    driver = (
        _read(roots.proc_path("driver/nvidia/version")),
        _inode(roots.dev / "sys/module/nvidia"),
        _identity(roots.dev / "lib/modules" / release / "modules.dep"),
        _libraries(roots.driver, lib_dirs),
    )
    mig = _tree(roots.proc_path("driver/nvidia/capabilities")) + tuple(
        "gpus/" + g for g in _tree(roots.proc_path("driver/nvidia/gpus")))
    majors = _read(roots.proc_path("devices")) or ""
    devices = tuple(line.strip() for line in majors.splitlines() if "nvidia" in line)
    return NodeState(driver=driver, mig=mig, devices=devices)


def probe_configured_node(settings: Settings) -> NodeState:
    """The node the ``generate`` section names, its libraries looked for in the folders
    the last spec's sidecar lists."""
    g = settings.generate
    roots = Roots(driver=Path(g.driver_root), dev=Path(g.dev_root or g.driver_root))
    dirs = read_sidecar(Path(g.output)).get("driver", {}).get("libraryDirs")
    listed = tuple(d for d in dirs if isinstance(d, str)) if isinstance(dirs, list) else ()
    return probe(roots, listed or _DEFAULT_LIB_DIRS)


# --- waiting for the driver ----------------------------------------------------------------


def driver_parts(settings: Settings) -> list[tuple[str, Callable[[], bool]]]:
    """What a driver container makes appear, each with a test that it is there: the kernel
    module's version file (under the dev root) and NVML's library (under the driver
    root), without which the generator finds no driver or an incomplete one."""
    # here: only a refresh that waits pays for the driver finder's imports
    from cdi.nvidia.discover import driver_version_from_proc
    from cdi.nvidia.driver import find_nvml_library

    g = settings.generate
    roots = Roots(driver=Path(g.driver_root), dev=Path(g.dev_root or g.driver_root))
    return [
        (f"{roots.proc_path('driver/nvidia/version')} (the kernel module)",
         lambda: driver_version_from_proc(roots) is not None),
        (f"libnvidia-ml.so.1 under {roots.driver} (the driver's libraries)",
         lambda: find_nvml_library(roots, None) is not None),
    ]


_NEVER_STOPPED = threading.Event()


def wait_for_driver(parts: Sequence[tuple[str, Callable[[], bool]]], bound: float, *,
                    poll: float = 1.0, clock: Callable[[], float] = time.monotonic,
                    wait: Callable[[float], bool] = _NEVER_STOPPED.wait) -> list[str]:
    """Look at ``parts`` every ``poll`` seconds, up to ``bound`` seconds, until each is
    there; log what is awaited at the start and each part as it appears. Returns the names
    of those still missing (empty: the driver is there). ``wait(seconds)`` returns True
    when asked to stop."""
    missing = [name for name, present in parts if not present()]
    if missing:
        log.info("waiting up to %gs for the NVIDIA driver: %s", bound, "; ".join(missing))
    start = clock()
    while missing:
        left = start + bound - clock()
        if left <= 0 or wait(min(poll, left)):
            return missing
        now = [name for name, present in parts if not present()]
        for name in missing:
            if name not in now:
                log.info("appeared after %.1fs: %s", clock() - start, name)
        if not now:
            log.info("NVIDIA driver ready after %.1fs", clock() - start)
        missing = now
    return []


# --- running the generator ---------------------------------------------------------------


def generator_args(settings: Settings) -> list[str]:
    """``nri-cdi generate`` flags for the ``generate`` section (always ``--if-changed``):
    each key's value with the flag of the option it sets, then ``extra_args``."""
    g = settings.generate
    args = ["--if-changed"]
    for name, key in keys_of("generate").items():
        value = getattr(g, name)
        if key.option is None or value is None:
            continue
        flag = OPTIONS[key.option].flags[0]
        for one in value if isinstance(value, tuple) else (value,):
            args += [flag, one]
    return args + list(g.extra_args)


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    ok: bool
    written: bool
    fingerprint: str | None
    message: str = ""


# The generator in an isolated interpreter (-I: no PYTHONPATH, no user site, not the
# current folder): the entry finds its own package from its path, its dependencies
# (PyYAML, nvidia-ml-py for --mode nvml) in the interpreter's site-packages.
GENERATOR_ENTRY = Path(__file__).resolve().parents[2] / "cdi" / "nvidia" / "__main__.py"


def run_generator_process(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", str(GENERATOR_ENTRY), *args],
                          capture_output=True, text=True, timeout=300, check=False)


def run_generator(settings: Settings, runner: Callable[
        [list[str]], subprocess.CompletedProcess[str]] = run_generator_process) -> Outcome:
    output = Path(settings.generate.output)
    before = _identity(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        done = runner(generator_args(settings))
    except (OSError, subprocess.SubprocessError) as exc:
        return Outcome(ok=False, written=False, fingerprint=None, message=str(exc))
    ok = done.returncode == 0
    return Outcome(ok=ok, written=ok and _identity(output) != before,
                   fingerprint=read_sidecar(output).get("fingerprint"),
                   message=done.stderr.strip())


# --- the watch loop ------------------------------------------------------------------------


class Watcher:
    """Poll the node; on a settled change (or every ``resync_interval``) run the generator.

    ``generate`` and ``probe_node`` are parameters so that tests can count runs."""

    def __init__(self, settings: Settings, *,
                 generate: Callable[[], Outcome] | None = None,
                 probe_node: Callable[[], NodeState] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._generate = generate or (lambda: run_generator(settings))
        self._probe = probe_node or (lambda: probe_configured_node(settings))
        self._clock = clock
        self._stop = threading.Event()
        self._state: NodeState | None = None
        self._next_resync = 0.0
        self._error: str | None = None  # the last run's failure: retried at the next poll

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        self.refresh("start")
        while not self._stop.wait(self.settings.watch.poll_interval):
            self.step()

    def step(self) -> None:
        state = self._probe()
        if state != self._state:
            state = self._settled(state)
            if self._stop.is_set():
                return
            reasons = state.changes(self._state) if self._state else ["start"]
            self._state = state
            self.refresh(" and ".join(reasons) + " changed")
        elif self._error is not None or self._clock() >= self._next_resync:
            self.refresh("periodic check" if self._error is None else "retry")

    def _settled(self, state: NodeState) -> NodeState:
        """Wait until the node stays the same for ``settle`` seconds (or stop is asked)."""
        while not self._stop.wait(self.settings.watch.settle):
            again = self._probe()
            if again == state:
                return state
            state = again
        return state

    def refresh(self, reason: str) -> Outcome:
        if self._state is None:
            self._state = self._probe()
        outcome = self._generate()
        self._next_resync = self._clock() + self.settings.watch.resync_interval
        if not outcome.ok:
            if outcome.message != self._error:  # once per error, not once a poll
                log.error("spec generation failed (%s): %s", reason, outcome.message)
        elif outcome.written:
            log.info("spec regenerated (%s): %s fingerprint %s", reason,
                     self.settings.generate.output, outcome.fingerprint)
        else:
            log.info("spec up to date (%s): fingerprint %s", reason, outcome.fingerprint)
        self._error = None if outcome.ok else outcome.message
        return outcome


# --- commands ------------------------------------------------------------------------------


def add_commands(subparsers: Any) -> None:
    watch = subparsers.add_parser(
        "watch", help="regenerate the NVIDIA spec when the driver or the MIG layout changes")
    _common(watch)
    add_setting_flags(watch, "watch.poll_interval", "watch.settle", "watch.resync_interval")
    watch.set_defaults(func=cmd_watch)
    refresh = subparsers.add_parser(
        "refresh", help="regenerate the NVIDIA spec once if the node changed (for boot)")
    _common(refresh)
    add_setting_flags(refresh, "watch.wait_for_driver")
    refresh.set_defaults(func=cmd_refresh)


def _common(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    add_setting_flags(parser, "generate.output", "generate.mode", "generate.driver_root",
                      "generate.dev_root", "log.level", "log.format")


def _setup(args: argparse.Namespace) -> Settings | None:
    settings = command_settings(args, args.command)
    if settings is None:
        return None
    log_to(logging.StreamHandler(sys.stderr), settings.log.level, settings.log.format)
    return settings


def cmd_refresh(args: argparse.Namespace) -> int:
    settings = _setup(args)
    if settings is None:
        return 2
    watcher = Watcher(settings)
    outcome = watcher.refresh("refresh")
    bound = settings.watch.wait_for_driver
    if outcome.ok or bound <= 0:
        return 0 if outcome.ok else 1
    # No driver yet (a driver container still starting): wait for what it makes appear,
    # then generate again.
    missing = wait_for_driver(driver_parts(settings), bound)
    if missing:
        log.error("no NVIDIA driver after waiting %gs (--wait-for-driver): never "
                  "appeared: %s", bound, "; ".join(missing))
        return 1
    return 0 if watcher.refresh("driver appeared").ok else 1


def cmd_watch(args: argparse.Namespace) -> int:
    settings = _setup(args)
    if settings is None:
        return 2
    watcher = Watcher(settings)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: watcher.stop())
    log.info("watching %s (poll %.1fs, settle %.1fs, resync %.0fs) for %s",
             settings.generate.driver_root, settings.watch.poll_interval,
             settings.watch.settle, settings.watch.resync_interval, settings.generate.output)
    watcher.run()
    log.info("watch stopped")
    return 0
