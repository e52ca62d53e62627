"""``generate`` as a whole process on an 8-GPU x 7-MIG simulated node, next to the
interpreter's own start-up.

Builds the node once (needs gcc, ldconfig and root for mknod), then runs, interleaved in
each round so that machine noise hits all sides alike:

- floor: ``python -c pass`` (interpreter start-up, site imports);
- generate: ``python -m cdi.nvidia.cli --mode procfs ...`` (the lean entry point);
- nri-cdi generate: ``python -m nri_plugin.ops.cli generate --mode procfs ...`` (the command's
  dispatcher, which imports only the ``generate`` module);
- the installed ``nri-cdi`` console script, when it is on PATH (what an operator runs);
- generate with PyYAML's C dumper: the lean entry point with ``cdi.yaml11.dump_yaml``
  replaced by ``yaml.dump(Dumper=CSafeDumper)`` (the alternative to our own writer; the
  output is byte-identical, tests/cdi/test_yaml11.py). The difference to ``generate`` is
  what the hand-written YAML writer saves.

Each child's wall time is measured around the process and its peak RSS is its own
``ru_maxrss`` (through GNU time, see ``run_child``).  Children get a bytecode cache
(``PYTHONPYCACHEPREFIX``, one warm-up run) as an installed package would have, even where
PYTHONDONTWRITEBYTECODE is set.
Prints medians, peaks and the ratios to the floor.  Target: <= 150 ms wall, <= 60 MB.
Run: ``python3 bench/bench_generate.py [--rounds 15] [--compare OLDER_CHECKOUT]``.
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nri_cdi_testbed.simnode import NodeLayout, build_node  # noqa: E402

# Linux carries a process's peak RSS across fork and exec, so a child forked from this
# (large) Python process reports at least our own peak.  GNU time is a small parent that
# reads the child's own ru_maxrss from wait4; without it the figures are upper bounds.
# generate, with PyYAML's C dumper in place of cdi.yaml11's writer (same bytes out).
PYYAML_GENERATE = """\
import sys
import cdi.yaml11

def dump_with_pyyaml(document):
    import yaml
    return "---\\n" + yaml.dump(document, Dumper=yaml.CSafeDumper, sort_keys=False,
                                default_flow_style=False, allow_unicode=True, width=1 << 16)

cdi.yaml11.dump_yaml = dump_with_pyyaml
from cdi.nvidia.cli import main
sys.exit(main())
"""

GNU_TIME = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)


def run_child(argv: list[str], env: dict[str, str], scratch: Path,
              cwd: Path = REPO) -> tuple[float, float]:
    """(wall ms, peak RSS MB) of one child process."""
    report = scratch / "maxrss"
    wrapped = [GNU_TIME, "-f", "%M", "-o", str(report), *argv] if GNU_TIME else argv
    start = time.perf_counter()
    proc = subprocess.Popen(wrapped, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter() - start) * 1000
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{stderr}")
    kib = int(report.read_text().split()[-1]) if GNU_TIME else usage.ru_maxrss
    return wall, kib / 1024  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--compare", type=Path, metavar="TREE",
                        help="also time `python -m cdi.nvidia.cli` of another checkout (an "
                             "older commit, say) in the same rounds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp:
        layout = NodeLayout.uniform(8, mig={i: "1g.10gb*7" for i in range(8)}, seed="bench")
        node = build_node(Path(tmp) / "node", layout)
        out = Path(tmp) / "out"
        out.mkdir()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        floor, ours = "python -c pass (floor)", "generate (python -m cdi.nvidia.cli)"
        pyyaml = "generate, PyYAML C dumper"
        common = ["--mode", "procfs", "--driver-root", str(node.driver_root),
                  "--hook-path", "/usr/local/bin/nri-cdi", "--output", str(out / "nvidia.yaml")]
        commands = {
            floor: [sys.executable, "-c", "pass"],
            ours: [sys.executable, "-m", "cdi.nvidia.cli", *common],
            "nri-cdi generate (nri_plugin.ops.cli)": [sys.executable, "-m", "nri_plugin.ops.cli",
                                                  "generate", *common],
            pyyaml: [sys.executable, "-c", PYYAML_GENERATE, *common],
        }
        installed = shutil.which("nri-cdi")
        if installed:
            commands["nri-cdi generate (console script)"] = [installed, "generate", *common]
        folders = dict.fromkeys(commands, REPO)
        if args.compare:
            name = f"generate ({args.compare.name})"
            commands[name] = [sys.executable, "-m", "cdi.nvidia.cli", *common]
            folders[name] = args.compare.resolve()
        written: dict[str, bytes] = {}
        for name, argv in commands.items():  # warm-up: bytecode cache, page cache
            run_child(argv, env, out, folders[name])
            if name != floor:
                written[name] = (out / "nvidia.yaml").read_bytes()
        if written[pyyaml] != written[ours]:  # the comparison is only fair on equal output
            raise SystemExit("PyYAML's C dumper wrote other bytes than cdi.yaml11")
        walls: dict[str, list[float]] = {name: [] for name in commands}
        peaks: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.rounds):
            for name, argv in commands.items():
                wall, peak = run_child(argv, env, out, folders[name])
                walls[name].append(wall)
                peaks[name].append(peak)
        report(walls, peaks, args.rounds)


def report(walls: dict[str, list[float]], peaks: dict[str, list[float]], rounds: int) -> None:
    floor_name = next(iter(walls))
    floor_wall = statistics.median(walls[floor_name])
    floor_peak = max(peaks[floor_name])
    print(f"8 GPUs x 7 MIG devices, procfs mode, {rounds} interleaved rounds")
    print(f"  {'command':38} {'median ms':>10} {'min ms':>8} {'x floor':>8} {'peak MB':>8} "
          f"{'x floor':>8}")
    for name in walls:
        wall, peak = statistics.median(walls[name]), max(peaks[name])
        print(f"  {name:38} {wall:10.1f} {min(walls[name]):8.1f} {wall / floor_wall:8.2f} "
              f"{peak:8.1f} {peak / floor_peak:8.2f}")
    print("  target for generate: <= 150 ms wall, <= 60 MB peak")


if __name__ == "__main__":
    main()
