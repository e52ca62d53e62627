"""Policy, NVIDIA requirements, driver capabilities and fail-closed, against a real
containerd, with a spec generated (nvml mode, pynvml test double) from a simulated node."""

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

from nri_cdi_testbed.waiting import wait_until
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient
from tests.e2e.images import BUSYBOX_IMAGE
from tests.e2e.plugin import REPO, PluginProcess, annotation_policy

SLEEP = ["sleep", "600"]
LIB = "/usr/lib/x86_64-linux-gnu"
DRIVER = "580.82.07"  # the simulated node's driver; it supports CUDA 13.0
GPU = "nvidia.com/gpu"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None,
                                reason="gcc is needed to build the simulated node")


@pytest.fixture(scope="module")
def gpu_node(tmp_path_factory: pytest.TempPathFactory, e2e_ready: None) -> Path:
    """A simulated 2-GPU node and its spec + sidecar in ``<root>/cdi``."""
    from nri_cdi_testbed.simnode import NodeLayout, build_node

    root = tmp_path_factory.mktemp("gpunode")
    node = build_node(root / "node", NodeLayout.uniform(2))
    (root / "cdi").mkdir()
    # NVML mode through nvidia-ml-py and the node's simulated libnvidia-ml
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "cdi.nvidia.cli", "--mode", "nvml",
                    "--driver-root", str(node.driver_root), "--dev-root", str(node.dev_root),
                    "--disable-hook", "all", "--output", str(root / "cdi" / "nvidia.yaml"),
                    # no additionalGids: NRI cannot carry them on containerd < 1.7.30
                    "--cdi-version", "0.6.0"],
                   env=env, check=True, cwd=REPO)
    return root


@pytest.fixture(scope="module")
def ctrd(containerd: ContainerdFactory) -> Containerd:
    return containerd()


class PolicyPlugin(PluginProcess):
    def __init__(self, *args: Any, policy: Path | None = None) -> None:
        super().__init__(*args)
        self.policy = policy

    def command(self) -> list[str]:
        extra = ["--policy", str(self.policy)] if self.policy else []
        return [*super().command(), *extra]


def start_plugin(ctrd: Containerd, node: Path, policy: str | None = None,
                 log: str = "plugin.log") -> PolicyPlugin:
    path = None
    if policy is not None:
        path = node / f"policy-{time.monotonic_ns()}.yaml"
        path.write_text(annotation_policy(["*"], policy))
    return PolicyPlugin(ctrd.nri_socket, [node / "cdi"], node / log, policy=path).start()


@pytest.fixture
def plugin(ctrd: Containerd, gpu_node: Path) -> Iterator[PolicyPlugin]:
    process = start_plugin(ctrd, gpu_node)
    yield process
    process.kill()


def sh(cri: CriClient, container: str, script: str) -> str:
    return cri.exec_sync(container, ["sh", "-c", script]).stdout


def gpus(cri: CriClient, container: str) -> list[str]:
    spec = cri.runtime_spec(container)
    return sorted(d["path"] for d in spec["linux"].get("devices", [])
                  if d["path"].startswith("/dev/nvidia") and d["path"][11:].isdigit())


def create_fails(cri: CriClient, pod: str, **kwargs: Any) -> str:
    with pytest.raises(cri.grpc.RpcError) as info:
        cri.create_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP, **kwargs)
    return str(info.value.details())


def run_privileged(cri: CriClient, name: str, env: dict[str, str]) -> str:
    """A privileged container in a privileged pod."""
    pod = cri.run_pod(name, privileged=True)
    return cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP, env=env,
                             privileged=True)


# --- 1. request sources ------------------------------------------------------------------------

def test_pod_annotation_source_allowed(cri: CriClient, plugin: PolicyPlugin) -> None:
    pod = cri.run_pod("ann", annotations={"cdi.k8s.io/gpu": f"{GPU}=1"})
    ctr = cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP)
    assert gpus(cri, ctr) == ["/dev/nvidia1"]
    assert sh(cri, ctr, "test -c /dev/nvidia1 && echo yes") == "yes\n"


def test_sources_denied_by_namespace_name_the_rule(
    cri: CriClient, ctrd: Containerd, gpu_node: Path
) -> None:
    policy = """\
sources:
  podAnnotations: {namespaces: [ml-*]}
  containerAnnotations: {namespaces: [ml-*]}
"""
    plugin = start_plugin(ctrd, gpu_node, policy, "denied.log")
    try:
        pod = cri.run_pod("denied", namespace="web",
                          annotations={"cdi.k8s.io/gpu": f"{GPU}=0"})
        message = create_fails(cri, pod)
        assert "request source pod annotations is not allowed in namespace 'web'" in message
        assert "sources.podAnnotations.namespaces ['ml-*']" in message
        pod = cri.run_pod("denied2", namespace="web")
        message = create_fails(cri, pod, annotations={"cdi.k8s.io/dp_0": f"{GPU}=0"})
        assert "request source container annotations is not allowed" in message
        ok = cri.run_pod("allowed", namespace="ml-train",
                         annotations={"cdi.k8s.io/gpu": f"{GPU}=0"})
        assert gpus(cri, cri.run_container(ok, "app", BUSYBOX_IMAGE,
                                           command=SLEEP)) == ["/dev/nvidia0"]
    finally:
        plugin.kill()


def test_container_annotation_source(cri: CriClient, plugin: PolicyPlugin) -> None:
    pod = cri.run_pod("kubelet")
    ctr = cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP,
                            annotations={"cdi.k8s.io/nvidia-device-plugin_0": f"{GPU}=0"})
    assert gpus(cri, ctr) == ["/dev/nvidia0"]


def test_device_rule_denies_with_rule_name(
    cri: CriClient, ctrd: Containerd, gpu_node: Path
) -> None:
    policy = """\
devices:
- namespaces: [team-a]
  allow: ["nvidia.com/gpu=0"]
- namespaces: ["*"]
  deny: ["nvidia.com/gpu=all"]
  allow: ["nvidia.com/gpu=*"]
"""
    plugin = start_plugin(ctrd, gpu_node, policy, "rules.log")
    try:
        pod = cri.run_pod("all", annotations={"cdi.k8s.io/gpu": f"{GPU}=all"})
        message = create_fails(cri, pod)
        assert "device nvidia.com/gpu=all denied in namespace 'default'" in message
        assert "devices[1]" in message and "deny 'nvidia.com/gpu=all'" in message
        pod = cri.run_pod("one", annotations={"cdi.k8s.io/gpu": f"{GPU}=1"})
        assert gpus(cri, cri.run_container(pod, "app", BUSYBOX_IMAGE,
                                           command=SLEEP)) == ["/dev/nvidia1"]
    finally:
        plugin.kill()


def test_visible_devices_env_ignored_by_default(cri: CriClient, plugin: PolicyPlugin) -> None:
    # The k8s-device-plugin#87 hole: an image with NVIDIA_VISIBLE_DEVICES=all gets nothing.
    pod = cri.run_pod("envdefault")
    ctr = cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP,
                            env={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert gpus(cri, ctr) == []


def test_visible_devices_env_for_privileged_only(
    cri: CriClient, ctrd: Containerd, gpu_node: Path
) -> None:
    policy = "sources:\n  visibleDevicesEnv: {enabled: true, privilegedOnly: true}\n"
    plugin = start_plugin(ctrd, gpu_node, policy, "env.log")
    try:
        pod = cri.run_pod("unpriv")
        ctr = cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP,
                                env={"NVIDIA_VISIBLE_DEVICES": "1"})
        assert gpus(cri, ctr) == []  # ignored: not privileged
        ctr = run_privileged(cri, "priv", {"NVIDIA_VISIBLE_DEVICES": "1"})
        plugin.wait_for_log("devices=nvidia.com/gpu=1")
        assert sh(cri, ctr, f"test -e {LIB}/libcuda.so.{DRIVER} && echo yes") == "yes\n"
    finally:
        plugin.kill()


def test_visible_devices_env_maps_uuid_and_index(
    cri: CriClient, ctrd: Containerd, gpu_node: Path
) -> None:
    import json

    meta = json.loads((gpu_node / "cdi" / "nvidia.yaml.meta").read_text())
    uuid = meta["devices"]["1"]["gpuUuid"]
    policy = "sources:\n  visibleDevicesEnv: {enabled: true, privilegedOnly: false}\n"
    plugin = start_plugin(ctrd, gpu_node, policy, "envmap.log")
    try:
        pod = cri.run_pod("envmap")
        ctr = cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP,
                                env={"NVIDIA_VISIBLE_DEVICES": f"0,{uuid.lower()}"})
        assert gpus(cri, ctr) == ["/dev/nvidia0", "/dev/nvidia1"]
        message = create_fails(cri, cri.run_pod("bad"), env={"NVIDIA_VISIBLE_DEVICES": "7"})
        assert "NVIDIA_VISIBLE_DEVICES: unknown device '7'" in message
    finally:
        plugin.kill()


# --- 2. capabilities ----------------------------------------------------------------------------

@pytest.mark.parametrize("caps, present, absent", [
    (None, [f"libcuda.so.{DRIVER}", f"libnvidia-ml.so.{DRIVER}"],
     [f"libnvidia-glcore.so.{DRIVER}", f"libGLX_nvidia.so.{DRIVER}"]),
    ("compute", [f"libcuda.so.{DRIVER}"],
     [f"libnvidia-glcore.so.{DRIVER}", f"libnvidia-ml.so.{DRIVER}"]),
    ("utility", [f"libnvidia-ml.so.{DRIVER}"], [f"libcuda.so.{DRIVER}"]),
    ("all", [f"libcuda.so.{DRIVER}", f"libnvidia-glcore.so.{DRIVER}"], []),
])
def test_driver_capabilities_filter_libraries(
    cri: CriClient, plugin: PolicyPlugin, caps: str | None, present: list[str],
    absent: list[str]
) -> None:
    pod = cri.run_pod("caps", annotations={"cdi.k8s.io/gpu": f"{GPU}=0"})
    env = {"NVIDIA_DRIVER_CAPABILITIES": caps} if caps else {}
    ctr = cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP, env=env)
    for name in present:
        assert sh(cri, ctr, f"test -e {LIB}/{name} && echo yes") == "yes\n", name
    for name in absent:
        assert sh(cri, ctr, f"test -e {LIB}/{name} || echo no") == "no\n", name
    smi = sh(cri, ctr, "test -e /usr/bin/nvidia-smi && echo yes || echo no")
    assert smi == ("yes\n" if caps in (None, "utility", "all") else "no\n")


# --- 3. requirements ----------------------------------------------------------------------------

@pytest.mark.parametrize("env", [
    {"NVIDIA_REQUIRE_CUDA": "cuda>=12.4"},
    {"NVIDIA_REQUIRE_CUDA": "cuda>=13.1", "NVIDIA_DISABLE_REQUIRE": "true"},
    {"NVIDIA_REQUIRE_CUDA": "cuda>=99.0 brand=nvidia,driver>=580,driver<581"},
    {"CUDA_VERSION": "12.8.1"},
    {"NVIDIA_REQUIRE_ARCH": "arch>=8.0"},
])
def test_requirements_met_or_disabled(cri: CriClient, plugin: PolicyPlugin,
                                      env: dict[str, str]) -> None:
    pod = cri.run_pod("req-ok", annotations={"cdi.k8s.io/gpu": f"{GPU}=0"})
    ctr = cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP, env=env)
    assert gpus(cri, ctr) == ["/dev/nvidia0"]


@pytest.mark.parametrize("env, message", [
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=13.1"},
     f"requirement cuda>=13.1 not met: node driver {DRIVER} supports CUDA 13.0"),
    ({"CUDA_VERSION": "13.2.0"},
     f"requirement cuda>=13.2 not met: node driver {DRIVER} supports CUDA 13.0 "
     "(CUDA_VERSION (legacy image)"),
    ({"NVIDIA_REQUIRE_ARCH": "arch>=10.0"},
     "requirement arch>=10.0 not met: GPU nvidia.com/gpu=0 has arch 9.0"),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0 brand=tesla"},
     "requirement cuda>=12.0 brand=tesla"),  # met by cuda: not an error; see below
])
def test_requirements_not_met(cri: CriClient, plugin: PolicyPlugin, env: dict[str, str],
                              message: str) -> None:
    pod = cri.run_pod("req-bad", annotations={"cdi.k8s.io/gpu": f"{GPU}=0"})
    if "brand=tesla" in env.get("NVIDIA_REQUIRE_CUDA", ""):
        # One alternative (cuda>=12.0) holds, so the OR holds.
        ctr = cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP, env=env)
        assert gpus(cri, ctr) == ["/dev/nvidia0"]
        return
    assert message in create_fails(cri, pod, env=env)


# --- 4. policy file errors -------------------------------------------------------------------

def test_policy_file_with_errors_stops_the_plugin(ctrd: Containerd, gpu_node: Path) -> None:
    bad = gpu_node / "bad-policy.yaml"
    bad.write_text("sources:\n  podAnotations: {enabled: false}\n"
                   "failClosed: {action: shoot}\n")
    log = gpu_node / "badpolicy.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "plugin", "--socket",
                             ctrd.nri_socket, "--policy", str(bad)], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=30)
    log.write_text(result.stderr)
    assert result.returncode == 2
    assert "sources.podAnotations: unknown key" in result.stderr
    assert "failClosed.action: must be one of evict, report, got 'shoot'" in result.stderr


# --- 5. fail-closed ------------------------------------------------------------------------------

def _state(cri: CriClient, container: str) -> int:
    return int(cri.container_status(container).status.state)


def _wait_state(cri: CriClient, container: str, state: int) -> int:
    wait_until(lambda: _state(cri, container) == state, f"container {container} in state "
               f"{state}", seen=lambda: _state(cri, container))
    return state


@pytest.mark.parametrize("action", ["evict", "report"])
def test_fail_closed_after_plugin_was_away(cri: CriClient, ctrd: Containerd, gpu_node: Path,
                                           action: str) -> None:
    running, exited = cri.pb.CONTAINER_RUNNING, cri.pb.CONTAINER_EXITED
    # No plugin connected: NRI is fail-open, the container starts without its GPU.
    pod = cri.run_pod("away", annotations={"cdi.k8s.io/ctr.gpu": f"{GPU}=0"})
    unserved = cri.run_container(pod, "gpu", BUSYBOX_IMAGE, command=SLEEP)
    plain = cri.run_container(pod, "plain", BUSYBOX_IMAGE, command=SLEEP)
    assert gpus(cri, unserved) == []
    plugin = start_plugin(ctrd, gpu_node, f"failClosed: {{action: {action}}}\n",
                          f"failclosed-{action}.log")
    try:
        if action == "evict":
            plugin.wait_for_log("fail-closed evict: stopped container gpu (")
            assert _wait_state(cri, unserved, exited) == exited
        else:
            plugin.wait_for_log("fail-closed report: container gpu")
            # Whatever the plugin does after its report it has done by the time it has
            # served a container created later.
            later = cri.run_pod("later", annotations={"cdi.k8s.io/gpu": f"{GPU}=0"})
            cri.run_container(later, "later", BUSYBOX_IMAGE, command=SLEEP)
            plugin.wait_for_log("container=later pod=default/later")
            assert _state(cri, unserved) == running
        assert _state(cri, plain) == running  # asked for nothing: left alone
        assert "container plain" not in plugin.log()
    finally:
        plugin.kill()
