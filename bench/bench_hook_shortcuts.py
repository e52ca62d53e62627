"""Issue 53 bench: what the start-up shortcuts on the hook path buy a hook process.

The shortcuts: ``TYPE_CHECKING = False`` (instead of ``from typing import TYPE_CHECKING``)
and ``cdi.linux.namedtuple`` (instead of ``typing.NamedTuple``) in the modules a
createContainer hook imports, which spare it ``typing``; and the ``nri-cdi`` parser's help
formatter (``nri_plugin/ops/cli.py``), which spares a hook named ``nri-cdi`` argparse's
import of ``shutil``. Two copies of the checkout's packages, as pip would install them
(plain files in a folder of their own): ``with`` as they are, ``without`` with each
shortcut replaced by the plain form. Each copy runs the hook entries of the same spec
(hooks mode, one GPU of a simulated node) on one prepared container root, as the runtime
starts them (clean environment, OCI state on stdin), interleaved round by round:

* ``entry``: the default hook program, ``python3 -I -S <copy>/cdi/hooks/__main__.py ...``;
* ``nri-cdi``: a console script like pip's for ``nri-cdi`` (site and all), ``nri-cdi hook
  ...``, which re-executes itself as the isolated entry.

Printed: the medians (wall clock and CPU) of each, next to ``python3 -I -S -c pass``, the
``without : with`` ratios, and, under ``--callgrind``, each one's instruction count
(valgrind --tool=callgrind, one run each; the same on any load). Run as root:
``python3 bench/bench_hook_shortcuts.py [--rounds 40] [--callgrind]``.
"""

from __future__ import annotations

import argparse
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_hooks import (  # noqa: E402
    HOOK_ENV,
    generate,
    hook_commands,
    prepared_bundle,
    private_root_mount,
)
from nri_cdi_testbed.simnode import NodeLayout, build_node  # noqa: E402

# shortcut -> (file pattern, what to replace, by what): its plain form.
PLAIN: dict[str, tuple[str, str, str]] = {
    "TYPE_CHECKING": (r"cdi/.*\.py", r"^TYPE_CHECKING = False\b.*$",
                      "from typing import TYPE_CHECKING"),
    "NamedTuple": (r"cdi/.*\.py", r"^from cdi\.linux\.namedtuple import ", "from typing import "),
    "formatter": (r"nri_plugin/ops/cli\.py",
                  r'^        kwargs\.setdefault\("formatter_class", _Formatter\)$', "        pass"),
}
# Each copy: the shortcuts in their plain form. One at a time, then all of them: TYPE_CHECKING
# and NamedTuple both spare typing, so either alone may cost what both do.
VARIANTS: dict[str, tuple[str, ...]] = {
    "with": (), "plain-TYPE_CHECKING": ("TYPE_CHECKING",), "typing.NamedTuple": ("NamedTuple",),
    "plain-argparse": ("formatter",), "without": tuple(PLAIN)}
CONSOLE_SCRIPT = """#!{python}
import sys
sys.path.insert(0, {root!r})
from nri_plugin.ops.cli import entry
sys.argv[0] = "nri-cdi"
{stage}entry()
"""
# callgrind loses the counts of a program that execs (the pid's file is the next program's):
# the console script's own part is counted up to its exec, the entry's on its own.
UP_TO_EXEC = "import os; os.execve = lambda *args: os._exit(0)\n"


def copy_tree(dest: Path, plain: tuple[str, ...]) -> int:
    """The packages into ``dest``, the ``plain`` shortcuts replaced (returns how many lines
    changed)."""
    changed = 0
    for package in ("cdi", "nri_plugin"):
        shutil.copytree(REPO / package, dest / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    if plain:
        for path in sorted(dest.rglob("*.py")):
            name = path.relative_to(dest).as_posix()
            text = path.read_text()
            for files, pattern, replacement in (PLAIN[p] for p in plain):
                if re.fullmatch(files, name):
                    text, n = re.subn(pattern, replacement, text, flags=re.M)
                    changed += n
            path.write_text(text)
    return changed


def commands_for(label: str, tree: Path, ours: dict[str, list[str]],
                 script: str) -> dict[str, list[str]]:
    """The spec's hook entries run from ``tree``: as the entry script, and through a console
    script ``nri-cdi hook``."""
    console = tree / "bin" / "nri-cdi"
    console.parent.mkdir()
    for path, stage in ((console, ""), (tree / "bin" / "nri-cdi-up-to-exec", UP_TO_EXEC)):
        path.write_text(CONSOLE_SCRIPT.format(python=sys.executable, root=str(tree),
                                              stage=stage))
        path.chmod(0o755)
    out: dict[str, list[str]] = {}
    entry = str(tree / "cdi/hooks/__main__.py")
    for name, command in ours.items():
        ops = command[command.index(script) + 1:]
        out[f"{label} entry {name}"] = [sys.executable, "-I", "-S", entry, *ops]
        out[f"{label} nri-cdi {name}"] = [str(console), "hook", *ops]
    return out


def run_rounds(commands: dict[str, list[str]], state: bytes,
               rounds: int) -> dict[str, tuple[float, float]]:
    wall: dict[str, list[float]] = {n: [] for n in commands}
    cpu: dict[str, list[float]] = {n: [] for n in commands}
    for _ in range(rounds):
        for name, command in commands.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            done = subprocess.run(command, input=state, capture_output=True, env=HOOK_ENV,
                                  check=False)
            wall[name].append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name].append(after.ru_utime + after.ru_stime
                             - before.ru_utime - before.ru_stime)
            if done.returncode:
                sys.exit(f"{name}: {done.stderr.decode(errors='replace').strip()}")
    return {n: (statistics.median(wall[n]) * 1000, statistics.median(cpu[n]) * 1000)
            for n in commands}


def instructions(command: list[str], state: bytes, work: Path) -> int:
    out = work / f"callgrind.{len(list(work.iterdir()))}"
    subprocess.run(["valgrind", "--tool=callgrind", "--trace-children=yes",
                    f"--callgrind-out-file={out}.%p", *command], input=state,
                   capture_output=True, env=HOOK_ENV, check=True)
    total = 0
    for part in work.glob(f"{out.name}.*"):
        match = re.search(r"^summary: (\d+)", part.read_text(errors="replace"), re.M)
        total += int(match.group(1)) if match else 0
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--callgrind", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        node = build_node(root / "node", NodeLayout.uniform(1)).driver_root
        spec = generate(node, "hooks", "gpu", root / "cdi")
        bundle, state = prepared_bundle(spec, root)
        private_root_mount(bundle / "rootfs")
        try:
            ours = hook_commands(spec, "", "0")
            script = str(REPO / "cdi/hooks/__main__.py")
            commands = {"python -I -S -c pass": [sys.executable, "-I", "-S", "-c", "pass"]}
            for label, plain in VARIANTS.items():
                changed = copy_tree(root / label, plain)
                print(f"{label}: {changed} lines in their plain form")
                commands |= commands_for(label, root / label, ours, script)
            run_rounds(commands, state, 1)  # each copy compiles its .pyc files once
            medians = run_rounds(commands, state, args.rounds)
            print(f"hook processes alone, {args.rounds} interleaved rounds (medians: wall "
                  f"clock, CPU user+sys)")
            for name, (w, c) in medians.items():
                print(f"    {name[:70]:70} {w:6.1f} ms  {c:6.1f} ms CPU")
            for kind in ("entry", "nri-cdi"):
                w, c = (sum(medians[n][i] for n in medians if n.startswith(f"with {kind} "))
                        for i in (0, 1))
                for label in list(VARIANTS)[1:]:
                    pw, pc = (sum(medians[n][i] for n in medians
                                  if n.startswith(f"{label} {kind} ")) for i in (0, 1))
                    print(f"    {kind}, {label} : with = {pw / w:.3f} (wall), {pc / c:.3f} "
                          f"(CPU): the shortcut buys {(pw - w) / pw:.1%} (wall), "
                          f"{(pc - c) / pc:.1%} (CPU) of its plain form's time")
            if args.callgrind and shutil.which("valgrind"):
                work = root / "callgrind"
                work.mkdir()
                counts: dict[str, int] = {}
                for name, command in commands.items():
                    if command[0].endswith("/bin/nri-cdi"):  # up to its exec, then the entry
                        label, _, hook = name.partition(" nri-cdi ")
                        command = [command[0] + "-up-to-exec", *command[1:]]
                        counts[name] = instructions(command, state, work) + instructions(
                            commands[f"{label} entry {hook}"], state, work)
                    else:
                        counts[name] = instructions(command, state, work)
                print("instructions (callgrind, every process of the hook)")
                for name, count in counts.items():
                    print(f"    {name[:70]:70} {count / 1e6:8.1f} M")
                for kind in ("entry", "nri-cdi"):
                    with_ = sum(v for n, v in counts.items() if n.startswith(f"with {kind} "))
                    for label in list(VARIANTS)[1:]:
                        plain_ = sum(v for n, v in counts.items()
                                     if n.startswith(f"{label} {kind} "))
                        print(f"    {kind}, {label} : with = {plain_ / with_:.3f}: the "
                              f"shortcut buys {(plain_ - with_) / plain_:.1%} of its plain "
                              "form's instructions")
        finally:
            subprocess.run(["umount", "-l", str(bundle / "rootfs")], check=False)


if __name__ == "__main__":
    main()
