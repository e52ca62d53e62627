"""``nri-cdi plugin`` on a real CRI-O (1.35.6 built from source: docs/developer/nri-wire.md).

CRI-O is not part of CI (no package of it is installable here): CI replays its NRI wire
instead (tests/test_nri_wire_replay.py). These tests run where ``$NRI_CDI_CRIO`` (or the
default build folder) holds ``crio``, ``pinns`` and ``copyimg``, and are skipped elsewhere,
saying so. They check, against CRI-O's own CDI reading the same folders:

- parity: the plugin's injection equals CRI-O's native CDI (CRI CDIDevices) for the e2e
  parity cases, both when the plugin hands the devices to CRI-O and when it injects them
  through NRI itself;
- what CRI-O does on its own: it resolves every container ``cdi.k8s.io`` annotation (a
  device only the plugin's folders hold fails the container), never a pod annotation;
- capability trims in both link modes, a refused requirement's pod-visible message, the
  start guard, and fail-closed with the plugin killed and started again under load;
- the plugin's log and ``nri-cdi doctor`` name CRI-O and its settings, not containerd's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nri_cdi_testbed.node_check.images import BUSYBOX_IMAGE, PAUSE_IMAGE
from nri_cdi_testbed.node_check.plugin import PluginProcess
from tests.nri_wire import GPU, IMPOSSIBLE_CUDA, World, build_world, generate
from tests.nri_wire_crio import Crio, bin_dir

REPO = Path(__file__).resolve().parents[2]
SLEEP = ["sleep", "600"]
PARITY = [
    ["parity.example/first=node", "parity.example/first=moded"],
    ["parity.example/first=node", "parity.example/first=envonly"],
    ["parity.example/first=envonly", "parity.example/second=other", "parity.example/first=node"],
    ["parity.example/first=readonly", "parity.example/first=node"],
    ["parity.example/first=gids", "parity.example/second=other"],
]
IDS = ["file-modes", "env-only", "two-spec-files", "permissions-r", "additional-gids"]


@pytest.fixture(scope="module")
def crio_ready(e2e_ready: None) -> Path:
    binaries = bin_dir()
    if not all((binaries / n).exists() for n in ("crio", "pinns", "copyimg")):
        pytest.skip(f"no CRI-O build in {binaries} ($NRI_CDI_CRIO): CRI-O runs only where "
                    "it was built (docs/developer/nri-wire.md); CI replays its NRI wire")
    return binaries


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, crio_ready: Path) -> World:
    root = tmp_path_factory.mktemp("crio")
    made = build_world(root / "node")
    # the same driver's spec hook-based, in a folder of its own
    node = made.root / "gpu-node"
    generate(made.root, node, node, "hooks", made.root / "nvidia-hooks")
    return made


@pytest.fixture(scope="module")
def crio(world: World, crio_ready: Path,
         image_archives: list[Path]) -> Iterator[Crio]:
    runtime = Crio(cdi_spec_dirs=world.spec_dirs, bin_path=crio_ready)
    runtime.import_image(image_archives[0], PAUSE_IMAGE)
    runtime.import_image(image_archives[1], BUSYBOX_IMAGE)
    runtime.start()
    yield runtime
    runtime.close()


def _plugin(crio: Crio, world: World, tmp_path: Path, *,
            runtime_cdi: dict[str, Any] | str | None = None,
            spec_dirs: list[str] | None = None) -> PluginProcess:
    """The plugin on CRI-O with the world's settings; ``runtime_cdi``: the section instead
    ("auto": none, the plugin reads CRI-O's files); ``spec_dirs``: its folders instead."""
    config = json.loads(world.config.read_text())
    if runtime_cdi == "auto":
        del config["runtime_cdi"]
    elif runtime_cdi is not None:
        config["runtime_cdi"] = runtime_cdi
    if spec_dirs is not None:
        config["plugin"]["spec_dirs"] = spec_dirs
    path = tmp_path / "plugin.yaml"
    path.write_text(json.dumps(config))
    process = PluginProcess(crio.nri_socket, [], tmp_path / "plugin.log",
                            extra_args=["--config", str(path)])
    process.spawn()
    process.wait_for_log("connected to cri-o 1.35.6")
    return process


@pytest.fixture
def cri(crio: Crio) -> Iterator[Any]:
    with crio.cri() as client, client.cleanup():
        yield client


def _ours(spec: dict[str, Any]) -> dict[str, Any]:
    linux = spec["linux"]
    return {
        "devices": [d for d in linux.get("devices", []) if d["path"].startswith("/dev/par")],
        "cgroup": [r for r in linux["resources"]["devices"] if r.get("major") in (242, 1)
                   and r.get("minor") in (0, 1, 2, 11)],
        "mounts": [m for m in spec["mounts"]
                   if m["destination"] in ("/usr/lib/par", "/usr/lib/aaa", "/opt/b")],
        "mount_order": [m["destination"] for m in spec["mounts"]],
        "env": [e for e in spec["process"]["env"] if e.startswith("PAR_")],
        "hooks": spec.get("hooks", {}).get("createContainer", []),
        "gids": spec["process"]["user"].get("additionalGids", []),
    }


def _native_and_ours(cri: Any, devices: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    native = cri.run_container(cri.run_pod("native"), "app", BUSYBOX_IMAGE, command=SLEEP,
                               cdi_devices=devices)
    ours = cri.run_container(cri.run_pod("ours", annotations={
        "cdi.k8s.io/dev": ",".join(devices)}), "app", BUSYBOX_IMAGE, command=SLEEP)
    return _ours(cri.runtime_spec(native)), _ours(cri.runtime_spec(ours))


@pytest.mark.parametrize("devices", PARITY, ids=IDS)
def test_handed_to_crio_the_container_is_native(crio: Crio, world: World, cri: Any,
                                                tmp_path: Path, devices: list[str]) -> None:
    plugin = _plugin(crio, world, tmp_path)
    try:
        native, ours = _native_and_ours(cri, devices)
        assert ours == native
        plugin.wait_for_log("handed to the runtime's own CDI")
    finally:
        plugin.kill()


@pytest.mark.parametrize("devices", PARITY[:3], ids=IDS[:3])
def test_injected_through_nri_the_container_is_native(crio: Crio, world: World, cri: Any,
                                                      tmp_path: Path,
                                                      devices: list[str]) -> None:
    # The plugin told CRI-O reads none of its folders: it injects through NRI itself.
    plugin = _plugin(crio, world, tmp_path,
                     runtime_cdi={"enabled": "on", "spec_dirs": [str(tmp_path / "none")]})
    try:
        native, ours = _native_and_ours(cri, devices)
        # NRI re-sorts mounts by (depth, path) when a plugin adds some; CRI-O 1.35's CDI
        # (1.1.0) keeps the spec's order within one depth
        assert sorted(ours.pop("mount_order")) == sorted(native.pop("mount_order"))
        key = str
        assert sorted(ours.pop("mounts"), key=key) == sorted(native.pop("mounts"), key=key)
        # NRI (0.11) adds its own rw rule for each node it creates, and relays the plugin's
        # rwm rule after it: the same access as native's one rule, one rule more
        derived = [r for r in ours["cgroup"] if r["access"] == "rw"]
        assert [dict(r, access="rwm") for r in derived] == native["cgroup"]
        ours["cgroup"] = [r for r in ours["cgroup"] if r not in derived]
        assert ours == native
        assert "handed to the runtime's own CDI" not in plugin.log()
    finally:
        plugin.kill()


def test_crio_resolves_container_annotations_itself(crio: Crio, world: World, cri: Any,
                                                    tmp_path: Path) -> None:
    # A container annotation naming a device only the plugin's folders hold fails in CRI-O
    # before NRI is asked; a pod annotation reaches the plugin untouched.
    other = tmp_path / "plugin-only"
    other.mkdir()
    (other / "x.json").write_text(json.dumps({
        "cdiVersion": "0.5.0", "kind": "plugin-only.example/dev",
        "devices": [{"name": "x", "containerEdits": {"env": ["ONLY=1"]}}]}))
    plugin = _plugin(crio, world, tmp_path,
                     spec_dirs=[*(str(d) for d in world.spec_dirs), str(other)])
    try:
        pod = cri.run_pod("annotated")
        with pytest.raises(cri.grpc.RpcError, match="unresolvable CDI devices"):
            cri.create_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP,
                                 annotations={"cdi.k8s.io/dev": "plugin-only.example/dev=x"})
        asked = cri.run_pod("pod-asked", annotations={
            "cdi.k8s.io/dev": "plugin-only.example/dev=x"})
        cid = cri.run_container(asked, "app", BUSYBOX_IMAGE, command=SLEEP)
        assert "ONLY=1" in cri.runtime_spec(cid)["process"]["env"]
        # named by its CRI name (no io.kubernetes.container.name label here)
        plugin.wait_for_log("container=app pod=default/pod-asked")
    finally:
        plugin.kill()


@pytest.mark.parametrize("mode", ["mounts", "hooks"])
def test_capability_trims_in_both_link_modes(crio: Crio, world: World, cri: Any,
                                             tmp_path: Path, mode: str) -> None:
    folder = world.root / ("nvidia" if mode == "mounts" else "nvidia-hooks")
    plugin = _plugin(crio, world, tmp_path, spec_dirs=[str(world.root / "cdi"), str(folder)])
    try:
        seen = {}
        for caps in ("all", "utility"):
            pod = cri.run_pod(f"gpu-{caps}", annotations={"cdi.k8s.io/gpu": GPU})
            cid = cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP,
                                    env={"NVIDIA_DRIVER_CAPABILITIES": caps})
            spec = cri.runtime_spec(cid)
            seen[caps] = {Path(m["destination"]).name for m in spec["mounts"]}
            assert cri.exec_sync(cid, ["ls", "/dev/nvidia0"]).exit_code == 0
            if mode == "hooks":
                assert spec.get("hooks", {}).get("createContainer"), spec.get("hooks")
        assert any(n.startswith("libcuda.so") for n in seen["all"])
        assert not any(n.startswith("libcuda.so") for n in seen["utility"])
        assert any(n.startswith("libnvidia-ml.so") for n in seen["utility"])
    finally:
        plugin.kill()


def test_a_refused_requirement_is_what_the_pod_sees(crio: Crio, world: World, cri: Any,
                                                    tmp_path: Path) -> None:
    plugin = _plugin(crio, world, tmp_path)
    try:
        pod = cri.run_pod("require", annotations={"cdi.k8s.io/gpu": GPU})
        with pytest.raises(cri.grpc.RpcError) as refused:
            cri.create_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP,
                                 env={"NVIDIA_REQUIRE_CUDA": IMPOSSIBLE_CUDA})
        # CRI-O passes the plugin's message through as it is
        assert refused.value.details().startswith(f"nri-cdi: requirement {IMPOSSIBLE_CUDA}")
    finally:
        plugin.kill()


def test_start_guard_and_fail_closed_under_load(crio: Crio, world: World, cri: Any,
                                                tmp_path: Path) -> None:
    """Containers asking for a device are created in a loop while the plugin is killed and
    started again: none of them may end up running without its device."""
    plugin = _plugin(crio, world, tmp_path)
    made: list[str] = []
    errors: list[str] = []
    stop = threading.Event()

    def load() -> None:
        with crio.cri() as client:
            n = 0
            while not stop.is_set() and n < 40:
                n += 1
                pod = client.run_pod(f"load-{n}", annotations={
                    "cdi.k8s.io/dev": "parity.example/first=node"})
                try:
                    cid = client.create_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP)
                    made.append(cid)
                    client.start_container(cid)
                except client.grpc.RpcError as error:
                    errors.append(error.details())

    worker = threading.Thread(target=load)
    worker.start()
    try:
        plugin.wait_for_log("adjusted container=app pod=default/load-")
        plugin.kill()
        mark = plugin.log_size()
        plugin.spawn()
        plugin.wait_for_log("connected to cri-o", after=mark)
        stop.set()
        worker.join(timeout=300)
        running_without = []
        for cid in made:
            status = cri.container_status(cid).status
            spec = cri.runtime_spec(cid)
            has = any(d["path"] == "/dev/par0" for d in spec["linux"].get("devices", []))
            if status.state == 1 and not has:
                running_without.append(cid)
        assert not running_without, (running_without, errors)
        assert len(made) >= 2
    finally:
        stop.set()
        worker.join(timeout=300)
        plugin.kill()
        with crio.cri() as client:
            for pod in client.list_pods():
                if pod.metadata.name.startswith("load-"):
                    client.delete_pod(pod.id)


def test_plugin_log_and_doctor_name_crio(crio: Crio, world: World, tmp_path: Path) -> None:
    plugin = _plugin(crio, world, tmp_path, runtime_cdi="auto")
    try:
        log = plugin.log()
        assert "containerd's settings were not read" not in log
        assert (f"CRI-O's own CDI is always on; read from {crio.config_path}" in log), log
    finally:
        plugin.kill()
    dirs = [f"--spec-dir={d}" for d in world.spec_dirs]
    doctor = subprocess.run(
        [sys.executable, "-m", "nri_plugin.ops.cli", "doctor", "--socket", crio.nri_socket,
         *dirs, "--status-dir", str(tmp_path / "status")],
        cwd=REPO, capture_output=True, text=True)
    out = doctor.stdout
    assert "CRI-O's settings" in out and str(crio.config_path) in out, out
    assert "NRI enabled in CRI-O" in out and "containerd" not in out, out
