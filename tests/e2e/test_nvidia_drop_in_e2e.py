"""NVIDIA's runtime semantics and Kubernetes allocation through our plugin, on a real
containerd, with specs generated from a simulated 2-GPU node (procfs mode; both GPUs
MIG-capable, so the MIG config/monitor capability nodes exist; one IMEX channel node):
``NVIDIA_VISIBLE_DEVICES=none``, MIG config/monitor, IMEX channels, /proc/driver/nvidia
masking in both link modes, the device plugin's volume mounts with requirement checks,
NVIDIA's NRI plugin keys, and policy reload."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient
from tests.e2e.images import BUSYBOX_IMAGE
from tests.e2e.plugin import REPO, PluginProcess, annotation_policy

SLEEP = ["sleep", "600"]
IMEX_MAJOR = 511
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None,
                                reason="gcc is needed to build the simulated node")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, e2e_ready: None) -> dict[str, Any]:
    from nri_cdi_testbed.simnode import BuiltNode, NodeLayout, build_node

    root = tmp_path_factory.mktemp("dropin")
    built = build_node(root / "node", NodeLayout.uniform(2))
    imex = built.dev_root / "dev" / "nvidia-caps-imex-channels"
    imex.mkdir(parents=True)
    os.mknod(imex / "channel0", 0o666 | 0o020000, os.makedev(IMEX_MAJOR, 0))
    for mode in ("hooks", "mounts"):
        (root / mode).mkdir()
        subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--mode",
                        "procfs", "--driver-root", str(built.driver_root), "--link-mode", mode,
                        "--output", str(root / mode / "nvidia.yaml")],
                       check=True, cwd=REPO, capture_output=True)
    manifest = BuiltNode.load(built.root).manifest
    return {"root": root, "gpus": manifest["gpus"]}


@pytest.fixture(scope="module")
def ctrd(containerd: ContainerdFactory) -> Containerd:
    return containerd()


class Plugin(PluginProcess):
    def __init__(self, *args: Any, policy: Path) -> None:
        super().__init__(*args)
        self.policy = policy

    def command(self) -> list[str]:
        return [*super().command(), "--policy", str(self.policy)]


@pytest.fixture
def start(ctrd: Containerd, node: dict[str, Any]) -> Iterator[Any]:
    started: list[Plugin] = []

    def run(policy: str, mode: str = "mounts") -> Plugin:
        path = node["root"] / f"policy-{time.monotonic_ns()}.yaml"
        path.write_text(annotation_policy(["*"], policy))
        plugin = Plugin(ctrd.nri_socket, [node["root"] / mode],
                        node["root"] / f"plugin-{mode}.log", policy=path).start()
        started.append(plugin)
        return plugin

    yield run
    for plugin in started:
        plugin.kill()


def create(cri: CriClient, name: str, *, env: dict[str, str] | None = None,
           pod_annotations: dict[str, str] | None = None, privileged: bool = False,
           mounts: dict[str, str] | None = None) -> str:
    """A started busybox container; ``mounts``: container path -> host path (as kubelet)."""
    pod = cri.run_pod(name, annotations=pod_annotations, privileged=privileged)
    return cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP, env=env,
                             privileged=privileged, mounts=mounts)


def refused(cri: CriClient, name: str, **kwargs: Any) -> str:
    with pytest.raises(cri.grpc.RpcError) as info:
        create(cri, name, **kwargs)
    return str(info.value.details())


def nvidia_nodes(cri: CriClient, ctr: str) -> list[str]:
    spec = cri.runtime_spec(ctr)
    return sorted(d["path"] for d in spec["linux"].get("devices", [])
                  if d["path"].startswith("/dev/nvidia"))


def sh(cri: CriClient, ctr: str, script: str) -> str:
    return cri.exec_sync(ctr, ["sh", "-c", script]).stdout


ENV_ON = "sources: {visibleDevicesEnv: {enabled: true, privilegedOnly: false}}\n"
CONTROL = ["/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"]


def test_none_gives_the_driver_without_a_gpu(cri: CriClient, start: Any) -> None:
    start(ENV_ON)
    ctr = create(cri, "none", env={"NVIDIA_VISIBLE_DEVICES": "none"})
    assert nvidia_nodes(cri, ctr) == CONTROL
    assert sh(cri, ctr, "ls /dev | grep -c '^nvidia[0-9]' || true") == "0\n"
    assert sh(cri, ctr, "ls /usr/bin/nvidia-smi /usr/lib/x86_64-linux-gnu/libcuda.so.1") == (
        "/usr/bin/nvidia-smi\n/usr/lib/x86_64-linux-gnu/libcuda.so.1\n")


def test_mig_capabilities_only_where_allowed(cri: CriClient, start: Any) -> None:
    start("")  # the defaults: MIG capabilities for privileged containers only
    env = {"NVIDIA_MIG_CONFIG_DEVICES": "all", "NVIDIA_MIG_MONITOR_DEVICES": "all"}
    assert "sources.migCapabilitiesEnv.privilegedOnly" in refused(cri, "mig-u", env=env)
    ctr = create(cri, "mig-p", env=env, privileged=True)
    # A privileged container's device list is the runtime's (every host node); the
    # plugin's own nodes are the ones that exist in the simulated node only.
    assert {"/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"} <= set(
        nvidia_nodes(cri, ctr))
    assert sh(cri, ctr, "stat -c %t:%T /dev/nvidia-caps/nvidia-cap1") != ""
    assert "only 'all' is supported" in refused(
        cri, "mig-bad", env={"NVIDIA_MIG_MONITOR_DEVICES": "0"}, privileged=True)


def test_imex_channels_only_where_allowed(cri: CriClient, start: Any) -> None:
    plugin = start("")  # imexChannelsEnv off by default: the variable is ignored
    ctr = create(cri, "imex-off", env={"NVIDIA_IMEX_CHANNELS": "0"})
    assert nvidia_nodes(cri, ctr) == []
    plugin.kill()
    start("sources: {imexChannelsEnv: {enabled: true, privilegedOnly: false, "
          "namespaces: [default]}}\n")
    ctr = create(cri, "imex-on", env={"NVIDIA_IMEX_CHANNELS": "0"})
    assert nvidia_nodes(cri, ctr) == ["/dev/nvidia-caps-imex-channels/channel0"]
    assert sh(cri, ctr, "stat -c %t /dev/nvidia-caps-imex-channels/channel0") == (
        f"{IMEX_MAJOR:x}\n")
    assert "channel 7 does not exist" in refused(cri, "imex-bad",
                                                 env={"NVIDIA_IMEX_CHANNELS": "7"})


@pytest.mark.parametrize("mode", ["hooks", "mounts"])
def test_proc_driver_nvidia_shows_only_the_given_gpu(cri: CriClient, start: Any,
                                                     node: dict[str, Any], mode: str) -> None:
    start("procMasking: {enabled: true}\n", mode)
    ctr = create(cri, f"mask-{mode}", pod_annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
    first, second = (g["bus_id"] for g in node["gpus"])
    assert sh(cri, ctr, "ls /proc/driver/nvidia/gpus").split() == [first.lower()]
    assert second.lower() not in sh(cri, ctr, "cat /proc/driver/nvidia/gpus/*/information")
    assert "read-only" in cri.exec_sync(
        ctr, ["sh", "-c", "touch /proc/driver/nvidia/gpus/x 2>&1"]).stdout.lower()


def test_device_plugin_volume_mounts(cri: CriClient, start: Any, node: dict[str, Any]) -> None:
    start("sources: {volumeMounts: {enabled: true}}\n")
    uuid = node["gpus"][1]["uuid"]
    mounts = {f"/var/run/nvidia-container-devices/{uuid}": "/dev/null"}
    ctr = create(cri, "vm", mounts=mounts)
    assert [n for n in nvidia_nodes(cri, ctr) if n[11:].isdigit()] == ["/dev/nvidia1"]
    # The requirement check applies to the GPU the mount named (the node runs 580.82.07).
    assert "driver>=999" in refused(cri, "vm-req", mounts=mounts,
                                    env={"NVIDIA_REQUIRE_DRIVER": "driver>=999"})
    ok = create(cri, "vm-req-ok", mounts=mounts, env={"NVIDIA_REQUIRE_DRIVER": "driver>=500"})
    assert "/dev/nvidia1" in nvidia_nodes(cri, ok)


def test_volume_mounts_refused_when_the_source_is_off(cri: CriClient, start: Any,
                                                      node: dict[str, Any]) -> None:
    start("")
    mounts = {f"/var/run/nvidia-container-devices/{node['gpus'][0]['uuid']}": "/dev/null"}
    assert "sources.volumeMounts.enabled" in refused(cri, "vm-off", mounts=mounts)


def test_nvidia_nri_plugin_keys(cri: CriClient, start: Any) -> None:
    start("")
    ctr = create(cri, "nvnri", pod_annotations={
        "nvidia.cdi.k8s.io/container.app": "nvidia.com/gpu=1"})
    assert [n for n in nvidia_nodes(cri, ctr) if n[11:].isdigit()] == ["/dev/nvidia1"]
    every = create(cri, "nvnri-all", pod_annotations={
        "nvidia.cdi.k8s.io/container.*": "nvidia.com/gpu=0"})
    assert [n for n in nvidia_nodes(cri, every) if n[11:].isdigit()] == ["/dev/nvidia0"]
    nri = create(cri, "nriplugins", pod_annotations={"cdi.nri.io/pod": "nvidia.com/gpu=1"})
    assert [n for n in nvidia_nodes(cri, nri) if n[11:].isdigit()] == ["/dev/nvidia1"]


def test_policy_reload_without_restart(cri: CriClient, start: Any) -> None:
    plugin = start("sources: {podAnnotations: {enabled: false}}\n")
    asks = {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}
    assert "sources.podAnnotations.enabled" in refused(cri, "r1", pod_annotations=asks)
    mark = plugin.log_size()
    # As an editor or a ConfigMap update does it: a new file renamed over the old one.
    fresh = plugin.policy.with_suffix(".new")
    fresh.write_text("sources: {podAnnotations: {namespaces: ['*']}}\n")
    fresh.rename(plugin.policy)
    plugin.wait_for_log("policy reloaded", after=mark)
    ctr = create(cri, "r2", pod_annotations=asks)
    assert "/dev/nvidia0" in nvidia_nodes(cri, ctr)
    # A broken policy is refused, naming every problem; the last good one stays.
    mark = plugin.log_size()
    plugin.policy.write_text("sources: {podAnnotations: {enabled: maybe}}\nbogus: 1\n")
    plugin.wait_for_log("previous policy stays in force", after=mark)
    log = plugin.log(mark)
    assert "sources.podAnnotations.enabled: must be true or false" in log
    assert "bogus: unknown key" in log
    assert "/dev/nvidia0" in nvidia_nodes(cri, create(cri, "r3", pod_annotations=asks))
    # SIGHUP reloads too (here: the file fixed, then the signal).
    plugin.policy.write_text("sources: {podAnnotations: {enabled: false}}\n")
    mark = plugin.log_size()
    assert plugin.process is not None
    plugin.process.send_signal(1)
    plugin.wait_for_log("policy reloaded", after=mark)
    assert "sources.podAnnotations.enabled" in refused(cri, "r4", pod_annotations=asks)
