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

Run: ``python3 bench/bench_generate_cli.py [--rounds 15] [--nodes 2gpu,8x7mig]
[--other CHECKOUT]`` (``--other``: the same rows from another checkout too). Once
installed (``pip install .``), the same run against the installed command is
``nri-cdi generate --driver-root NODE --dev-root NODE --mode procfs`` inside the namespace;
this script mirrors that command exactly, but imports this checkout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import sysconfig
import tempfile
import venv
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_generate_vs_ctk import timed as run  # noqa: E402
from nri_cdi_testbed.simnode import BuiltNode, NodeLayout, build_node, in_node_namespace  # noqa: E402

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


def two_gpus() -> NodeLayout:
    return NodeLayout.uniform(2, mig={0: "3g.40gb,2g.20gb,1g.10gb*2"}, seed="bench")


def eight_by_seven() -> NodeLayout:
    return NodeLayout.uniform(8, mig=dict.fromkeys(range(8), "1g.10gb*7"), seed="bench")


NODES: dict[str, tuple[str, Callable[[], NodeLayout]]] = {
    "2gpu": ("2 GPUs, MIG on GPU 0 (4 devices)", two_gpus),
    "8x7mig": ("8 GPUs x 7 MIG devices", eight_by_seven),
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




def console_script(folder: Path, python: str) -> Path:
    script = folder / "nri-cdi"
    script.write_text(CONSOLE_SCRIPT.format(python=python))
    script.chmod(0o755)
    return script


def commands(node: BuiltNode, scripts: dict[str, Path], ctk: str | None, out: Path,
             other: Path | None) -> dict[str, list[str]]:
    roots = ["--driver-root", str(node.driver_root), "--dev-root", str(node.dev_root)]
    args = ["generate", *roots, "--output", str(out / "ours.yaml")]
    clean, here = str(scripts["clean"]), str(scripts["here"])
    rows = {"floor": [sys.executable, "-I", "-S", "-c", "pass"],
            "ours procfs": [clean, *args, "--mode", "procfs"],
            "ours nvml": [clean, *args, "--mode", "nvml"],
            "ours procfs, this site": [here, *args, "--mode", "procfs"]}
    if other is not None:  # the same rows from another checkout, both through env(1)
        for mode in ("procfs", "nvml"):
            for who, repo in (("ours", REPO), ("other", other)):
                path = os.pathsep.join([str(repo), sysconfig.get_paths()["purelib"]])
                rows[f"{who} {mode}"] = ["env", f"PYTHONPATH={path}", clean, *args,
                                         "--mode", mode]
    if ctk:
        rows["nvidia-ctk"] = [
            ctk, "--quiet", "cdi", "generate", *roots, "--mode", "nvml",
            "--feature-flag", "disable-nvsandboxutils",
            "--nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook", "--output",
            str(out / "ctk.yaml")]
    return {name: in_node_namespace(node, argv) for name, argv in rows.items()}


def measure(rows: dict[str, list[str]], env: dict[str, str],
            rounds: int) -> dict[str, tuple[float, float]]:
    """Median (wall ms, CPU ms) of each row."""
    for argv in rows.values():  # warm-up: bytecode cache, page cache
        run(argv, env)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
    for _ in range(rounds):  # interleaved: each round runs every row once
        for name, argv in rows.items():
            times[name].append(run(argv, env))
    return {name: (statistics.median(w for w, _ in values),
                   statistics.median(c for _, c in values))
            for name, values in times.items()}


def report(title: str, med: dict[str, tuple[float, float]], rounds: int) -> None:
    print(f"{title}: median of {rounds} interleaved rounds, load average "
          f"{os.getloadavg()[0]:.1f}; floor (python -I -S -c pass) {med['floor'][0]:.1f} ms "
          f"wall, {med['floor'][1]:.1f} ms CPU")
    print(f"  {'mode':18} {'ours ms':>8} {'nvidia-ctk':>10} {'ratio':>6} {'goal':>5}   "
          f"{'CPU ms':>7} {'nvidia-ctk':>10} {'ratio':>6}")
    ctk = med.get("nvidia-ctk")
    for mode, goal in (("procfs", 1.0), ("nvml", 1.2), ("procfs, this site", 1.0)):
        wall, cpu = med[f"ours {mode}"]
        if ctk is None:
            print(f"  {mode:18} {wall:8.1f} {'-':>10} {'-':>6} {goal:5.1f}   {cpu:7.1f}")
        else:
            print(f"  {mode:18} {wall:8.1f} {ctk[0]:10.1f} {wall / ctk[0]:6.2f} {goal:5.1f}   "
                  f"{cpu:7.1f} {ctk[1]:10.1f} {cpu / ctk[1]:6.2f}")
    for mode in ("procfs", "nvml"):
        if f"other {mode}" in med:
            (wall, cpu), (o_wall, o_cpu) = med[f"ours {mode}"], med[f"other {mode}"]
            print(f"  {mode:7} other checkout {o_wall:.1f} ms wall, {o_cpu:.1f} ms CPU: "
                  f"ours/other {wall / o_wall:.2f} wall, {cpu / o_cpu:.2f} CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--nodes", default=",".join(NODES),
                        help=f"comma-separated, of {', '.join(NODES)}")
    parser.add_argument("--other", type=Path, metavar="CHECKOUT",
                        help="also run the command from another checkout (before/after)")
    args = parser.parse_args()
    missing = [what for what, ok in (("root", os.geteuid() == 0),
                                     ("unshare", shutil.which("unshare")),
                                     ("gcc", shutil.which("gcc"))) if not ok]
    if missing:
        raise SystemExit(f"needs {', '.join(missing)} (a simulated node in a private mount "
                         "namespace)")
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
                rows = commands(node, scripts, ctk, out, args.other)
                med = measure(rows, env, args.rounds)
                report(title, med, args.rounds)
        finally:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
