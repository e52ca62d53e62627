"""``nri-cdi generate`` as a person types it (the console script, whole process) next to
NVIDIA's ``nvidia-ctk cdi generate`` on the same simulated node, interleaved, ratio of
medians.

Nodes: 2 GPUs (MIG on GPU 0: 4 devices) and 8 GPUs x 7 MIG devices. Rows per node:

- ``floor``: ``python -I -S -c pass`` (the interpreter alone, in the same wrapper);
- ``nvidia-ctk``: ``nvidia-ctk cdi generate --mode nvml`` through the node's simulated
  libnvidia-ml (its default mode on a GPU node; it has no procfs mode);
- ``ours procfs`` and ``ours nvml``: ``nri-cdi generate --mode ...``, run through a console
  script written the way pip writes ``nri-cdi`` (``from nri_plugin.ops.cli import entry``),
  in a fresh virtual environment of this interpreter, as a plain ``pip install`` leaves it
  (this checkout and the interpreter's site-packages on ``PYTHONPATH``, so their ``.pth``
  files do not run);
- ``ours procfs, this site``: the same script run by this interpreter itself, whose ``site``
  runs the ``.pth`` files of its site-packages (an editable install's finder, say): what
  the command costs on this development machine.

Goal: ours/nvidia-ctk <= 1.0 in procfs mode, <= 1.2 in nvml mode.

nvidia-ctk is found from ``$NVIDIA_CTK``, else ``nvidia-ctk`` on the PATH; without it its
column is skipped (the reason is printed) and the floor remains. nvidia-ctk reads
``/proc/driver/nvidia`` and ``/sys/bus/pci/devices`` from the host, so every command (ours
too, for equal overhead) runs in ``simnode.in_node_namespace``'s private mount namespace:
root, gcc and unshare are needed. Bytecode is cached (``PYTHONPYCACHEPREFIX``) as an
installed package has it; the specs go to a tmpfs, as on a node (/var/run/cdi).

Run: ``python3 bench/bench_generate_cli.py [--rounds 15] [--nodes 2gpu,8x7mig]``. Once
installed (``pip install .``), the same run against the installed command is
``nri-cdi generate --driver-root NODE --dev-root NODE --mode procfs`` inside the namespace;
this script mirrors that command exactly, but imports this checkout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import venv
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cdi.nvidia.simnode import BuiltNode, NodeLayout, build_node, in_node_namespace  # noqa: E402

# What pip writes for ``[project.scripts] nri-cdi = "nri_plugin.ops.cli:entry"``.
CONSOLE_SCRIPT = """#!{python}
# -*- coding: utf-8 -*-
import re
import sys
from nri_plugin.ops.cli import entry
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(entry())
"""
NODES = {
    "2gpu": ("2 GPUs, MIG on GPU 0 (4 devices)",
             lambda: NodeLayout.uniform(2, mig={0: "3g.40gb,2g.20gb,1g.10gb*2"}, seed="bench")),
    "8x7mig": ("8 GPUs x 7 MIG devices",
               lambda: NodeLayout.uniform(8, mig=dict.fromkeys(range(8), "1g.10gb*7"),
                                          seed="bench")),
}


def find_ctk() -> tuple[str | None, str]:
    """(path to nvidia-ctk or None, where it came from or why it is missing)."""
    wanted = os.environ.get("NVIDIA_CTK")
    if wanted:
        return (wanted, "$NVIDIA_CTK") if os.access(wanted, os.X_OK) else (
            None, f"$NVIDIA_CTK={wanted} is not an executable file")
    found = shutil.which("nvidia-ctk")
    return (found, "PATH") if found else (None, "nvidia-ctk is not on the PATH and "
                                                "$NVIDIA_CTK is unset")


def run(argv: Sequence[str], env: dict[str, str]) -> float:
    """Wall time in ms of one command; a failure stops the benchmark with its stderr."""
    start = time.perf_counter()
    proc = subprocess.run(list(argv), env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False)
    elapsed = (time.perf_counter() - start) * 1000
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[-14:])} failed:\n{proc.stderr[-2000:]}")
    return elapsed


def console_script(folder: Path, python: str) -> Path:
    script = folder / "nri-cdi"
    script.write_text(CONSOLE_SCRIPT.format(python=python))
    script.chmod(0o755)
    return script


def commands(node: BuiltNode, scripts: dict[str, Path], ctk: str | None,
             out: Path) -> dict[str, list[str]]:
    roots = ["--driver-root", str(node.driver_root), "--dev-root", str(node.dev_root)]
    args = ["generate", *roots, "--output", str(out / "ours.yaml")]
    clean, here = str(scripts["clean"]), str(scripts["here"])
    rows = {"floor": [sys.executable, "-I", "-S", "-c", "pass"],
            "ours procfs": [clean, *args, "--mode", "procfs"],
            "ours nvml": [clean, *args, "--mode", "nvml"],
            "ours procfs, this site": [here, *args, "--mode", "procfs"]}
    if ctk:
        rows["nvidia-ctk"] = [
            ctk, "--quiet", "cdi", "generate", *roots, "--mode", "nvml",
            "--feature-flag", "disable-nvsandboxutils",
            "--nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook", "--output",
            str(out / "ctk.yaml")]
    return {name: in_node_namespace(node, argv) for name, argv in rows.items()}


def measure(rows: dict[str, list[str]], env: dict[str, str], rounds: int) -> dict[str, float]:
    for argv in rows.values():  # warm-up: bytecode cache, page cache
        run(argv, env)
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(rounds):  # interleaved: each round runs every row once
        for name, argv in rows.items():
            times[name].append(run(argv, env))
    return {name: statistics.median(values) for name, values in times.items()}


def report(title: str, med: dict[str, float], rounds: int) -> None:
    print(f"{title}: median of {rounds} interleaved rounds, load average "
          f"{os.getloadavg()[0]:.1f}; floor (python -I -S -c pass) {med['floor']:.1f} ms")
    print(f"  {'mode':22} {'ours ms':>8} {'nvidia-ctk ms':>14} {'ratio':>6} {'goal':>5}")
    ctk = med.get("nvidia-ctk")
    for mode, goal in (("procfs", 1.0), ("nvml", 1.2), ("procfs, this site", 1.0)):
        ours = med[f"ours {mode}"]
        if ctk is None:
            print(f"  {mode:22} {ours:8.1f} {'-':>14} {'-':>6} {goal:5.1f}")
        else:
            print(f"  {mode:22} {ours:8.1f} {ctk:14.1f} {ours / ctk:6.2f} {goal:5.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--nodes", default=",".join(NODES),
                        help=f"comma-separated, of {', '.join(NODES)}")
    args = parser.parse_args()
    ctk, origin = find_ctk()
    print(f"nvidia-ctk: {ctk} ({origin})" if ctk else f"nvidia-ctk column skipped: {origin}")
    with tempfile.TemporaryDirectory(prefix="bench-generate-cli-") as tmp:
        venv.create(Path(tmp) / "venv", with_pip=False)
        (Path(tmp) / "clean").mkdir()
        scripts = {"clean": console_script(Path(tmp) / "clean",
                                           str(Path(tmp) / "venv" / "bin" / "python")),
                   "here": console_script(Path(tmp), sys.executable)}
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        path = os.pathsep.join([str(REPO), sysconfig.get_paths()["purelib"]])
        env |= {"PYTHONPATH": path, "PYTHONPYCACHEPREFIX": str(Path(tmp) / "pycache")}
        shm = Path("/dev/shm")
        out = Path(tempfile.mkdtemp(prefix="bench-generate-cli-",
                                    dir=shm if shm.is_dir() else tmp))
        try:
            for key in args.nodes.split(","):
                title, layout = NODES[key]
                node = build_node(Path(tmp) / key, layout())
                med = measure(commands(node, scripts, ctk, out), env, args.rounds)
                report(title, med, args.rounds)
        finally:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
