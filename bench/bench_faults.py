"""The plugin under faults: reconnect time after containerd restarts, and RSS under floods.

(1) Reconnect: a private containerd (scripts/install-containerd.sh) is restarted N times
(default 24, SIGTERM and SIGKILL alternately) with some pods running. Two plugins are
connected in the same run: ours, and a baseline that reconnects the way the plugin used to
(0.5 s after a disconnect, then 1, 2, 4 ... s while the socket refuses). For each restart we
time from the new NRI socket appearing to each plugin's next registration (polled every
2 ms), and report median and max of each, with the ratio.

(2) Floods: a real plugin process against the test runtime peer (tests/nri_runtime_peer.py):
RSS (VmRSS) before, at the peak and after each flood.

Run as root: ``python3 bench/bench_faults.py [--restarts 24] [--skip-restarts]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nri_plugin.nri.api import nri_pb2
from tests.e2e import images, paths
from tests.e2e.containerd import Containerd
from tests.e2e.plugin import REPO, PluginProcess
from tests.nri_plugin.floodpeer import KIND, FloodedPlugin, create
from tests.nri_runtime_peer import PLUGIN_CONN, REQUEST, mux_frame, request_bytes, ttrpc_frame

LEGACY = """
import asyncio, logging, sys
from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.stub import Stub

class Noop(Plugin):
    def create_container(self, pod, container):
        return None

class Legacy(Stub):
    # What the plugin did before: 0.5 s after any disconnect, doubling while refused.
    async def run(self):
        backoff = 0.5
        while True:
            try:
                session = await self._connect()
            except OSError:
                pass
            else:
                if await self._serve(session):
                    backoff = 0.5
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
asyncio.run(Legacy(Noop(), name="legacy", idx="20", socket_path=sys.argv[1]).run())
"""


class Timeline(threading.Thread):
    """Polls the socket identity and the plugins' logs every 2 ms."""

    def __init__(self, socket_path: str, logs: dict[str, tuple[Path, str]]) -> None:
        super().__init__(daemon=True)
        self.socket_path, self.logs = socket_path, logs
        self.sockets: list[float] = []
        self.events: dict[str, list[float]] = {name: [] for name in logs}
        self.offsets = {name: path.stat().st_size for name, (path, _) in logs.items()}
        self.done = threading.Event()

    def run(self) -> None:
        last = None
        while not self.done.is_set():
            now = time.monotonic()
            try:
                st = os.stat(self.socket_path)
                ident: tuple[int, int] | None = (st.st_ino, st.st_ctime_ns)
            except FileNotFoundError:
                ident = None
            if ident is not None:
                if last is not None and ident != last:
                    self.sockets.append(now)
                last = ident
            for name, (path, marker) in self.logs.items():
                with open(path, "rb") as handle:
                    handle.seek(self.offsets[name])
                    data = handle.read()
                self.offsets[name] += len(data)
                self.events[name] += [now] * data.decode(errors="replace").count(marker)
            time.sleep(0.002)

    def delays(self, name: str) -> list[float]:
        return [min((e for e in self.events[name] if e >= s), default=float("inf")) - s
                for s in self.sockets]


def restarts(count: int, workdir: Path) -> None:
    specs = workdir / "cdi"
    specs.mkdir()
    (specs / "b.yaml").write_text(f"cdiVersion: 0.5.0\nkind: {KIND}\ndevices:\n- name: '0'\n"
                                  "  containerEdits: {env: [B=1]}\n")
    archives = [images.pause_image(workdir), images.busybox_image(workdir)]
    ctrd = Containerd().start()
    ours = legacy = None
    try:
        ctrd.import_images(*archives)
        with ctrd.cri() as cri:
            for i in range(10):  # containerd reloads these on every restart
                pod = cri.run_pod(f"bench{i}", annotations={"cdi.k8s.io/x": f"{KIND}=0"})
                cri.run_container(pod, "c", images.BUSYBOX_IMAGE, command=["sleep", "600"])
        ours = PluginProcess(ctrd.nri_socket, [specs], workdir / "ours.log").start(timeout=60)
        legacy_log = workdir / "legacy.log"
        with open(legacy_log, "ab") as log:
            legacy = subprocess.Popen([sys.executable, "-c", LEGACY, ctrd.nri_socket],
                                      stdout=log, stderr=log, cwd=REPO,
                                      env={**os.environ, "PYTHONPATH": str(REPO)})
        time.sleep(2)
        timeline = Timeline(ctrd.nri_socket, {
            "ours": (ours.log_path, "connected to containerd"),
            "legacy (0.5 s, doubling)": (legacy_log, "registered as 20-legacy")})
        timeline.start()
        outages = []
        for i in range(count):
            stopped = time.monotonic()
            if i % 2:
                ctrd.kill_daemon()
                ctrd.start()
            else:
                ctrd.restart()
            outages.append(time.monotonic() - stopped)
            time.sleep(4.5)  # both plugins back (the legacy one may wait up to 4 s)
        timeline.done.set()
        timeline.join()
        print(f"(1) {count} containerd restarts (SIGTERM/SIGKILL alternately, 10 pods), "
              f"from the new NRI socket to the plugin registered:")
        print(f"    containerd itself: stop to CRI ready median "
              f"{statistics.median(outages) * 1e3:.0f} ms")
        results = {}
        for name in timeline.events:
            d = timeline.delays(name)
            results[name] = d
            print(f"    {name:26s} median {statistics.median(d) * 1e3:7.0f} ms, max "
                  f"{max(d) * 1e3:7.0f} ms, over 1 s: {sum(x > 1 for x in d)}/{len(d)}")
        a, b = (statistics.median(v) for v in results.values())
        print(f"    median ratio legacy/ours: {b / a:.1f}x")
    finally:
        if legacy is not None:
            legacy.kill()
            legacy.wait()
        if ours is not None:
            ours.kill()
        ctrd.close()


async def floods(workdir: Path) -> None:
    flooded = FloodedPlugin(workdir)
    peer = await flooded.start()
    print("(2) plugin RSS (MiB) under floods from the test runtime peer: before / peak / after")

    async def measure(name: str, flood: object) -> None:
        before, peak = flooded.rss_kib, 0
        task = asyncio.ensure_future(flood)  # type: ignore[arg-type]
        while not task.done():
            peak = max(peak, flooded.rss_kib)
            await asyncio.sleep(0.05)
        await task
        peak = max(peak, flooded.rss_kib)
        print(f"    {name:52s} {before / 1024:6.1f} {peak / 1024:6.1f} "
              f"{flooded.rss_kib / 1024:6.1f}")

    async def refusals() -> None:
        unknown = ",".join(f"{KIND}=u{i}" for i in range(60000))
        for _ in range(3):
            await peer.response_to(peer.send_request("CreateContainer",
                                                     create("c", asks=unknown)))

    async def service_name() -> None:
        stream = peer.next_stream
        peer.next_stream += 2
        peer.write(mux_frame(PLUGIN_CONN, ttrpc_frame(
            stream, REQUEST, request_bytes("s" * 4_000_000, "CreateContainer"))))
        await peer.response_to(stream)

    async def pages() -> None:
        containers = [nri_pb2.Container(id=f"c{i}", name=f"c{i}",
                                        env=[f"E{j}={'v' * 60}" for j in range(10)])
                      for i in range(1200)]
        page = nri_pb2.SynchronizeRequest(containers=containers, more=True)
        for _ in range(120):
            await peer.call("Synchronize", page, nri_pb2.SynchronizeResponse)
        await peer.call("Synchronize", nri_pb2.SynchronizeRequest(), nri_pb2.SynchronizeResponse)

    async def never_reads() -> None:
        nonlocal peer
        request = create("c", asks=f"{KIND}=0")
        for _ in range(40000):
            peer.send_request("CreateContainer", request)
        peer = await flooded.connection(timeout=60)  # it drops us after the stall timeout

    try:
        await measure("3 refusals naming 60,000 unknown devices (1.3 MB)", refusals())
        await measure("a 4 MB service name", service_name())
        await measure("120 Synchronize pages more=true, ~1 MB each", pages())
        await measure("40,000 CreateContainer, peer never reads", never_reads())
        print(f"    plugin log after all floods: {flooded.log_size() / 1024:.0f} KiB")
    finally:
        flooded.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=24)
    parser.add_argument("--skip-restarts", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        if not args.skip_restarts:
            missing = paths.missing_prerequisites()
            if missing:
                print(f"skipping (1): {'; '.join(missing)}")
            else:
                (Path(tmp) / "r").mkdir()
                restarts(args.restarts, Path(tmp) / "r")
        (Path(tmp) / "f").mkdir()
        asyncio.run(floods(Path(tmp) / "f"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
