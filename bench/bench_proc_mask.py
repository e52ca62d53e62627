"""Issue 17 bench: what /proc/driver/nvidia masking costs a container.

Create+Start of a busybox container that gets GPU 0 of a simulated node through our plugin
(hook-free spec, so the mask-proc hook is the only hook), with the policy's procMasking off
and on, alternated round by round in one run (the policy is switched by a reload, SIGHUP),
medians and their ratio.

Run as root: ``python3 bench/bench_proc_mask.py [--rounds 10]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nri_cdi_testbed.simnode import NodeLayout, build_node  # noqa: E402
from tests.e2e import images  # noqa: E402
from tests.e2e.containerd import Containerd  # noqa: E402
from tests.e2e.plugin import PluginProcess  # noqa: E402


class _Plugin(PluginProcess):
    policy: Path

    def command(self) -> list[str]:
        return [*super().command(), "--policy", str(self.policy)]


def _switch(plugin: _Plugin, enabled: bool) -> None:
    plugin.policy.write_text(f"procMasking: {{enabled: {str(enabled).lower()}}}\n")
    mark = plugin.log_size()
    assert plugin.process is not None
    os.kill(plugin.process.pid, signal.SIGHUP)
    plugin.wait_for_log("policy reloaded", after=mark)


def _create_start(cri: object, pod: str) -> float:
    start = time.perf_counter()
    cid = cri.create_container(pod, "b", images.BUSYBOX_IMAGE,  # type: ignore[attr-defined]
                               command=["sleep", "600"])
    cri.start_container(cid)  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - start
    cri.stop_container(cid)  # type: ignore[attr-defined]
    cri.remove_container(cid)  # type: ignore[attr-defined]
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        node = build_node(root / "node", NodeLayout.uniform(2))
        (root / "cdi").mkdir()
        subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--mode",
                        "procfs", "--driver-root", str(node.driver_root), "--link-mode",
                        "mounts", "--output", str(root / "cdi" / "nvidia.yaml")],
                       check=True, cwd=REPO, capture_output=True)
        archives = [images.pause_image(root), images.busybox_image(root)]
        samples: dict[bool, list[float]] = {False: [], True: []}
        with Containerd() as ctrd:
            ctrd.import_images(*archives)
            plugin = _Plugin(ctrd.nri_socket, [root / "cdi"], root / "plugin.log")
            plugin.policy = root / "policy.yaml"
            plugin.policy.write_text("procMasking: {enabled: false}\n")
            plugin.start()
            try:
                with ctrd.cri() as cri, cri.cleanup():
                    pod = cri.run_pod("bench", annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
                    for enabled in (False, True):  # warm-up
                        _switch(plugin, enabled)
                        _create_start(cri, pod)
                    for index in range(args.rounds):
                        for enabled in ((False, True) if index % 2 else (True, False)):
                            _switch(plugin, enabled)
                            samples[enabled].append(_create_start(cri, pod))
            finally:
                plugin.kill()
    off, on = (statistics.median(samples[k]) * 1000 for k in (False, True))
    print(f"Create+Start, GPU 0 via the plugin, hook-free spec, {args.rounds} rounds (median):")
    print(f"  procMasking off: {off:7.1f} ms")
    print(f"  procMasking on:  {on:7.1f} ms  (x{on / off:.2f}, +{on - off:.1f} ms: the "
          "mask-proc hook)")


if __name__ == "__main__":
    main()
