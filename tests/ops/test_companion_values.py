"""The companion installs as the docs give them (issue 52, item 6): NVIDIA's device plugin
and DRA driver pinned to a release, scheduled on the nodes nri-cdi's DaemonSet selects
(their charts' default node affinity needs node-feature-discovery's or GPU Feature
Discovery's labels), each followed by a check that it serves.

The charts are not in this repository, so their rendering is not run here; the value keys
are the ones their released charts read (k8s-device-plugin v0.20.0: ``affinity`` on the
device plugin's DaemonSet; dra-driver-nvidia-gpu 0.4.1: ``kubeletPlugin.affinity``,
``gpuResourcesEnabledOverride``, which its validation requires with GPU allocation on).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
DEVICE_PLUGIN_VERSION = "0.20.0"
DRA_DRIVER_VERSION = "0.4.1"
DRA_CHART = "oci://registry.k8s.io/dra-driver-nvidia/charts/dra-driver-nvidia-gpu"


def _nri_cdi_node_terms() -> list[dict[str, Any]]:
    """nri-cdi's default nodeSelector as one nodeSelectorTerm's matchExpressions."""
    values = yaml.safe_load((REPO / "deploy" / "helm" / "nri-cdi" / "values.yaml").read_text())
    selector = values["nodeSelector"]
    assert selector == {"nri-cdi/gpu": "true"}  # the label the docs teach
    return [{"matchExpressions": [{"key": k, "operator": "In", "values": [v]}
                                  for k, v in selector.items()]}]


def _required_terms(affinity: dict[str, Any]) -> Any:
    return affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]


def _commands(text: str) -> str:
    """Shell text with continuations joined and comment marks dropped."""
    return re.sub(r"\\\n[#\s]*", "", text)


def test_the_device_plugin_runs_where_nri_cdi_runs() -> None:
    values = yaml.safe_load((DEPLOY / "device-plugin-values.yaml").read_text())
    assert values["deviceListStrategy"] == "volume-mounts"
    # the only term is nri-cdi's label: none of NFD's or GFD's is required
    assert _required_terms(values["affinity"]) == _nri_cdi_node_terms()
    assert "nodeSelector" not in values  # the chart's default {} adds nothing


def test_the_dra_drivers_kubelet_plugin_runs_where_nri_cdi_runs() -> None:
    values = yaml.safe_load((DEPLOY / "dra-driver-values.yaml").read_text())
    assert _required_terms(values["kubeletPlugin"]["affinity"]) == _nri_cdi_node_terms()
    assert values["resources"]["gpus"]["enabled"] is True
    assert values["gpuResourcesEnabledOverride"] is True


def test_the_installs_are_pinned_and_checked() -> None:
    kubernetes = _commands((REPO / "docs" / "install" / "kubernetes.md").read_text())
    dra = _commands((REPO / "docs" / "install" / "dra.md").read_text())
    device_plugin_values = _commands((DEPLOY / "device-plugin-values.yaml").read_text())
    dra_values = _commands((DEPLOY / "dra-driver-values.yaml").read_text())
    install = f"nvdp/nvidia-device-plugin --version {DEVICE_PLUGIN_VERSION}"
    assert install in kubernetes and install in device_plugin_values
    install = f"{DRA_CHART} --version {DRA_DRIVER_VERSION}"
    assert install in dra and install in dra_values
    assert "<chart>" not in dra
    # each followed by a check that it serves
    allocatable = "kubectl get node NODE -o jsonpath='{.status.allocatable.nvidia\\.com/gpu}'"
    assert allocatable in kubernetes and allocatable in device_plugin_values
    for check in ("kubectl get resourceslices", "kubectl get deviceclasses"):
        assert check in dra and check in dra_values
