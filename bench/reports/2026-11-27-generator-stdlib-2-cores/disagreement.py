"""Why ``bench_generate_cli.py`` as it was on main (0.98 of nvidia-ctk) and a user's run
(1.72) disagreed: both ways of running ``nri-cdi generate``, on the old default node (MIG on
GPU 0) and on the user's (no MIG), next to nvidia-ctk on each, in the same rounds.

- the old way: a venv made without pip (``venv.create(with_pip=False)``), pip's console
  script text pointing at it, ``PYTHONPATH`` = the checkout + this interpreter's
  site-packages (their ``.pth`` files not run), ``PYTHONPYCACHEPREFIX`` set;
- a user's way: ``python3 -m venv`` + ``pip install 'CHECKOUT[nvml]'`` and its ``nri-cdi``.

Run as root from this repository: ``NVIDIA_CTK=... python3 disagreement.py CHECKOUT [ROUNDS]``
(CHECKOUT: the code measured; main at 2dfe716 for ``disagreement.txt``).
"""

from __future__ import annotations

import os
import statistics
import sys
import sysconfig
import tempfile
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from bench.bench_generate_cli import (  # noqa: E402
    install,
    median_interval,
    timed,
    user_env,
)
from nri_cdi_testbed.simnode import NodeLayout, build_node, in_node_namespace  # noqa: E402

SCRIPT = """#!{python}
import re
import sys
from nri_plugin.ops.cli import entry
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(entry())
"""


def main() -> None:
    checkout, rounds = Path(sys.argv[1]).resolve(), int(sys.argv[2]) if len(sys.argv) > 2 else 31
    ctk = os.environ["NVIDIA_CTK"]
    with tempfile.TemporaryDirectory(prefix="disagreement-") as tmp:
        top = Path(tmp)
        venv.create(top / "bare", with_pip=False)
        old = top / "old-nri-cdi"
        old.write_text(SCRIPT.format(python=top / "bare" / "bin" / "python"))
        old.chmod(0o755)
        user = install(checkout, top / "venv", [])
        old_env = ["env", f"PYTHONPATH={checkout}:{sysconfig.get_paths()['purelib']}",
                   f"PYTHONPYCACHEPREFIX={top / 'pycache'}"]
        rows = {}
        for tag, layout in (("nomig", NodeLayout.uniform(2, seed="bench")),
                            ("mig", NodeLayout.uniform(2, mig={0: "3g.40gb,2g.20gb,1g.10gb*2"},
                                                       seed="bench"))):
            node = build_node(top / tag, layout)
            roots = ["--driver-root", str(node.driver_root), "--dev-root", str(node.dev_root)]
            out = top / f"out-{tag}"
            out.mkdir()
            for mode in ("procfs", "nvml"):
                args = ["generate", *roots, "--mode", mode, "--output", str(out / f"{mode}.yaml")]
                rows[f"old way, {tag}, {mode}"] = in_node_namespace(node, [*old_env, str(old),
                                                                           *args])
                rows[f"user's way, {tag}, {mode}"] = in_node_namespace(node, [str(user), *args])
            rows[f"nvidia-ctk, {tag}"] = in_node_namespace(node, [
                ctk, "--quiet", "cdi", "generate", *roots, "--mode", "nvml", "--feature-flag",
                "disable-nvsandboxutils", "--nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook",
                "--output", str(out / "ctk.yaml")])
        env, names = user_env(), list(rows)
        for name in names:
            timed(rows[name], env)
        t: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                t[name].append(timed(rows[name], env))
    print(f"{rounds} rounds, load average {os.getloadavg()[0]:.1f} at the end; medians")
    for name in names:
        print(f"  {name:28} wall {statistics.median(w for w, _ in t[name]):6.1f} ms  "
              f"CPU {statistics.median(c for _, c in t[name]):6.1f} ms")

    def ratio(a: str, b: str) -> str:
        w = median_interval([x[0] / y[0] for x, y in zip(t[a], t[b], strict=True)])
        c = median_interval([x[1] / y[1] for x, y in zip(t[a], t[b], strict=True)])
        return f"wall {w[0]:.2f} ({w[1]:.2f}-{w[2]:.2f})  CPU {c[0]:.2f} ({c[1]:.2f}-{c[2]:.2f})"

    print("  per-round ratios, median (95 % interval):")
    for tag in ("nomig", "mig"):
        for mode in ("procfs", "nvml"):
            for way in ("old way", "user's way"):
                print(f"  {way}, {tag}, {mode} / nvidia-ctk: "
                      f"{ratio(f'{way}, {tag}, {mode}', f'nvidia-ctk, {tag}')}")
    print(f"  nvidia-ctk, mig / nomig: {ratio('nvidia-ctk, mig', 'nvidia-ctk, nomig')}")
    for mode in ("procfs", "nvml"):
        print(f"  user's way / old way, nomig, {mode}: "
              f"{ratio(f'user{chr(39)}s way, nomig, {mode}', f'old way, nomig, {mode}')}")


if __name__ == "__main__":
    main()
