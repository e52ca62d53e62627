"""Issue 5 bench: what our hooks cost.

(1) Create+Start on a real containerd (native CDI, so only the spec differs) for a GPU of
    a simulated node (about 60 library files): hook mode (bind mounts + the default hooks:
    create-symlinks, enable-cuda-compat, update-ldcache, disable-device-node-modification)
    vs the same with only the first and third vs hook-free mode (links as extra bind
    mounts, no hook) vs no injection, interleaved round by round, medians and ratios.
(2) The hook processes alone against a prepared container root: ``update-ldcache`` and
    ``create-symlinks`` as the runtime starts them (``nri-cdi hook ...`` with a clean
    environment), next to ``python -c pass`` in the same run.

Run as root: ``python3 bench/bench_hooks.py [--rounds 20]``.
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cdi.nvidia.simnode import NodeLayout, build_node  # noqa: E402
from cdi.spec import read_spec  # noqa: E402
from tests.e2e import images, paths  # noqa: E402
from tests.e2e.containerd import Containerd  # noqa: E402

HOOK_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def generate(node: Path, mode: str, klass: str, out: Path, *extra: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--mode", "procfs",
                    "--driver-root", str(node), "--link-mode", mode, "--class", klass,
                    "--output", str(out / f"{klass}.yaml"), *extra], check=True, cwd=REPO,
                   capture_output=True)
    return out / f"{klass}.yaml"


def create_start(cri: object, pod: str, devices: list[str]) -> float:
    start = time.perf_counter()
    kwargs = {"cdi_devices": devices} if devices else {}
    cid = cri.create_container(pod, "b", images.BUSYBOX_IMAGE,  # type: ignore[attr-defined]
                               command=["sleep", "600"], **kwargs)
    cri.start_container(cid)  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - start
    cri.stop_container(cid)  # type: ignore[attr-defined]
    cri.remove_container(cid)  # type: ignore[attr-defined]
    return elapsed


def bench_containerd(specs: Path, root: Path, rounds: int) -> dict[str, float]:
    kinds = {"none": [], "hooks": ["nvidia.com/gpu=0"], "2 hooks": ["nvidia.com/two=0"],
             "hook-free": ["nvidia.com/flat=0"]}
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    archives = [images.pause_image(root), images.busybox_image(root)]
    with Containerd(enable_cdi=True, cdi_spec_dirs=[specs]) as ctrd:
        ctrd.import_images(*archives)
        with ctrd.cri() as cri, cri.cleanup():
            pod = cri.run_pod("bench")
            order = list(kinds.items())
            for _, devices in order:
                create_start(cri, pod, devices)  # warm-up
            for index in range(rounds):
                for kind, devices in order[index % len(order):] + order[:index % len(order)]:
                    samples[kind].append(create_start(cri, pod, devices))
    return {k: statistics.median(v) * 1000 for k, v in samples.items()}


def hook_commands(spec_path: Path) -> dict[str, list[str]]:
    """Each hook as the runtime starts it: ``path`` with ``args`` after argv[0]."""
    hooks = read_spec(spec_path).data.container_edits.hooks
    return {f"hook {h.args[4]}": [h.path, *h.args[1:]] for h in hooks}


def bench_hook_processes(spec_path: Path, node: Path, root: Path, rounds: int) -> None:
    """Run each hook against a bundle whose rootfs has the spec's libraries copied in."""
    bundle = root / "bundle"
    rootfs = bundle / "rootfs"
    spec = read_spec(spec_path).data
    for mount in spec.container_edits.mounts:
        target = rootfs / mount.container_path.lstrip("/")
        if os.path.isfile(mount.host_path):
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(mount.host_path, target)
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "bench", "status": "creating",
                        "bundle": str(bundle)}).encode()
    commands = {"python -c pass": [sys.executable, "-c", "pass"],
                **hook_commands(spec_path)}
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(rounds):
        for name, command in commands.items():
            start = time.perf_counter()
            subprocess.run(command, input=state, env=HOOK_ENV, check=True, capture_output=True)
            samples[name].append(time.perf_counter() - start)
    floor = statistics.median(samples["python -c pass"]) * 1000
    print(f"(2) hook processes alone, {rounds} rounds (medians)")
    for name, values in samples.items():
        med = statistics.median(values) * 1000
        print(f"    {name:28} {med:7.1f} ms   ({med / floor:.2f} x python -c pass)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    if paths.missing_prerequisites():
        sys.exit("run: bash scripts/install-containerd.sh")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        node = build_node(root / "node", NodeLayout.uniform(1)).driver_root
        specs = root / "cdi"
        hooks_spec = generate(node, "hooks", "gpu", specs)
        # The two hooks before issue 15 (no enable-cuda-compat, no
        # disable-device-node-modification), to price the two it added.
        generate(node, "hooks", "two", specs, "--disable-hook", "enable-cuda-compat",
                 "--disable-hook", "disable-device-node-modification")
        flat_spec = generate(node, "mounts", "flat", specs)
        mounts = len(read_spec(hooks_spec).data.container_edits.mounts)
        hooks = len(read_spec(hooks_spec).data.container_edits.hooks)
        flat_mounts = len(read_spec(flat_spec).data.container_edits.mounts)
        med = bench_containerd(specs, root, args.rounds)
        print(f"(1) Create+Start, {args.rounds} interleaved rounds (medians); hook mode: "
              f"{mounts} mounts + {hooks} hooks (2 hooks: create-symlinks, update-ldcache), "
              f"hook-free: {flat_mounts} mounts")
        for kind in ("none", "hooks", "2 hooks", "hook-free"):
            print(f"    {kind:12} {med[kind]:7.1f} ms   ({med[kind] / med['none']:.3f} x none)")
        bench_hook_processes(hooks_spec, node, root, args.rounds)


if __name__ == "__main__":
    main()
