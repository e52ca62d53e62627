"""A device asked for past the scheduler (a pod annotation, an env variable) that the kubelet
allocated to another pod is refused, naming that pod (plugins/cdi_injector/allocations.py,
vendors/nvidia/rules.py); the pod's own allocation, a device shared with it, and sources
the kubelet itself fills pass."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cdi.cache import SpecCache
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.dispatch import RpcError
from nri_plugin.plugins.cdi_injector.allocations import (
    DeviceHeld,
    Holding,
    KubeletAllocations,
    overlaps,
)
from nri_plugin.plugins.cdi_injector.injector import CdiInjector, Wiring
from nri_plugin.plugins.cdi_injector.vendor import Registry
from nri_plugin.vendors.nvidia.rules import NvidiaRules
from tests.helpers import annotations_policy, write_specs

GPU0, GPU1 = "GPU-0000aaaa", "GPU-1111bbbb"
MIG_A, MIG_B = "MIG-aaaa0000", "MIG-bbbb1111"
SPEC = """\
cdiVersion: 0.5.0
kind: nvidia.com/gpu
containerEdits:
  deviceNodes: [{path: /dev/nvidiactl, type: c, major: 195, minor: 255}]
devices:
- name: "0"
  containerEdits: {deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]}
- name: GPU-0000aaaa
  containerEdits: {deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]}
- name: "1"
  containerEdits: {deviceNodes: [{path: /dev/nvidia1, type: c, major: 195, minor: 1}]}
- name: "1:0"
  containerEdits:
    deviceNodes:
    - {path: /dev/nvidia1, type: c, major: 195, minor: 1}
    - {path: /dev/nvidia-caps/nvidia-cap21, type: c, major: 509, minor: 21}
    - {path: /dev/nvidia-caps/nvidia-cap22, type: c, major: 509, minor: 22}
- name: "1:1"
  containerEdits:
    deviceNodes:
    - {path: /dev/nvidia1, type: c, major: 195, minor: 1}
    - {path: /dev/nvidia-caps/nvidia-cap30, type: c, major: 509, minor: 30}
    - {path: /dev/nvidia-caps/nvidia-cap31, type: c, major: 509, minor: 31}
- name: all
  containerEdits:
    deviceNodes:
    - {path: /dev/nvidia0, type: c, major: 195, minor: 0}
    - {path: /dev/nvidia1, type: c, major: 195, minor: 1}
"""
# A DRA driver's claim spec: its own names, our GPUs' and MIG devices' nodes.
CLAIM_SPEC = """\
cdiVersion: 0.5.0
kind: k8s.gpu.example.com/claim
devices:
- name: uid1-gpu-0
  containerEdits: {deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]}
- name: uid2-mig
  containerEdits:
    deviceNodes:
    - {path: /dev/nvidia1, type: c, major: 195, minor: 1}
    - {path: /dev/nvidia-caps/nvidia-cap30, type: c, major: 509, minor: 30}
    - {path: /dev/nvidia-caps/nvidia-cap31, type: c, major: 509, minor: 31}
- name: plain
  containerEdits: {env: [A=1]}
"""


def _sidecar(spec: bytes) -> dict[str, object]:
    gpu = {"type": "gpu", "busId": ""}
    return {
        "spec": {"sha256": hashlib.sha256(spec).hexdigest()},
        "driver": {"version": "550.54.15", "cudaVersion": "12.4"},
        "capabilities": {},
        "devices": {
            "0": {**gpu, "gpuIndex": 0, "gpuUuid": GPU0, "minor": 0},
            GPU0: {**gpu, "gpuIndex": 0, "gpuUuid": GPU0, "minor": 0},
            "1": {**gpu, "gpuIndex": 1, "gpuUuid": GPU1, "minor": 1},
            "1:0": {"type": "mig", "gpuIndex": 1, "migIndex": 0, "gpuUuid": GPU1,
                    "migUuid": MIG_A, "busId": "", "minor": 1},
            "1:1": {"type": "mig", "gpuIndex": 1, "migIndex": 1, "gpuUuid": GPU1,
                    "migUuid": MIG_B, "busId": "", "minor": 1}},
    }


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    folder = write_specs(tmp_path / "cdi", {"nvidia.yaml": SPEC, "claim.yaml": CLAIM_SPEC})
    spec = folder / "nvidia.yaml"
    (folder / "nvidia.yaml.meta").write_text(json.dumps(_sidecar(spec.read_bytes())))
    return Registry.load(SpecCache([str(folder)]).refresh(), [NvidiaRules()])


DP = Holding(pod="default/dp", container="app", resource="nvidia.com/gpu",
             device_ids=(GPU0,))
MIG_DP = Holding(pod="default/mig", container="app", resource="nvidia.com/mig-1g.10gb",
                 device_ids=(MIG_A,))
CLAIM = Holding(pod="team/dra", container="ctr", claim="team/gpu-claim",
                cdi_devices=("k8s.gpu.example.com/claim=uid2-mig",))


def decide(registry: Registry, allocations: KubeletAllocations | None, request: str, *,
           namespace: str = "ml", name: str = "asker",
           container_annotations: dict[str, str] | None = None) -> None:
    plugin = CdiInjector(lambda: registry, vendors=[NvidiaRules()],
                         policy=annotations_policy(),
                         wiring=Wiring(allocations=lambda: allocations))
    plugin.configure("", "containerd", "1.7.24")
    pod = nri_pb2.PodSandbox(id="p1", name=name, namespace=namespace,
                             annotations={"cdi.k8s.io/gpu": request} if request else {})
    ctr = nri_pb2.Container(id="c1", pod_sandbox_id="p1", name="app",
                            annotations=container_annotations or {})
    plugin.create_container(pod, ctr)


@pytest.mark.parametrize(("request_name", "holding"), [
    ("nvidia.com/gpu=0", DP),  # by index, held by its uuid
    (f"nvidia.com/gpu={GPU0}", DP),  # by uuid
    ("nvidia.com/gpu=all", DP),  # every GPU
    ("nvidia.com/gpu=1", MIG_DP),  # a whole GPU, a MIG device on it held
    ("nvidia.com/gpu=1:0", MIG_DP),  # the MIG device itself
    ("nvidia.com/gpu=1:1", CLAIM),  # a claim's device, known by its capability nodes
    ("nvidia.com/gpu=0", Holding(pod="default/shared", container="a",
                                 resource="nvidia.com/gpu", device_ids=(f"{GPU0}::3",))),
    ("nvidia.com/gpu=0", Holding(pod="default/index", container="a",
                                 resource="nvidia.com/gpu", device_ids=("0",))),
])
def test_an_annotation_asking_for_another_pods_device_is_refused_naming_it(
        registry: Registry, request_name: str, holding: Holding) -> None:
    with pytest.raises(RpcError) as info:
        decide(registry, KubeletAllocations(holdings=(holding,)), request_name)
    message = str(info.value)
    assert message.startswith(f"nri-cdi: device {request_name} (pod annotation "
                              "'cdi.k8s.io/gpu') is allocated by the kubelet to "
                              f"{holding.describe()}")
    assert "the scheduler does not count devices asked for by annotation" in message
    assert isinstance(info.value.__cause__, DeviceHeld)
    assert info.value.__cause__.reason.rule == "allocations"


@pytest.mark.parametrize(("request_name", "holdings"), [
    ("nvidia.com/gpu=1", (DP,)),  # another GPU
    ("nvidia.com/gpu=1:1", (MIG_DP,)),  # another MIG device of the same GPU
    ("nvidia.com/gpu=0", (CLAIM,)),  # the claim holds a MIG device of GPU 1
    ("nvidia.com/gpu=1", (Holding(pod="team/dra", container="c", claim="team/x",
                                  cdi_devices=("k8s.gpu.example.com/claim=plain",)),)),
    ("nvidia.com/gpu=0", (Holding(pod="default/other", container="c",
                                  resource="example.com/nic", device_ids=("0",)),)),
    ("nvidia.com/gpu=0", ()),
])
def test_a_device_no_other_pod_holds_passes(registry: Registry, request_name: str,
                                            holdings: tuple[Holding, ...]) -> None:
    decide(registry, KubeletAllocations(holdings=holdings), request_name)


def test_the_pods_own_allocation_and_a_device_shared_with_it_pass(registry: Registry) -> None:
    own = Holding(pod="ml/asker", container="app", resource="nvidia.com/gpu",
                  device_ids=(f"{GPU0}::1",))
    other = Holding(pod="default/dp", container="app", resource="nvidia.com/gpu",
                    device_ids=(f"{GPU0}::2",))
    decide(registry, KubeletAllocations(holdings=(own, other)), "nvidia.com/gpu=0")
    # Covered only in part: GPU 1 is not the pod's.
    with pytest.raises(RpcError, match="allocated by the kubelet to pod default/mig"):
        decide(registry, KubeletAllocations(holdings=(own, MIG_DP)), "nvidia.com/gpu=all")


def test_what_the_kubelet_allocated_itself_is_not_checked_against_others(
        registry: Registry) -> None:
    # A device plugin's container annotation: the kubelet's own allocation, shared or not.
    decide(registry, KubeletAllocations(holdings=(DP,)), "",
           container_annotations={"cdi.k8s.io/dp": "nvidia.com/gpu=0"})


def test_no_kubelet_checks_nothing_and_unknown_allocations_refuse(registry: Registry) -> None:
    decide(registry, None, "nvidia.com/gpu=0")
    unknown = KubeletAllocations(unknown="/x/kubelet.sock: UNAVAILABLE: connection refused")
    with pytest.raises(RpcError) as info:
        decide(registry, unknown, "nvidia.com/gpu=0")
    assert str(info.value) == (
        "nri-cdi: cannot check that nvidia.com/gpu=0 (pod annotation 'cdi.k8s.io/gpu') is "
        "not allocated to another pod: the kubelet's device allocations are not known "
        "right now")  # the socket and the error are the node's: its log, not the pod's
    assert isinstance(info.value.__cause__, DeviceHeld)
    assert "connection refused" in info.value.__cause__.log_message()
    decide(registry, unknown, "")  # asking for nothing asks the kubelet nothing


def test_units_overlap_when_one_is_under_the_other() -> None:
    assert overlaps("GPU-1", "GPU-1") and overlaps("GPU-1", "GPU-1/MIG-2")
    assert overlaps("GPU-1/MIG-2", "GPU-1")
    assert not overlaps("GPU-1/MIG-2", "GPU-1/MIG-3")
    assert not overlaps("GPU-1", "GPU-10")  # a prefix of the text is not a unit under it
