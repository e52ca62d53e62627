"""``nri-cdi doctor --e2e``: prove on this node that a container gets its GPU.

Generates the spec in nvml and procfs modes (and lists every difference), validates it,
starts a private containerd (or uses the node's) with our plugin, runs throwaway containers
that ask for one GPU, and checks inside them: the GPU's device node and no other GPU's,
``nvidia-smi -L``, a CUDA driver API probe (``cuda_probe.c``, built with gcc here),
``NVIDIA_DRIVER_CAPABILITIES`` and ``NVIDIA_REQUIRE_CUDA``. Without a GPU (no
``/dev/nvidiactl``, or NVML not loadable) the same checks run on a simulated node
(nri_cdi_testbed/simnode/). Everything started is stopped and removed, on failure and on
Ctrl-C/SIGTERM too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cdi.nvidia.discover import DiscoveryError, Roots, discover_with_nvml
from cdi.nvidia.driver import find_nvml_library
from cdi.spec import read_spec
from nri_cdi_testbed.node_check import images, paths
from nri_cdi_testbed.node_check.containerd import Containerd, ContainerdError
from nri_cdi_testbed.node_check.cri import CriClient
from nri_cdi_testbed.node_check.images import import_image
from nri_cdi_testbed.node_check.plugin import PluginProcess
from nri_cdi_testbed.node_record import record
from nri_cdi_testbed.simnode import BuiltNode, NodeLayout, SimNodeError, build_node
from nri_plugin.nri.errors import NRIPluginError
from nri_plugin.nri.versions import DEFAULT_SOCKET_PATH

PROBE_SOURCE = Path(__file__).with_name("cuda_probe.c")
PROBE_IMAGE = "localhost/nri-cdi/cuda-probe:doctor"
CDI_ANNOTATION = "cdi.k8s.io/doctor"
# The private containerd is 1.7.24 in CI: no additionalGids through NRI before 1.7.30.
CDI_VERSION = "0.6.0"
# A CUDA version no driver supports, for the refusal check.
IMPOSSIBLE_CUDA = "cuda>=99.0"
MODES = ("hooks", "mounts")


class NodeCheckError(NRIPluginError):
    """Something the checks need is missing; one line, said before anything starts."""


@dataclass(frozen=True, slots=True)
class Verdict:
    name: str
    status: str  # PASS | FAIL | SKIP
    detail: str


@dataclass(slots=True)
class Report:
    node: str = ""
    driver_root: str = ""
    runtime: str = ""
    checks: list[Verdict] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    differences: list[str] = field(default_factory=list)

    def add(self, name: str, ok: bool | None, detail: str) -> None:
        status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        self.checks.append(Verdict(name, status, detail))

    @property
    def failed(self) -> bool:
        return any(c.status == "FAIL" for c in self.checks)


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    runtime: str = paths.DEFAULT_RUNTIME
    containerd_bin: Path | None = None
    containerd_address: str | None = None  # the node's containerd instead of a private one
    nri_socket: str = DEFAULT_SOCKET_PATH  # with containerd_address
    simulated: bool = False
    sim_node: Path | None = None  # an already built simulated node
    spec_dir: Path | None = None  # check this spec folder instead of generating one
    driver_root: Path | None = None
    gpu: int = 0
    repeat: int = 3


# --- the node --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Node:
    kind: str  # real | simulated
    driver_root: Path
    dev_root: Path
    why: str  # why this kind
    gpu_names: Mapping[str, str]  # GPU uuid -> name (expected in the probe)


def _nvml_loadable(driver_root: Path) -> str | None:
    """None when NVML answers under ``driver_root``, else why not."""
    try:
        discover_with_nvml(find_nvml_library(Roots(driver=driver_root, dev=Path("/")), None))
    except DiscoveryError as exc:
        return str(exc)
    return None


def pick_node(opts: Options, work: Path) -> Node:
    driver_root = opts.driver_root or Path("/")
    why = ""
    if not opts.simulated and opts.sim_node is None:
        if not os.path.exists("/dev/nvidiactl"):
            why = "no /dev/nvidiactl"
        else:
            why = _nvml_loadable(driver_root) or ""
            if not why:
                return Node("real", driver_root, Path("/"), "NVML answers", {})
            why += f"; /dev/nvidiactl is here: is the driver under --driver-root {driver_root}?"

    if opts.sim_node is not None:
        built, why = BuiltNode.load(opts.sim_node), "--sim-node"
    else:
        built = build_node(work / "node", NodeLayout.uniform(2))
        why = why or "--simulated"
    names = {str(g["uuid"]): str(g["name"]) for g in built.manifest["gpus"]}
    return Node("simulated", built.driver_root, built.dev_root, why, names)


# --- specs -----------------------------------------------------------------------------------


def _generate(node: Node, mode: str, link: str, out: Path) -> float:
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--mode", mode,
            "--cdi-version", CDI_VERSION, "--driver-root", str(node.driver_root),
            "--dev-root", str(node.dev_root), "--link-mode", link, "--output", str(out)]
    env = {**os.environ, "PYTHONPATH": str(paths.REPO)}
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise NodeCheckError(f"generate --mode {mode} failed: {proc.stderr.strip()[-500:]}")
    return elapsed * 1000


def _load(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def _devices(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {str(d["name"]): d.get("containerEdits", {}) for d in doc.get("devices", [])}


def _lines(edits: Mapping[str, Any]) -> set[str]:
    return {f"{key}: {json.dumps(item, sort_keys=True)}"
            for key, items in edits.items() for item in (items or [])}


def spec_differences(a: Mapping[str, Any], b: Mapping[str, Any],
                     names: tuple[str, str] = ("nvml", "procfs")) -> list[str]:
    """Every difference between two specs: devices only in one, and edits (device or
    spec-wide) only in one, one line each."""
    out: list[str] = []
    da, db = _devices(a), _devices(b)
    for name in sorted(set(da) ^ set(db)):
        out.append(f"device {name}: only in {names[0] if name in da else names[1]}")
    pairs = [("spec", a.get("containerEdits", {}), b.get("containerEdits", {}))]
    pairs += [(f"device {n}", da[n], db[n]) for n in sorted(set(da) & set(db))]
    for where, ea, eb in pairs:
        la, lb = _lines(ea), _lines(eb)
        out += [f"{where}: only in {names[0]}: {line}" for line in sorted(la - lb)]
        out += [f"{where}: only in {names[1]}: {line}" for line in sorted(lb - la)]
    return out


def _gpu_nodes(doc: Mapping[str, Any], name: str) -> set[str]:
    edits = _devices(doc).get(name, {})
    return {str(d["path"]) for d in edits.get("deviceNodes", []) or []}


@dataclass(frozen=True, slots=True)
class SpecFacts:
    """What the container checks expect, read from the spec the plugin uses."""

    own_nodes: set[str]
    other_nodes: set[str]
    uuid: str | None
    smi: str | None  # container path of nvidia-smi
    libcuda: str | None  # container path of libcuda.so.1
    libcuda_host: str | None  # the host file the spec mounts for it


def spec_facts(doc: Mapping[str, Any], gpu: int) -> SpecFacts:
    devices = _devices(doc)
    own = _gpu_nodes(doc, str(gpu))
    indexed = [n for n in devices if n.isdigit()]
    # Not less ``own``: a node that the spec gives to another GPU too must not be there.
    others = set().union(*(_gpu_nodes(doc, n) for n in indexed if n != str(gpu)))
    uuid = next((n for n in devices if n.startswith("GPU-") and _gpu_nodes(doc, n) == own),
                None)
    mounts = [m for e in [doc.get("containerEdits", {}), *devices.values()]
              for m in e.get("mounts", []) or []]
    paths_in = [str(m["containerPath"]) for m in mounts]
    smi = next((p for p in paths_in if p.endswith("/nvidia-smi")), None)
    cuda = next((p for p in paths_in if p.endswith("/libcuda.so.1")), None)
    if cuda is None:  # hooks mode: the SONAME link is made by a hook, next to the file
        lib = next((p for p in paths_in if "/libcuda.so." in p), None)
        cuda = lib.rsplit("/", 1)[0] + "/libcuda.so.1" if lib else None
    host = next((str(m["hostPath"]) for m in mounts if "/libcuda.so." in str(m["containerPath"])),
                None)
    return SpecFacts(own, others, uuid, smi, cuda, host)


# --- images ----------------------------------------------------------------------------------


def _build_probe(work: Path) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:  # require() said so before anything started
        raise NodeCheckError("gcc (builds the CUDA probe): apt-get install gcc libc6-dev")
    out = work / "cuda-probe"
    proc = subprocess.run([gcc, "-O1", "-o", str(out), str(PROBE_SOURCE)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise NodeCheckError(f"gcc {PROBE_SOURCE} failed: {proc.stderr.strip()[-300:]}")
    return out


def _runtime_libs(binary: Path) -> list[Path]:
    """The loader and libraries ``binary`` needs (by ldd), to copy into its image."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True,
                         check=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.replace("=>", " ").split()
        found += [Path(p) for p in parts if p.startswith("/")]
    return found


def _image_libs(probe: Path, libcuda: str | None) -> list[Path]:
    """The probe's libraries, and the glibc ones the node's libcuda needs (the real one
    needs libm, libdl, libpthread and librt, as a CUDA image has them); never a driver
    library, which must come from the spec."""
    found = dict.fromkeys(_runtime_libs(probe))
    try:
        needed = _runtime_libs(Path(libcuda)) if libcuda is not None else []
    except (OSError, subprocess.CalledProcessError):
        needed = []  # ldd cannot read it: the CUDA check in the container says why
    for lib in needed:
        if not lib.name.startswith(("libcuda", "libnvidia")):
            found.setdefault(lib)
    return list(found)


def build_images(work: Path, libcuda: str | None = None) -> list[Path]:
    """Archives of the pause image, busybox, and the probe image (busybox + glibc + probe):
    ``libcuda`` is the host's libcuda file whose glibc libraries the image carries."""
    probe = _build_probe(work)
    tree = work / "probe-tree"
    for lib in _image_libs(probe, libcuda):
        target = tree / str(lib).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(lib), target)
    shutil.copy2(probe, tree / "cuda-probe")
    return [images.pause_image(work), images.busybox_image(work),
            images.image_from_tree(PROBE_IMAGE, tree, work / "probe.tar")]


# --- the runtime -----------------------------------------------------------------------------


class Runtime:
    """A private containerd (or the node's), our plugin, and a CRI client; close() undoes
    everything it started."""

    def __init__(self, opts: Options, work: Path) -> None:
        self.opts = opts
        self.work = work
        self.ctrd: Any = None
        self.plugin: Any = None
        self.imported: list[str] = []

    def start(self, archives: Sequence[Path]) -> None:
        if self.opts.containerd_address is None:
            self.ctrd = Containerd(self.work / "ctrd", version=self.opts.runtime,
                                   bin_dir=self.opts.containerd_bin)
            self.ctrd.start()
            self.ctrd.import_images(*archives)
            return
        before = set(self._ctr("images", "ls", "-q").split())
        for archive in archives:
            import_image(archive, self.address, ctr=self._ctr_path())
        # Only what was not there before is removed at the end.
        self.imported = sorted(set(self._ctr("images", "ls", "-q").split()) - before)

    def _ctr_path(self) -> Path:
        if self.opts.containerd_bin is not None:
            return self.opts.containerd_bin / "ctr"
        return Path(shutil.which("ctr") or "ctr")

    def _ctr(self, *args: str) -> str:
        proc = subprocess.run([str(self._ctr_path()), "-a", self.address, "-n", "k8s.io", *args],
                              capture_output=True, text=True, check=False, timeout=60)
        return proc.stdout

    @property
    def address(self) -> str:
        return str(self.ctrd.address if self.ctrd else self.opts.containerd_address)

    @property
    def nri_socket(self) -> str:
        return str(self.ctrd.nri_socket if self.ctrd else self.opts.nri_socket)

    @contextlib.contextmanager
    def plugin_on(self, spec_dir: Path, log: Path) -> Iterator[None]:
        # Known before it starts: an interrupt while it connects still stops it.
        self.plugin = PluginProcess(self.nri_socket, [spec_dir], log)
        try:
            self.plugin.start()
            yield
        finally:
            if self.plugin is not None:
                self.plugin.kill()
            self.plugin = None

    def close(self) -> None:
        if self.plugin is not None:
            self.plugin.kill()
        if self.ctrd is not None:
            self.ctrd.close()
        elif self.imported:
            self._ctr("images", "rm", *self.imported)


# --- the container checks --------------------------------------------------------------------


def _create_start_ms(cri: Any, image: str, annotations: Mapping[str, str],
                     repeat: int) -> float:
    """Median CreateContainer + StartContainer time over ``repeat`` pods."""
    times = []
    for i in range(repeat):
        pod = cri.run_pod(f"doctor-t{i}", annotations=annotations)
        start = time.perf_counter()
        cri.run_container(pod, "t", image, command=["sleep", "60"])
        times.append((time.perf_counter() - start) * 1000)
        cri.delete_pod(pod)
    return round(statistics.median(times), 1)


def _in_container(cri: Any, env: Mapping[str, str], request: str) -> str:
    pod = cri.run_pod("doctor-gpu", annotations={CDI_ANNOTATION: request})
    return str(cri.run_container(pod, "probe", PROBE_IMAGE, command=["sleep", "600"],
                                 env=dict(env)))


def check_devices(cri: Any, cid: str, facts: SpecFacts) -> tuple[bool, str]:
    wanted = " ".join(sorted(facts.own_nodes | facts.other_nodes))
    script = f"for p in {wanted}; do [ -e $p ] && echo $p; done; true"
    present = set(cri.exec_sync(cid, ["sh", "-c", script]).stdout.split())
    missing = sorted(facts.own_nodes - present)
    leaked = sorted(facts.other_nodes & present)
    ok = not missing and not leaked and bool(facts.own_nodes)
    return ok, (f"present {sorted(facts.own_nodes & present)}; missing {missing}; "
                f"other GPUs' nodes visible {leaked}")


def check_smi(cri: Any, cid: str, facts: SpecFacts) -> tuple[bool | None, str]:
    if facts.smi is None:
        return None, "the spec mounts no nvidia-smi"
    result = cri.exec_sync(cid, [facts.smi, "-L"])
    gpus = [line for line in result.stdout.splitlines() if line.startswith("GPU ")]
    ok = result.exit_code == 0 and len(gpus) == 1 and f"(UUID: {facts.uuid})" in gpus[0]
    return ok, f"exit {result.exit_code}, listed {gpus or result.stderr.strip()[:200]}"


def check_cuda(cri: Any, cid: str, node: Node) -> tuple[bool, str]:
    result = cri.exec_sync(cid, ["/cuda-probe"], timeout=60)
    lines = result.stdout.strip().splitlines()
    calls = {line.split()[0]: line.split()[1:] for line in lines if line.split()}
    count = calls.get("cuDeviceGetCount", ["", "0"])[1:2]
    name = " ".join(calls.get("cuDeviceGetName", ["", ""])[1:])
    ok = result.exit_code == 0 and count == ["1"]
    if ok and node.gpu_names:  # the simulated node: the name is known
        ok = name in node.gpu_names.values()
    return ok, f"exit {result.exit_code}: " + "; ".join(lines)[:400]


def check_capabilities(cri: Any, facts: SpecFacts, request: str) -> tuple[bool | None, str]:
    if facts.libcuda is None or facts.smi is None:
        return None, "the spec has no libcuda.so.1 or no nvidia-smi"
    cid = _in_container(cri, {"NVIDIA_DRIVER_CAPABILITIES": "utility"}, request)
    probe = f"[ -e {facts.libcuda} ] && echo cuda; [ -e {facts.smi} ] && echo smi; true"
    seen = cri.exec_sync(cid, ["sh", "-c", probe]).stdout.split()
    ok = seen == ["smi"]
    return ok, (f"utility only: nvidia-smi {'present' if 'smi' in seen else 'MISSING'}, "
                f"libcuda.so.1 {'MOUNTED' if 'cuda' in seen else 'absent'}")


def check_require(cri: Any, request: str) -> tuple[bool, str]:
    try:
        _in_container(cri, {"NVIDIA_REQUIRE_CUDA": IMPOSSIBLE_CUDA}, request)
    except Exception as exc:  # grpc.RpcError: CreateContainer refused
        details = getattr(exc, "details", None)
        reason = str(details() if callable(details) else exc)
        ok = "requirement" in reason and IMPOSSIBLE_CUDA in reason
        return ok, f"refused: {reason[:300]}"
    return False, f"NVIDIA_REQUIRE_CUDA={IMPOSSIBLE_CUDA}: the container was created"


def container_checks(rt: Runtime, node: Node, facts: SpecFacts, label: str,
                     report: Report, *, full: bool) -> None:
    request = f"nvidia.com/gpu={rt.opts.gpu}"
    with CriClient(rt.address) as cri, cri.cleanup():
        report.timings_ms[f"create+start with GPU [{label}]"] = _create_start_ms(
            cri, images.BUSYBOX_IMAGE, {CDI_ANNOTATION: request}, rt.opts.repeat)
        cid = _in_container(cri, {}, request)
        report.add(f"device nodes [{label}]", *check_devices(cri, cid, facts))
        report.add(f"nvidia-smi -L [{label}]", *check_smi(cri, cid, facts))
        report.add(f"CUDA driver API [{label}]", *check_cuda(cri, cid, node))
        if full:
            report.add("NVIDIA_DRIVER_CAPABILITIES=utility", *check_capabilities(
                cri, facts, request))
            report.add("NVIDIA_REQUIRE_CUDA refused", *check_require(cri, request))


# --- the run ---------------------------------------------------------------------------------


def _specs(opts: Options, node: Node, work: Path, report: Report) -> dict[str, Path]:
    """Folders holding the spec per link mode (generated unless --spec-dir)."""
    if opts.spec_dir is not None:
        dirs = {"given": opts.spec_dir}
    else:
        dirs = {}
        for mode in ("nvml", "procfs"):
            ms = _generate(node, mode, "hooks", work / f"spec-{mode}" / "nvidia.yaml")
            report.timings_ms[f"generate {mode}"] = round(ms, 1)
        docs = [_load(work / f"spec-{m}" / "nvidia.yaml") for m in ("nvml", "procfs")]
        report.differences = spec_differences(docs[0], docs[1])
        d_ok = not any(d.startswith(f"device {opts.gpu}:") for d in report.differences)
        report.add("nvml vs procfs", d_ok, f"{len(report.differences)} difference(s)"
                   + ("" if d_ok else f" in device {opts.gpu}"))
        _generate(node, "nvml", "mounts", work / "spec-mounts" / "nvidia.yaml")
        dirs = {"hooks": work / "spec-nvml", "mounts": work / "spec-mounts"}
    for label, folder in dirs.items():
        errors = []
        for spec in sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.json")):
            try:
                read_spec(spec)
            except Exception as exc:
                errors.append(f"{spec.name}: {exc}")
        report.add(f"spec valid [{label}]", not errors, "; ".join(errors) or str(folder))
    return dirs


def _spec_doc(folder: Path) -> dict[str, Any]:
    docs = [_load(p) for p in sorted(folder.glob("*.yaml"))]
    docs += [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    merged: dict[str, Any] = {"devices": [], "containerEdits": {}}
    for doc in docs:
        if str(doc.get("kind", "")) != "nvidia.com/gpu":
            continue
        merged["devices"] += doc.get("devices", [])
        for key, items in (doc.get("containerEdits") or {}).items():
            merged["containerEdits"].setdefault(key, []).extend(items or [])
    return merged


def require(opts: Options) -> None:
    """Fail before starting anything when a prerequisite is missing: one line each, what is
    missing and how to get it."""
    if opts.containerd_address is None and opts.runtime not in paths.RUNTIMES:
        raise NodeCheckError(f"unknown --runtime {opts.runtime} "
                             f"(known: {', '.join(paths.RUNTIMES)})")
    own_bin = opts.containerd_bin
    missing = [m for m in paths.missing_prerequisites(
                   (opts.runtime,), private_containerd=opts.containerd_address is None)
               if own_bin is None or not m.startswith(f"containerd {opts.runtime} (")]
    if opts.containerd_address is None and own_bin is not None:
        absent = [n for n in ("containerd", "ctr") if not os.access(own_bin / n, os.X_OK)]
        if absent:
            missing.append(f"containerd ({', '.join(absent)} in --containerd-bin {own_bin}): "
                           "a folder holding containerd, ctr and containerd-shim-runc-v2")
    if missing:
        raise NodeCheckError("missing prerequisites:\n" + "\n".join(f"  - {m}" for m in missing))


def driver_files(facts: SpecFacts) -> tuple[bool, str]:
    detail = f"libcuda.so.1 at {facts.libcuda}, nvidia-smi at {facts.smi}"
    if facts.libcuda and facts.smi:
        return True, detail
    # The generator searches the usual folders and /usr/local/nvidia: a driver elsewhere
    # needs its root named.
    return False, (detail + "; pass --driver-root DIR (the folder holding the driver's "
                   "usr/), or generate with --library-search-path")


def run(opts: Options) -> Report:
    require(opts)
    report = Report(runtime=opts.containerd_address or f"private containerd {opts.runtime}")
    work = Path(tempfile.mkdtemp(prefix="nri-cdi-e2e-"))
    rt = Runtime(opts, work)
    try:
        node = pick_node(opts, work)
        report.node = f"{node.kind} ({node.why})"
        report.driver_root = str(node.driver_root)
        dirs = _specs(opts, node, work, report)
        all_facts = {label: spec_facts(_spec_doc(folder), opts.gpu)
                     for label, folder in dirs.items()}
        rt.start(build_images(work, next(iter(all_facts.values())).libcuda_host))
        with CriTimer(rt) as timer:
            report.timings_ms["create+start without GPU"] = timer.plain(opts.repeat)
        for i, (label, folder) in enumerate(dirs.items()):
            facts = all_facts[label]
            if i == 0:
                report.add("driver files in the spec", *driver_files(facts))
            try:
                with rt.plugin_on(folder, work / f"plugin-{label}.log"):
                    container_checks(rt, node, facts, label, report, full=i == 0)
            except Exception as exc:  # a refused container, a CRI error: this mode fails
                details = getattr(exc, "details", None)
                why = str(details() if callable(details) else exc).splitlines()[0][:300]
                report.add(f"GPU container [{label}]", False, f"{type(exc).__name__}: {why}")
    finally:
        rt.close()
        shutil.rmtree(work, ignore_errors=True)
    return report


class CriTimer:
    """Create+Start of a container without a GPU (no plugin connected)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.client: Any = None

    def __enter__(self) -> CriTimer:
        self.client = CriClient(self.rt.address)
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def plain(self, repeat: int) -> float:
        with self.client.cleanup():
            return _create_start_ms(self.client, images.BUSYBOX_IMAGE, {}, repeat)


# --- the command -----------------------------------------------------------------------------


def render(report: Report) -> str:
    lines = [f"node: {report.node}; driver root {report.driver_root}; {report.runtime}"]
    lines += [f"[{c.status}] {c.name}: {c.detail}" for c in report.checks]
    if report.differences:
        lines.append("nvml vs procfs differences:")
        lines += [f"  {d}" for d in report.differences]
    lines.append("timings (ms, median): " + ", ".join(
        f"{k} {v}" for k, v in report.timings_ms.items()))
    return "\n".join(lines) + "\n"


def _raise_on_term(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def build_parser() -> argparse.ArgumentParser:
    """``nri-cdi doctor --e2e``'s flags: doctor hands this check what follows ``--e2e``."""
    parser = argparse.ArgumentParser(
        prog="nri-cdi doctor --e2e",
        description="The end-to-end node check: a throwaway GPU container on this node.")
    parser.add_argument("--runtime", default=paths.DEFAULT_RUNTIME, choices=tuple(paths.RUNTIMES),
                        help="the private containerd's version (default %(default)s)")
    parser.add_argument("--cache", type=Path, help="scripts/install-containerd.sh's cache "
                        "(default $NRI_CDI_CACHE, else .cache/containerd in the source tree)")
    parser.add_argument("--containerd-bin", type=Path, metavar="DIR",
                        help="a folder holding containerd, ctr and containerd-shim-runc-v2")
    parser.add_argument("--runc", type=Path, metavar="PATH",
                        help="the runc for the private containerd (default $NRI_CDI_RUNC, "
                        "else /usr/sbin/runc)")
    parser.add_argument("--containerd-address", metavar="SOCK",
                        help="use the node's containerd at SOCK (our plugin connects to "
                        "--socket)")
    parser.add_argument("--socket", default=DEFAULT_SOCKET_PATH, metavar="PATH",
                        help="the NRI socket of --containerd-address (default %(default)s)")
    parser.add_argument("--simulated", action="store_true",
                        help="use a simulated node even where a GPU is present")
    parser.add_argument("--sim-node", type=Path, metavar="DIR",
                        help="an already built simulated node (nri_cdi_testbed/simnode/)")
    parser.add_argument("--e2e-spec-dir", type=Path, metavar="DIR",
                        help="check the specs in DIR instead of generating them")
    parser.add_argument("--driver-root", type=Path,
                        help="the real node's driver root (default /)")
    parser.add_argument("--gpu", type=int, default=0,
                        help="the GPU index to ask for (default 0)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="containers per timing (median; default %(default)s)")
    parser.add_argument("--record-node", type=Path, metavar="FILE",
                        help="on a real node: also write to FILE what the generator reads "
                             "there (driver files, device nodes, /proc), so its spec can be "
                             "regenerated from the record later")
    parser.add_argument("--json", action="store_true", help="JSON output")
    return parser


def main(argv: Sequence[str], *, json_output: bool = False, socket: str | None = None) -> int:
    """``nri-cdi doctor --e2e ARGV``; doctor's own ``--json`` and ``--socket``, given before
    ``--e2e``, are the defaults of this check's."""
    parser = build_parser()
    parser.set_defaults(json=json_output, socket=socket or DEFAULT_SOCKET_PATH)
    args = parser.parse_args(argv)
    if args.record_node is not None:
        if args.simulated:
            print("nri-cdi doctor: --record-node records a real node, not --simulated's",
                  file=sys.stderr)
            return 2
        args.record_node.write_text(json.dumps(
            record(args.driver_root or "/", "/"), indent=1, sort_keys=True) + "\n")
    if args.cache:
        os.environ[paths.CACHE_ENV] = str(args.cache)
    if args.runc:  # this process only: the private containerd's config names it
        paths.RUNC = args.runc
    opts = Options(runtime=args.runtime, containerd_bin=args.containerd_bin,
                   containerd_address=args.containerd_address, nri_socket=args.socket,
                   simulated=args.simulated, sim_node=args.sim_node, spec_dir=args.e2e_spec_dir,
                   driver_root=args.driver_root, gpu=args.gpu, repeat=args.repeat)
    previous = signal.signal(signal.SIGTERM, _raise_on_term)
    try:
        report = run(opts)
    except (NodeCheckError, SimNodeError, ContainerdError) as exc:
        # Cleanup has run: the error says what could not start (containerd: its log tail).
        print(f"nri-cdi doctor --e2e: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("nri-cdi doctor --e2e: interrupted; everything it started was removed",
              file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        print(render(report), end="")
    return 1 if report.failed else 0
