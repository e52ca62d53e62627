"""The node the NRI wire recordings were made on (tests/data/nri-wire/), and how they were
made: the same spec folders and device nodes are built again by the replay
(tests/test_nri_wire_replay.py), under another root.

Everything the plugin sees of the node lies under one root, written ``{node}`` in the
recordings: the parity specs (``parity_node``, which tests/e2e/test_native_parity_e2e.py
builds too: env, device nodes with and without fileMode, a read-only device, additionalGids,
mounts, a hook, two spec files)
and a simulated NVIDIA node with its generated spec (capability trims, requirements). The
plugin gets one settings file, the same when recording and replaying: the runtime's own CDI
on, reading the plugin's folders (the set-up docs/install/ recommends); no kubelet.

Recording (as root, next to a real runtime): ``python -m tests.nri_wire record --runtime
containerd-2.2.1 --bin /opt/builds/containerd-2.2.1/bin OUT.jsonl`` (containerd), or
``--crio-socket``/``--crio-nri`` against a running CRI-O (docs/developer/nri-wire.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers import make_char_device

ROOT_NAME = "{node}"
MAJOR = 242  # local-use range: no default rule of a container uses it
KMSG = (1, 11)  # /dev/kmsg: a write-only open succeeds without privileges, so a
#                 read-only cgroup rule is what refuses it
# The spec folders, in the order the plugin and the runtime read them.
SPEC_FOLDERS = ("cdi", "nvidia")
IMPOSSIBLE_CUDA = "cuda>=99.0"
GPU = "nvidia.com/gpu=0"


@dataclass(frozen=True)
class World:
    root: Path

    @property
    def spec_dirs(self) -> list[Path]:
        return [self.root / name for name in SPEC_FOLDERS]

    @property
    def config(self) -> Path:
        return self.root / "nri-cdi.yaml"


def parity_node(root: Path) -> None:
    """The parity specs under ``root``: ``cdi/a.json`` and ``cdi/b.json``, and the host
    files and device nodes (root only) they name, under ``host/``."""
    host = root / "host"
    (host / "lib").mkdir(parents=True)
    (host / "lib" / "libpar.so.1").write_text("lib\n")
    (host / "share").mkdir()
    for minor in (0, 1, 2):
        make_char_device(host / f"dev{minor}", major=MAJOR, minor=minor, mode=0o644)
    make_char_device(host / "kmsg", major=KMSG[0], minor=KMSG[1], mode=0o600)
    specs = root / "cdi"
    specs.mkdir()
    hook = {"hookName": "createContainer", "path": "/bin/true", "args": ["true", "parity"]}
    mount = {"hostPath": str(host / "lib"), "containerPath": "/usr/lib/par",
             "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]}
    (specs / "a.json").write_text(json.dumps({
        "cdiVersion": "0.7.0", "kind": "parity.example/first",  # additionalGids: 0.7.0
        "containerEdits": {"env": ["PAR_SPEC=a", "PAR_SHARED=a"], "hooks": [hook],
                           "mounts": [mount]},
        "devices": [
            # no fileMode: the host node is 0644
            {"name": "node", "containerEdits": {
                "deviceNodes": [{"path": "/dev/par0", "hostPath": str(host / "dev0")}],
                "env": ["PAR_NODE=0"]}},
            {"name": "envonly", "containerEdits": {"env": ["PAR_SHARED=from-env-device"]}},
            {"name": "moded", "containerEdits": {
                "deviceNodes": [{"path": "/dev/par1", "hostPath": str(host / "dev1"),
                                 "fileMode": 0o640, "permissions": "rwm"}],
                # same depth as /usr/lib/par but a name that sorts before it
                "mounts": [{"hostPath": str(host / "share"), "containerPath": "/usr/lib/aaa",
                            "options": ["ro", "rbind"]}]}},
            {"name": "readonly", "containerEdits": {
                "deviceNodes": [{"path": "/dev/par-ro", "hostPath": str(host / "kmsg"),
                                 "permissions": "r"}]}},
            {"name": "gids", "containerEdits": {
                "deviceNodes": [{"path": "/dev/par2", "hostPath": str(host / "dev2")}],
                "additionalGids": [4242]}},
        ]}))
    (specs / "b.json").write_text(json.dumps({
        "cdiVersion": "0.5.0", "kind": "parity.example/second",
        "containerEdits": {"env": ["PAR_SHARED=b"]},
        "devices": [{"name": "other", "containerEdits": {"env": ["PAR_B=1"], "mounts": [
            {"hostPath": str(host / "share"), "containerPath": "/opt/b",
             "options": ["ro", "rbind"]}]}}]}))


def build_world(root: Path) -> World:
    """The node under ``root`` (a new folder): the parity specs (``parity_node``), the
    simulated NVIDIA driver and its spec, and the plugin's settings file."""
    parity_node(root)
    _nvidia(root)
    world = World(root)
    dirs = [str(d) for d in world.spec_dirs]
    sources = {name: {"namespaces": ["*"]} for name in
               ("podAnnotations", "nriPluginsAnnotations", "nvidiaNriAnnotations")}
    world.config.write_text(json.dumps({
        "plugin": {"spec_dirs": dirs, "rescan_interval": 3600,
                   "pod_resources_socket": str(root / "no-kubelet" / "kubelet.sock")},
        "runtime_cdi": {"enabled": "on", "spec_dirs": dirs},
        "log": {"level": "debug"},
        "policy": {"sources": sources},
    }, indent=1) + "\n")
    return world


def _nvidia(root: Path) -> None:
    """One simulated GPU and its spec, hook-free (``--link-mode mounts``: the driver's
    files are mounts, which a capability trim leaves out one by one)."""
    from nri_cdi_testbed.simnode import NodeLayout, build_node

    node = build_node(root / "gpu-node", NodeLayout.uniform(1))
    generate(root, node.driver_root, node.root, "mounts", root / "nvidia")


def generate(root: Path, driver_root: Path, dev_root: Path, mode: str, out: Path) -> None:
    """``nri-cdi generate`` of the simulated driver into ``out/nvidia.yaml``."""
    out.mkdir()
    subprocess.run(
        [sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--mode", "procfs",
         "--cdi-version", "0.6.0", "--driver-root", str(driver_root),
         "--dev-root", str(dev_root), "--link-mode", mode,
         "--output", str(out / "nvidia.yaml")],
        check=True, cwd=Path(__file__).resolve().parents[1], capture_output=True)


# --- recording ------------------------------------------------------------------------------

SLEEP = ["sleep", "600"]
POD_ANNOTATION = "cdi.k8s.io/dev"


def projection(spec: dict[str, object]) -> dict[str, object]:
    """What the recordings keep of the OCI spec a runtime made: what an adjustment or CDI
    can change (env, gids, mounts in order, device nodes, device cgroup rules, hooks)."""
    process = spec.get("process") if isinstance(spec.get("process"), dict) else {}
    linux = spec.get("linux") if isinstance(spec.get("linux"), dict) else {}
    assert isinstance(process, dict) and isinstance(linux, dict)
    resources = linux.get("resources") if isinstance(linux.get("resources"), dict) else {}
    assert isinstance(resources, dict)
    user = process.get("user") if isinstance(process.get("user"), dict) else {}
    assert isinstance(user, dict)
    return {"env": process.get("env", []), "additionalGids": user.get("additionalGids", []),
            "mounts": spec.get("mounts", []), "devices": linux.get("devices", []),
            "device_rules": resources.get("devices", []), "hooks": spec.get("hooks", {})}


@dataclass
class Scenarios:
    """The fixed scenarios, driven through CRI (tests/e2e/cri.py's client, any runtime),
    each outcome written into the recording as a mark: ``#spec`` (the runtime's OCI spec
    of a created container, ``projection``) or ``#refused`` (the CRI error the pod's
    user sees)."""

    cri: Any
    recorder: Any
    image: str
    kill_plugin: Callable[[], None]
    start_plugin: Callable[[], None]

    def _mark(self, event: str, **details: object) -> None:
        self.recorder.mark(event, **details)

    def create(self, label: str, pod: str, *, start: bool = True, **kwargs: object) -> str:
        cri = self.cri
        self._mark("#case", label=label)
        try:
            cid = str(cri.create_container(pod, "app", self.image,
                                           command=SLEEP, **kwargs))
        except cri.grpc.RpcError as error:
            self._mark("#refused", label=label, code=error.code().name,
                       message=error.details())
            return ""
        self._mark("#spec", label=label, container=cid,
                   spec=projection(cri.runtime_spec(cid)))
        if start:
            cri.start_container(cid)
        return cid

    def pod(self, name: str, devices: str = "", **kwargs: object) -> str:
        annotations = {POD_ANNOTATION: devices} if devices else {}
        return str(self.cri.run_pod(name, annotations=annotations,
                                    **kwargs))

    def run(self, *, cdi_devices_field: bool) -> None:
        cri = self.cri
        first = self.create("file-modes", self.pod(
            "file-modes", "parity.example/first=node,parity.example/first=moded"))
        self.create("env-only", self.pod(
            "env-only", "parity.example/first=node,parity.example/first=envonly"))
        self.create("two-spec-files", self.pod(
            "two-spec-files", "parity.example/first=envonly,parity.example/second=other,"
            "parity.example/first=node"))
        if cdi_devices_field:
            self.create("native-file-modes", self.pod("native"), cdi_devices=[
                "parity.example/first=node", "parity.example/first=moded"])
        self.create("container-annotation", self.pod("annotated"), annotations={
            POD_ANNOTATION: "parity.example/first=envonly,parity.example/first=node"})
        self.create("permissions-r", self.pod(
            "permissions-r", "parity.example/first=readonly,parity.example/first=node"))
        self.create("additional-gids", self.pod(
            "additional-gids", "parity.example/first=gids,parity.example/second=other"))
        self.create("unknown-device", self.pod("unknown", "parity.example/first=missing"))
        self.create("gpu", self.pod("gpu", GPU))
        self.create("gpu-utility", self.pod("gpu-utility", GPU),
                    env={"NVIDIA_DRIVER_CAPABILITIES": "utility"})
        self.create("gpu-require", self.pod("gpu-require", GPU),
                    env={"NVIDIA_REQUIRE_CUDA": IMPOSSIBLE_CUDA})
        # stop and removal events of a container the plugin injected
        if first:
            self._mark("#case", label="stop-remove")
            cri.stop_container(first)
            cri.remove_container(first)
        # fail-closed: a container created while the plugin is away, started once it is back
        away_pod = self.pod("away", GPU)
        self._mark("#plugin", action="killed")
        self.kill_plugin()
        away = self.create("created-while-away", away_pod, start=False)
        self._mark("#plugin", action="started")
        self.start_plugin()
        self._mark("#case", label="start-guard")
        try:
            cri.start_container(away)
            status = cri.container_status(away).status
            self._mark("#started", label="start-guard", state=int(status.state),
                       reason=status.reason, message=status.message)
        except cri.grpc.RpcError as error:
            self._mark("#refused", label="start-guard", code=error.code().name,
                       message=error.details())


def record(label: str, out: Path, work: Path, *, crio_bin: Path | None = None,
           containerd_bin: Path | None = None) -> None:
    """The scenarios on a private runtime (containerd from ``containerd_bin``, or CRI-O
    from ``crio_bin``), its own CDI on and reading the plugin's folders, the plugin
    connected through the recorder; ``out`` gets the recording with the node's root
    written ``{node}`` and the runtime's folder ``{runtime}``."""
    from nri_cdi_testbed.node_check.containerd import Containerd
    from nri_cdi_testbed.node_check.images import (
        BUSYBOX_IMAGE,
        PAUSE_IMAGE,
        busybox_image,
        pause_image,
    )
    from nri_cdi_testbed.node_check.plugin import PluginProcess
    from tests.e2e.nri_recorder import NriRecorder
    from tests.nri_wire_crio import Crio

    world = build_world(work / "node")
    (work / "images").mkdir()
    archives = [pause_image(work / "images"), busybox_image(work / "images")]
    runtime: Crio | Containerd
    if crio_bin is not None:
        runtime = Crio(cdi_spec_dirs=world.spec_dirs, bin_path=crio_bin)
        runtime.import_image(archives[0], PAUSE_IMAGE)
        runtime.import_image(archives[1], BUSYBOX_IMAGE)
        runtime_name = "cri-o"
    else:
        assert containerd_bin is not None
        major_minor = ".".join(label.split("-")[-1].split(".")[:2])
        runtime = Containerd(enable_cdi=True, cdi_spec_dirs=world.spec_dirs,
                             bin_dir=containerd_bin, version=major_minor)
        runtime_name = "containerd"
    listen = work / "nri-proxy.sock"
    plugin = PluginProcess(str(listen), [], work / "plugin.log",
                           extra_args=["--config", str(world.config)])

    def start_plugin() -> None:
        mark = plugin.log_size()
        plugin.spawn()
        plugin.wait_for_log(f"connected to {runtime_name}", after=mark)

    try:
        runtime.start()
        if isinstance(runtime, Containerd):
            runtime.import_images(*archives)
        with NriRecorder(listen, runtime.nri_socket, out,
                         roots={str(world.root): ROOT_NAME,
                                str(runtime.workdir): "{runtime}"}) as recorder:
            recorder.mark("#runtime", label=label)
            start_plugin()
            with runtime.cri() as cri, cri.cleanup():
                Scenarios(cri, recorder, BUSYBOX_IMAGE, plugin.kill, start_plugin).run(
                    cdi_devices_field=cri.has_cdi_devices_field)
            plugin.kill()
    finally:
        plugin.kill()
        runtime.close()


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m tests.nri_wire")
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record the scenarios on a private runtime")
    rec.add_argument("--runtime", required=True, help="the recording's name, "
                     "e.g. containerd-2.2.1 or cri-o-1.35.6")
    rec.add_argument("--bin", type=Path, required=True,
                     help="folder with containerd, ctr, containerd-shim-runc-v2 (or with "
                          "CRI-O's crio, pinns, copyimg for a cri-o-* runtime)")
    rec.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    args.out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="nri-wire-") as work:
        crio = args.runtime.startswith("cri-o")
        record(args.runtime, args.out.resolve(), Path(work),
               crio_bin=args.bin if crio else None, containerd_bin=None if crio else args.bin)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
