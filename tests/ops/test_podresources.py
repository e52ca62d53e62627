"""The daemon's reader of the kubelet's pod-resources API (nri_plugin/ops/podresources.py),
against a real gRPC server on a Unix socket answering ``List`` as the kubelet does: what
each container holds; no socket, no check; a kubelet that stops answering makes the
allocations unknown once its last answer is stale, and known again when it answers."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_plugin.ops.kubelet_api import podresources_pb2 as pb
from nri_plugin.ops.podresources import LIST_METHOD, PodResourcesWatch, holdings
from nri_plugin.plugins.cdi_injector.allocations import Holding, KubeletAllocations
from tests.kubelet_peer import PodResourcesServer, recorded

grpc = pytest.importorskip("grpc")


def kubelet_answer() -> bytes:
    """A List answer with a device plugin's GPU, a DRA claim and a pod holding nothing."""
    response = pb.ListPodResourcesResponse()
    dp = response.pod_resources.add(name="dp", namespace="default")
    app = dp.containers.add(name="app")
    app.devices.add(resource_name="nvidia.com/gpu", device_ids=["GPU-aaa"])
    app.devices.add(resource_name="example.com/none")  # no ids: nothing held
    dra = response.pod_resources.add(name="dra", namespace="team")
    ctr = dra.containers.add(name="ctr")
    claim = ctr.dynamic_resources.add(claim_name="gpu", claim_namespace="team")
    claim.claim_resources.add(driver_name="gpu.example.com", pool_name="node",
                              device_name="gpu-0").cdi_devices.add(name="k8s.x/claim=u-0")
    response.pod_resources.add(name="plain", namespace="default").containers.add(name="c")
    return response.SerializeToString()


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[PodResourcesServer]:
    server = PodResourcesServer(tmp_path / "kubelet.sock", kubelet_answer).start()
    yield server
    server.stop()


EXPECTED = (
    Holding(pod="default/dp", container="app", resource="nvidia.com/gpu",
            device_ids=("GPU-aaa",)),
    Holding(pod="team/dra", container="ctr", claim="team/gpu",
            cdi_devices=("k8s.x/claim=u-0",)))


def test_the_method_is_the_kubelets() -> None:
    assert LIST_METHOD == "/v1.PodResourcesLister/List"


def test_what_the_kubelet_lists_is_what_the_injector_gets(kubelet: PodResourcesServer) -> None:
    watch = PodResourcesWatch(str(kubelet.path), interval=1.0)
    try:
        assert watch.current() == KubeletAllocations(unknown=f"{kubelet.path}: no answer "
                                                             "from the kubelet yet")
        watch.read_once()
        assert watch.current() == KubeletAllocations(holdings=EXPECTED)
    finally:
        watch.stop()


def test_holdings_skip_containers_that_hold_nothing() -> None:
    response = pb.ListPodResourcesResponse.FromString(kubelet_answer())
    assert holdings(response) == EXPECTED


def test_no_socket_is_no_kubelet(tmp_path: Path) -> None:
    watch = PodResourcesWatch(str(tmp_path / "kubelet.sock"), interval=1.0)
    watch.read_once()
    assert watch.current() is None


def test_a_kubelet_that_stops_answering_makes_the_allocations_unknown_once_stale(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "nri_cdi.podresources")
    now = [100.0]
    kubelet = PodResourcesServer(tmp_path / "kubelet.sock", kubelet_answer).start()
    watch = PodResourcesWatch(str(kubelet.path), interval=1.0, timeout=0.5,
                              clock=lambda: now[0])
    try:
        watch.read_once()
        kubelet.stop()
        # The socket is there (the kubelet is restarting), nobody answers.
        dead = socket.socket(socket.AF_UNIX)
        dead.bind(str(kubelet.path))
        watch.read_once()
        # Within a few intervals the last answer still holds...
        now[0] += watch.stale_after
        assert watch.current() == KubeletAllocations(holdings=EXPECTED)
        # ...past them, nothing is known and the injector refuses what it cannot check.
        now[0] += 0.1
        unknown = watch.current()
        assert unknown is not None and unknown.holdings == ()
        assert unknown.unknown.startswith(f"{kubelet.path}: UNAVAILABLE")
        assert "failed: UNAVAILABLE" in caplog.text
        watch.read_once()  # the same error again is not logged again
        assert caplog.text.count("pod-resources API (") == 1
        dead.close()
        kubelet.path.unlink()
        kubelet = PodResourcesServer(tmp_path / "kubelet.sock", kubelet_answer).start()
        watch.read_once()
        assert watch.current() == KubeletAllocations(holdings=EXPECTED)
        assert "pod-resources API answers" in caplog.text
    finally:
        watch.stop()
        kubelet.stop()
        dead.close()


def test_the_socket_going_away_turns_the_check_off(kubelet: PodResourcesServer) -> None:
    watch = PodResourcesWatch(str(kubelet.path), interval=1.0)
    try:
        watch.read_once()
        assert watch.current() == KubeletAllocations(holdings=EXPECTED)
        kubelet.stop()
        kubelet.path.unlink(missing_ok=True)
        watch.read_once()
        assert watch.current() is None
    finally:
        watch.stop()


def test_a_real_kubelets_answer_is_read() -> None:
    # What kubelet 1.35.6 answered with NVIDIA's device plugin and Kubernetes' DRA test
    # driver each holding a device for a pod.
    answer = pb.ListPodResourcesResponse.FromString(recorded("dra-List"))
    assert holdings(answer) == (
        Holding(pod="default/dp", container="app", resource="nvidia.com/gpu",
                device_ids=("GPU-970392d6-a829-4d12-b74d-94ad7449a639",)),
        Holding(pod="default/dra", container="app", claim="default/dra-gpu-bjhbw",
                cdi_devices=("test-driver.cdi.k8s.io/test=claim-da7edfb6-5a6b-4f63-b9a8-"
                             "8cb82108d997-my-device",)))
