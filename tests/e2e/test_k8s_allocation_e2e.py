"""Kubernetes allocation as the kubelet does it now, through CRI, on a simulated 2-GPU node.

DRA (NVIDIA's DRA driver, facts in docs/developer/kubernetes-allocation.md): one transient spec per
claim in the run-time folder, kind ``k8s.gpu.nvidia.com/claim``, device ``<uid>-gpu-0``
(the spec's own edits: the driver's; the device's: its GPU's nodes; a MIG claim adds
``nvidia-cap`` nodes), written just before CreateContainer and deleted at unprepare. The
device plugin's strategies: ``cdi-annotations`` (container annotation), ``cdi-cri`` (CRI
CDIDevices) and ``volume-mounts`` (a mount under /var/run/nvidia-container-devices).

Each case runs on both containerds in two set-ups: ``plugin`` (containerd's CDI off: the
plugin injects; the kubelet is one before 1.31, which sets the claim's annotation too) and
``runtime`` (containerd's CDI on and reading the same folders: it injects; the kubelet is
1.31+, CRI CDIDevices only; the plugin checks what containerd injected).

containerd's own CDI (1.7 to 2.3) rereads its folders only from an inotify watcher that
runs apart from CreateContainer, every spec file at each event: a claim renamed into place
moments before can be unknown to it, and a deleted one still served, for a while that grows
with the files present. So in ``runtime`` a claim's creation is retried (as the kubelet
does) and a deleted claim's refusal awaited, bounded; in ``plugin`` both must hold at once.
Each test deletes the claims it wrote, as the driver does at unprepare.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e import kubelet_requests
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient
from tests.e2e.images import BUSYBOX_IMAGE
from tests.e2e.parity import runtime_of
from tests.e2e.plugin import REPO, PluginProcess

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None,
                                reason="gcc is needed to build the simulated node")
KIND = "k8s.gpu.nvidia.com/claim"
DEVICE_PLUGIN_SPEC = REPO / "tests" / "data" / "kubelet-1.35.6" / "device-plugin-spec.json"
SLEEP = ["sleep", "600"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, e2e_ready: None) -> dict[str, Any]:
    from nri_cdi_testbed.simnode import BuiltNode, NodeLayout, build_node

    root = tmp_path_factory.mktemp("k8s")
    built = build_node(root / "node", NodeLayout.uniform(2))
    (root / "etc-cdi").mkdir()
    (root / "run-cdi").mkdir()
    subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--mode", "procfs",
                    "--driver-root", str(built.driver_root), "--link-mode", "mounts",
                    "--output", str(root / "etc-cdi" / "nvidia.yaml")],
                   check=True, cwd=REPO, capture_output=True)
    spec = yaml.safe_load((root / "etc-cdi" / "nvidia.yaml").read_text())
    # The device plugin's own spec, as the real one wrote it on this node (its hooks
    # left out: they would run NVIDIA's nvidia-cdi-hook, which CI does not have).
    dp_spec = json.loads(DEVICE_PLUGIN_SPEC.read_text().replace("{simnode}", str(built.root)))
    dp_spec["containerEdits"].pop("hooks", None)
    (root / "run-cdi" / "k8s.device-plugin.nvidia.com-gpu.json").write_text(json.dumps(dp_spec))
    manifest = BuiltNode.load(built.root).manifest
    caps = built.dev_root / "dev" / "nvidia-caps"
    return {"root": root, "spec": spec, "gpus": manifest["gpus"], "caps": caps,
            "libcuda": f"/usr/lib/x86_64-linux-gnu/libcuda.so.{manifest['driver_version']}",
            "etc": root / "etc-cdi", "run": root / "run-cdi"}


@pytest.fixture(scope="module", params=["plugin", "runtime"])
def setup(request: pytest.FixtureRequest, containerd: ContainerdFactory,
          node: dict[str, Any]) -> Iterator[tuple[str, Containerd]]:
    """(who injects, a containerd with our plugin connected)."""
    mode = str(request.param)
    folders = [node["etc"], node["run"]]
    ctrd = containerd(enable_cdi=mode == "runtime",
                      cdi_spec_dirs=folders if mode == "runtime" else ())
    policy = node["root"] / "policy.yaml"  # the device plugin's volume mounts allowed
    policy.write_text("sources: {volumeMounts: {enabled: true}}\n")
    plugin = PluginProcess(ctrd.nri_socket, folders,
                           node["root"] / f"plugin-{ctrd.version}-{mode}.log",
                           ["--policy", str(policy)]).start()
    yield mode, ctrd
    plugin.kill()


# containerd 2.3 fails a creation with CRI CDIDevices while its CDI is off (commit
# ec8933999), before NRI: there the pre-1.31 kubelet's claims cannot be the plugin's.
REFUSED_WITH_CDI_OFF = "CDI support is explicitly disabled"


def refuses_cdi_devices_with_cdi_off(cri: CriClient) -> bool:
    version = runtime_of(cri).version
    return version is not None and version >= (2, 3, 0)


@pytest.fixture
def cri(request: pytest.FixtureRequest,
        setup: tuple[str, Containerd]) -> Iterator[CriClient]:
    with setup[1].cri() as client, client.cleanup():
        if (setup[0] == "plugin" and refuses_cdi_devices_with_cdi_off(client)
                and "strategy" not in request.fixturenames):
            pytest.skip("containerd >= 2.3 refuses CRI CDIDevices with its CDI off "
                        "(test_device_plugin_strategy[cdi-cri] asserts it): claims are "
                        "served in the 'runtime' set-up there")
        yield client


def _device_edits(node: dict[str, Any], gpu: int) -> dict[str, Any]:
    for device in node["spec"]["devices"]:
        if device["name"] == str(gpu):
            return dict(device["containerEdits"])
    raise KeyError(gpu)


@pytest.fixture(autouse=True)
def unprepare(node: dict[str, Any]) -> Iterator[None]:
    """Deletes, after each test, the claim specs it left (the driver's unprepare): left,
    they would slow every later refresh of containerd's own CDI."""
    yield
    for path in node["run"].glob("k8s.gpu.nvidia.com-claim_*"):
        path.unlink()


def write_claim(node: dict[str, Any], gpu: int, *, mig: bool = False) -> tuple[str, Path]:
    """A claim spec as NVIDIA's DRA driver writes it (to a temporary name, renamed into
    place); returns the claim's device name and the file."""
    uid = str(uuid.uuid4())
    edits = _device_edits(node, gpu)
    name = f"{uid}-gpu-{gpu}"
    if mig:
        name = f"{uid}-mig-{gpu}-1-0"
        edits["deviceNodes"] = [*edits["deviceNodes"], *(
            {"path": f"/dev/nvidia-caps/nvidia-cap{m}", "hostPath": str(node["caps"] /
                                                                        f"nvidia-cap{m}")}
            for m in (1, 2))]
    spec = {"cdiVersion": node["spec"]["cdiVersion"], "kind": KIND,
            "containerEdits": node["spec"]["containerEdits"],
            "devices": [{"name": name, "containerEdits": edits}]}
    path = node["run"] / f"k8s.gpu.nvidia.com-claim_{uid}.yaml"
    temp = path.with_name("." + path.name + ".tmp")
    temp.write_text(yaml.safe_dump(spec))
    os.rename(temp, path)
    return f"{KIND}={name}", path


def kubelet_claim(node: dict[str, Any], mode: str, device: str) -> dict[str, Any]:
    """What the kubelet sends for a DRA claim: from 1.31 the device in CDIDevices only (as
    the recorded kubelet 1.35 does, tests/data/kubelet-1.35.6), before 1.31 the annotation
    too ("plugin": the only way a plugin sees a claim with the runtime's CDI off); either
    way with the annotations and mounts the kubelet gives every container."""
    uid = device.split("=", 1)[1].split("-gpu-")[0].split("-mig-")[0]
    claim = {f"cdi.k8s.io/gpu.nvidia.com_{uid}": device} if mode == "plugin" else {}
    return with_kubelet_extras(node, {"annotations": claim, "cdi_devices": [device]})


def with_kubelet_extras(node: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """``request`` (create_container arguments) with what a real kubelet adds to every
    container: its annotations, the pod's /etc/hosts and a termination-message file."""
    pod_dir = node["root"] / "kubelet" / "pods" / str(uuid.uuid4())
    return {**request,
            "annotations": {**kubelet_requests.container_annotations("app"),
                            **request.get("annotations", {})},
            "mounts": {**kubelet_requests.container_files(pod_dir, "app"),
                       **request.get("mounts", {})}}


def nvidia_nodes(cri: CriClient, ctr: str) -> list[str]:
    spec = cri.runtime_spec(ctr)
    return sorted(d["path"] for d in spec["linux"].get("devices", [])
                  if d["path"].startswith("/dev/nvidia"))


def gpu_nodes(cri: CriClient, ctr: str) -> list[str]:
    return [p for p in nvidia_nodes(cri, ctr) if p[len("/dev/nvidia"):].isdigit()]


def refusal(cri: CriClient, pod: str, name: str, **kwargs: Any) -> str:
    with pytest.raises(cri.grpc.RpcError) as info:
        cri.create_container(pod, name, BUSYBOX_IMAGE, command=SLEEP, **kwargs)
    text = str(info.value.details())
    assert "\n" not in text, text
    return text


# How long containerd's own CDI may take to see a claim written or deleted (its watcher
# rereads every spec file; on a loaded 2-core machine that has taken over 100 ms).
NATIVE_CDI_SETTLE = 60.0


def claimed(mode: str, cri: CriClient, pod: str, name: str, request: dict[str, Any], *,
            start: bool = False, **kwargs: Any) -> str:
    """Creates (and with ``start`` starts) a container with a claim's ``request``: in
    ``plugin`` on the first try; in ``runtime`` retried while containerd's CDI does not
    know the claim yet, as the kubelet retries, bounded."""
    create = cri.run_container if start else cri.create_container
    deadline = time.monotonic() + NATIVE_CDI_SETTLE
    while True:
        try:
            return create(pod, name, BUSYBOX_IMAGE, command=SLEEP, **request, **kwargs)
        except cri.grpc.RpcError as error:
            text = str(error.details())
            if (mode != "runtime" or "unresolvable CDI devices" not in text
                    or time.monotonic() > deadline):
                raise
        time.sleep(0.05)


def stale_refusal(node: dict[str, Any], mode: str, cri: CriClient, pod: str, name: str,
                  device: str) -> str:
    """The refusal of a container naming the deleted claim ``device``: in ``plugin`` at
    once; in ``runtime`` awaited (bounded) while containerd's CDI still serves it, each
    container it let through removed."""
    deadline = time.monotonic() + NATIVE_CDI_SETTLE
    while mode == "runtime" and time.monotonic() < deadline:
        try:
            ctr = cri.create_container(pod, name, BUSYBOX_IMAGE, command=SLEEP,
                                       **kubelet_claim(node, mode, device))
        except cri.grpc.RpcError as error:
            return str(error.details())
        cri.remove_container(ctr)
        time.sleep(0.05)
    return refusal(cri, pod, name, **kubelet_claim(node, mode, device))


# --- DRA claims -----------------------------------------------------------------------------


def test_fresh_claims_resolve_on_the_first_try(setup: tuple[str, Containerd], cri: CriClient,
                                               node: dict[str, Any]) -> None:
    """The spec written, CreateContainer at once: 20 of 20 get their GPU on the first try
    from the plugin (containerd's own CDI is given its watcher's while, module docstring)."""
    mode = setup[0]
    pod = cri.run_pod("fresh")
    got = []
    for i in range(20):
        device, _ = write_claim(node, i % 2)
        ctr = claimed(mode, cri, pod, f"c{i}", kubelet_claim(node, mode, device))
        got.append(gpu_nodes(cri, ctr) == [f"/dev/nvidia{node['gpus'][i % 2]['minor']}"])
    assert sum(got) == 20, got


def test_a_deleted_claim_is_gone_at_once(setup: tuple[str, Containerd], cri: CriClient,
                                         node: dict[str, Any]) -> None:
    """A claim's spec deleted, the next container naming it is refused: at once by the
    plugin, once its watcher has caught up by containerd's own CDI."""
    mode = setup[0]
    pod = cri.run_pod("deleted")
    for i in range(10):
        device, path = write_claim(node, 1)
        ctr = claimed(mode, cri, pod, f"live{i}", kubelet_claim(node, mode, device))
        assert gpu_nodes(cri, ctr) == [f"/dev/nvidia{node['gpus'][1]['minor']}"]
        path.unlink()
        text = stale_refusal(node, mode, cri, pod, f"stale{i}", device)
        assert device in text or "unresolvable" in text, text


def test_base_gpu_and_a_claim_each_edit_once(setup: tuple[str, Containerd], cri: CriClient,
                                             node: dict[str, Any]) -> None:
    mode = setup[0]
    device, _ = write_claim(node, 1)
    claim = kubelet_claim(node, mode, device)
    pod = cri.run_pod("base")
    base = "nvidia.com/gpu=0"
    if mode == "plugin":
        claim["annotations"]["cdi.k8s.io/nvidia-device-plugin_gpu0"] = base
    claim["cdi_devices"] = [base, *claim["cdi_devices"]]
    ctr = claimed(mode, cri, pod, "both", claim, start=True)
    minors = sorted(f"/dev/nvidia{g['minor']}" for g in node["gpus"])
    assert gpu_nodes(cri, ctr) == minors
    spec = cri.runtime_spec(ctr)
    paths = [d["path"] for d in spec["linux"]["devices"]]
    mounts = [m["destination"] for m in spec["mounts"]]
    assert len(paths) == len(set(paths)), paths
    assert len(mounts) == len(set(mounts)), mounts
    assert cri.exec_sync(ctr, ["sh", "-c", "ls /dev/nvidia0 /dev/nvidia1"]).exit_code == 0


def test_fifty_claims_one_container_each(setup: tuple[str, Containerd], cri: CriClient,
                                         node: dict[str, Any]) -> None:
    mode = setup[0]
    claims = [write_claim(node, i % 2) for i in range(50)]
    pod = cri.run_pod("fifty")
    ok = 0
    for i, (device, _) in enumerate(claims):
        ctr = claimed(mode, cri, pod, f"c{i}", kubelet_claim(node, mode, device))
        ok += gpu_nodes(cri, ctr) == [f"/dev/nvidia{node['gpus'][i % 2]['minor']}"]
    assert ok == 50
    for _, path in claims:
        path.unlink()


def test_a_mig_style_claim(setup: tuple[str, Containerd], cri: CriClient,
                           node: dict[str, Any]) -> None:
    mode = setup[0]
    device, _ = write_claim(node, 0, mig=True)
    pod = cri.run_pod("mig")
    ctr = claimed(mode, cri, pod, "mig", kubelet_claim(node, mode, device), start=True)
    nodes = nvidia_nodes(cri, ctr)
    assert {"/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2",
            f"/dev/nvidia{node['gpus'][0]['minor']}"} <= set(nodes), nodes
    assert f"/dev/nvidia{node['gpus'][1]['minor']}" not in nodes


def test_a_requirement_refusal_on_a_claim(setup: tuple[str, Containerd], cri: CriClient,
                                          node: dict[str, Any]) -> None:
    """With the runtime injecting (its CDI on, CDIDevices only) the plugin matches the
    claim's GPU by its device node and refuses, naming the requirement. (The container
    that passes comes first: then the runtime's CDI knows the claim.)"""
    mode = setup[0]
    device, _ = write_claim(node, 1)
    pod = cri.run_pod("require")
    ctr = claimed(mode, cri, pod, "fine", kubelet_claim(node, mode, device),
                  env={"NVIDIA_REQUIRE_DRIVER": "driver>=500"})
    assert gpu_nodes(cri, ctr) == [f"/dev/nvidia{node['gpus'][1]['minor']}"]
    text = refusal(cri, pod, "req", env={"NVIDIA_REQUIRE_DRIVER": "driver>=999"},
                   **kubelet_claim(node, mode, device))
    assert "driver>=999" in text, text


def test_capabilities_on_a_claim(setup: tuple[str, Containerd], cri: CriClient,
                                 node: dict[str, Any]) -> None:
    """NVIDIA_DRIVER_CAPABILITIES=utility: the claim's compute library is not in the
    container, whoever injected it (runtime-injected: the plugin removes the mount)."""
    mode = setup[0]
    device, _ = write_claim(node, 0)
    pod = cri.run_pod("caps")
    ctr = claimed(mode, cri, pod, "util", kubelet_claim(node, mode, device), start=True,
                  env={"NVIDIA_DRIVER_CAPABILITIES": "utility"})
    mounts = {m["destination"] for m in cri.runtime_spec(ctr)["mounts"]}
    assert "/usr/bin/nvidia-smi" in mounts
    if mode == "runtime" and setup[1].major == 1:
        # containerd 1.7 keeps the mounts its own CDI injected whatever NRI removes; the
        # plugin logs that the filter could not apply (docs/install/dra.md)
        assert node["libcuda"] in mounts
    else:
        assert node["libcuda"] not in mounts
    ctr = cri.run_container(pod, "all", BUSYBOX_IMAGE, command=SLEEP,
                            env={"NVIDIA_DRIVER_CAPABILITIES": "all"},
                            **kubelet_claim(node, mode, device))
    assert node["libcuda"] in {m["destination"] for m in cri.runtime_spec(ctr)["mounts"]}


# --- NVIDIA's device plugin strategies ------------------------------------------------------


def _strategy(node: dict[str, Any], name: str, uid: str,
              env: dict[str, str] | None = None) -> dict[str, Any]:
    """What the kubelet passes for the GPU ``uid`` the device plugin allocated with strategy
    ``name``, as recorded: its own spec's device (k8s.device-plugin.nvidia.com/gpu) in an
    annotation or CDIDevices, or a /dev/null mount beside NVIDIA_VISIBLE_DEVICES."""
    request = kubelet_requests.device_plugin_request(name, uid)
    merged = {**request.pop("env", {}), **(env or {})}
    return with_kubelet_extras(node, {**request, **({"env": merged} if merged else {})})


@pytest.mark.parametrize("strategy", ["cdi-annotations", "cdi-cri", "volume-mounts"])
def test_device_plugin_strategy(setup: tuple[str, Containerd], cri: CriClient,
                                node: dict[str, Any], strategy: str) -> None:
    mode = setup[0]
    gpu = node["gpus"][1]
    pod = cri.run_pod(f"dp-{strategy}")
    if strategy == "cdi-cri" and mode == "plugin":
        # The broken set-up doctor reports: before 2.3 the runtime ignores CDIDevices with
        # its CDI off and shows them to no plugin; 2.3 refuses the container.
        if refuses_cdi_devices_with_cdi_off(cri):
            text = refusal(cri, pod, "app", **_strategy(node, strategy, gpu["uuid"]))
            assert REFUSED_WITH_CDI_OFF in text, text
            return
        ctr = cri.create_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP,
                                   **_strategy(node, strategy, gpu["uuid"]))
        assert gpu_nodes(cri, ctr) == []
        return
    ctr = cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP,
                            **_strategy(node, strategy, gpu["uuid"]))
    assert gpu_nodes(cri, ctr) == [f"/dev/nvidia{gpu['minor']}"]
    text = refusal(cri, pod, "old-cuda", **_strategy(node, strategy, gpu["uuid"],
                                                     {"NVIDIA_REQUIRE_DRIVER": "driver>=999"}))
    assert "driver>=999" in text, text
