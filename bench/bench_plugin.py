"""NRI plugin costs, medians and tails, each next to a baseline from the same run.

(a) adjustment computation for an 8-GPU request (8 GPU nodes + 4 control nodes, 60
    library mounts, hooks, env): the pure ``plan_injection`` path, p50/p99, next to
    ``Snapshot.resolve`` alone (the registry part of it);
(b) CreateContainer round trip over a real Unix socket against the test runtime peer
    (raw frames in, raw frames out), p50/p99, next to an empty CreateContainer (a
    container that asks for nothing) over the same connection.

Run: ``python3 bench/bench_plugin.py``. (c), Create+Start on a real containerd, is
``bench/bench_containerd.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cdi.cache import Snapshot, SpecCache
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.stub import Stub
from nri_plugin.nri.versions import RuntimeInfo
from nri_plugin.plugins.cdi_injector.injector import CdiInjector, plan_injection
from nri_plugin.plugins.cdi_injector.requests import DeviceRequest
from nri_plugin.plugins.cdi_injector.vendor import Registry
from tests.nri_runtime_peer import RuntimePeer


def gpu_spec(gpus: int = 8, libraries: int = 60) -> str:
    control = "".join(
        f"  - {{path: /dev/{n}, type: c, major: 195, minor: {m}, fileMode: 438}}\n"
        for n, m in (("nvidiactl", 255), ("nvidia-uvm", 0), ("nvidia-uvm-tools", 1),
                     ("nvidia-modeset", 254)))
    mounts = "".join(
        f"  - {{hostPath: /usr/lib/x86_64-linux-gnu/libnv{i}.so.580.82.07, "
        f"containerPath: /usr/lib/x86_64-linux-gnu/libnv{i}.so.580.82.07, "
        "options: [ro, nosuid, nodev, rbind, rprivate]}\n" for i in range(libraries))
    devices = "".join(
        f"- name: \"{g}\"\n  containerEdits:\n    deviceNodes:\n"
        f"    - {{path: /dev/nvidia{g}, type: c, major: 195, minor: {g}, fileMode: 438}}\n"
        f"    - {{path: /dev/dri/card{g}, type: c, major: 226, minor: {g}, fileMode: 432}}\n"
        for g in range(gpus))
    return (
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ncontainerEdits:\n"
        "  env: [NVIDIA_VISIBLE_DEVICES=void, NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu]\n"
        f"  deviceNodes:\n{control}  mounts:\n{mounts}"
        "  hooks:\n"
        "  - {hookName: createContainer, path: /usr/local/bin/nri-cdi, args: [nri-cdi, hook, "
        "create-symlinks, --link, libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so]}\n"
        "  - {hookName: createContainer, path: /usr/local/bin/nri-cdi, args: [nri-cdi, hook, "
        "update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]}\n"
        f"devices:\n{devices}")


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def bench_plan(snapshot: Snapshot, rounds: int) -> None:
    names = [f"nvidia.com/gpu={g}" for g in range(8)]
    requests = [DeviceRequest(n, "bench") for n in names]
    runtime = RuntimeInfo.from_configure("containerd", "1.7.24")
    plan_us, resolve_us = [], []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        snapshot.resolve(names)
        resolve_us.append((time.perf_counter_ns() - start) / 1000)
        start = time.perf_counter_ns()
        plan_injection(snapshot, requests, runtime)
        plan_us.append((time.perf_counter_ns() - start) / 1000)
    (p50, p99), (r50, r99) = percentiles(plan_us), percentiles(resolve_us)
    print(f"(a) adjustment for 8 GPUs (12 nodes, 60 mounts, 2 hooks), {rounds} rounds")
    print(f"    plan_injection  p50 {p50:8.1f} us   p99 {p99:8.1f} us")
    print(f"    resolve only    p50 {r50:8.1f} us   p99 {r99:8.1f} us   "
          f"(plan / resolve = {p50 / r50:.1f})")


async def round_trips(
    snapshot: Snapshot, rounds: int, *, plan_cache: bool
) -> tuple[list[float], list[float]]:
    ours, theirs = socket.socketpair()
    injector = CdiInjector(lambda: Registry(snapshot))
    if not plan_cache:
        injector.PLAN_CACHE_SIZE = 0  # every request computes its plan afresh
    stub = Stub(injector, sock=ours, name="bench", idx="10", env={})
    runner = asyncio.create_task(stub.run())
    peer = RuntimePeer(*await asyncio.open_unix_connection(sock=theirs))
    await peer.handshake()
    gpu = nri_pb2.CreateContainerRequest(
        pod=nri_pb2.PodSandbox(name="p", namespace="n", annotations={
            "cdi.k8s.io/gpus": ",".join(f"nvidia.com/gpu={g}" for g in range(8))}),
        container=nri_pb2.Container(name="c"))
    empty = nri_pb2.CreateContainerRequest(pod=nri_pb2.PodSandbox(name="p"),
                                           container=nri_pb2.Container(name="c"))
    timings: dict[str, list[float]] = {"gpu": [], "empty": []}
    for _ in range(rounds):
        for kind, request in (("gpu", gpu), ("empty", empty)):
            start = time.perf_counter_ns()
            reply = await peer.response_to(peer.send_request("CreateContainer", request))
            timings[kind].append((time.perf_counter_ns() - start) / 1000)
            assert reply.status.code == 0
    peer.close()
    await asyncio.wait_for(runner, 5)
    return timings["gpu"], timings["empty"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    import logging

    logging.disable(logging.INFO)  # one log line per injection is not what we measure
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "nvidia.yaml").write_text(gpu_spec())
        snapshot = SpecCache([tmp]).refresh()
        assert not snapshot.errors, snapshot.errors
        bench_plan(snapshot, args.rounds)
        cold, empty = asyncio.run(round_trips(snapshot, args.rounds, plan_cache=False))
        warm, _ = asyncio.run(round_trips(snapshot, args.rounds, plan_cache=True))
    (c50, c99), (w50, w99), (e50, e99) = percentiles(cold), percentiles(warm), percentiles(empty)
    print(f"(b) CreateContainer round trip over a Unix socket, {args.rounds} rounds each")
    print(f"    8 GPUs, plan computed   p50 {c50:8.1f} us   p99 {c99:8.1f} us   "
          f"(/ empty = {c50 / e50:.1f})")
    print(f"    8 GPUs, plan cached     p50 {w50:8.1f} us   p99 {w99:8.1f} us   "
          f"(/ empty = {w50 / e50:.1f})")
    print(f"    no devices              p50 {e50:8.1f} us   p99 {e99:8.1f} us")


if __name__ == "__main__":
    main()
