"""What CRI-O's NRI shows of a container, made uniform (nri_plugin/nri/crio.py), as seen in
the CRI-O 1.35.6 wire recording (tests/data/nri-wire/cri-o-1.35.6.jsonl): a container its
CRI client did not label has no name, and each container carries the pod's annotations,
its own kept as JSON in io.kubernetes.cri-o.Annotations."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from cdi.cache import SpecCache
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.crio import fill_name, own_annotations
from nri_plugin.nri.dispatch import Dispatcher, RpcError
from nri_plugin.nri.plugin import Plugin
from nri_plugin.plugins.cdi_injector.injector import CdiInjector
from nri_plugin.plugins.cdi_injector.vendor import Registry
from nri_plugin.vendors.nvidia.rules import NvidiaRules
from tests.helpers import annotations_policy, write_specs
from tests.nri_plugin.test_policy_injector import SPEC, _sidecar

CDI_KEY = "cdi.k8s.io/dev"


def crio_container(own: str = "null", name: str = "") -> nri_pb2.Container:
    """A container as CRI-O 1.35.6 sent it (the recording's annotations, shortened)."""
    return nri_pb2.Container(id="c1", name=name, annotations={
        "io.kubernetes.cri-o.Metadata": '{"name":"app"}',
        "io.kubernetes.cri-o.Annotations": own,
        CDI_KEY: "vendor.example/dev=pod-asked",  # the pod's, copied in by CRI-O
    })


def test_a_container_crio_sent_without_a_name_gets_its_cri_name() -> None:
    container = crio_container()
    fill_name(container)
    assert container.name == "app"


def test_a_name_crio_sent_is_kept() -> None:
    container = crio_container(name="from-label")
    fill_name(container)
    assert container.name == "from-label"


def test_a_container_of_another_runtime_without_a_name_stays_so() -> None:
    container = nri_pb2.Container(id="c1", annotations={"io.kubernetes.cri-o.Metadata": "{"})
    fill_name(container)
    assert container.name == ""


def test_crio_own_annotations_leave_the_pods_copies_out() -> None:
    assert own_annotations(crio_container()) == {}
    own = own_annotations(crio_container(own='{"cdi.k8s.io/dev": "vendor.example/dev=x"}'))
    assert own == {CDI_KEY: "vendor.example/dev=x"}


def test_other_runtimes_own_annotations_are_all_nri_shows() -> None:
    container = nri_pb2.Container(annotations={CDI_KEY: "vendor.example/dev=x"})
    assert own_annotations(container) == {CDI_KEY: "vendor.example/dev=x"}


class Names(Plugin):
    def __init__(self) -> None:
        self.names: list[str] = []

    def create_container(self, pod: Any, container: Any) -> None:
        self.names.append(container.name)

    def synchronize(self, pods: Any, containers: Any) -> None:
        self.names += [c.name for c in containers]


def test_the_plugin_sees_the_cri_name_in_every_request() -> None:
    plugin = Names()
    dispatcher = Dispatcher(plugin)
    dispatcher.dispatch("Synchronize", nri_pb2.SynchronizeRequest(
        containers=[crio_container()]).SerializeToString())
    dispatcher.dispatch("CreateContainer", nri_pb2.CreateContainerRequest(
        container=crio_container()).SerializeToString())
    assert plugin.names == ["app", "app"]


def test_a_pods_annotation_crio_copied_is_judged_as_the_pods(tmp_path: Path) -> None:
    """Where pod annotations are not allowed, a pod's cdi.k8s.io annotation that CRI-O
    copied into the container's is still refused by the pod-annotation rule (the container
    annotation rule, which allows it everywhere by default, does not let it through)."""
    folder = write_specs(tmp_path / "cdi", {"nvidia.yaml": SPEC})
    (folder / "nvidia.yaml.meta").write_text(
        json.dumps(_sidecar((folder / "nvidia.yaml").read_bytes())))
    registry = Registry.load(SpecCache([str(folder)]).refresh(), [NvidiaRules()])
    plugin = CdiInjector(lambda: registry, vendors=[NvidiaRules()], policy=annotations_policy(
        {"sources": {"podAnnotations": {"namespaces": ["ml"]}}}))
    plugin.configure("", "cri-o", "1.35.6")
    asked = {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}
    pod = nri_pb2.PodSandbox(id="p1", name="pod", namespace="web", annotations=asked)
    copied = nri_pb2.Container(id="c1", pod_sandbox_id="p1", name="app", annotations={
        **asked, "io.kubernetes.cri-o.Annotations": "null"})
    with pytest.raises(RpcError, match=re.escape("sources.podAnnotations.namespaces")):
        plugin.create_container(pod, copied)
