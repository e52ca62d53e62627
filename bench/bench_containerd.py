"""(c) Create+Start on a real containerd: no injection vs containerd's native CDI vs our
NRI plugin, interleaved round by round in one run, medians and ratios, per containerd
version (1.7 and 2.1 by default, ``--runtime 2.1`` for one).

Per version, two private containerds (scripts/install-containerd.sh must have run): one
with native CDI enabled and no NRI plugin (serves "no injection" and "native CDI"), one
with our plugin connected (serves "our plugin"). Each round creates and starts one container of each
kind; the three request the same devices (two GPU-like char devices, a library folder,
env, a createContainer hook). Containers are removed outside the timed part.

``--baseline-repo DIR`` adds a fourth kind in the same rounds: the plugin of another
checkout (e.g. the main branch) on a containerd of its own, to compare two versions of
the plugin against the same native CDI figures.

Run as root: ``python3 bench/bench_containerd.py [--rounds 30] [--runtime 1.7 --runtime 2.1]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e import images, paths
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient
from tests.e2e.plugin import PluginProcess
from tests.helpers import make_char_device

KIND = "bench.example/gpu"
DEVICES = [f"{KIND}=0", f"{KIND}=1"]
SLEEP = ["sleep", "600"]


def make_node(root: Path) -> Path:
    host = root / "host"
    (host / "lib").mkdir(parents=True)
    for minor in (0, 1):
        make_char_device(host / f"gpu{minor}", major=241, minor=minor)
    specs = root / "cdi"
    specs.mkdir()
    devices = "".join(
        f"- name: \"{m}\"\n  containerEdits:\n    deviceNodes: "
        f"[{{path: /dev/benchgpu{m}, hostPath: {host}/gpu{m}}}]\n" for m in (0, 1))
    (specs / "bench.yaml").write_text(
        f"cdiVersion: 0.5.0\nkind: {KIND}\ncontainerEdits:\n  env: [BENCH=1]\n"
        f"  mounts:\n  - {{hostPath: {host}/lib, containerPath: /usr/lib/bench, "
        "options: [ro, nosuid, nodev, rbind, rprivate]}\n"
        "  hooks:\n  - {hookName: createContainer, path: /bin/true, args: ['true']}\n"
        f"devices:\n{devices}")
    return specs


class CheckoutPlugin(PluginProcess):
    """The plugin of another source checkout (``repo``): the baseline of an A/B run."""

    def __init__(self, repo: Path, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.repo = repo

    def spawn(self) -> PluginProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        env = {**os.environ, "PYTHONPATH": str(self.repo)}
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=log, env=env,
                                        cwd=self.repo)
        log.close()
        return self


def timed_create_start(cri: CriClient, pod: str, **kwargs: object) -> float:
    start = time.perf_counter()
    container = cri.create_container(pod, "bench", images.BUSYBOX_IMAGE, command=SLEEP,
                                     **kwargs)  # type: ignore[arg-type]
    cri.start_container(container)
    elapsed = time.perf_counter() - start
    cri.stop_container(container)
    cri.remove_container(container)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--runtime", action="append", choices=sorted(paths.RUNTIMES),
                        help="containerd version (repeatable; default: all of them)")
    parser.add_argument("--baseline-repo", type=Path,
                        help="also run the plugin of this checkout, in the same rounds")
    args = parser.parse_args()
    versions = args.runtime or paths.runtimes()
    missing = paths.missing_prerequisites(tuple(versions))
    if missing:
        sys.exit(f"missing: {'; '.join(missing)}; run: bash scripts/install-containerd.sh")
    for version in versions:
        report(bench_runtime(version, args.rounds, args.baseline_repo), args.rounds, version)


def bench_runtime(version: str, rounds: int,
                  baseline: Path | None = None) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        specs = make_node(root)
        archives = [images.pause_image(root), images.busybox_image(root)]
        native = Containerd(enable_cdi=True, cdi_spec_dirs=[specs], version=version).start()
        ours = Containerd(version=version).start()  # enable_cdi off: the plugin alone
        other = Containerd(version=version).start() if baseline else None
        plugins: list[PluginProcess] = []
        try:
            for ctrd in (native, ours, other):
                if ctrd is not None:
                    ctrd.import_images(*archives)
            plugins.append(PluginProcess(ours.nri_socket, [specs], root / "plugin.log",
                                         extra_args=["--log-level", "info"]).start())
            if other is not None and baseline is not None:
                plugins.append(CheckoutPlugin(baseline, other.nri_socket, [specs],
                                              root / "baseline.log",
                                              extra_args=["--log-level", "info"]).start())
            return run_rounds(native, ours, rounds, other)
        finally:
            for plugin in plugins:
                plugin.kill()
            for ctrd in (native, ours, other):
                if ctrd is not None:
                    ctrd.close()


def run_rounds(native: Containerd, ours: Containerd, rounds: int,
               other: Containerd | None = None) -> dict[str, list[float]]:
    if other is not None:
        with other.cri() as bcri, bcri.cleanup():
            base_pod = bcri.run_pod("baseline",
                                    annotations={"cdi.k8s.io/gpu": ",".join(DEVICES)})
            extra = [("baseline", lambda: timed_create_start(bcri, base_pod))]
            return _rounds(native, ours, rounds, extra)
    return _rounds(native, ours, rounds, [])


def _rounds(native: Containerd, ours: Containerd, rounds: int,
            extra: list[tuple[str, Callable[[], float]]]) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"none": [], "native": [], "plugin": []}
    samples.update({kind: [] for kind, _ in extra})
    with native.cri() as ncri, ours.cri() as ocri, ncri.cleanup(), ocri.cleanup():
        plain_pod = ncri.run_pod("plain")
        native_pod = ncri.run_pod("native")
        plugin_pod = ocri.run_pod("plugin", annotations={"cdi.k8s.io/gpu": ",".join(DEVICES)})
        kinds: list[tuple[str, Callable[[], float]]] = [
            ("none", lambda: timed_create_start(ncri, plain_pod)),
            ("native", lambda: timed_create_start(ncri, native_pod, cdi_devices=DEVICES)),
            ("plugin", lambda: timed_create_start(ocri, plugin_pod)),
            *extra,
        ]
        for _kind, measure in kinds:  # warm-up, not counted
            measure()
        for index in range(rounds):
            # Rotate the order each round so that no kind always runs first.
            turn = index % len(kinds)
            for kind, measure in kinds[turn:] + kinds[:turn]:
                samples[kind].append(measure())
    return samples


def report(samples: dict[str, list[float]], rounds: int, version: str) -> None:
    med = {kind: statistics.median(values) * 1000 for kind, values in samples.items()}
    print(f"(c) Create+Start on containerd {version}, {rounds} interleaved rounds (medians)")
    print(f"    no injection        {med['none']:7.1f} ms")
    print(f"    native CDI          {med['native']:7.1f} ms   ({med['native'] / med['none']:.3f}"
          " x no injection)")
    print(f"    our NRI plugin      {med['plugin']:7.1f} ms   ({med['plugin'] / med['none']:.3f}"
          f" x no injection, {med['plugin'] / med['native']:.3f} x native CDI)")
    if "baseline" in med:
        print(f"    baseline plugin     {med['baseline']:7.1f} ms   ("
              f"{med['baseline'] / med['native']:.3f} x native CDI; ours "
              f"{med['plugin'] / med['baseline']:.3f} x baseline)")


if __name__ == "__main__":
    main()
