"""Issue 5/16 bench: what our hooks cost, next to NVIDIA's Go hooks.

(1) Create+Start on a real containerd (native CDI, so only the spec differs) for a GPU of
    a simulated node (about 60 library files), interleaved round by round, medians:
    no device; our hook mode (nvidia-ctk's default operations, one entry); the same with
    only create-symlinks and update-ldcache (``hooks-2ops``: what the two others cost);
    our hook-free mode (links as bind mounts, no hook); and, when
    ``$NRI_CDI_PEERS/nvidia-cdi-hook`` is present, the same spec with its hook entries
    rewritten to NVIDIA's hook binary (``nvidia``: the same operations as ours, one entry
    per operation and the device's links in the device, as ``nvidia-ctk`` lays them out;
    ``nvidia-default``: plus ``update-application-profile``).  The image is glibc-like (a
    static ``ldconfig`` in ``/sbin``, ``/etc/ld.so.conf``), so NVIDIA's ``update-ldcache``
    has an ldconfig to run and ours has a cache to rewrite.  The figure that matters is
    the *added* time over no device, ours against NVIDIA's.
(2) The hook processes alone against a prepared container root, as the runtime starts
    them (clean environment, OCI state on stdin): every hook entry of our spec, then the
    same operations with ``nvidia-cdi-hook``, next to ``python -I -S -c pass``.

Run as root: ``python3 bench/bench_hooks.py [--rounds 20]``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cdi.spec import read_spec  # noqa: E402
from nri_cdi_testbed.simnode import NodeLayout, build_node  # noqa: E402
from tests.e2e import images, paths  # noqa: E402
from tests.e2e.containerd import Containerd  # noqa: E402
from tests.peers import peer  # noqa: E402

HOOK_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
NVIDIA_HOOK = peer("nvidia-cdi-hook")
NVIDIA_ENV = ["NVIDIA_CTK_DEBUG=false"]
IMAGE = "localhost/nri-cdi/bench-glibc:e2e"
# Our operations and their options that take a value (see cdi/hooks/cli.py).
OPERATIONS = ("create-symlinks", "enable-cuda-compat", "update-ldcache",
              "disable-device-node-modification")


def generate(node: Path, mode: str, klass: str, out: Path, *extra: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--mode", "procfs",
                    "--driver-root", str(node), "--link-mode", mode, "--class", klass,
                    "--output", str(out / f"{klass}.json"), *extra], check=True, cwd=REPO,
                   capture_output=True)
    return out / f"{klass}.json"


# --- NVIDIA's hooks on the same spec ----------------------------------------------------------


def operations(args: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Our hook's argv after the entry script, split into (operation, its options)."""
    steps: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(args):
        if args[i] in OPERATIONS:
            steps.append((args[i], []))
            i += 1
            continue
        option = args[i]
        if "=" in option:
            steps[-1][1].extend(option.split("=", 1))
            i += 1
        else:
            steps[-1][1].extend((option, args[i + 1]))
            i += 2
    return steps


def _our_ops(hook: dict[str, Any]) -> list[tuple[str, list[str]]]:
    args = hook["args"]
    start = next(i for i, a in enumerate(args) if a in OPERATIONS)
    return operations(args[start:])


def _nvidia_hook(subcommand: str, *args: str) -> dict[str, Any]:
    return {"hookName": "createContainer", "path": str(NVIDIA_HOOK),
            "args": ["nvidia-cdi-hook", subcommand, *args], "env": NVIDIA_ENV}


def _split_links(options: list[str]) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """--link values, --device-link values by device, and the other options."""
    links: list[str] = []
    by_device: dict[str, list[str]] = {}
    rest: list[str] = []
    pairs = list(zip(options[::2], options[1::2], strict=True))
    for name, value in pairs:
        if name == "--link":
            links.append(value)
        elif name == "--device-link":
            device, _, link = value.partition("::")
            by_device.setdefault(device, []).append(link)
        else:
            rest += [name, value]
    return links, by_device, rest


def _nvidia_edits(edits: dict[str, Any], by_device: dict[str, list[str]], *,
                  defaults: bool) -> list[dict[str, Any]]:
    hooks: list[dict[str, Any]] = []
    device_paths = [n["path"] for n in edits.get("deviceNodes", [])]
    device_links = [link for p in device_paths for link in by_device.get(p, [])]
    if device_links:
        hooks.append(_nvidia_hook("create-symlinks",
                                  *[a for v in device_links for a in ("--link", v)]))
    for hook in edits.get("hooks", []):
        for op, options in _our_ops(hook):
            links, _, rest = _split_links(options)
            if op == "create-symlinks" and links:
                hooks.append(_nvidia_hook("create-symlinks",
                                          *[a for v in links for a in ("--link", v)]))
            elif op != "create-symlinks":
                hooks.append(_nvidia_hook(op, *rest))
    if defaults and any(_our_ops(h) for h in edits.get("hooks", [])):
        hooks.append(_nvidia_hook("update-application-profile"))
    return hooks


def nvidia_spec(ours: Path, klass: str, *, defaults: bool) -> Path:
    """``ours`` with every hook entry replaced by NVIDIA's entries for the same work."""
    spec = json.loads(ours.read_text())
    by_device: dict[str, list[str]] = {}
    for hook in spec.get("containerEdits", {}).get("hooks", []):
        for _, options in _our_ops(hook):
            for device, links in _split_links(options)[1].items():
                by_device.setdefault(device, []).extend(links)
    spec["kind"] = f"nvidia.com/{klass}"
    common = spec.get("containerEdits", {})
    common["hooks"] = _nvidia_edits(common, {}, defaults=defaults)
    for device in spec["devices"]:
        edits = device["containerEdits"]
        edits["hooks"] = _nvidia_edits({**edits}, by_device, defaults=False)
        if not edits["hooks"]:
            del edits["hooks"]
    out = ours.with_name(f"{klass}.json")
    out.write_text(json.dumps(spec))
    return out


# --- (1) Create+Start ---------------------------------------------------------------------------


def bench_image(root: Path) -> Path:
    """busybox plus what a glibc image has for the loader: a static ldconfig, ld.so.conf."""
    tree = root / "glibc-image"
    (tree / "sbin").mkdir(parents=True)
    (tree / "etc/ld.so.conf.d").mkdir(parents=True)
    shutil.copy2("/sbin/ldconfig", tree / "sbin/ldconfig")
    (tree / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    return images.image_from_tree(IMAGE, tree, root / "bench-glibc.tar",
                                  config=images.ImageConfig(cmd=("sleep", "600")))


def create_start(cri: object, pod: str, devices: list[str]) -> float:
    start = time.perf_counter()
    kwargs = {"cdi_devices": devices} if devices else {}
    cid = cri.create_container(pod, "b", IMAGE,  # type: ignore[attr-defined]
                               command=["sleep", "600"], **kwargs)
    cri.start_container(cid)  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - start
    cri.stop_container(cid)  # type: ignore[attr-defined]
    cri.remove_container(cid)  # type: ignore[attr-defined]
    return elapsed


def bench_containerd(specs: Path, root: Path, rounds: int,
                     kinds: dict[str, list[str]]) -> dict[str, float]:
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    archives = [images.pause_image(root), bench_image(root)]
    with Containerd(enable_cdi=True, cdi_spec_dirs=[specs]) as ctrd:
        ctrd.import_images(*archives)
        with ctrd.cri() as cri, cri.cleanup():
            pod = cri.run_pod("bench")
            order = list(kinds.items())
            for _, devices in order:
                create_start(cri, pod, devices)  # warm-up
            for index in range(rounds):
                shift = index % len(order)
                for kind, devices in order[shift:] + order[:shift]:
                    samples[kind].append(create_start(cri, pod, devices))
    return {k: statistics.median(v) * 1000 for k, v in samples.items()}


# --- (2) the hook processes alone ---------------------------------------------------------------


def hook_commands(spec_path: Path, label: str, device: str) -> dict[str, list[str]]:
    """Each hook entry a container gets from ``device``, as the runtime starts it."""
    data = read_spec(spec_path).data
    hooks = list(data.container_edits.hooks)
    for d in data.devices:
        if d.name == device:
            hooks += d.container_edits.hooks
    out: dict[str, list[str]] = {}
    for n, h in enumerate(hooks):
        name = " + ".join(a for a in h.args if a in OPERATIONS or a.startswith(
            ("enable-", "disable-", "update-application")))
        out[f"{label} {n}: {name}"] = [h.path, *h.args[1:]]
    return out


def prepared_bundle(spec_path: Path, root: Path) -> tuple[Path, bytes]:
    bundle = root / "bundle"
    rootfs = bundle / "rootfs"
    spec = read_spec(spec_path).data
    for mount in spec.container_edits.mounts:
        target = rootfs / mount.container_path.lstrip("/")
        if os.path.isfile(mount.host_path):
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(mount.host_path, target)
    (rootfs / "sbin").mkdir(exist_ok=True)
    shutil.copy2("/sbin/ldconfig", rootfs / "sbin/ldconfig")
    (rootfs / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    nodes = [{"path": n.path, "type": n.type, "major": n.major, "minor": n.minor}
             for d in spec.devices if d.name == "0" for n in d.container_edits.device_nodes]
    # /dev is a tmpfs of the container's own, as runc mounts it (the device links go there)
    dev = {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
           "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"},
                                                    "mounts": [dev],
                                                    "linux": {"devices": nodes}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "bench", "status": "creating",
                        "bundle": str(bundle)}).encode()
    return bundle, state


proc_usage: dict[int, float] = {}
_wait4 = os.wait4


def _recording_wait4(pid: int, options: int) -> tuple[int, int, Any]:
    """subprocess's own wait, also recording the child's CPU time (user + system)."""
    got, status, usage = _wait4(pid, options)
    if got:
        proc_usage[got] = usage.ru_utime + usage.ru_stime
    return got, status, usage


def _waitpid(pid: int, options: int) -> tuple[int, int]:
    got, status, _ = _recording_wait4(pid, options)
    return got, status


def private_root_mount(rootfs: Path) -> None:
    """Make ``rootfs`` a mount point in a mount namespace of this process's own, as it is
    when runc runs the hooks (NVIDIA's ``update-ldcache`` pivot_roots into it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
        sys.exit(f"unshare: {os.strerror(ctypes.get_errno())}")
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    subprocess.run(["mount", "--bind", str(rootfs), str(rootfs)], check=True)
    (rootfs / "dev").mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "nosuid,mode=755", "tmpfs",
                    str(rootfs / "dev")], check=True)


def baseline_commands(ours: dict[str, list[str]], rev: str, out: Path) -> dict[str, list[str]]:
    """Our hook entries again, run from ``rev``'s ``cdi/`` (a ``git archive`` copy), so that
    a change's cost is a ratio against the previous version measured in the same run."""
    out.mkdir()
    tar = subprocess.run(["git", "-C", str(REPO), "archive", rev, "cdi"], check=True,
                         capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=tar, check=True)
    script = str(REPO / "cdi/hooks/__main__.py")
    return {name.replace("ours", "baseline", 1): [str(out / "cdi/hooks/__main__.py")
                                                   if a == script else a for a in command]
            for name, command in ours.items()}


def bench_hook_processes(commands: dict[str, list[str]], state: bytes, rounds: int) -> None:
    commands = {"python -I -S -c pass": [sys.executable, "-I", "-S", "-c", "pass"], **commands}
    wall: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(rounds):
        for name, command in commands.items():
            wall[name].append(-time.perf_counter())
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, env=HOOK_ENV)
            _, err = proc.communicate(state)
            wall[name][-1] += time.perf_counter()
            usage = proc_usage.pop(proc.pid, None)
            cpu[name].append(usage if usage is not None else float("nan"))
            if proc.returncode:
                sys.exit(f"{name}: {err.decode(errors='replace').strip()}")
    print(f"(2) hook processes alone, {rounds} rounds (medians: wall clock, CPU user+sys)")
    totals: dict[str, list[float]] = {}
    for name in commands:
        w, c = statistics.median(wall[name]) * 1000, statistics.median(cpu[name]) * 1000
        label = name.split(" ", 1)[0]
        totals.setdefault(label, [0.0, 0.0])
        totals[label][0] += w
        totals[label][1] += c
        print(f"    {name[:58]:58} {w:6.1f} ms  {c:6.1f} ms CPU")
    for label in ("ours", "baseline", "nvidia", "nvidia-default"):
        if label in totals:
            w, c = totals[label]
            print(f"    all of {label + chr(39) + 's'} hooks for one GPU:{'':20} {w:6.1f} ms  "
                  f"{c:6.1f} ms CPU")
    if "baseline" in totals:
        (w, c), (bw, bc) = totals["ours"], totals["baseline"]
        print(f"    ours : baseline = {w / bw:.2f} (wall), {c / bc:.2f} (CPU)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--skip-containerd", action="store_true")
    parser.add_argument("--baseline", metavar="REV", help="also run the hook entry of this "
                        "git revision's cdi/ (e.g. main) in (2), for an ours:baseline ratio")
    args = parser.parse_args()
    if paths.missing_prerequisites():
        sys.exit("run: bash scripts/install-containerd.sh")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        built = build_node(root / "node", NodeLayout.uniform(1))
        node = built.driver_root
        specs = root / "cdi"
        hooks_spec = generate(node, "hooks", "gpu", specs)
        generate(node, "hooks", "two", specs, "--disable-hook", "enable-cuda-compat",
                 "--disable-hook", "disable-device-node-modification")
        flat_spec = generate(node, "mounts", "flat", specs)
        kinds = {"none": [], "hooks": ["nvidia.com/gpu=0"], "hooks-2ops": ["nvidia.com/two=0"],
                 "hook-free": ["nvidia.com/flat=0"]}
        nv_specs: dict[str, Path] = {}
        if NVIDIA_HOOK.exists():
            for klass, defaults in (("nvidia", False), ("nvidia-default", True)):
                nv_specs[klass] = nvidia_spec(hooks_spec, klass.replace("-", ""),
                                              defaults=defaults)
                kinds[klass] = [f"nvidia.com/{klass.replace('-', '')}=0"]
        else:
            print(f"({NVIDIA_HOOK} is absent: no NVIDIA figures)")
        if not args.skip_containerd:
            med = bench_containerd(specs, root, args.rounds, kinds)
            spec = read_spec(hooks_spec).data
            n_hooks = len(spec.container_edits.hooks) + sum(
                len(d.container_edits.hooks) for d in spec.devices if d.name == "0")
            print(f"(1) Create+Start, {args.rounds} interleaved rounds (medians); hook mode: "
                  f"{len(spec.container_edits.mounts)} mounts + {n_hooks} hook entries, "
                  f"hook-free: {len(read_spec(flat_spec).data.container_edits.mounts)} mounts")
            for kind in kinds:
                added = med[kind] - med["none"]
                print(f"    {kind:15} {med[kind]:7.1f} ms   (+{added:5.1f} ms over none)")
            for nv in nv_specs:
                ours = med["hooks"] - med["none"]
                theirs = med[nv] - med["none"]
                print(f"    added time, our hooks : {nv}'s = {ours:.1f} : {theirs:.1f} = "
                      f"{ours / theirs:.2f}")
        bundle, state = prepared_bundle(hooks_spec, root)
        private_root_mount(bundle / "rootfs")
        commands = hook_commands(hooks_spec, "ours", "0")
        if args.baseline:
            commands |= baseline_commands(commands, args.baseline, root / "baseline")
        for klass, path in nv_specs.items():
            commands |= hook_commands(path, klass, "0")
        os.waitpid = _waitpid  # type: ignore[assignment]  # for the children's CPU time
        try:
            bench_hook_processes(commands, state, max(args.rounds, 10))
        finally:
            subprocess.run(["umount", "-l", str(bundle / "rootfs")], check=False)


if __name__ == "__main__":
    main()
