"""What the policy, requirement and capability work adds, each next to a baseline from the
same run.

(a) the adjustment computation for one 8-GPU request with NVIDIA_REQUIRE_CUDA and
    NVIDIA_DRIVER_CAPABILITIES set, sidecar facts loaded: the full decision
    (``adjustment_for``: sources under the policy, device rules, requirements,
    capability filter, plan) next to what the plugin did before the policy (annotation
    parsing + plan), both with the plan cache as in production and both without it;
(b) Synchronize with 10 000 containers of which 100 asked for devices (50 of them
    unserved) through the test runtime peer over a Unix socket: reply time with the
    fail-closed check, next to the same Synchronize answered by a plugin that does no
    check. Target: < 100 ms.

Run: ``python3 bench/bench_policy.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_plugin import gpu_spec
from cdi.cache import Snapshot, SpecCache
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.stub import Stub
from nri_plugin.plugins.cdi_injector.guard import StartGuard
from nri_plugin.plugins.cdi_injector.injector import CdiInjector, plan_injection
from nri_plugin.plugins.cdi_injector.requests import (
    container_requests,
    pod_requests,
    unique_requests,
)
from nri_plugin.plugins.cdi_injector.vendor import Registry
from nri_plugin.vendors.nvidia.nodefacts import NodeFacts, load_facts
from nri_plugin.vendors.nvidia.rules import NvidiaRules
from tests.nri_runtime_peer import RuntimePeer

LIB = "/usr/lib/x86_64-linux-gnu"


def requested_devices(pod: Mapping[str, str], name: str, ctr: Mapping[str, str]) -> list[Any]:
    """The annotation requests, joined as ``sources.gather`` joins them."""
    return unique_requests(pod_requests(pod, name) + container_requests(ctr))


GPUS = 8


def sidecar(spec: bytes, libraries: int = 60) -> dict[str, object]:
    caps = ("compute", "utility", "graphics", "video")
    capabilities: dict[str, list[str]] = {}
    for i in range(libraries):
        capabilities.setdefault(caps[i % 4], []).append(f"{LIB}/libnv{i}.so.580.82.07")
    return {"spec": {"sha256": hashlib.sha256(spec).hexdigest()},
            "driver": {"version": "580.82.07", "cudaVersion": "13.0"},
            "capabilities": capabilities,
            "devices": {str(g): {"type": "gpu", "gpuIndex": g, "gpuUuid": f"GPU-{g}",
                                 "arch": "9.0", "brand": "nvidia"} for g in range(GPUS)}}


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def timed(fn: Callable[[], object], rounds: int) -> tuple[float, float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return percentiles(samples)


def bench_adjustment(snapshot: Snapshot, facts: NodeFacts, rounds: int) -> None:
    pod = nri_pb2.PodSandbox(name="p", namespace="ml", annotations={
        "cdi.k8s.io/gpus": ",".join(f"nvidia.com/gpu={g}" for g in range(GPUS))})
    ctr = nri_pb2.Container(name="c", env=[
        "PATH=/usr/bin", "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471",
        "NVIDIA_DRIVER_CAPABILITIES=compute,utility", "CUDA_VERSION=12.4.1", "HOME=/root"])
    ctr.linux.resources.devices.add(allow=False, access="rwm")
    results = {}
    for cached in (True, False):
        on = CdiInjector(lambda: Registry(snapshot, (facts,)), vendors=[NvidiaRules()])
        off = CdiInjector(lambda: Registry(snapshot))
        for plugin in (on, off):
            plugin.configure("", "containerd", "1.7.24")
            if not cached:
                plugin.PLAN_CACHE_SIZE = 0

        def before(plugin: CdiInjector = off) -> object:
            requests = requested_devices(pod.annotations, ctr.name, ctr.annotations)
            return plugin.plan(requests, 0, 0)

        results[cached] = (timed(lambda p=on: p.adjustment_for(pod, ctr), rounds),
                           timed(before, rounds))
    print(f"(a) adjustment for 8 GPUs, 60 mounts, requirement + capabilities, {rounds} rounds")
    for cached, label in ((True, "plan cached  "), (False, "plan computed")):
        (o50, o99), (b50, b99) = results[cached]
        print(f"    {label} policy on  p50 {o50:8.1f} us  p99 {o99:8.1f} us   "
              f"off p50 {b50:8.1f} us  p99 {b99:8.1f} us   (+{o50 - b50:.1f} us)")
    (pure50, _) = timed(lambda: plan_injection(
        snapshot, requested_devices(pod.annotations, ctr.name, ctr.annotations),
        on.runtime), rounds)
    print(f"    (plan_injection alone p50 {pure50:.1f} us)")


def sync_state(total: int, with_devices: int) -> tuple[list[nri_pb2.PodSandbox],
                                                       list[nri_pb2.Container]]:
    pods, containers = [], []
    for i in range(total // 2):  # two containers per pod
        annotations = {"app": f"a{i}"}
        if i < with_devices // 2:
            annotations["cdi.k8s.io/gpu"] = f"nvidia.com/gpu={i % GPUS}"
        pods.append(nri_pb2.PodSandbox(id=f"pod{i}", name=f"pod{i}", namespace="ns",
                                       annotations=annotations))
        for j in range(2):
            ctr = nri_pb2.Container(id=f"c{i}-{j}", pod_sandbox_id=f"pod{i}", name=f"ctr{j}",
                                    state=nri_pb2.CONTAINER_RUNNING, pid=0,
                                    env=["PATH=/usr/bin", f"HOSTNAME=pod{i}"])
            ctr.linux.resources.devices.add(allow=False, access="rwm")
            if j == 0 and "cdi.k8s.io/gpu" in annotations:  # the first one was served
                g = i % GPUS
                ctr.linux.devices.add(path=f"/dev/nvidia{g}", type="c", major=195, minor=g)
                ctr.linux.devices.add(path=f"/dev/dri/card{g}", type="c", major=226, minor=g)
            containers.append(ctr)
    return pods, containers


def pages(pods: Sequence[nri_pb2.PodSandbox], containers: Sequence[nri_pb2.Container],
          per_page: int = 4000) -> list[nri_pb2.SynchronizeRequest]:
    """Split like the runtime does when one message would pass 4 MiB
    (docs/developer/nri-protocol.md §3.5)."""
    out = []
    for start in range(0, len(containers), per_page):
        out.append(nri_pb2.SynchronizeRequest(containers=containers[start:start + per_page]))
    out[0].pods.extend(pods)
    for page in out[:-1]:
        page.more = True
    return out


class NoCheck(Plugin):
    def create_container(self, pod: object, container: object) -> None:
        return None


async def sync_reply_ms(plugin: Plugin, requests: list[nri_pb2.SynchronizeRequest]) -> float:
    ours, theirs = socket.socketpair()
    stub = Stub(plugin, sock=ours, name="bench", idx="10", env={})
    runner = asyncio.create_task(stub.run())
    peer = RuntimePeer(*await asyncio.open_unix_connection(sock=theirs))
    await peer.handshake(pages=[])
    start = time.perf_counter_ns()
    for page in requests:
        reply = await peer.call("Synchronize", page, nri_pb2.SynchronizeResponse)
        assert reply.more == page.more
    elapsed = (time.perf_counter_ns() - start) / 1e6
    peer.close()
    await asyncio.wait_for(runner, 5)
    return elapsed


def bench_sync(snapshot: Snapshot, facts: NodeFacts, repeats: int) -> None:
    pods, containers = sync_state(10_000, 100)
    requests = pages(pods, containers)
    size = sum(r.ByteSize() for r in requests)
    found: list[int] = []
    ours, base = [], []
    for _ in range(repeats):
        injector = CdiInjector(lambda: Registry(snapshot, (facts,)), vendors=[NvidiaRules()])
        plugin = StartGuard(injector)  # unserved found are counted; none is acted on
        ours.append(asyncio.run(sync_reply_ms(plugin, requests)))
        found.append(injector.counters.unserved_found)
        base.append(asyncio.run(sync_reply_ms(NoCheck(), requests)))
    print(f"(b) Synchronize, 10 000 containers (100 asked for devices, {found[0]} unserved), "
          f"{len(requests)} pages, {size / 1e6:.1f} MB, {repeats} runs")
    print(f"    with fail-closed check  median {statistics.median(ours):7.1f} ms  "
          f"max {max(ours):7.1f} ms")
    print(f"    no check (baseline)     median {statistics.median(base):7.1f} ms  "
          f"max {max(base):7.1f} ms   (target < 100 ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--sync-runs", type=int, default=5)
    args = parser.parse_args()
    import logging

    logging.disable(logging.WARNING)  # a log line per container is not what we measure
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "nvidia.yaml"
        spec.write_text(gpu_spec(GPUS))
        (Path(tmp) / "nvidia.yaml.meta").write_text(json.dumps(sidecar(spec.read_bytes())))
        snapshot = SpecCache([tmp]).refresh()
        assert not snapshot.errors, snapshot.errors
        facts = load_facts(snapshot)
        assert facts.specs, "sidecar not loaded"
        bench_adjustment(snapshot, facts, args.rounds)
        bench_sync(snapshot, facts, args.sync_runs)


if __name__ == "__main__":
    main()
