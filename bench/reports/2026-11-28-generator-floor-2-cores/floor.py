"""Where ``nri-cdi generate``'s time goes, as a user runs it, against nvidia-ctk's: the
whole process next to the standard-library modules it cannot do without, and a fresh
process's CPU split at each stage. Diagnostic; the figures are in this folder's README.

    NVIDIA_CTK=/path/to/nvidia-ctk python3 floor.py [ROUNDS]
"""

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import bench_generate_cli as bench

# Each stage of the console script's work, in a fresh process: CPU since the last mark.
STAGES = """
import sys, time
c = time.process_time_ns
marks = [c()]
import re  # what pip's console script imports first
marks.append(c())
import nri_plugin.ops.cli as cli
marks.append(c())
import cdi.nvidia.cli
marks.append(c())
args = cli.build_parser("generate").parse_args(sys.argv[1:])
marks.append(c())
args.func(args)
marks.append(c())
print(" ".join(f"{(b - a) / 1e6:.2f}" for a, b in zip(marks, marks[1:])), file=sys.stderr)
"""
STAGE_NAMES = ("re", "nri_plugin.ops.cli", "cdi.nvidia.cli's imports", "parser",
               "the generation")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    ctk, origin = bench.find_ctk()
    if ctk is None:
        raise SystemExit(f"needs nvidia-ctk: {origin}")
    env = bench.user_env()
    with tempfile.TemporaryDirectory(prefix="generator-floor-") as tmp:
        script = bench.install(bench.REPO, Path(tmp) / "venv", [])
        python = str(script.with_name("python"))
        node = bench.build_node(Path(tmp) / "node", bench.NODES["2gpu"][1]())
        roots = ["--driver-root", str(node.driver_root), "--dev-root", str(node.dev_root)]
        out = Path(tmp) / "out"
        out.mkdir()
        generate = ["generate", *roots, "--mode", "procfs", "--output", str(out / "a.yaml")]
        rows = {
            "python -c pass": [python, "-c", "pass"],
            "import re, argparse, hashlib, json": [python, "-c",
                                                   "import re, argparse, hashlib, json"],
            "nri-cdi generate (procfs)": [str(script), *generate],
            bench.CTK: [ctk, "--quiet", "cdi", "generate", *roots, "--mode", "nvml",
                        "--feature-flag", "disable-nvsandboxutils", "--nvidia-cdi-hook-path",
                        "/usr/bin/nvidia-cdi-hook", "--output", str(out / "ctk.yaml")],
        }
        times = bench.measure({k: bench.in_node_namespace(node, v) for k, v in rows.items()},
                              env, rounds)
        (Path(tmp) / "stages.py").write_text(STAGES)
        stages: list[list[float]] = []
        for _ in range(rounds):
            argv = bench.in_node_namespace(node, [python, str(Path(tmp) / "stages.py"),
                                                  *generate])
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            stages.append([float(x) for x in done.stderr.strip().splitlines()[-1].split()])
    print(f"2 GPUs, no MIG: {rounds} interleaved rounds, load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    base = [cpu for _, cpu in times[bench.CTK]]
    for name, values in times.items():
        cpu = [c for _, c in values]
        ratio = bench.median_interval([a / b for a, b in zip(cpu, base, strict=True)])
        print(f"  {name:38s} CPU {statistics.median(cpu):5.1f} ms   ÷ nvidia-ctk "
              f"{ratio[0]:.2f} ({ratio[1]:.2f}-{ratio[2]:.2f})")
    print("  one process's CPU by stage, medians (ms):")
    for i, name in enumerate(STAGE_NAMES):
        print(f"    {name:36s} {statistics.median(s[i] for s in stages):5.1f}")


if __name__ == "__main__":
    main()
