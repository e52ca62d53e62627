"""``nri-cdi generate`` as a user has it, next to NVIDIA's ``nvidia-ctk cdi generate`` on
the same simulated node, interleaved; per-round ratios with 95 % intervals.

What "as a user has it" means here, step by step:

- a fresh virtual environment of the interpreter running this script (``python3 -m venv``,
  with the pip and setuptools that brings, and the ``.pth`` file setuptools installs);
- ``pip install 'CHECKOUT[nvml]'``, not editable, from a copy of the checkout's files (pip
  builds in the source folder; the copy keeps ``build/`` out of the checkout), so the
  package, PyYAML, protobuf and nvidia-ml-py land in that environment's site-packages,
  byte-compiled by pip;
- the console script pip wrote, ``VENV/bin/nri-cdi generate ...``, run with the caller's
  environment minus every ``PYTHON*`` variable (no ``PYTHONPATH``, no bytecode prefix).

Rows, each run once per round in an order rotated from round to round:

- ``python -c pass``: the environment's interpreter alone (its ``site`` included), the
  least any Python command costs;
- ``procfs`` and ``nvml``: ``nri-cdi generate --mode ...``;
- ``nvidia-ctk``: ``nvidia-ctk cdi generate --mode nvml`` through the node's simulated
  libnvidia-ml (its default mode on a GPU node; it has no procfs mode);
- with ``--other NAME=CHECKOUT``: the same two modes from another checkout, installed the
  same way into its own environment (before/after, or a variant with one thing removed).

Every command runs in ``simnode.in_node_namespace``'s private mount namespace (nvidia-ctk
reads ``/proc/driver/nvidia`` and ``/sys/bus/pci/devices`` from the host; ours runs there
too, for equal overhead); root, gcc and unshare are needed. The specs go to a tmpfs, as
``/var/run/cdi`` (where the documented command writes) is on a node; ``--output-dir`` puts
them elsewhere, where a disk's fsync latency counts (ours syncs, nvidia-ctk does not).

Nodes: ``2gpu`` (default): 2 GPUs, no MIG, the node of issue 42's measurement; ``2gpu-mig``:
the same with 4 MIG devices on GPU 0; ``8x7mig``: 8 GPUs x 7 MIG devices. Through the
simulated libnvidia-ml, nvidia-ctk's MIG walk costs it far more than MIG costs us, so MIG
nodes flatter our ratio; the goal is judged on ``2gpu``.

Goal: ours / nvidia-ctk <= 1.0 in procfs mode, <= 1.2 in nvml mode (wall time).

nvidia-ctk comes from ``$NVIDIA_CTK``, else ``nvidia-ctk`` on the PATH; without it its row
is left out and the others remain. ``--pip-option`` passes options to pip (an index, a
wheel folder). Run as root: ``python3 bench/bench_generate_cli.py [--rounds 31]
[--node 2gpu] [--other NAME=CHECKOUT ...] [--save FILE.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from math import comb
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nri_cdi_testbed.simnode import NodeLayout, build_node, in_node_namespace  # noqa: E402

NODES: dict[str, tuple[str, Callable[[], NodeLayout]]] = {
    "2gpu": ("2 GPUs, no MIG", lambda: NodeLayout.uniform(2, seed="bench")),
    "2gpu-mig": ("2 GPUs, MIG on GPU 0 (4 devices)",
                 lambda: NodeLayout.uniform(2, mig={0: "3g.40gb,2g.20gb,1g.10gb*2"},
                                            seed="bench")),
    "8x7mig": ("8 GPUs x 7 MIG devices",
               lambda: NodeLayout.uniform(8, mig=dict.fromkeys(range(8), "1g.10gb*7"),
                                          seed="bench")),
}
MODES = ("procfs", "nvml")
GOALS = {"procfs": 1.0, "nvml": 1.2}
CTK = "nvidia-ctk"
FLOOR = "python -c pass"


def find_ctk() -> tuple[str | None, str]:
    """(path to nvidia-ctk or None, where it came from or why it is missing)."""
    wanted = os.environ.get("NVIDIA_CTK")
    if wanted:
        return (wanted, "$NVIDIA_CTK") if os.access(wanted, os.X_OK) else (
            None, f"$NVIDIA_CTK={wanted} is not an executable file")
    found = shutil.which("nvidia-ctk")
    return (found, "PATH") if found else (None, "nvidia-ctk is not on the PATH and "
                                                "$NVIDIA_CTK is unset")


def user_env() -> dict[str, str]:
    """The caller's environment as a user's shell would have it: no PYTHON* variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def checkout_files(checkout: Path) -> list[str]:
    """What ``pip install CHECKOUT`` sees of a git checkout: tracked files and new ones that
    git does not ignore (so build outputs and caches stay out)."""
    out = subprocess.run(["git", "-C", str(checkout), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], check=True, capture_output=True, text=True)
    return [name for name in out.stdout.split("\0")
            if name and (checkout / name).is_file() and not (checkout / name).is_symlink()]


def install(checkout: Path, where: Path, pip_options: Sequence[str]) -> Path:
    """A fresh venv at ``where`` with ``checkout[nvml]`` installed; its ``nri-cdi``."""
    source = where.with_name(where.name + "-source")
    for name in checkout_files(checkout):
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(checkout / name, target)
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, env=user_env())
    subprocess.run([str(where / "bin" / "pip"), "install", "--quiet",
                    "--disable-pip-version-check", *pip_options, f"{source}[nvml]"],
                   check=True, env=user_env())
    script = where / "bin" / "nri-cdi"
    if not script.is_file():
        raise SystemExit(f"pip wrote no {script}")
    return script


def spec_text(path: Path, script: Path) -> str:
    """A spec with its environment's folder spelled VENV (the default hook entry names
    that environment's interpreter and site-packages)."""
    return path.read_text().replace(str(script.parent.parent), "VENV")


def timed(argv: Sequence[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one command; a failure stops the benchmark with its stderr.
    CPU is user + system time of the process tree (wait4)."""
    start = time.perf_counter()
    proc = subprocess.Popen(list(argv), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter() - start) * 1000
    assert proc.stderr is not None
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv[-16:])} failed:\n{stderr[-2000:]}")
    return wall, (usage.ru_utime + usage.ru_stime) * 1000


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float,
                                                                                 float]:
    """(median, low, high): the distribution-free interval of the median from order
    statistics (the binomial with p = 1/2); for 31 values, the 10th and 22nd."""
    ordered = sorted(values)
    n = len(ordered)
    k, tail = 0, 0.0  # the largest k with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2
    while k < n // 2:
        tail += comb(n, k) / 2**n
        if tail > (1 - confidence) / 2:
            break
        k += 1
    if k == 0:  # too few values for an interval at this confidence
        return statistics.median(ordered), ordered[0], ordered[-1]
    return statistics.median(ordered), ordered[k - 1], ordered[n - k]


def measure(rows: dict[str, list[str]], env: dict[str, str],
            rounds: int) -> dict[str, list[tuple[float, float]]]:
    """Each row's (wall, CPU) per round; the row order rotates one step per round."""
    names = list(rows)
    for name in names:  # warm-up: page cache, and a check that every command runs
        timed(rows[name], env)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timed(rows[name], env))
    return times


def ratio_line(label: str, times: dict[str, list[tuple[float, float]]], row: str, base: str,
               goal: float | None = None) -> str:
    walls = [a[0] / b[0] for a, b in zip(times[row], times[base], strict=True)]
    cpus = [a[1] / b[1] for a, b in zip(times[row], times[base], strict=True)]
    (w, wl, wh), (c, cl, ch) = median_interval(walls), median_interval(cpus)
    met = ""
    if goal is not None:
        verdict = "met" if wh <= goal else "not met" if wl > goal else "not resolved"
        met = f"   goal <= {goal:.1f}: {verdict}"
    return (f"  {label:34} wall {w:5.2f} ({wl:.2f}-{wh:.2f})   CPU {c:5.2f} ({cl:.2f}-{ch:.2f})"
            f"{met}")


def report(title: str, times: dict[str, list[tuple[float, float]]], others: Sequence[str]
           ) -> None:
    rounds = len(next(iter(times.values())))
    print(f"{title}: {rounds} interleaved rounds, load average {os.getloadavg()[0]:.1f} at "
          "the end")
    print(f"  {'row':34} {'wall ms':>8} {'CPU ms':>8}   (medians)")
    for name, values in times.items():
        print(f"  {name:34} {statistics.median(w for w, _ in values):8.1f} "
              f"{statistics.median(c for _, c in values):8.1f}")
    print("  per-round ratios, median (95 % interval):")
    for mode in MODES:
        if CTK in times:
            print(ratio_line(f"{mode} / nvidia-ctk", times, mode, CTK, GOALS[mode]))
        for other in others:
            print(ratio_line(f"{mode} / {other} {mode}", times, mode, f"{other} {mode}"))
    if CTK in times:
        print(ratio_line(f"{FLOOR} / nvidia-ctk", times, FLOOR, CTK))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--node", choices=list(NODES), default="2gpu")
    parser.add_argument("--other", action="append", default=[], metavar="NAME=CHECKOUT",
                        help="also install and run another checkout (repeatable)")
    parser.add_argument("--pip-option", action="append", default=[], metavar="OPTION",
                        help="passed to pip install (repeatable)")
    parser.add_argument("--save", type=Path, metavar="FILE.json",
                        help="write every round's figures there")
    parser.add_argument("--output-dir", type=Path, metavar="DIR",
                        help="where the specs go (default: a folder in /dev/shm, a tmpfs "
                             "as /var/run/cdi is; a disk folder adds ours' fsyncs)")
    args = parser.parse_args()
    missing = [what for what, ok in (("root", os.geteuid() == 0),
                                     ("unshare", shutil.which("unshare")),
                                     ("gcc", shutil.which("gcc"))) if not ok]
    if missing:
        raise SystemExit(f"needs {', '.join(missing)} (a simulated node in a private mount "
                         "namespace)")
    others = dict(item.split("=", 1) for item in args.other)
    ctk, origin = find_ctk()
    print(f"nvidia-ctk: {ctk} ({origin})" if ctk else f"nvidia-ctk row left out: {origin}")
    with tempfile.TemporaryDirectory(prefix="bench-generate-cli-") as tmp:
        scripts = {"": install(REPO, Path(tmp) / "venv", args.pip_option)}
        for name, checkout in others.items():
            scripts[f"{name} "] = install(Path(checkout).resolve(), Path(tmp) / f"venv-{name}",
                                          args.pip_option)
        title, layout = NODES[args.node]
        node = build_node(Path(tmp) / "node", layout())
        shm = Path("/dev/shm")
        out = Path(tempfile.mkdtemp(prefix="bench-generate-cli-", dir=args.output_dir or (
            shm if shm.is_dir() else tmp)))
        roots = ["--driver-root", str(node.driver_root), "--dev-root", str(node.dev_root)]
        rows = {FLOOR: [str(scripts[""].with_name("python")), "-c", "pass"]}
        for prefix, script in scripts.items():  # each in its own folder, same file names
            (out / prefix.strip()).mkdir(exist_ok=True)
            for mode in MODES:
                rows[f"{prefix}{mode}"] = [str(script), "generate", *roots, "--mode", mode,
                                           "--output", str(out / prefix.strip() / f"{mode}.yaml")]
        if ctk:
            rows[CTK] = [ctk, "--quiet", "cdi", "generate", *roots, "--mode", "nvml",
                         "--feature-flag", "disable-nvsandboxutils",
                         "--nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook", "--output",
                         str(out / "ctk.yaml")]
        try:
            times = measure({name: in_node_namespace(node, argv) for name, argv in rows.items()},
                            user_env(), args.rounds)
            for mode in MODES:  # a variant that writes another spec is no fair comparison
                ours = spec_text(out / f"{mode}.yaml", scripts[""])
                for name in others:
                    if spec_text(out / name / f"{mode}.yaml", scripts[f"{name} "]) != ours:
                        print(f"note: {name} wrote another {mode} spec than this checkout")
        finally:
            shutil.rmtree(out, ignore_errors=True)
    report(title, times, list(others))
    if args.save:
        args.save.write_text(json.dumps({"node": args.node, "others": others,
                                         "load_average": os.getloadavg(), "rounds": times},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
