"""Whole-process ``generate`` next to NVIDIA's ``nvidia-ctk cdi generate`` on one simulated
node (2 GPUs, MIG on one), paired in each round:

- ``nvidia-ctk cdi generate --mode nvml`` ($NVIDIA_CTK, else $NRI_CDI_PEERS/nvidia-ctk),
  through the node's simulated libnvidia-ml;
- ``python -m cdi.nvidia.cli --mode nvml`` (nvidia-ml-py on the same library);
- ``python -m cdi.nvidia.cli --mode procfs``;
- both again through the lean entry ``python -I -S cdi/nvidia/__main__.py`` (no ``site``);
- the floor: ``true`` in the same wrapper.

nvidia-ctk reads ``/proc/driver/nvidia`` and ``/sys/bus/pci/devices`` from the host, so every
command (ours too, for equal overhead) runs in the private mount namespace of
``simnode.in_node_namespace``; peak RSS is each command's own (GNU time inside the
namespace).  Prints median wall and CPU (user + system) time, peak RSS, and our/nvidia-ctk
ratios (raw, and with the wrapper's floor taken off both).
Goal: ratio <= 1.0 in procfs mode, <= 1.2 in nvml mode.
Needs root, gcc, unshare and GNU time.  Run: ``python3 bench/bench_generate_vs_ctk.py
[--rounds 21] [--gpus 2]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nri_cdi_testbed.simnode import NodeLayout, build_node, in_node_namespace  # noqa: E402
from tests.peers import peer  # noqa: E402

CTK = Path(os.environ["NVIDIA_CTK"]) if os.environ.get("NVIDIA_CTK") else peer("nvidia-ctk")
GNU_TIME = shutil.which("time") or "/usr/bin/time"


def timed(argv: Sequence[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one command; a failure stops the benchmark with its stderr.
    CPU is user + system time of the process and its waited-for children (wait4): less
    sensitive than wall time to other load on the machine."""
    start = time.perf_counter()
    proc = subprocess.Popen(list(argv), env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter() - start) * 1000
    stderr = proc.stderr.read() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv[-14:])} failed:\n{stderr[-2000:]}")
    return wall, (usage.ru_utime + usage.ru_stime) * 1000


def run(node_argv: list[str], env: dict[str, str], report: Path) -> tuple[float, float, float]:
    """(wall ms, CPU ms, peak RSS MiB) of one command run in the node's namespace."""
    wall, cpu = timed(node_argv, env)
    return wall, cpu, int(report.read_text().split()[-1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--gpus", type=int, default=2)
    args = parser.parse_args()
    if not CTK.is_file():
        raise SystemExit(f"nvidia-ctk not found at {CTK}")
    with tempfile.TemporaryDirectory(prefix="bench-ctk-") as tmp:
        layout = NodeLayout.uniform(args.gpus, mig={0: "3g.40gb,2g.20gb,1g.10gb*2"},
                                    seed="bench-ctk")
        node = build_node(Path(tmp) / "node", layout)
        report = Path(tmp) / "maxrss"
        # Specs go to /var/run/cdi, a tmpfs, on a node: write both tools' output to one too,
        # so that the disk's fsync latency (ours syncs, nvidia-ctk does not) is not measured.
        shm = Path("/dev/shm")
        out = Path(tempfile.mkdtemp(prefix="bench-ctk-", dir=shm if shm.is_dir() else tmp))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        env["PYTHONPATH"] = str(REPO)
        roots = ["--driver-root", str(node.driver_root), "--dev-root", str(node.dev_root)]
        options = [*roots, "--hook-path", "/usr/local/bin/nri-cdi",
                   "--output", str(out / "ours.yaml")]
        ours = [sys.executable, "-m", "cdi.nvidia.cli", *options]
        lean = [sys.executable, "-I", "-S", str(REPO / "cdi" / "nvidia" / "__main__.py"),
                *options]
        commands = {
            "floor (true)": ["true"],
            "nvidia-ctk --mode nvml": [
                str(CTK), "--quiet", "cdi", "generate", *roots, "--mode", "nvml",
                "--feature-flag", "disable-nvsandboxutils",
                "--nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook",
                "--output", str(out / "ctk.yaml")],
            "ours --mode nvml": [*ours, "--mode", "nvml"],
            "ours --mode procfs": [*ours, "--mode", "procfs"],
            "ours -I -S --mode nvml": [*lean, "--mode", "nvml"],
            "ours -I -S --mode procfs": [*lean, "--mode", "procfs"],
        }
        wrapped = {name: in_node_namespace(node, [GNU_TIME, "-f", "%M", "-o", str(report), *c])
                   for name, c in commands.items()}
        for argv in wrapped.values():  # warm-up: bytecode cache, page cache
            run(argv, env, report)
        walls: dict[str, list[float]] = {name: [] for name in wrapped}
        cpus: dict[str, list[float]] = {name: [] for name in wrapped}
        peaks: dict[str, list[float]] = {name: [] for name in wrapped}
        for _ in range(args.rounds):
            for name, argv in wrapped.items():
                wall, cpu, peak = run(argv, env, report)
                walls[name].append(wall)
                cpus[name].append(cpu)
                peaks[name].append(peak)
        print_report(walls, cpus, peaks, args)
        shutil.rmtree(out, ignore_errors=True)


def print_report(walls: dict[str, list[float]], cpus: dict[str, list[float]],
                 peaks: dict[str, list[float]], args: argparse.Namespace) -> None:
    ctk = "nvidia-ctk --mode nvml"
    print(f"{args.gpus} GPUs (MIG on GPU 0: 4 devices), {args.rounds} interleaved rounds, "
          f"each in the node's mount namespace; load average {os.getloadavg()[0]:.1f}")
    print(f"  {'command':26} {'wall ms':>8} {'ratio':>6} {'-floor':>7} {'CPU ms':>7} "
          f"{'ratio':>6} {'-floor':>7} {'peak MiB':>9} {'ratio':>6}")
    rows = {"wall": walls, "cpu": cpus}
    med = {k: {n: statistics.median(v) for n, v in d.items()} for k, d in rows.items()}
    floor = {k: med[k]["floor (true)"] for k in rows}

    def ratios(kind: str, name: str) -> tuple[float, float, float]:
        m = med[kind]
        net = (m[name] - floor[kind]) / (m[ctk] - floor[kind])
        return m[name], m[name] / m[ctk], net

    for name in walls:
        wall, wall_ratio, wall_net = ratios("wall", name)
        cpu, cpu_ratio, cpu_net = ratios("cpu", name)
        peak = max(peaks[name])
        print(f"  {name:26} {wall:8.1f} {wall_ratio:6.2f} {wall_net:7.2f} {cpu:7.1f} "
              f"{cpu_ratio:6.2f} {cpu_net:7.2f} {peak:9.1f} {peak / max(peaks[ctk]):6.2f}")
    print("  ratio: to nvidia-ctk; -floor: both less the namespace wrapper's own cost")
    print("  goal: ratio <= 1.0 (procfs), <= 1.2 (nvml) against nvidia-ctk in nvml mode")


if __name__ == "__main__":
    main()
