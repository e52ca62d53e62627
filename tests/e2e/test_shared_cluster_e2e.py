"""Safe on a shared cluster, against a real containerd: pods ask by annotation only in the
namespaces the policy lists, and never for a GPU the kubelet allocated to another pod.

The kubelet is a stand-in answering its pod-resources API with what a real kubelet
(1.35.6) answered while NVIDIA's device plugin (v0.20.0) had allocated GPU 0 of the same
simulated node (``NodeLayout.uniform(2)``, default seed) to pod ``default/dp-podres-node``
(tests/data/kubelet-1.35.6/pod-resources/); that pod's own container is replayed as the
kubelet created it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient
from tests.e2e.images import BUSYBOX_IMAGE
from tests.e2e.plugin import REPO, PluginProcess
from tests.kubelet_peer import RECORDINGS, PodResourcesServer, recorded

SLEEP = ["sleep", "600"]
HELD_BY = "default/dp-podres-node"  # the recorded pod the device plugin gave GPU 0
HELD_UUID = "GPU-970392d6-a829-4d12-b74d-94ad7449a639"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None,
                                reason="gcc is needed to build the simulated node")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, e2e_ready: None) -> Path:
    """The recorded node: a simulated 2-GPU node, its spec and sidecar in ``<root>/cdi``,
    and the device plugin's own spec (its hooks left out) in ``<root>/dp``."""
    from nri_cdi_testbed.simnode import NodeLayout, build_node

    root = tmp_path_factory.mktemp("shared")
    built = build_node(root / "node", NodeLayout.uniform(2))
    (root / "cdi").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "cdi.nvidia.cli", "--mode", "nvml",
                    "--driver-root", str(built.driver_root), "--dev-root",
                    str(built.dev_root), "--disable-hook", "all", "--cdi-version", "0.6.0",
                    "--output", str(root / "cdi" / "nvidia.yaml")],
                   env=env, check=True, cwd=REPO)
    spec = RECORDINGS.parent / "device-plugin-spec.json"
    dp_spec = json.loads(spec.read_text().replace("{simnode}", str(built.root)))
    dp_spec["containerEdits"].pop("hooks", None)
    (root / "dp").mkdir()
    (root / "dp" / "k8s.device-plugin.nvidia.com-gpu.json").write_text(json.dumps(dp_spec))
    return root


@pytest.fixture(scope="module")
def ctrd(containerd: ContainerdFactory) -> Containerd:
    return containerd()


@pytest.fixture(scope="module")
def kubelet(node: Path) -> Iterator[PodResourcesServer]:
    server = PodResourcesServer(node / "pod-resources.sock", lambda: recorded("List")).start()
    yield server
    server.stop()


def start_plugin(ctrd: Containerd, node: Path, name: str, *extra: str,
                 policy: str = "") -> PluginProcess:
    args = list(extra)
    if policy:
        (node / f"{name}.policy.yaml").write_text(policy)
        args += ["--policy", str(node / f"{name}.policy.yaml")]
    return PluginProcess(ctrd.nri_socket, [node / "cdi", node / "dp"], node / f"{name}.log",
                         args).start()


@pytest.fixture
def cri(ctrd: Containerd) -> Iterator[CriClient]:
    with ctrd.cri() as client, client.cleanup():
        yield client


def create_fails(cri: CriClient, pod: str, **kwargs: Any) -> str:
    """What the pod's user reads: the runtime's error from our message on (the runtime
    puts its own words before it)."""
    with pytest.raises(cri.grpc.RpcError) as info:
        cri.create_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP, **kwargs)
    details = str(info.value.details())
    assert "nri-cdi: " in details, details
    return details[details.index("nri-cdi: "):]


def gpus(cri: CriClient, container: str) -> list[str]:
    spec = cri.runtime_spec(container)
    return sorted(d["path"] for d in spec["linux"].get("devices", [])
                  if d["path"].startswith("/dev/nvidia") and d["path"][11:].isdigit())


def test_by_default_no_namespace_asks_by_annotation(cri: CriClient, ctrd: Containerd,
                                                    node: Path) -> None:
    # The built-in policy, as a node gets it with no policy of its own.
    plugin = start_plugin(ctrd, node, "defaults", "--config", "/dev/null")
    try:
        for i, key in enumerate(("cdi.k8s.io/gpu", "nvidia.cdi.k8s.io/pod", "cdi.nri.io/pod")):
            pod = cri.run_pod(f"asker-{i}", namespace="team",
                              annotations={key: "nvidia.com/gpu=1"})
            message = create_fails(cri, pod)
            assert message.startswith("nri-cdi: request source "), message
            assert "is allowed in no namespace on this node" in message, message
            assert "the node's operator lists the namespaces that may ask this way" in message
        # What the kubelet sets from the device plugin's allocation is served.
        pod = cri.run_pod("dp", annotations={})
        ctr = cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP,
                                annotations={"cdi.k8s.io/dp": "nvidia.com/gpu=0"})
        assert gpus(cri, ctr) == ["/dev/nvidia0"]
    finally:
        plugin.kill()


@pytest.fixture(scope="module")
def listed(ctrd: Containerd, node: Path,
           kubelet: PodResourcesServer) -> Iterator[PluginProcess]:
    """The plugin with namespace ``team`` listed, asking the recorded kubelet."""
    policy = ("sources: {podAnnotations: {namespaces: [team]},"
              " nvidiaNriAnnotations: {namespaces: [team]}}\n")
    plugin = start_plugin(ctrd, node, "listed", "--pod-resources-socket", str(kubelet.path),
                          "--pod-resources-interval", "0.5", policy=policy)
    plugin.wait_for_log("pod-resources API answers")
    yield plugin
    plugin.kill()


@pytest.mark.parametrize(("key", "request_name"), [
    ("cdi.k8s.io/gpu", "nvidia.com/gpu=0"),
    ("cdi.k8s.io/gpu", f"nvidia.com/gpu={HELD_UUID}"),
    ("cdi.k8s.io/gpu", "nvidia.com/gpu=all"),
    ("nvidia.cdi.k8s.io/pod", "nvidia.com/gpu=0"),
])
def test_an_annotation_for_a_gpu_the_device_plugin_gave_another_pod_is_refused(
        cri: CriClient, listed: PluginProcess, key: str, request_name: str) -> None:
    pod = cri.run_pod("asker", namespace="team", annotations={key: request_name})
    message = create_fails(cri, pod)
    assert message == (
        f"nri-cdi: device {request_name} (pod annotation {key!r}) is allocated by the "
        f"kubelet to pod {HELD_BY} (resource nvidia.com/gpu); the scheduler does not "
        "count devices asked for by annotation or env: ask for it in the pod's resources "
        "or a resource claim")


def test_a_gpu_no_pod_holds_is_served_and_the_holder_gets_its_own(
        cri: CriClient, listed: PluginProcess) -> None:
    pod = cri.run_pod("free", namespace="team", annotations={"cdi.k8s.io/gpu":
                                                             "nvidia.com/gpu=1"})
    ctr = cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP)
    assert gpus(cri, ctr) == ["/dev/nvidia1"]
    # The device plugin's pod, its container as the real kubelet created it: served.
    request = json.loads((RECORDINGS / "dp-CreateContainer.json").read_text())["request"]
    namespace, name = HELD_BY.split("/")
    pod = cri.run_pod(name, namespace=namespace)
    annotations = {k: v for k, v in request["config"]["annotations"].items()
                   if k.startswith("cdi.k8s.io/")}
    assert list(annotations.values()) == [f"k8s.device-plugin.nvidia.com/gpu={HELD_UUID}"]
    ctr = cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP, annotations=annotations)
    assert gpus(cri, ctr) == ["/dev/nvidia0"]


def test_a_kubelet_that_stops_answering_refuses_what_it_cannot_check(
        cri: CriClient, ctrd: Containerd, node: Path) -> None:
    # A socket nobody answers on: the kubelet restarting.
    import socket

    (node / "dead.sock").unlink(missing_ok=True)  # the other containerd's run
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(node / "dead.sock"))
    plugin = start_plugin(ctrd, node, "dead", "--pod-resources-socket", str(node / "dead.sock"),
                          policy="sources: {podAnnotations: {namespaces: [team]}}\n")
    try:
        plugin.wait_for_log("pod-resources API")
        pod = cri.run_pod("unsure", namespace="team",
                          annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=1"})
        assert create_fails(cri, pod) == (
            "nri-cdi: cannot check that nvidia.com/gpu=1 (pod annotation 'cdi.k8s.io/gpu') "
            "is not allocated to another pod: the kubelet's device allocations are not "
            "known right now")
        assert f"pod-resources API ({node / 'dead.sock'}) failed: " in plugin.log()
    finally:
        plugin.kill()
        dead.close()
