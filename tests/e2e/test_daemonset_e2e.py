"""The DaemonSet as it would run (deploy/kubernetes): its image built as the Dockerfile says,
its pod run through CRI as the kubelet would run the manifest (tests/e2e/daemonset.py), on a
simulated GPU node, against the private containerd that it then serves as NRI plugin.

The init container generates the node's spec, the plugin registers with that containerd, a
GPU pod gets its device; the plugin killed and started again (the kubelet's restart) behaves
as the README's fail-closed section says: a GPU container created and started while it was
down, without its device, is killed once it is back; one created while it was down and
started after it is back never runs; new GPU containers get their device again."""

from __future__ import annotations

import os
import signal
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nri_cdi_testbed.simnode import NodeLayout, build_node
from nri_cdi_testbed.waiting import wait_until
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


@pytest.fixture(scope="module")
def image_archive(e2e_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = daemonset.missing_image_parts()
    if missing:
        reason = f"the nri-cdi image cannot be built: {'; '.join(missing)}"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, e2e tests must not be skipped: {reason}", pytrace=False)
        pytest.skip(reason)
    image = daemonset.pod_template()["spec"]["containers"][0]["image"]
    return daemonset.build_image(image, tmp_path_factory.mktemp("nri-cdi-image"))


def _settings() -> dict[str, Any]:
    (data,) = daemonset.config_maps().values()
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
        assert "created without the plugin" in str(exc.details())
    _wait_for("the container started after the plugin came back is stopped",
              lambda: cri.container_status(cid).status.state != cri.pb.CONTAINER_RUNNING)


def test_daemonset_serves_a_gpu_pod_and_fails_closed_across_a_restart(
        node_ctrd: tuple[Containerd, Path], tmp_path: Path) -> None:
    ctrd, node_run = node_ctrd
    settings = _settings()
    spec_file = node_run / Path(settings["generate"]["output"]).relative_to("/var/run")
    assert daemonset.untranslated(daemonset.pod_template()) == []
    with ctrd.cri() as cri, cri.cleanup():
        runner = PodRunner(cri, tmp_path / "kubelet")
        runner.run_pod()
        runner.run_init_containers()
        assert "nvidia.com/gpu" in spec_file.read_text()  # the init container's spec

        plugin = runner.container("plugin")
        plugin_id = runner.start(plugin)
        runner.start(runner.container("watch"))
        _wait_for("the plugin registers", lambda: CONNECTED in container_log(cri, plugin_id),
                  log=lambda: container_log(cri, plugin_id))
        probe = plugin["readinessProbe"]["httpGet"]
        _wait_for("the readiness probe passes", lambda: _healthy(probe["port"], probe["path"]))
        live = plugin["livenessProbe"]["httpGet"]
        assert _healthy(live["port"], live["path"])
        # Ours answered, not another process on that port: it bound it and still runs.
        assert cri.container_status(plugin_id).status.state == cri.pb.CONTAINER_RUNNING
        assert f":{probe['port']}/metrics" in container_log(cri, plugin_id)

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
