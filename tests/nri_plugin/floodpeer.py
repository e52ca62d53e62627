"""A real ``nri-cdi plugin`` process against the test runtime peer, for floods and RSS.

The test listens on a unix socket as the runtime; the plugin (a subprocess, as deployed)
connects to it. RSS comes from /proc/PID/status (VmRSS). Shared by tests and bench.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from nri_plugin.nri.api import nri_pb2
from tests.nri_runtime_peer import RuntimePeer

REPO = Path(__file__).resolve().parents[2]
KIND = "flood.example/gpu"
# 40 env entries per device: each reply is ~2 KB, so unread replies pile up quickly.
SPEC = (f"cdiVersion: 0.5.0\nkind: {KIND}\ndevices:\n- name: \"0\"\n  containerEdits:\n"
        "    env: [" + ", ".join(f"FLOOD_{i}={'x' * 40}" for i in range(40)) + "]\n")


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


class FloodedPlugin:
    """Serve as the runtime on ``folder/nri.sock``; ``start()`` launches the plugin."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.socket = str(folder / "nri.sock")
        (folder / "cdi").mkdir(exist_ok=True)
        (folder / "cdi" / "flood.yaml").write_text(SPEC)
        self.log_path = folder / "plugin.log"
        self.peers: asyncio.Queue[RuntimePeer] = asyncio.Queue()
        self.process: subprocess.Popen[bytes] | None = None
        self.server: asyncio.AbstractServer | None = None
        self.guards: list[RuntimePeer] = []

    async def start(self) -> RuntimePeer:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self.peers.put(RuntimePeer(reader, writer))

        self.server = await asyncio.start_unix_server(accept, path=self.socket, limit=1 << 16)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "nri_plugin.ops.cli", "plugin", "--socket", self.socket,
                 "--spec-dir", str(self.folder / "cdi"), "--rescan-interval", "3600",
                 "--log-level", "info"],
                stdout=log, stderr=log, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        return await self.connection()

    async def connection(self, timeout: float = 120.0) -> RuntimePeer:
        """The injector's next connection, handshake done. The start guard's connection,
        which comes first (nri_plugin/ops/guarded.py), is answered and kept in
        ``guards``."""
        while True:
            peer = await asyncio.wait_for(self.peers.get(), timeout)
            registered, _ = await peer.handshake()
            if not registered.plugin_name.endswith("-guard"):
                return peer
            self.guards.append(peer)

    @property
    def rss_kib(self) -> int:
        assert self.process is not None
        return rss_kib(self.process.pid)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.server is not None:
            self.server.close()


def create(name: str, *, asks: str = "", **annotations: str) -> nri_pb2.CreateContainerRequest:
    if asks:
        annotations["cdi.k8s.io/dev"] = asks
    return nri_pb2.CreateContainerRequest(
        pod=nri_pb2.PodSandbox(id="p", name="pod", namespace="default"),
        container=nri_pb2.Container(id=f"id-{name[:50]}", pod_sandbox_id="p", name=name,
                                    annotations=annotations))
