"""The recordings of a real kubelet (tests/data/kubelet-1.35.6) against the e2e tests' own
emulation of it (tests/e2e/kubelet_requests.py): where they differ, the recording wins, so
a kubelet that changes what it sends fails here first. Plain JSON, no containerd."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import kubelet_requests

DATA = Path(__file__).parent / "data" / "kubelet-1.35.6"
RECORDINGS = sorted(DATA.glob("*.jsonl"))
SCENARIOS = {"annotations", "annotations-standalone", "device-plugin-volume-mounts",
             "device-plugin-cdi-annotations", "device-plugin-cdi-cri",
             "device-plugin-cdi-cri-cdi-on", "dra-cdi-off", "dra-cdi-on", "churn",
             "capabilities-hooks", "capabilities-mounts", "capabilities-mounts-cdi-on",
             "refusal"}


def calls(path: Path, method: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [c for c in sorted(lines, key=lambda c: c["seq"])
            if c["method"] == f"RuntimeService/{method}"]


def scenario(path: Path) -> str:
    return path.stem.rpartition("-containerd-")[0]


def test_every_scenario_is_recorded_on_both_containerds() -> None:
    recorded = {(scenario(p), p.stem.rpartition("-containerd-")[2]) for p in RECORDINGS}
    for name in SCENARIOS - {"capabilities-mounts-cdi-on"}:  # containerd 2.x only
        assert {(name, "1.7"), (name, "2.1")} <= recorded, name
    assert ("capabilities-mounts-cdi-on", "2.1") in recorded
    assert {scenario(p) for p in RECORDINGS} <= SCENARIOS


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.stem for p in RECORDINGS])
def test_every_container_gets_the_kubelets_annotations_and_files(path: Path) -> None:
    creates = calls(path, "CreateContainer")
    assert creates
    for create in creates:
        config = create["request"]["config"]
        name = config["metadata"]["name"]
        emulated = kubelet_requests.container_annotations(name)
        kubelet_keys = {k for k in config.get("annotations", {})
                        if k.startswith("io.kubernetes.")}
        assert kubelet_keys == set(emulated), kubelet_keys
        restarts = config["annotations"]["io.kubernetes.container.restartCount"]
        assert int(restarts) == config["metadata"].get("attempt", 0)
        mounts = {m["container_path"]: m for m in config.get("mounts", [])}
        assert {"/etc/hosts", kubelet_requests.TERMINATION_LOG} <= set(mounts)
        log = mounts[kubelet_requests.TERMINATION_LOG]["host_path"]
        # pods/<uid>: a UUID, or for a static pod its manifest's hash
        assert re.fullmatch(r"\{node\}/kubelet/pods/[0-9a-f-]{32,36}/containers/"
                            + re.escape(name) + r"/[0-9a-f]{8}", log), log
        sandbox = create["request"]["sandbox_config"]
        meta = sandbox["metadata"]
        pod = kubelet_requests.pod_labels(meta["name"], meta["namespace"], meta["uid"])
        assert pod.items() <= config["labels"].items()
        assert pod.items() <= sandbox["labels"].items()
        assert {"kubernetes.io/config.source", "kubernetes.io/config.seen"} \
            <= set(sandbox["annotations"])
        assert sandbox["log_directory"].endswith(
            f"/{meta['namespace']}_{meta['name']}_{meta['uid']}")


@pytest.mark.parametrize("path", [p for p in RECORDINGS if scenario(p).startswith(
    "device-plugin-")], ids=lambda p: p.stem)
def test_device_plugin_requests_are_emulated_as_recorded(path: Path) -> None:
    strategy = scenario(path).removeprefix("device-plugin-").removesuffix("-cdi-on")
    (first, *_) = [c for c in calls(path, "CreateContainer")
                   if c["request"]["sandbox_config"]["metadata"]["name"] == "dp"]
    config = first["request"]["config"]
    device_paths = [m for m in config.get("mounts", [])
                    if m["container_path"].startswith(kubelet_requests.DEVICE_PLUGIN_MOUNTS)]
    gpu = (device_paths[0]["container_path"].rpartition("/")[2] if device_paths else
           next(iter([d["name"] for d in config.get("CDI_devices", [])] + [
               v for k, v in config["annotations"].items()
               if k.startswith(kubelet_requests.DEVICE_PLUGIN_ANNOTATION)])).partition("=")[2])
    emulated = kubelet_requests.device_plugin_request(strategy, gpu)
    recorded_annotations = {k: v for k, v in config["annotations"].items()
                            if k.startswith("cdi.k8s.io/")}
    assert [re.sub(r"[0-9a-f-]{36}$", "ID", k) for k in recorded_annotations] == \
        [re.sub(r"[0-9a-f-]{36}$", "ID", k) for k in emulated.get("annotations", {})]
    assert list(recorded_annotations.values()) == list(emulated.get("annotations", {}).values())
    assert [d["name"] for d in config.get("CDI_devices", [])] == emulated.get("cdi_devices", [])
    assert {m["container_path"]: m["host_path"] for m in device_paths} == \
        emulated.get("mounts", {})
    assert not any(m.get("readonly") for m in device_paths)
    envs = {e["key"]: e["value"] for e in config.get("envs", []) if e["key"].startswith("NVIDIA")}
    assert envs == emulated.get("env", {})


@pytest.mark.parametrize("path", [p for p in RECORDINGS if scenario(p).startswith("dra-")],
                         ids=lambda p: p.stem)
def test_a_dra_claim_comes_in_cdi_devices_only(path: Path) -> None:
    """A kubelet 1.35 names a claim's device in CRI CDIDevices and nowhere else: no
    cdi.k8s.io annotation (what the e2e DRA cases call the 'runtime' set-up)."""
    claimed = [c for c in calls(path, "CreateContainer")
               if c["request"]["config"].get("CDI_devices")]
    assert claimed
    for create in claimed:
        config = create["request"]["config"]
        (device,) = config["CDI_devices"]
        assert device["name"].startswith("test-driver.cdi.k8s.io/test=claim-")
        assert not [k for k in config["annotations"] if k.startswith("cdi.k8s.io/")]
