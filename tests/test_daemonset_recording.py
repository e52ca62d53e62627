"""The DaemonSet's pod as a real kubelet was asked to run it (tests/data/kubelet-1.35.6/
daemonset, recorded on a control plane from the chart) against the chart as it renders now
with the same values: tests/e2e/test_daemonset_e2e.py replays that recording, so it must
still be the chart's pod. A change of the pod's spec, its configuration or a new field
fails here until the recording is made again. Needs Helm (tests/helm.py), no containerd."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests import helm
from tests.e2e import daemonset

RECORDINGS = sorted(daemonset.RECORDED.glob("install-containerd-*.jsonl"))
REFRESH = ("the chart's pod is no longer the one recorded in tests/data/kubelet-1.35.6/"
           "daemonset: record it again on a control plane, as its README.md says "
           "(helm install with its values.yaml, the CRI recorder between each kubelet and "
           "its containerd, then python -m tests.e2e.cri_recorder to trim it)")


def _rendered() -> dict[str, dict[str, Any]]:
    helm.require()
    return {d["kind"]: d for d in helm.documents(daemonset.recorded_values())}


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, Any]]:
    return _rendered()


def test_a_recording_per_containerd_the_replay_runs_on() -> None:
    assert [p.name for p in RECORDINGS] == [
        f"install-containerd-{v}.jsonl" for v in sorted(daemonset.RECORDED_VERSIONS)]


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
def test_the_recorded_pod_is_the_charts_pod(path: Path,
                                            rendered: dict[str, dict[str, Any]]) -> None:
    calls = daemonset.recorded_requests(path)
    template = rendered["DaemonSet"]["spec"]["template"]
    differences = daemonset.recording_differences(template, calls)
    assert differences == [], f"{REFRESH}:\n" + "\n".join(differences)
    assert daemonset.recorded_image(calls) == template["spec"]["containers"][0]["image"]


def test_the_recorded_config_map_is_the_charts(rendered: dict[str, dict[str, Any]]) -> None:
    name, data = daemonset.recorded_config_map()
    config_map = rendered["ConfigMap"]
    assert (name, data) == (config_map["metadata"]["name"], config_map["data"]), REFRESH


CHANGES = {
    "an environment variable": lambda c: c.setdefault("env", []).append(
        {"name": "X", "value": "1"}),
    "a mount made writable": lambda c: c["volumeMounts"][0].update(readOnly=False),
    "a mount's propagation": lambda c: c["volumeMounts"][0].update(
        mountPropagation="HostToContainer"),
    "the command": lambda c: c["command"].append("--verbose"),
    "a capability": lambda c: c["securityContext"]["capabilities"]["add"].append("SYS_ADMIN"),
    "a memory limit": lambda c: c["resources"]["limits"].update(memory="1Gi"),
    "a field the comparison does not know": lambda c: c.update(stdin=True),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_of_the_plugins_container_is_a_difference(
        change: str, rendered: dict[str, dict[str, Any]]) -> None:
    template = copy.deepcopy(rendered["DaemonSet"]["spec"]["template"])
    plugin = next(c for c in template["spec"]["containers"] if c["name"] == "plugin")
    CHANGES[change](plugin)
    calls = daemonset.recorded_requests(RECORDINGS[0])
    differences = daemonset.recording_differences(template, calls)
    assert differences and all(d.startswith("plugin") for d in differences), differences


def test_a_change_of_the_pod_is_a_difference(rendered: dict[str, dict[str, Any]]) -> None:
    template = copy.deepcopy(rendered["DaemonSet"]["spec"]["template"])
    template["metadata"]["annotations"]["checksum/config"] = "0" * 64
    template["spec"]["hostPID"] = False
    differences = daemonset.recording_differences(template,
                                                  daemonset.recorded_requests(RECORDINGS[0]))
    assert [d.partition(":")[0] for d in differences] == ["pod annotations", "spec.hostPID"]


def test_a_new_chart_version_alone_needs_no_new_recording(
        rendered: dict[str, dict[str, Any]]) -> None:
    template = copy.deepcopy(rendered["DaemonSet"]["spec"]["template"])
    template["metadata"]["labels"].update({"helm.sh/chart": "nri-cdi-9.9.9",
                                           "app.kubernetes.io/version": "9.9.9"})
    assert daemonset.recording_differences(
        template, daemonset.recorded_requests(RECORDINGS[0])) == []
