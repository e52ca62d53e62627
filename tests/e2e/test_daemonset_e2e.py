"""The DaemonSet as it would run (deploy/kubernetes): its image built as the Dockerfile says,
its pod run through CRI as the kubelet would run the manifest (tests/e2e/daemonset.py), on a
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

import io
import json
import os
import signal
import tarfile
import tempfile
import urllib.request
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
from tests.e2e.daemonset import NodeNamespace, PodRunner, container_log, wait_exited
from tests.e2e.images import BUSYBOX_IMAGE

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


# The quick start's policy: pods of one listed namespace ask by annotation.
POLICY = {"sources": {"podAnnotations": {"namespaces": ["default"]}}}


def _config_maps() -> dict[str, dict[str, str]]:
    """The ConfigMap with the quick start's policy added, as its values add it."""
    ((name, data),) = daemonset.config_maps().items()
    config = {**yaml.safe_load(data["config.yaml"]), "policy": POLICY}
    return {name: {**data, "config.yaml": yaml.safe_dump(config)}}


def _settings() -> dict[str, Any]:
    (data,) = _config_maps().values()
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
    pod = cri.run_pod(name, annotations=ASK)
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


def test_daemonset_serves_a_gpu_pod_and_fails_closed_across_a_restart(
        node_ctrd: tuple[Containerd, Path], tmp_path: Path) -> None:
    ctrd, node_run = node_ctrd
    settings = _settings()
    spec_file = node_run / Path(settings["generate"]["output"]).relative_to("/var/run")
    assert daemonset.untranslated(daemonset.pod_template()) == []
    with ctrd.cri() as cri, cri.cleanup():
        runner = PodRunner(cri, tmp_path / "kubelet", maps=_config_maps())
        runner.run_pod()
        runner.run_init_containers()
        assert "nvidia.com/gpu" in spec_file.read_text()  # the init container's spec

        plugin = runner.container("plugin")
        plugin_id = runner.start(plugin)
        runner.start(runner.container("watch"))
        _wait_for("the plugin registers", lambda: CONNECTED in container_log(cri, plugin_id),
                  log=lambda: container_log(cri, plugin_id))
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

        # The kubelet starts it again: the container that lacks its device is killed.
        again = runner.start(plugin)
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
