"""``nri-cdi plugin`` as a process next to a private containerd (its log kept in a file)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from nri_cdi_testbed.node_check.paths import REPO
from nri_cdi_testbed.waiting import DEFAULT_TIMEOUT, wait_until


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The plugin's environment: the checkout first on PYTHONPATH, then whatever the caller's
    interpreter was given (a node whose dependencies sit on PYTHONPATH keeps them)."""
    path = os.pathsep.join(filter(None, (str(REPO), environ.get("PYTHONPATH"))))
    return {**environ, "PYTHONPATH": path}


# Every plugin spawned and not yet known to have ended, so that a failing test's report
# can show their logs (tests/e2e/conftest.py prunes the ended ones between tests).
SPAWNED: list[PluginProcess] = []


# The pod annotation sources, as a policy file's ``sources`` names them.
ANNOTATION_SOURCES = ("podAnnotations", "nriPluginsAnnotations", "nvidiaNriAnnotations")


def annotation_policy(namespaces: Sequence[str], policy: str = "") -> str:
    """``policy`` (a policy document, YAML) with pods in ``namespaces`` let ask by every
    annotation source whose namespaces it does not set itself."""
    doc = yaml.safe_load(policy) or {}
    sources = doc.setdefault("sources", {})
    for source in ANNOTATION_SOURCES:
        sources.setdefault(source, {}).setdefault("namespaces", list(namespaces))
    return str(yaml.safe_dump(doc, sort_keys=False))


class PluginProcess:
    """``nri-cdi plugin`` connected to a containerd's NRI socket; log kept in a file.

    Its pods ask by annotation (the private containerd is the harness's alone): without a
    ``--policy`` or ``--config`` of the caller's, the plugin gets a policy that lets
    pods of ``annotation_namespaces`` do so, written next to its log."""

    def __init__(self, nri_socket: str, spec_dirs: Sequence[Path], log_path: Path,
                 extra_args: Sequence[str] = (), *,
                 annotation_namespaces: Sequence[str] = ("*",)) -> None:
        self.nri_socket = nri_socket
        self.spec_dirs = list(spec_dirs)
        self.log_path = log_path
        self.extra_args = list(extra_args)
        self.annotation_namespaces = tuple(annotation_namespaces)
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        args = [sys.executable, "-m", "nri_plugin.ops.cli", "plugin", "--socket", self.nri_socket,
                "--rescan-interval", "3600", *self.extra_args]
        # No --containerd-config: the plugin finds the private containerd's config itself
        # (the running containerd serving its socket), as on a node.
        if "--config" not in self.extra_args and "--log-level" not in self.extra_args:
            args += ["--log-level", "debug"]
        if "--status-dir" not in self.extra_args:  # not the host's /run/nri-cdi
            args += ["--status-dir", str(self.status_dir)]
        if "--policy" not in self.extra_args and "--config" not in self.extra_args:
            args += ["--policy", str(self.policy_path)]
        for folder in self.spec_dirs:
            args += ["--spec-dir", str(folder)]
        return args

    @property
    def status_dir(self) -> Path:
        """Where this plugin keeps its status file (next to its log)."""
        return self.log_path.with_name(self.log_path.name + ".status")

    @property
    def policy_path(self) -> Path:
        """The policy the harness gives the plugin when the caller gives none."""
        return self.log_path.with_name(self.log_path.name + ".policy.yaml")

    def start(self, timeout: float = DEFAULT_TIMEOUT) -> PluginProcess:
        mark = self.log_size()
        self.spawn()
        self.wait_for_log("connected to containerd", timeout, after=mark)
        return self

    def spawn(self) -> PluginProcess:
        """Start the process without waiting for it to connect."""
        self.policy_path.write_text(annotation_policy(self.annotation_namespaces))
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=log,
                                        env=child_env(os.environ), cwd=REPO)
        log.close()
        SPAWNED.append(self)
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log(self, after: int = 0) -> str:
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as handle:
            handle.seek(after)
            return handle.read().decode(errors="replace")

    def wait_for_log(self, text: str, timeout: float = DEFAULT_TIMEOUT, *,
                     after: int = 0) -> str:
        """Until the log (from offset ``after``) says ``text``; returns that part of the
        log. Raises at once if the plugin exits first, WaitTimeout (with the log's tail)
        if the bound passes."""
        def said() -> str:
            part = self.log(after)
            if text in part:
                return part
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"plugin exited ({self.process.returncode}) before its log "
                                   f"said {text!r}:\n{self.log()[-3000:]}")
            return ""

        return wait_until(said, f"the plugin's log to say {text!r}", timeout=timeout,
                          seen=lambda: self.log(after)[-3000:] or "(nothing logged)")

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def terminate(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=10)
