"""(c) Create+Start on a real containerd: no injection vs containerd's native CDI vs our
NRI plugin, interleaved round by round in one run, medians and ratios, per containerd
version (1.7 and 2.1 by default, ``--runtime 2.1`` for one).

Per version, one private containerd per role (scripts/install-containerd.sh must have
run): "plain", with native CDI enabled and no NRI plugin (serves "no injection" and "native
CDI"), and one with our plugin connected (serves "our plugin"), and one per extra plugin
below. Each round creates and starts one container of each kind; all request the same
devices (two GPU-like char devices, a library folder, env, a createContainer hook).
Containers are removed outside the timed part. The rounds run in blocks: from one block to
the next every role moves to the next containerd (each restarted with its new role's
setting, the plugins started anew), so that each kind is measured on each containerd
equally often (``--rotations N``: N times). Two containerds serving the same plugin differ
by up to 3 % in Create+Start within one run, more than the differences to measure: with
fixed places that difference went to one kind; moved around, it goes to all alike. The
report gives CreateContainer ours - reference block by block too.

``--baseline-repo DIR`` adds a fourth kind in the same rounds: the plugin of another
checkout (e.g. the main branch) on a containerd of its own, to compare two versions of
the plugin against the same native CDI figures.

``--noop`` (with ``--reference``) adds the reference started with an empty device pattern,
which answers every CreateContainer at once with no adjustment: an NRI plugin doing
nothing, the floor any NRI plugin costs that containerd over no plugin at all.

``--floor`` (with ``--reference``) adds native CDI with that no-op plugin connected: the
same devices injected by the runtime's own CDI, on a containerd that also asks an NRI
plugin (which answers nothing) at every CreateContainer. No NRI plugin that injects can
cost less than that: what it adds over native CDI is the floor of any injection through
NRI on that containerd, and ours over it is what our plugin itself adds.

``--reference BINARY`` (or ``$NRI_CDI_REFERENCE_INJECTOR``) adds the Go reference CDI
injector, on a containerd of its own, in the same rounds: an NRI plugin that resolves the
same devices with the CDI Go library and turns the edits into an adjustment
(containers/nri-plugins PR #327's ``cdi-device-injector``, commit 2206edc9: its pods ask
with its own annotation, ``cdi.nri.io/pod``). It is not part of this project; build it
from its public source. It is started as
``BINARY -name nri-cdi-ref -idx 10 -socket SOCKET -spec-dir DIR``: as published it has
neither flag (it uses the default socket and spec folders) and it fails on a spec with
device nodes (a nil ``Linux.Resources``), so a build for this bench adds the two flags
and that nil check. In every block each kind's two warm-up containers (not timed) are
checked to have both devices, so no kind is measured doing less.
The report then also gives each plugin's CreateContainer alone (Create, not Start), and
each kind's Start alone.

Each round runs the kinds in a new random order (seeded by ``--rounds``). Besides the
medians, the report gives per-round paired differences with two bootstrap 95 % intervals
(ours against native CDI, the reference and the baseline, each from the same rounds): one
resampling rounds, one resampling whole blocks (the rounds of a block share its placement,
so they are not independent draws: the second is the honest one when placements differ),
and
each plugin process's CPU time during its CreateContainer (all its threads, from
/proc/PID/task/*/schedstat: less noisy than wall time, which two containerds running the
same plugin already split by about 0.2 ms; ``--baseline-repo`` of this checkout gives
that A/A spread).

``--save FILE.json`` (with one ``--runtime``) also writes every round's times, for
``bench/pool_containerd.py`` to pool several runs: one run's intervals are too wide, and
its hour too particular, to settle a goal of 1-2 %.

``--spec-dir DIR --device NAME`` asks for the devices of a spec folder of one's own
instead (a real node's generated spec, ``--device nvidia.com/gpu=0``).

Run as root: ``python3 bench/bench_containerd.py [--rounds 30] [--runtime 1.7 --runtime 2.1]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.pool_containerd import (
    COMPARISONS,
    FORMS,
    Run,
    per_round,
    pooled,
    split,
    unit,
)
from cdi.cache import SpecCache
from tests.e2e import images, paths
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient
from tests.e2e.plugin import PluginProcess, annotation_policy
from tests.helpers import make_char_device

KIND = "bench.example/gpu"
# What every kind's container asks for, and the spec folder it is in (None: make_node's).
# --spec-dir and --device replace them: a real node's GPU spec, say.
DEVICES = [f"{KIND}=0", f"{KIND}=1"]
SPEC_DIR: Path | None = None
ENV: dict[str, str] = {}  # every kind's container env (--env)
SLEEP = ["sleep", "600"]


def wanted_nodes(specs: Path, devices: list[str]) -> set[str]:
    """The device nodes the devices' edits give a container (checked in each kind's)."""
    snapshot = SpecCache([str(specs)]).refresh()
    if snapshot.errors:
        sys.exit(f"{specs}: {dict(snapshot.errors)}")
    edits = snapshot.resolve(devices)
    return {node.path for node in edits.device_nodes}


def make_node(root: Path) -> Path:
    if SPEC_DIR is not None:
        return SPEC_DIR
    host = root / "host"
    (host / "lib").mkdir(parents=True)
    for minor in (0, 1):
        make_char_device(host / f"gpu{minor}", major=241, minor=minor)
    specs = root / "cdi"
    specs.mkdir()
    devices = "".join(
        f"- name: \"{m}\"\n  containerEdits:\n    deviceNodes: "
        f"[{{path: /dev/benchgpu{m}, hostPath: {host}/gpu{m}}}]\n" for m in (0, 1))
    (specs / "bench.yaml").write_text(
        f"cdiVersion: 0.5.0\nkind: {KIND}\ncontainerEdits:\n  env: [BENCH=1]\n"
        f"  mounts:\n  - {{hostPath: {host}/lib, containerPath: /usr/lib/bench, "
        "options: [ro, nosuid, nodev, rbind, rprivate]}\n"
        "  hooks:\n  - {hookName: createContainer, path: /bin/true, args: ['true']}\n"
        f"devices:\n{devices}")
    return specs


class CheckoutPlugin(PluginProcess):
    """The plugin of another source checkout (``repo``): the baseline of an A/B run."""

    def __init__(self, repo: Path, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.repo = repo

    def command(self) -> list[str]:
        # An older checkout may not know the flags added since (its status file).
        args = super().command()
        if "--status-dir" in args:
            at = args.index("--status-dir")
            del args[at:at + 2]
        return args

    def spawn(self) -> PluginProcess:
        # The same policy as ours (the harness writes it when it spawns its own plugin).
        self.policy_path.write_text(annotation_policy(self.annotation_namespaces))
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        env = {**os.environ, "PYTHONPATH": str(self.repo)}
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=log, env=env,
                                        cwd=self.repo)
        log.close()
        return self


REFERENCE_ENV = "NRI_CDI_REFERENCE_INJECTOR"


class ReferencePlugin:
    """The Go reference injector as a process on ``nri_socket`` (its log kept in a file)."""

    def __init__(self, binary: Path, nri_socket: str, specs: Path, log_path: Path, *,
                 noop: bool = False) -> None:
        # noop: an empty device pattern, with which the reference answers every
        # CreateContainer with no adjustment at once (an NRI plugin doing nothing).
        self.command = [str(binary), "-name", "nri-cdi-ref", "-idx", "10", "-socket",
                        nri_socket, "-spec-dir", str(specs),
                        *(["-allowed-cdi-device-pattern="] if noop else [])]
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, ctrd: Containerd, timeout: float = 15.0) -> ReferencePlugin:
        mark = ctrd.log_path.stat().st_size  # an earlier block's "connected" is before it
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=log)
        # Connected once containerd says so (its log names the plugin, quotes escaped).
        deadline = time.monotonic() + timeout
        while '\\"10-nri-cdi-ref\\" connected' not in _read_from(ctrd.log_path, mark):
            if self.process.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"the reference injector did not connect: "
                         f"{self.log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.02)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode(errors="replace")


# Per kind, CreateContainer alone (the part of Create+Start the plugin is asked in).
CREATE_ONLY: dict[str, list[float]] = {}
# Per kind, StartContainer alone (no plugin of this bench is asked anything there).
START_ONLY: dict[str, list[float]] = {}
# Per kind whose plugin is a process here: its pid, and its CPU seconds (all threads)
# during each CreateContainer, the reply's deferred work included.
PLUGIN_PIDS: dict[str, int] = {}
CREATE_CPU: dict[str, list[float]] = {}


def process_cpu(pid: int) -> float:
    """Seconds on CPU of every thread of ``pid`` so far (schedstat: nanoseconds)."""
    total = 0
    for task in os.scandir(f"/proc/{pid}/task"):
        # A thread that just ended is gone from the total, as it is from the process.
        with contextlib.suppress(FileNotFoundError), open(f"{task.path}/schedstat") as stat:
            total += int(stat.read().split()[0])
    return total / 1e9


# What each kind's pod asks with: the reference injector reads containers/nri-plugins' own
# annotation (PR #327: cdi.nri.io/pod), the others the cdi.k8s.io/ convention.
ANNOTATION = {"reference": "cdi.nri.io/pod"}


def pod_annotations(kind: str) -> dict[str, str]:
    return {ANNOTATION.get(kind, "cdi.k8s.io/gpu"): ",".join(DEVICES)}


WANTED: set[str] = set()  # wanted_nodes() of the run's spec and devices
MOUNTS: dict[str, int] = {}  # each kind's first container: mounts in its runtime spec


def check_devices(cri: CriClient, container: str, kind: str) -> None:
    """Every kind but "none" gave the container the devices' nodes (the runtime spec runc
    got): a plugin that answered without them would be measured doing less."""
    spec = cri.runtime_spec(container)
    paths = {d["path"] for d in spec.get("linux", {}).get("devices", [])}
    got = WANTED & paths
    if got != (set() if kind in ("none", "noop") else WANTED):
        sys.exit(f"{kind}: the container has {sorted(got)} of {sorted(WANTED)}")
    MOUNTS[kind] = len(spec.get("mounts", []))


def timed_create_start(cri: CriClient, pod: str, kind: str = "", *, check: bool = False,
                       **kwargs: object) -> float:
    """One container of ``kind`` created and started, timed; ``check``: a warm-up, not
    recorded, whose runtime spec is checked to hold the kind's devices."""
    pid = PLUGIN_PIDS.get(kind)
    cpu = process_cpu(pid) if pid else 0.0
    start = time.perf_counter()
    container = cri.create_container(pod, "bench", images.BUSYBOX_IMAGE, command=SLEEP,
                                     env=ENV, **kwargs)
    created = time.perf_counter()
    if pid and not check:  # read between the timed parts, not inside them
        CREATE_CPU.setdefault(kind, []).append(process_cpu(pid) - cpu)
    starting = time.perf_counter()
    cri.start_container(container)
    elapsed = (created - start) + (time.perf_counter() - starting)
    if kind and not check:
        CREATE_ONLY.setdefault(kind, []).append(created - start)
        START_ONLY.setdefault(kind, []).append(elapsed - (created - start))
    if check:
        check_devices(cri, container, kind)
    cri.stop_container(container)
    cri.remove_container(container)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--runtime", action="append", choices=sorted(paths.RUNTIMES),
                        help="containerd version (repeatable; default: all of them)")
    parser.add_argument("--baseline-repo", type=Path,
                        help="also run the plugin of this checkout, in the same rounds")
    parser.add_argument("--reference", type=Path,
                        default=os.environ.get(REFERENCE_ENV) or None,
                        help="the Go reference CDI injector's binary (also "
                             f"${REFERENCE_ENV}), run in the same rounds")
    parser.add_argument("--noop", action="store_true",
                        help="with --reference: also the reference answering every container "
                             "with no adjustment (what any NRI plugin costs the runtime)")
    parser.add_argument("--floor", action="store_true",
                        help="with --reference: also native CDI with the no-op plugin "
                             "connected (the least any injection through NRI costs)")
    parser.add_argument("--rotations", type=int, default=1,
                        help="how many times every role visits every containerd (blocks: "
                             "this times the containerds; --rounds is split among them)")
    parser.add_argument("--spec-dir", type=Path,
                        help="ask for devices of this CDI spec folder instead (a real "
                             "node's, say; with --device)")
    parser.add_argument("--device", action="append",
                        help="a device of --spec-dir to ask for (repeatable)")
    parser.add_argument("--save", type=Path, metavar="FILE.json",
                        help="also write every round's times there (one --runtime), for "
                             "bench/pool_containerd.py to pool several runs")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="in every kind's container (e.g. NVIDIA_DRIVER_CAPABILITIES=all, "
                             "with which our plugin mounts what native CDI does)")
    args = parser.parse_args()
    ENV.update(entry.split("=", 1) for entry in args.env)
    if args.rotations < 1:
        sys.exit(f"--rotations {args.rotations}: at least 1 (each role on each containerd)")
    if (args.spec_dir is None) != (args.device is None):
        sys.exit("--spec-dir and --device go together")
    if args.spec_dir is not None:
        global SPEC_DIR
        SPEC_DIR, DEVICES[:] = args.spec_dir.resolve(), args.device
    if (args.noop or args.floor) and args.reference is None:
        sys.exit("--noop and --floor run the reference as the no-op plugin: give --reference")
    if args.reference is not None and not os.access(args.reference, os.X_OK):
        sys.exit(f"--reference {args.reference}: not an executable")
    versions = args.runtime or paths.runtimes()
    if args.save is not None and len(versions) != 1:
        sys.exit("--save: with one --runtime (a file holds one containerd's rounds)")
    missing = paths.missing_prerequisites(tuple(versions))
    if missing:
        sys.exit(f"missing: {'; '.join(missing)}; run: bash scripts/install-containerd.sh")
    for version in versions:
        CREATE_ONLY.clear()
        START_ONLY.clear()
        CREATE_CPU.clear()
        BLOCKS.clear()
        BLOCK_ROUNDS.clear()
        samples = bench_runtime(version, args.rounds, args.baseline_repo, args.reference,
                                args.noop, args.rotations, floor=args.floor)
        report(samples, version)
        if args.save is not None:
            save(args.save, version, samples)


# A role is what one containerd serves in a block: "plain" (no NRI plugin, native CDI on:
# the kinds "none" and "native"), "floor" (native CDI on and the no-op plugin connected),
# or one plugin kind, the plugin connected and CDI off.
PLAIN = "plain"
FLOOR = "floor"
NATIVE_CDI_ROLES = (PLAIN, FLOOR)
# The kinds whose containers the runtime's own CDI gives the devices (CRI CDIDevices).
NATIVE_KINDS = ("native", FLOOR)


def bench_runtime(version: str, rounds: int, baseline: Path | None = None,
                  reference: Path | None = None, noop: bool = False,
                  rotations: int = 1, *, floor: bool = False) -> dict[str, list[float]]:
    """The rounds in blocks: one containerd per role, and from one block to the next each
    role moves to the next containerd (all restarted, plugins started anew), so that
    every kind is measured on every containerd equally often. Two containerds serving
    the same thing differ by up to 3 % in Create+Start (an A/A run: this plugin against
    a copy of itself), more than the differences measured; moving the roles around puts
    that difference into every kind alike instead of into one of them."""
    extras = {"baseline": baseline, "reference": reference,
              "noop": reference if noop else None, FLOOR: reference if floor else None}
    roles = [PLAIN, "plugin", *(kind for kind, what in extras.items() if what is not None)]
    blocks = rotations * len(roles)
    per_block = -(-rounds // blocks)
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        specs = make_node(root)
        WANTED.clear()
        WANTED.update(wanted_nodes(specs, DEVICES))
        archives = [images.pause_image(root), images.busybox_image(root)]
        ctrds = [Containerd(cdi_spec_dirs=[specs], version=version) for _ in roles]
        try:
            for ctrd in ctrds:
                ctrd.start().import_images(*archives)
            order = random.Random(rounds)  # the same orders for a given --rounds
            for where in placements(roles, blocks):
                placed = {role: ctrds[index] for role, index in where.items()}
                before = {kind: len(values) for kind, values in CREATE_ONLY.items()}
                got = run_block(placed, root, specs, extras, per_block, order)
                BLOCK_ROUNDS.append(len(got["plugin"]))
                for kind, values in got.items():
                    samples.setdefault(kind, []).extend(values)
                BLOCKS.append({kind: values[before.get(kind, 0):]
                               for kind, values in CREATE_ONLY.items()})
        finally:
            for ctrd in ctrds:
                ctrd.close()
    return samples


def placements(roles: list[str], blocks: int) -> list[dict[str, int]]:
    """Per block, each role's containerd (an index): a cyclic Latin square, so that over
    a multiple of len(roles) blocks every role is on every containerd equally often, and
    no two roles share one in a block."""
    return [{role: (i + block) % len(roles) for i, role in enumerate(roles)}
            for block in range(blocks)]


# Per block, each kind's CreateContainer times (the per-block line of the report).
BLOCKS: list[dict[str, list[float]]] = []
# Rounds in each block, in order: the clusters of the blocks-resampled intervals.
BLOCK_ROUNDS: list[int] = []


def place(placed: dict[str, Containerd]) -> None:
    """Each containerd restarted with its role's CDI setting (on only where "plain" and
    "floor")."""
    for role, ctrd in placed.items():
        ctrd.stop_daemon()
        ctrd.enable_cdi = role in NATIVE_CDI_ROLES
        ctrd.config_path.write_text(ctrd.render_config())
        ctrd.start()


def run_block(placed: dict[str, Containerd], root: Path, specs: Path,
              extras: dict[str, Path | None], rounds: int,
              order: random.Random) -> dict[str, list[float]]:
    place(placed)
    plugins: list[PluginProcess | ReferencePlugin] = []
    try:
        mine = PluginProcess(placed["plugin"].nri_socket, [specs], root / "plugin.log",
                             extra_args=["--log-level", "info"])
        ours = [(mine, mine.log_size())]
        plugins.append(mine.start())
        _watch("plugin", mine.process)
        for kind, ctrd in placed.items():
            if kind == "baseline" and (repo := extras["baseline"]) is not None:
                theirs = CheckoutPlugin(repo, ctrd.nri_socket, [specs], root / "baseline.log",
                                        extra_args=["--log-level", "info"])
                ours.append((theirs, theirs.log_size()))
                plugins.append(theirs.start())
                _watch(kind, theirs.process)
            elif kind in ("reference", "noop", FLOOR) and (binary := extras[kind]) is not None:
                go = ReferencePlugin(binary, ctrd.nri_socket, specs, root / f"{kind}.log",
                                     noop=kind != "reference").start(ctrd)
                plugins.append(go)
                _watch(kind, go.process)
        # Measured once the start guards' connections have gone (after their linger): until
        # then the runtime asks the guard at every container's start.
        for python_plugin, mark in ours:
            python_plugin.wait_for_log("nothing in doubt", timeout=60, after=mark)
        others = {k: c for k, c in placed.items() if k not in (PLAIN, "plugin")}
        return run_rounds(placed[PLAIN], placed["plugin"], rounds, others, order)
    finally:
        PLUGIN_PIDS.clear()
        for plugin in plugins:
            plugin.kill()


def _watch(kind: str, process: subprocess.Popen[bytes] | None) -> None:
    if process is not None:
        PLUGIN_PIDS[kind] = process.pid


def run_rounds(native: Containerd, ours: Containerd, rounds: int,
               others: dict[str, Containerd], order: random.Random) -> dict[str, list[float]]:
    """The rounds, with each of ``others`` (a plugin on a containerd of its own) as one
    more kind, asking for the same devices the same way as ours ("floor": as native CDI
    does)."""
    with contextlib.ExitStack() as stack:
        extra: list[tuple[str, Callable[..., float]]] = []
        for kind, ctrd in others.items():
            cri = stack.enter_context(ctrd.cri())
            stack.enter_context(cri.cleanup())
            if kind in NATIVE_KINDS:
                pod = cri.run_pod(kind)
                measure = functools.partial(timed_create_start, cri, pod, kind,
                                            cdi_devices=DEVICES)
            else:
                pod = cri.run_pod(kind, annotations=pod_annotations(kind))
                measure = functools.partial(timed_create_start, cri, pod, kind)
            extra.append((kind, measure))
        return _rounds(native, ours, rounds, extra, order)


def _rounds(native: Containerd, ours: Containerd, rounds: int,
            extra: list[tuple[str, Callable[..., float]]],
            order: random.Random) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"none": [], "native": [], "plugin": []}
    samples.update({kind: [] for kind, _ in extra})
    with native.cri() as ncri, ours.cri() as ocri, ncri.cleanup(), ocri.cleanup():
        plain_pod = ncri.run_pod("plain")
        native_pod = ncri.run_pod("native")
        plugin_pod = ocri.run_pod("plugin", annotations=pod_annotations("plugin"))
        kinds: list[tuple[str, Callable[..., float]]] = [
            ("none", functools.partial(timed_create_start, ncri, plain_pod, "none")),
            ("native", functools.partial(timed_create_start, ncri, native_pod, "native",
                                         cdi_devices=DEVICES)),
            ("plugin", functools.partial(timed_create_start, ocri, plugin_pod, "plugin")),
            *extra,
        ]
        for _kind, measure in kinds:  # warm-up, not counted: each kind's devices checked
            measure(check=True)
            # A second one: the first after a restart also warms the runtime's and the
            # plugin's own code paths (our plugin's answers are kept by request shape).
            measure(check=True)
        for _ in range(rounds):
            # A new order each round: rotating one order would have each kind always
            # follow the same one, whose teardown (shim exit, cgroup removal) still
            # loads the machine as the next is measured.
            for kind, measure in order.sample(kinds, len(kinds)):
                samples[kind].append(measure())
    return samples


def report(samples: dict[str, list[float]], version: str) -> None:
    med = {kind: statistics.median(values) * 1000 for kind, values in samples.items()}
    done = len(samples["plugin"])
    print(f"(c) Create+Start on containerd {version}, {done} interleaved rounds in "
          f"{len(BLOCKS)} blocks, each kind on each containerd alike (medians)")
    print(f"    no injection        {med['none']:7.1f} ms")
    print(f"    native CDI          {med['native']:7.1f} ms   ({med['native'] / med['none']:.3f}"
          " x no injection)")
    print(f"    our NRI plugin      {med['plugin']:7.1f} ms   ({med['plugin'] / med['none']:.3f}"
          f" x no injection, {med['plugin'] / med['native']:.3f} x native CDI)")
    if "baseline" in med:
        print(f"    baseline plugin     {med['baseline']:7.1f} ms   ("
              f"{med['baseline'] / med['native']:.3f} x native CDI; ours "
              f"{med['plugin'] / med['baseline']:.3f} x baseline)")
    if "reference" in med:
        print(f"    Go reference        {med['reference']:7.1f} ms   ("
              f"{med['reference'] / med['native']:.3f} x native CDI; ours "
              f"{med['plugin'] / med['reference']:.3f} x reference)")
    if "noop" in med:
        # Its containers get no devices: it is compared with no injection.
        print(f"    Go no-op plugin     {med['noop']:7.1f} ms   ("
              f"{med['noop'] / med['none']:.3f} x no injection: any NRI plugin's floor, "
              "no devices)")
    if FLOOR in med:
        print(f"    native CDI + no-op  {med[FLOOR]:7.1f} ms   ("
              f"{med[FLOOR] / med['native']:.3f} x native CDI: any injection through NRI's "
              f"floor; ours {med['plugin'] / med[FLOOR]:.3f} x it)")
    create = {kind: statistics.median(v) * 1000 for kind, v in CREATE_ONLY.items() if v}
    if "reference" in create:
        print("    CreateContainer alone (medians): "
              + ", ".join(f"{kind} {ms:.1f} ms" for kind, ms in create.items())
              + f"; ours / reference {create['plugin'] / create['reference']:.3f}, "
              f"ours - no injection {create['plugin'] - create['none']:.1f} ms, "
              f"reference - no injection {create['reference'] - create['none']:.1f} ms")
    started = {kind: statistics.median(v) * 1000 for kind, v in START_ONLY.items() if v}
    print("    Start alone (medians): "
          + ", ".join(f"{kind} {ms:.1f} ms" for kind, ms in started.items()))
    paired(samples)


def save(path: Path, version: str, samples: dict[str, list[float]]) -> None:
    """One run's rounds (seconds; each kind's list in round order, so the i-th entries
    of two kinds are one round) and its blocks, with the code that ran ("-dirty": with
    changes not committed, in any file)."""
    try:
        commit = subprocess.run(["git", "-C", str(Path(__file__).parent), "describe",
                                 "--always", "--dirty"], capture_output=True, text=True,
                                check=False).stdout.strip()
    except OSError:  # no git here
        commit = ""
    path.write_text(json.dumps({
        "containerd": version, "plugin_commit": commit or "unknown",
        "block_rounds": BLOCK_ROUNDS, **{part: to_microseconds(kinds) for part, kinds in (
            ("create_start", samples), ("create", CREATE_ONLY), ("start", START_ONLY),
            ("create_cpu", CREATE_CPU))}}) + "\n")


def to_microseconds(kinds: dict[str, list[float]]) -> dict[str, list[float]]:
    """Seconds kept to the microsecond: finer is below what the bench resolves, and the
    file is half the size."""
    return {kind: [round(value, 6) for value in values] for kind, values in kinds.items()}


def interval(values: list[float], resamples: int = 2000) -> tuple[float, float, float]:
    """The median of ``values`` and a bootstrap 95 % interval for it (seeded), rounds
    resampled."""
    draw = random.Random(len(values))
    medians = sorted(statistics.median(draw.choices(values, k=len(values)))
                     for _ in range(resamples))
    return (statistics.median(values), medians[int(resamples * 0.025)],
            medians[int(resamples * 0.975) - 1])


def block_interval(values: list[float], rounds: list[int]) -> tuple[float, float]:
    """A bootstrap 95 % interval for the median of ``values`` with whole blocks resampled
    (``rounds``: how many values each block gave, in order). Rounds of one block share
    its placement of the kinds on the containerds, so they are not independent draws:
    resampling rounds alone gives too narrow an interval when placements differ. One
    run pooled alone (``pool_containerd.pooled``)."""
    _, low, high = pooled([Run("", split(values, rounds))], seed=len(values) + 1)
    return low, high


def _with_intervals(values: list[float], form: str) -> str:
    """``median (rounds resampled; blocks resampled)``, each number in ``form``."""
    mid, low, high = interval(values)
    text = f"{mid:{form}} ({low:{form}} to {high:{form}}"
    if len(BLOCK_ROUNDS) >= 2:
        blow, bhigh = block_interval(values, BLOCK_ROUNDS)
        text += f"; blocks {blow:{form}} to {bhigh:{form}}"
    return text + ")"


def paired(samples: dict[str, list[float]]) -> None:
    """Per-round comparisons: each round measured every kind, so its differences leave
    out what changed between rounds (the machine's load, the page cache)."""
    parts = {"create_start": samples, "create": CREATE_ONLY, "start": START_ONLY,
             "create_cpu": CREATE_CPU}
    lines = []
    for comparison in COMPARISONS:
        values = per_round(parts, comparison)
        if values is not None:
            said = unit(comparison)
            name = comparison[0].removesuffix(f" {said}")
            lines.append(f"{name} {_with_intervals(values, FORMS[said])}"
                         + (f" {said[1:-1]}" if said else ""))
    print("    per round, median (bootstrap 95 % intervals: rounds resampled; blocks "
          "resampled): " + "; ".join(lines))
    if MOUNTS:
        print("    mounts in each kind's container: "
              + ", ".join(f"{kind} {count}" for kind, count in MOUNTS.items()))
    per_block()
    if CREATE_CPU:
        print("    plugin CPU during its CreateContainer, all threads (median): "
              + ", ".join(f"{kind} {statistics.median(v) * 1e6:.0f} us"
                          for kind, v in CREATE_CPU.items()))


def per_block() -> None:
    """CreateContainer ours - reference (else - baseline) block by block: how far apart
    single containerd placements are, which the blocks average out."""
    other = next((k for k in ("reference", "baseline") if BLOCKS and k in BLOCKS[0]), None)
    if other is None:
        return
    medians = [statistics.median(a - b for a, b in zip(block["plugin"], block[other],
                                                       strict=True)) * 1000
               for block in BLOCKS if block.get("plugin")]
    print(f"    CreateContainer ours - {other} per block (median): "
          + ", ".join(f"{ms:+.2f}" for ms in medians) + " ms")


if __name__ == "__main__":
    main()
