"""CreateContainer cost of the injector in this tree next to another checkout's, in one run.

The same three containers, each handed to ``CdiInjector.create_container`` (the handler
the stub calls; logging off), on the same 8-GPU spec with its sidecar facts and NVIDIA's
rules:

* ``gpus-cached``: 8 GPUs by pod annotation, NVIDIA_REQUIRE_CUDA and
  NVIDIA_DRIVER_CAPABILITIES set, plan and decision caches warm (the common repeat);
* ``gpus-computed``: the same with both caches off (every step every time);
* ``nothing``: a container that asks for no device (most containers of a node).

Each tree runs in its own interpreter (``PYTHONPATH`` = the tree), alternately, ``--runs``
times; the figure per tree and case is the median of the runs' medians, and the ratio is
this tree's over the baseline's.

Run: ``python3 bench/bench_create_container.py --baseline /path/to/other/checkout``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
CASES = ("gpus-cached", "gpus-computed", "nothing")
GPUS = 8


def worker(rounds: int) -> dict[str, float]:
    """Median microseconds per case, in this interpreter's tree."""
    import logging

    from bench.bench_plugin import gpu_spec
    from bench.bench_policy import sidecar
    from cdi.cache import SpecCache
    from nri_plugin.nri.api import nri_pb2
    from nri_plugin.plugins.cdi_injector.injector import CdiInjector
    from nri_plugin.plugins.cdi_injector.vendor import Registry
    from nri_plugin.vendors.nvidia.nodefacts import load_facts
    from nri_plugin.vendors.nvidia.rules import NvidiaRules

    logging.disable(logging.WARNING + 10)  # a log line per container is not measured
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "nvidia.yaml"
        spec.write_text(gpu_spec(GPUS))
        (Path(tmp) / "nvidia.yaml.meta").write_text(json.dumps(sidecar(spec.read_bytes())))
        snapshot = SpecCache([tmp]).refresh()
        facts = load_facts(snapshot)
    registry = Registry(snapshot, (facts,))
    asking = nri_pb2.PodSandbox(name="p", namespace="ml", annotations={
        "cdi.k8s.io/gpus": ",".join(f"nvidia.com/gpu={g}" for g in range(GPUS))})
    plain = nri_pb2.PodSandbox(name="q", namespace="ml", annotations={"app": "web"})
    ctr = nri_pb2.Container(name="c", env=[
        "PATH=/usr/bin", "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=nvidia,driver>=470",
        "NVIDIA_DRIVER_CAPABILITIES=compute,utility", "CUDA_VERSION=12.4.1", "HOME=/root"])
    ctr.linux.resources.devices.add(allow=False, access="rwm")
    out = {}
    for case in CASES:
        plugin = CdiInjector(lambda: registry, vendors=[NvidiaRules()])
        plugin.configure("", "containerd", "2.1.9")
        if case == "gpus-computed":
            plugin.PLAN_CACHE_SIZE = 0
        pod = plain if case == "nothing" else asking
        samples = []
        for _ in range(rounds):
            start = time.perf_counter_ns()
            plugin.create_container(pod, ctr)
            samples.append((time.perf_counter_ns() - start) / 1000)
        out[case] = statistics.median(samples)
    return out


def run_tree(tree: Path, rounds: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    code = (f"import json, sys; sys.path.insert(0, {str(tree)!r}); "
            f"from bench.bench_create_container import worker; "
            f"print(json.dumps(worker({rounds})))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, check=True,
                          capture_output=True, text=True)
    return dict(json.loads(done.stdout.splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True,
                        help="another checkout of this project (e.g. main)")
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    # The baseline tree runs this file's worker too: it must find it there.
    baseline = args.baseline.resolve()
    if not (baseline / "bench" / "bench_create_container.py").exists():
        raise SystemExit(f"{baseline}/bench/bench_create_container.py: copy this file there "
                         "first (the worker must run in the baseline's tree)")
    ours: dict[str, list[float]] = {c: [] for c in CASES}
    theirs: dict[str, list[float]] = {c: [] for c in CASES}
    for _ in range(args.runs):
        for tree, into in ((HERE, ours), (baseline, theirs)):
            for case, micros in run_tree(tree, args.rounds).items():
                into[case].append(micros)
    print(f"CreateContainer, injector with NVIDIA's rules, {args.rounds} rounds x "
          f"{args.runs} runs each, interleaved; median of run medians")
    for case in CASES:
        new, old = statistics.median(ours[case]), statistics.median(theirs[case])
        print(f"    {case:14s} this tree {new:8.1f} us   baseline {old:8.1f} us   "
              f"ratio {new / old:5.2f}")


if __name__ == "__main__":
    main()
