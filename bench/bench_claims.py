"""CreateContainer with 0, 1,000 and 5,000 DRA claim specs present, and a fresh claim's miss.

The plugin is wired as the daemon wires it (an AutoRefresh watching the folders, the
injector's ``on_miss`` and ``on_hit``); each CreateContainer request goes through
``dispatch`` from its wire bytes. Per claim-file count, in one run:

- no device: a container that names nothing;
- GPU: a container that names the node's GPU (annotation), claims elsewhere untouched;
- fresh claim: a claim spec written (renamed into place), then a container naming it at
  once: the miss path's bounded re-read of the folders.

Prints medians and the ratio to the same case with 0 claim files (same run).
``--containerd 1.7`` (or 2.1) adds the same through CRI on a private containerd with the
plugin process connected (its CDI off: the plugin injects): CreateContainer of a container
naming nothing and of one naming the GPU, with that many claim files in the folder.
Run: ``python3 bench/bench_claims.py [--counts 0,1000,5000] [--rounds 300]
[--containerd 1.7 --cri-rounds 20]`` (root: device nodes are made with mknod).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cdi.cache import SpecCache
from cdi.watch import AutoRefresh
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.dispatch import dispatch
from nri_plugin.ops.daemon import miss_reader, removals_applied
from nri_plugin.plugins.cdi_injector.injector import CdiInjector
from nri_plugin.plugins.cdi_injector.vendor import RegistryHolder

KIND = "k8s.gpu.nvidia.com/claim"


def node_spec(dev: Path) -> str:
    return (f"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ncontainerEdits:\n  mounts:\n"
            f"  - {{hostPath: /usr/lib, containerPath: /usr/lib/drv, options: [ro, bind]}}\n"
            f"devices:\n- name: '0'\n  containerEdits:\n"
            f"    deviceNodes: [{{path: /dev/nvidia0, hostPath: {dev}}}]\n")


def claim_spec(uid: str, dev: Path) -> str:
    return (f"cdiVersion: 0.5.0\nkind: {KIND}\ndevices:\n- name: {uid}-gpu-0\n"
            f"  containerEdits:\n    deviceNodes: [{{path: /dev/nvidia0, hostPath: {dev}}}]\n")


def write_claim(folder: Path, uid: str, dev: Path) -> None:
    temp = folder / f".{uid}.tmp"
    temp.write_text(claim_spec(uid, dev))
    os.rename(temp, folder / f"k8s.gpu.nvidia.com-claim_{uid}.yaml")


def request(annotations: dict[str, str]) -> bytes:
    return nri_pb2.CreateContainerRequest(
        pod=nri_pb2.PodSandbox(name="p", namespace="ns", annotations=annotations),
        container=nri_pb2.Container(name="c")).SerializeToString()


def measure(root: Path, count: int, rounds: int) -> dict[str, float]:
    dev = root / "nvidia0"
    if not dev.exists():
        os.mknod(dev, 0o666 | 0o020000, os.makedev(195, 0))
    etc, run = root / f"etc-{count}", root / f"run-{count}"
    etc.mkdir()
    run.mkdir()
    (etc / "nvidia.yaml").write_text(node_spec(dev))
    for i in range(count):
        write_claim(run, f"old{i:05d}", dev)
    holder = RegistryHolder([])
    refresher = AutoRefresh(SpecCache([str(etc), str(run)]), rescan_interval=3600,
                            on_refresh=holder.update).start()
    try:
        plugin = CdiInjector(holder.get, on_miss=miss_reader(refresher, holder),
                             on_hit=removals_applied(refresher, holder))
        plugin.configure("", "containerd", "v1.7.24")
        none = request({})
        gpu = request({"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
        times: dict[str, list[float]] = {"no device": [], "GPU": [], "fresh claim": []}
        for i in range(rounds):
            for name, body in (("no device", none), ("GPU", gpu)):
                start = time.perf_counter_ns()
                dispatch(plugin, "CreateContainer", body)
                times[name].append((time.perf_counter_ns() - start) / 1000)
            if i % 10 == 0:  # a miss rescans the folders: fewer of them
                uid = f"new{i:05d}"
                write_claim(run, uid, dev)
                body = request({"cdi.k8s.io/claim": f"{KIND}={uid}-gpu-0"})
                start = time.perf_counter_ns()
                dispatch(plugin, "CreateContainer", body)
                times["fresh claim"].append((time.perf_counter_ns() - start) / 1000)
        return {name: statistics.median(values) for name, values in times.items()}
    finally:
        refresher.stop()


def measure_cri(root: Path, version: str, counts: list[int],
                rounds: int) -> dict[int, dict[str, float]]:
    from tests.e2e import images
    from tests.e2e.containerd import Containerd
    from tests.e2e.images import BUSYBOX_IMAGE
    from tests.e2e.plugin import PluginProcess

    dev = root / "nvidia0"
    if not dev.exists():
        os.mknod(dev, 0o666 | 0o020000, os.makedev(195, 0))
    etc, run = root / "cri-etc", root / "cri-run"
    etc.mkdir()
    run.mkdir()
    (etc / "nvidia.yaml").write_text(node_spec(dev))
    archives = [images.pause_image(root), images.busybox_image(root)]
    ctrd = Containerd(version=version)
    results: dict[int, dict[str, float]] = {}
    try:
        ctrd.start()
        ctrd.import_images(*archives)
        written = 0
        for count in counts:
            for i in range(written, count):
                write_claim(run, f"old{i:05d}", dev)
            written = max(written, count)
            plugin = PluginProcess(ctrd.nri_socket, [etc, run], root / f"plugin-{count}.log",
                                   ["--log-level", "warning"]).spawn()
            try:
                _wait_connected(ctrd, plugin)
                results[count] = _cri_rounds(ctrd, rounds, BUSYBOX_IMAGE)
            finally:
                plugin.kill()
    finally:
        ctrd.close()
    return results


def _wait_connected(ctrd: object, plugin: object) -> None:
    # the plugin logs nothing at warning level when it connects: poll until a GPU
    # container gets its device
    from tests.e2e.containerd import Containerd
    from tests.e2e.images import BUSYBOX_IMAGE

    assert isinstance(ctrd, Containerd)
    deadline = time.monotonic() + 60
    with ctrd.cri() as cri, cri.cleanup():
        pod = cri.run_pod("probe")
        while time.monotonic() < deadline:
            ctr = cri.create_container(pod, f"p{time.monotonic_ns()}", BUSYBOX_IMAGE,
                                       command=["true"],
                                       annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
            spec = cri.runtime_spec(ctr)
            if any(d["path"] == "/dev/nvidia0" for d in spec["linux"].get("devices", [])):
                return
            time.sleep(0.1)
    raise TimeoutError("the plugin never served the GPU")


def _cri_rounds(ctrd: object, rounds: int, image: str) -> dict[str, float]:
    from tests.e2e.containerd import Containerd

    assert isinstance(ctrd, Containerd)
    times: dict[str, list[float]] = {"CRI no device": [], "CRI GPU": []}
    with ctrd.cri() as cri, cri.cleanup():
        pod = cri.run_pod("bench")
        for i in range(5):  # warm-up, untimed: the first creations of a pod are slower
            cri.create_container(pod, f"warm{i}", image, command=["true"])
        for i in range(rounds):
            for name, annotations in (("CRI no device", {}),
                                      ("CRI GPU", {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})):
                start = time.perf_counter_ns()
                cri.create_container(pod, f"{name[4:7]}{i}", image, command=["true"],
                                     annotations=annotations)
                times[name].append((time.perf_counter_ns() - start) / 1e6)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="0,1000,5000")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--containerd", default="", help="1.7 or 2.1: also through CRI")
    parser.add_argument("--cri-rounds", type=int, default=20)
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        results = {count: measure(Path(tmp), count, args.rounds) for count in counts}
        cri = (measure_cri(Path(tmp), args.containerd, counts, args.cri_rounds)
               if args.containerd else {})
    base = results[counts[0]]
    print(f"CreateContainer (dispatch from bytes), medians over {args.rounds} rounds; "
          f"ratio to {counts[0]} claim files")
    for count, med in results.items():
        row = "  ".join(f"{name} {us:9.1f} us (x{us / base[name]:.2f})"
                        for name, us in med.items())
        print(f"  {count:5d} claim files: {row}")
    if cri:
        base_cri = cri[counts[0]]
        print(f"CreateContainer through CRI on containerd {args.containerd} (plugin injects), "
              f"medians over {args.cri_rounds} rounds; ratio to {counts[0]} claim files")
        for count, med in cri.items():
            row = "  ".join(f"{name} {ms:7.1f} ms (x{ms / base_cri[name]:.2f})"
                            for name, ms in med.items())
            print(f"  {count:5d} claim files: {row}")


if __name__ == "__main__":
    main()
