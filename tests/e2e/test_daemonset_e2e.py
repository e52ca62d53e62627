"""The DaemonSet as it runs (deploy/helm/nri-cdi): its image built as the Dockerfile says,
its pod created through CRI with the very requests a real kubelet sent when a control plane
created it from the chart (tests/data/kubelet-1.35.6/daemonset, replayed; the recording is
checked against the chart as it renders now by tests/test_daemonset_recording.py), on a
simulated GPU node, against the private containerd that it then serves as NRI plugin.

The init container generates the node's spec, the plugin registers with that containerd, a
GPU pod gets its device; the plugin killed and started again (the kubelet's restart) behaves
as docs/usage/fail-closed.md says: a GPU container created and started while it was
down, without its device, is killed once it is back; one created while it was down and
started after it is back never runs; new GPU containers get their device again.

The image for arm64 is built the same way from the arm64 root and wheels (its pip run by
qemu-aarch64, started explicitly: no binfmt_misc needed): an arm64 image whose every
compiled module is aarch64. Where binfmt_misc takes qemu-aarch64, a container of it runs
the generator in NVML mode, nvidia-ml-py on the aarch64 simulated node's NVML."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import os
import signal
import tarfile
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdi.linux import elf
from nri_cdi_testbed.node_check.images import archive_platform
from nri_cdi_testbed.simnode import NodeLayout, build_node
from nri_cdi_testbed.waiting import wait_until
from nri_plugin.ops.status import read_status
from tests import arm64, prerequisites
from tests.e2e import daemonset
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient
from tests.e2e.cri_recorder import Call, substitute
from tests.e2e.daemonset import NodeNamespace, container_log, wait_exited
from tests.e2e.images import BUSYBOX_IMAGE
from tests.e2e.kubelet_replay import Replay, remove_cgroup_tree

ASK = {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}
SLEEP = ["sleep", "600"]
NOBODY = 65534
CONNECTED = "connected to containerd"


def _require_image_parts(architecture: str) -> None:
    missing = daemonset.missing_image_parts(architecture)
    if missing:
        prerequisites.missing("e2e tests", f"the {architecture} nri-cdi image cannot be "
                              f"built: {'; '.join(missing)}")


IMAGE = daemonset.pod_template()["spec"]["containers"][0]["image"]


@pytest.fixture(scope="module")
def image_archive(e2e_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    _require_image_parts("amd64")
    return daemonset.build_image(IMAGE, tmp_path_factory.mktemp("nri-cdi-image"))


@pytest.fixture(scope="session")  # once: its pip runs under the emulator
def arm64_image_archive(e2e_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    _require_image_parts("arm64")
    return daemonset.build_image(IMAGE, tmp_path_factory.mktemp("nri-cdi-image-arm64"),
                                 architecture="arm64", emulator=arm64.emulator())


# The namespace the recorded install's policy lists for pod annotations (its values.yaml).
GPU_NAMESPACE = "gpu-lab"


def _recorded_settings() -> dict[str, Any]:
    _, data = daemonset.recorded_config_map()
    return dict(yaml.safe_load(data["config.yaml"]))


@pytest.fixture(scope="module")
def node_ctrd(containerd: ContainerdFactory, image_archive: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Containerd, Path]]:
    """A private containerd in the simulated node's mount namespace, the image imported."""
    work = tmp_path_factory.mktemp("ds-node")
    node = build_node(work / "node", NodeLayout(driver_container=True))
    # The simulated NVML finds its description by walking up from its own file: in the pod
    # only the driver root is mounted, so the description sits at its top.
    (node.driver_root / "simnode-nvml.txt").write_bytes(
        (node.root / "simnode-nvml.txt").read_bytes())
    # Short: unix socket paths are limited to 107 bytes.
    ctrd_dir = Path(tempfile.mkdtemp(prefix="nri-cdi-ds-"))
    ns = NodeNamespace(node, work / "ns", ctrd_dir)
    ns.create = [v["path"] for v in daemonset.host_paths(daemonset.pod_template()).values()
                 if v.get("type") == "DirectoryOrCreate"]
    ctrd = containerd(workdir=ctrd_dir, wrapper=ns.wrapper())
    ctrd.import_images(image_archive)
    yield ctrd, ns.run


def _has_gpu(cri: CriClient, cid: str) -> bool:
    devices = cri.runtime_spec(cid)["linux"].get("devices", [])
    return any(d["path"] == "/dev/nvidia0" for d in devices)


def _wait_for(what: str, check: Any, log: Any = None) -> None:
    """Polls ``check`` until it is true; ``log`` (a callable) says why when it never is."""
    wait_until(check, what, interval=0.1,
               seen=(lambda: log()[-3000:]) if log else lambda: "the check still false")


def _healthy(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def _gpu_container(cri: CriClient, name: str, *, start: bool = True) -> str:
    """A GPU container whose processes run as a user other than the plugin's (nobody), as
    workloads usually do: the plugin must still be able to stop it."""
    pod = cri.run_pod(name, namespace=GPU_NAMESPACE, annotations=ASK)
    cid = cri.create_container(pod, name, BUSYBOX_IMAGE, command=SLEEP, run_as_user=NOBODY)
    if start:
        cri.start_container(cid)
    return cid


def _start_is_stopped(cri: CriClient, cid: str) -> None:
    """Starting it fails, or (a runtime that only logs the plugin's error) it is killed."""
    try:
        cri.start_container(cid)
    except cri.grpc.RpcError as exc:
        assert "created while the plugin was away" in str(exc.details())
    _wait_for("the container started after the plugin came back is stopped",
              lambda: cri.container_status(cid).status.state != cri.pb.CONTAINER_RUNNING)


def _creating(name: str) -> Any:
    return lambda call: (call.short == "CreateContainer"
                         and call.request["config"]["metadata"]["name"] == name)


def _restarted(call: Call) -> Call:
    """The recorded CreateContainer of a container as the kubelet sends it again once the
    container has ended (rewrite: its attempt and restart count 1, its log 1.log)."""
    request = copy.deepcopy(dict(call.request))
    config = request["config"]
    config["metadata"]["attempt"] = 1
    config["annotations"]["io.kubernetes.container.restartCount"] = "1"
    config["log_path"] = config["log_path"].replace("/0.log", "/1.log")
    return dataclasses.replace(call, request=request, response={})


def test_daemonset_serves_a_gpu_pod_and_fails_closed_across_a_restart(
        node_ctrd: tuple[Containerd, Path], tmp_path: Path) -> None:
    """The DaemonSet's pod as a real kubelet created it from the chart (the recording,
    replayed call by call in the node's namespace), then a GPU pod, then a crash."""
    ctrd, node_run = node_ctrd
    settings = _recorded_settings()
    spec_file = node_run / Path(settings["generate"]["output"]).relative_to("/var/run")
    path = daemonset.recording_file(ctrd.version)
    # The replay's rewrites: the recorded image's name to the image built here, and the
    # recording's placeholders to this test's folders (Replay: {node}, {cgroup}).
    rewrites = {daemonset.recorded_image(daemonset.recorded_requests(path)): IMAGE}
    cgroup_root = f"/nri-cdi-ds-{uuid.uuid4().hex[:8]}"
    node = tmp_path / "kubelet"
    with ctrd.cri() as cri, cri.cleanup():
        replay = Replay.of(path, cri, node, cgroup_root, extra_names=rewrites)
        try:
            _serve_and_fail_closed(replay, cri, spec_file, node_run, settings)
        finally:
            for pod in replay.pods.values():
                with contextlib.suppress(cri.grpc.RpcError):
                    cri.delete_pod(pod)
    assert not remove_cgroup_tree(cgroup_root)


def _write_config_volume(replay: Replay) -> None:
    """The ConfigMap's data as the kubelet writes it into the pod's config volume before
    the first container is created (the recorded ConfigMap)."""
    name, data = daemonset.recorded_config_map()
    volume = next(v for v in daemonset.pod_template()["spec"]["volumes"]
                  if v.get("configMap", {}).get("name") == name)
    suffix = f"/volumes/kubernetes.io~configmap/{volume['name']}"
    first = next(c for c in replay.calls if c.short == "CreateContainer")
    folder = next(m["host_path"] for m in first.request["config"]["mounts"]
                  if m["host_path"].endswith(suffix))
    target = Path(substitute(folder, replay.names))
    target.mkdir(parents=True, exist_ok=True)
    for key, text in data.items():
        (target / key).write_text(text)


def _serve_and_fail_closed(replay: Replay, cri: CriClient, spec_file: Path, node_run: Path,
                           settings: dict[str, Any]) -> None:
    _write_config_volume(replay)
    (pod_name,) = {c.request["config"]["metadata"]["name"] for c in replay.calls
                   if c.short == "RunPodSandbox"}
    # The kubelet created the plugin only once the init container had exited 0.
    replay.run(until=_creating("plugin"))
    status = wait_exited(cri, replay.live(pod_name, "generate"), 120)
    assert status.exit_code == 0, container_log(cri, replay.live(pod_name, "generate"))
    assert "nvidia.com/gpu" in spec_file.read_text()  # the init container's spec
    replay.run()
    assert not replay.mismatches(), "\n".join(replay.mismatches())
    plugin_id = replay.live(pod_name, "plugin")
    _wait_for("the plugin registers", lambda: CONNECTED in container_log(cri, plugin_id),
              log=lambda: container_log(cri, plugin_id))
    plugin = daemonset.pod_template()["spec"]["containers"][0]
    # The readiness probe, run as the kubelet runs an exec probe: in the container.
    ready = plugin["readinessProbe"]["exec"]["command"]
    _wait_for("the readiness probe passes",
              lambda: cri.exec_sync(plugin_id, ready).exit_code == 0)
    live = plugin["livenessProbe"]["httpGet"]
    assert _healthy(live["port"], live["path"])
    # Ours answered, not another process on that port: it bound it and still runs.
    assert cri.container_status(plugin_id).status.state == cri.pb.CONTAINER_RUNNING
    assert f":{live['port']}/metrics" in container_log(cri, plugin_id)
    # Its status file lands in the node's /run/nri-cdi, where doctor on the host reads it.
    status_dir = node_run / Path(settings["plugin"].get(
        "status_dir", "/run/nri-cdi")).relative_to("/run")
    _wait_for("the status file says connected", lambda: (
        (reading := read_status(str(status_dir), "nri-cdi", "10")).status is not None
        and reading.status.state == "connected" and reading.alive is True))
    # doctor runs in the plugin's container (the quick start's step): the image has all
    # it imports
    doctor = cri.exec_sync(plugin_id, ["nri-cdi", "doctor"], timeout=120)
    assert "Traceback" not in doctor.stderr + doctor.stdout, doctor.stderr[-3000:]
    assert "device nodes present" in doctor.stdout, doctor.stdout[-3000:]

    served = _gpu_container(cri, "gpu-served")
    assert _has_gpu(cri, served)
    listing = cri.exec_sync(served, ["ls", "-l", "/dev/nvidia0"])
    assert listing.exit_code == 0 and listing.stdout.startswith("c"), listing

    # Killed (a crash); while it is down NRI is fail-open: created without the device.
    os.kill(int(cri.container_info(plugin_id)["pid"]), signal.SIGKILL)
    wait_exited(cri, plugin_id, 15)
    unserved = _gpu_container(cri, "gpu-while-down")
    assert not _has_gpu(cri, unserved)
    waiting = _gpu_container(cri, "gpu-created-while-down", start=False)

    # The kubelet creates it again: the container that lacks its device is killed.
    created = next(c for c in replay.calls if _creating("plugin")(c))
    outcome = replay.step(_restarted(created))
    assert outcome.code == "OK", outcome.message
    again = outcome.container_id
    cri.start_container(again)
    _wait_for("the plugin registers again", lambda: CONNECTED in container_log(cri, again))
    _wait_for("the container created without its device is stopped",
              lambda: cri.container_status(unserved).status.state
              == cri.pb.CONTAINER_EXITED, log=lambda: container_log(cri, again))
    assert unserved in container_log(cri, again)
    _start_is_stopped(cri, waiting)
    assert _has_gpu(cri, _gpu_container(cri, "gpu-after"))
    assert cri.container_status(served).status.state == cri.pb.CONTAINER_RUNNING


def _layer(archive: Path) -> tarfile.TarFile:
    """The one layer of an archive images.write_archive made."""
    with tarfile.open(archive) as outer:
        index = json.load(outer.extractfile("index.json"))  # type: ignore[arg-type]
        blob = outer.extractfile(f"blobs/sha256/{index['manifests'][0]['digest'][7:]}")
        manifest = json.load(blob)  # type: ignore[arg-type]
        digest = manifest["layers"][0]["digest"][7:]
        data = outer.extractfile(f"blobs/sha256/{digest}").read()  # type: ignore[union-attr]
    return tarfile.open(fileobj=io.BytesIO(data))


def test_the_arm64_image_is_built_of_aarch64_parts(arm64_image_archive: Path,
                                                    tmp_path: Path) -> None:
    assert archive_platform(arm64_image_archive) == "linux/arm64"
    layer = _layer(arm64_image_archive)
    names = layer.getnames()
    assert "usr/local/bin/nri-cdi" in names and ".nri-cdi-emulator" not in names
    script = layer.extractfile("usr/local/bin/nri-cdi").read()  # type: ignore[union-attr]
    assert script.startswith(b"#!/usr/bin/python3\n")
    modules = [n for n in names if n.startswith("usr/local/lib/python3.11/dist-packages/")
               and n.endswith(".so")]
    assert {m.split("/")[5] for m in modules} >= {"yaml", "google"}, modules
    for name in [*modules, "usr/bin/python3.11"]:
        (tmp_path / "obj").write_bytes(layer.extractfile(name).read())  # type: ignore[union-attr]
        assert elf.read_header(tmp_path / "obj").architecture == "aarch64", name


def test_the_arm64_image_starts_and_generates_with_nvml(
        containerd: ContainerdFactory, arm64_image_archive: Path,
        arm64_containers: arm64.Arm64, tmp_path: Path) -> None:
    parts = arm64_containers
    node = build_node(tmp_path / "node", NodeLayout.uniform(2, machine="aarch64", seed="ds"),
                      cache_dir=tmp_path / "cache", ldconfig=[str(parts.qemu),
                                                              str(parts.ldconfig)])
    ctrd = containerd()
    ctrd.import_images(arm64_image_archive)
    with ctrd.cri() as cri, cri.cleanup():
        pod = cri.run_pod("nri-cdi-arm64")
        cid = cri.run_container(pod, "nri-cdi", IMAGE, command=["sleep", "600"],
                                ro_mounts={"/node": str(node.root)})
        assert cri.exec_sync(cid, ["uname", "-m"]).stdout.strip() == "aarch64"
        done = cri.exec_sync(cid, ["nri-cdi", "generate", "--mode", "nvml", "--driver-root",
                                   "/node", "--cdi-version", "0.6.0"], timeout=300)
        assert done.exit_code == 0, done.stderr
        spec = yaml.safe_load(done.stdout.split("---", 1)[-1])
        assert {d["name"] for d in spec["devices"]} >= {
            "0", "1", node.manifest["gpus"][1]["uuid"]}
        assert "/usr/lib/aarch64-linux-gnu/libcuda.so.580.82.07" in done.stdout
