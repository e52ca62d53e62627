"""A real kubelet's CRI calls, replayed: CI has no kubelet, so it replays one.

tests/data/kubelet-1.35.6/ holds what a real kubelet (Kubernetes v1.35.6, with its API
server, scheduler and controller manager) sent to containerd through the CRI recorder in
each scenario of issue 41 (its README says how they were recorded). Each recording is
replayed here, call by call in the kubelet's order, against a private containerd of the
version it was recorded on with ``nri-cdi plugin`` connected, on a simulated 2-GPU node
built as the recording's was (its UUIDs and minors are the same), and the test asserts
what the real run showed: which devices and driver files a container got, the refusal
text that reached the kubelet, which containers fail-closed stopped and which stayed dead.
The plugin's kill and restart are replayed where the recording marks them.

control-plane/ holds a GPU Job's pod and a GPU pod as a control plane under load created
them on each of its two nodes (issue 54, its README): replayed on containerd 1.7 and 2.1,
each container must get its device and run to its end, exit 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nri_cdi_testbed.waiting import wait_until
from tests.e2e import paths
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient
from tests.e2e.cri_recorder import Call, substitute
from tests.e2e.kubelet_replay import (
    CONTROL_PLANE_REPLAYED_ON,
    STOPS,
    Outcome,
    Replay,
    control_plane_recording,
    job_pods,
    remove_cgroup_tree,
)
from tests.e2e.plugin import REPO, PluginProcess

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None,
                                reason="gcc is needed to build the simulated node")

DATA = REPO / "tests" / "data" / "kubelet-1.35.6"
LIB = "/usr/lib/x86_64-linux-gnu"
# The device plugin's own spec as it wrote it on the recordings' node ({simnode}: the
# node's root); a DRA recording's claim spec, as the DRA test driver wrote it at prepare,
# is <recording>.claim.json.
DEVICE_PLUGIN_SPEC = DATA / "device-plugin-spec.json"


@dataclass(frozen=True)
class Setup:
    """How the recording's node was set up (its README lists the same)."""

    link_mode: str = "hooks"
    enable_cdi: bool = False
    volume_mounts: bool = False  # the policy's volumeMounts source on
    device_plugin_spec: bool = False
    dra_claim_spec: bool = False
    # where pods may ask by annotation (the policy's podAnnotations.namespaces)
    annotation_namespaces: tuple[str, ...] = ("*",)


SETUPS: dict[str, Setup] = {
    "annotations": Setup(),
    "annotations-standalone": Setup(),
    "device-plugin-volume-mounts": Setup(volume_mounts=True),
    "device-plugin-cdi-annotations": Setup(volume_mounts=True, device_plugin_spec=True),
    "device-plugin-cdi-cri-cdi-on": Setup(volume_mounts=True, device_plugin_spec=True,
                                          enable_cdi=True),
    "device-plugin-cdi-cri": Setup(volume_mounts=True, device_plugin_spec=True),
    "dra-cdi-off": Setup(dra_claim_spec=True),
    "dra-cdi-on": Setup(dra_claim_spec=True, enable_cdi=True),
    "capabilities-hooks": Setup(link_mode="hooks"),
    "capabilities-mounts": Setup(link_mode="mounts"),
    "capabilities-mounts-cdi-on": Setup(link_mode="mounts", enable_cdi=True),
    "churn": Setup(),
    "refusal": Setup(),
    # control-plane/: the chart's install let pods of gpu-lab (only) ask by annotation
    "gpu-load": Setup(annotation_namespaces=("gpu-lab",)),
}


def split_name(path: Path) -> tuple[str, str]:
    """("annotations", "1.7") of annotations-containerd-1.7.jsonl."""
    scenario, _, version = path.stem.rpartition("-containerd-")
    return scenario, version


# containerd versions the e2e set-up does not install (2.2, 2.3 built from source): their
# recordings are replayed where $NRI_CDI_CONTAINERD_<major>_<minor> names the folder of
# that containerd's containerd, ctr and containerd-shim-runc-v2.
BUILT_ENV = "NRI_CDI_CONTAINERD_{}"


def built_containerd(version: str) -> Path | None:
    folder = os.environ.get(BUILT_ENV.format(version.replace(".", "_")), "")
    return Path(folder) if folder else None


def recordings(*scenarios: str) -> list[Any]:
    """The recordings of these scenarios: those of the e2e set-up's containerds this run
    has (NRI_CDI_E2E_RUNTIMES narrows it; no others are generated), and those of a
    containerd built from source, skipped unless its folder is named."""
    wanted = set(paths.runtimes())
    out = []
    for path in sorted(DATA.glob("*.jsonl")):
        scenario, version = split_name(path)
        if scenario not in scenarios:
            continue
        if version in wanted:
            out.append(pytest.param(path, id=path.stem))
        elif version not in paths.RUNTIMES:
            variable = "$" + BUILT_ENV.format(version.replace(".", "_"))
            marks = [] if built_containerd(version) else [pytest.mark.skip(
                reason=f"containerd {version} is not part of the e2e set-up: {variable} "
                       "names a folder with its containerd, ctr and containerd-shim-runc-v2 "
                       "(built from source, never committed)")]
            out.append(pytest.param(path, id=path.stem, marks=marks))
    return out


# --- the node ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def simnode(tmp_path_factory: pytest.TempPathFactory, e2e_ready: None) -> dict[str, Any]:
    """The recordings' node (2 GPUs, the builder's default seed: same UUIDs and minors) and
    its spec generated in each link mode."""
    from nri_cdi_testbed.simnode import BuiltNode, NodeLayout, build_node

    root = tmp_path_factory.mktemp("kubelet-node")
    built = build_node(root / "node", NodeLayout.uniform(2))
    specs = {}
    for mode in ("hooks", "mounts"):
        folder = root / f"cdi-{mode}"
        folder.mkdir()
        subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--mode",
                        "procfs", "--driver-root", str(built.driver_root), "--dev-root",
                        str(built.dev_root), "--link-mode", mode, "--output",
                        str(folder / "nvidia.yaml")], check=True, cwd=REPO,
                       capture_output=True)
        specs[mode] = folder
    return {"root": built.root, "specs": specs,
            "gpus": BuiltNode.load(built.root).manifest["gpus"]}


@dataclass
class Replayed:
    replay: Replay
    ctrd: Containerd
    cri: CriClient
    plugin: PluginProcess
    setup: Setup
    version: str

    def spec(self, container_id: str) -> dict[str, Any]:
        return self.cri.runtime_spec(container_id)

    def devices(self, container_id: str) -> list[str]:
        return sorted(d["path"] for d in self.spec(container_id)["linux"].get("devices", []))

    def gpus(self, container_id: str) -> list[str]:
        return [d for d in self.devices(container_id) if d[len("/dev/nvidia"):].isdigit()]

    def mounts(self, container_id: str) -> list[str]:
        return [m["destination"] for m in self.spec(container_id)["mounts"]]

    def env(self, container_id: str) -> dict[str, str]:
        pairs = (e.partition("=") for e in self.spec(container_id)["process"]["env"])
        return {k: v for k, _, v in pairs}


def dynamic_specs(setup: Setup, recording: Path, folder: Path, simnode_root: Path) -> None:
    """The specs the recording's device plugin or DRA driver had written (hooks left out:
    they would run NVIDIA's nvidia-cdi-hook, which CI does not have)."""
    names = {"{simnode}": str(simnode_root)}
    if setup.device_plugin_spec:
        spec = substitute(json.loads(DEVICE_PLUGIN_SPEC.read_text()), names)
        spec["containerEdits"].pop("hooks", None)
        (folder / "k8s.device-plugin.nvidia.com-gpu.json").write_text(json.dumps(spec))
    claim = recording.with_suffix(".claim.json")  # none where the pod never started
    if setup.dra_claim_spec and claim.exists():
        shutil.copy(claim, folder / "test-driver.cdi.k8s.io-claim.json")


@pytest.fixture
def replayed(request: pytest.FixtureRequest, simnode: dict[str, Any], tmp_path: Path,
             image_archives: list[Path]) -> Iterator[Callable[[Path], Replayed]]:
    """replayed(recording[, version]): a containerd of the recording's version (or of
    ``version``) with the plugin connected, and a Replay of the recording on it (nothing
    replayed yet)."""
    made: list[Replayed] = []
    cgroup_root = f"/nri-cdi-replay-{uuid.uuid4().hex[:8]}"

    def make(recording: Path, on: str | None = None) -> Replayed:
        scenario, version = split_name(recording)
        version = on or version
        setup = SETUPS[scenario]
        dyn = tmp_path / "cdi-dyn"
        dyn.mkdir()
        dynamic_specs(setup, recording, dyn, simnode["root"])
        folders = [simnode["specs"][setup.link_mode], dyn]
        ctrd = Containerd(version=version, enable_cdi=setup.enable_cdi, cdi_spec_dirs=folders,
                          bin_dir=built_containerd(version))
        ctrd.start()
        ctrd.import_images(*image_archives)
        extra = []
        if setup.volume_mounts:
            policy = tmp_path / "policy.yaml"
            policy.write_text("sources: {volumeMounts: {enabled: true}}\n")
            extra = ["--policy", str(policy)]
        plugin = PluginProcess(ctrd.nri_socket, folders, tmp_path / "plugin.log", extra,
                               annotation_namespaces=setup.annotation_namespaces)
        cri = CriClient(ctrd.address)
        node = tmp_path / "node"
        node.mkdir()

        def on_mark(call: Call) -> None:
            event = call.request.get("event")
            running = plugin.process is not None and plugin.process.poll() is None
            if event == "plugin killed":
                plugin.kill()
            elif event == "plugin started" and not running:  # the first mark: at start
                plugin.start()

        replay = Replay.of(recording, cri, node, cgroup_root, on_mark=on_mark,
                           extra_names={"{simnode}": str(simnode["root"]),
                                        "{containerd}": str(ctrd.workdir)})
        done = Replayed(replay, ctrd, cri, plugin, setup, version)
        made.append(done)
        plugin.start()
        return done

    yield make
    for done in made:
        done.plugin.kill()
        for pod in done.cri.list_pods():
            with contextlib.suppress(done.cri.grpc.RpcError):
                done.cri.delete_pod(pod.id)
        done.cri.close()
        done.ctrd.close()
    assert not remove_cgroup_tree(cgroup_root)


# containerd >= 2.3 fails a creation naming CRI CDI devices while its own CDI is off.
REFUSED_WITH_CDI_OFF = "CDI support is explicitly disabled"


def refuses_cdi_devices(done: Replayed) -> bool:
    """On containerd >= 2.3 with its CDI off: every container naming a CRI CDI device
    (a DRA claim, the device plugin's cdi-cri) was refused by containerd, before NRI, as in
    the recording; True then (nothing else to check)."""
    if done.setup.enable_cdi or tuple(map(int, done.version.split("."))) < (2, 3):
        return False
    named = [o for o in done.replay.outcomes if o.call.short == "CreateContainer"
             and o.call.request["config"].get("CDI_devices")]
    assert named and all(o.code != "OK" and REFUSED_WITH_CDI_OFF in o.message
                         for o in named), [(o.code, o.message) for o in named]
    return True


def until_stops(call: Call) -> bool:
    return call.short in STOPS


def replay_all(done: Replayed) -> None:
    done.replay.run()
    assert not done.replay.mismatches(), "\n".join(done.replay.mismatches())


# --- (a) pod annotations ----------------------------------------------------------------------


@pytest.mark.parametrize("recording", recordings("annotations", "annotations-standalone"))
def test_annotations(replayed: Callable[[Path], Replayed], recording: Path,
                     simnode: dict[str, Any]) -> None:
    """cdi.k8s.io/gpu: nvidia.com/gpu=0 gets /dev/nvidia0 and the driver, not /dev/nvidia1;
    a plain pod nothing; nvidia.com/gpu=7 a CreateContainerError naming the device, which
    the kubelet retried."""
    done = replayed(recording)
    replay = done.replay
    replay.run(until=until_stops)
    assert not replay.mismatches(), "\n".join(replay.mismatches())
    gpu0 = replay.live(pod_name(replay, "gpu0"))
    assert done.gpus(gpu0) == ["/dev/nvidia0"]
    assert "libcuda.so.1" in exec_out(done, gpu0, f"ls {LIB}").split()
    plain = replay.live(pod_name(replay, "plain"))
    assert not [d for d in done.devices(plain) if "nvidia" in d]
    assert not [m for m in done.mounts(plain) if "nvidia" in m or "cuda" in m]
    refused = replay.created(pod_name(replay, "gpu7"))
    assert len(refused) >= 2 and all(o.code != "OK" for o in refused)
    for outcome in refused:
        assert "nvidia.com/gpu=7" in outcome.message, outcome.message
        assert "cdi.k8s.io/gpu" in outcome.message, outcome.message
    replay_all(done)


def pod_name(replay: Replay, name: str) -> str:
    """The pod's name in the recording (a static pod's carries the node's name)."""
    names = {c.request["config"]["metadata"]["name"] for c in replay.calls
             if c.short == "RunPodSandbox"}
    return name if name in names else next(n for n in names if n.startswith(name + "-"))


def exec_out(done: Replayed, container_id: str, script: str) -> str:
    result = done.cri.exec_sync(container_id, ["sh", "-c", script])
    return result.stdout + result.stderr


# --- (b) NVIDIA's device plugin -----------------------------------------------------------------

DP_STRATEGIES = ("device-plugin-volume-mounts", "device-plugin-cdi-annotations",
                 "device-plugin-cdi-cri-cdi-on", "device-plugin-cdi-cri")


def allocated_uuid(call: Call) -> str:
    """The GPU the device plugin gave a container, as the kubelet passed it on: a /dev/null
    mount at /var/run/nvidia-container-devices/<uuid>, a cdi.k8s.io/nvidia-device-plugin_*
    annotation or a CRI CDI device, each naming k8s.device-plugin.nvidia.com/gpu=<uuid>."""
    config = call.request["config"]
    names = [m["container_path"].rpartition("/")[2] for m in config.get("mounts", [])
             if m["container_path"].startswith("/var/run/nvidia-container-devices/")]
    names += [v.partition("=")[2] for k, v in config.get("annotations", {}).items()
              if k.startswith("cdi.k8s.io/nvidia-device-plugin_")]
    names += [d["name"].partition("=")[2] for d in config.get("CDI_devices", [])]
    assert len(names) == 1, config
    return names[0]


@pytest.mark.parametrize("recording", recordings(*DP_STRATEGIES))
def test_device_plugin(replayed: Callable[[Path], Replayed], recording: Path,
                       simnode: dict[str, Any]) -> None:
    """A pod with resources.limits nvidia.com/gpu: 1 gets the GPU the device plugin chose
    and no other, and NVIDIA_REQUIRE_DRIVER=driver>=999 is refused naming the requirement;
    with the cdi-cri strategy and containerd's CDI off the kubelet's CDI devices reach
    nobody: the container starts without a GPU and nothing is checked."""
    done = replayed(recording)
    replay = done.replay
    replay.run(until=until_stops)
    assert not replay.mismatches(), "\n".join(replay.mismatches())
    if refuses_cdi_devices(done):
        return
    (first, *_) = replay.created("dp")
    uuid_ = allocated_uuid(first.call)
    minor = next(g["minor"] for g in simnode["gpus"] if g["uuid"] == uuid_)
    dp = replay.live("dp")
    old = replay.created("dp-old")
    if split_name(recording)[0] == "device-plugin-cdi-cri":
        assert done.gpus(dp) == []
        assert all(o.code == "OK" for o in old)
    else:
        assert done.gpus(dp) == [f"/dev/nvidia{minor}"]
        assert old and all(o.code != "OK" and "driver>=999" in o.message for o in old), \
            [(o.code, o.message) for o in old]
    replay_all(done)


# --- (c) DRA through Kubernetes' DRA test driver ------------------------------------------------


@pytest.mark.parametrize("recording", recordings("dra-cdi-off", "dra-cdi-on"))
def test_dra_claim(replayed: Callable[[Path], Replayed], recording: Path) -> None:
    """The DRA test driver's claim (a CDI device with env only, named in CRI CDIDevices)
    reaches the container only through containerd's own CDI; the pod's GPU annotation
    (nvidia.com/gpu=1, NVIDIA_DRIVER_CAPABILITIES=compute,utility) is served either way, and
    its graphics and video files are left out also where the GPU is handed to
    containerd's CDI."""
    done = replayed(recording)
    replay = done.replay
    replay.run(until=until_stops)
    assert not replay.mismatches(), "\n".join(replay.mismatches())
    if refuses_cdi_devices(done):
        return
    ctr = replay.live("dra")
    env = done.env(ctr)
    assert (env.get("user_a") == "b") is done.setup.enable_cdi, env
    assert done.gpus(ctr) == ["/dev/nvidia1"]
    assert not graphics(done.mounts(ctr)), graphics(done.mounts(ctr))
    assert "libcuda.so.1" in exec_out(done, ctr, f"ls {LIB}").split()
    replay_all(done)


# Driver files of the graphics, video and display capabilities (never of compute/utility).
GRAPHICS = ("libEGL_nvidia", "libGLX_nvidia", "libGLX_indirect", "libGLESv", "libnvcuvid",
            "libnvidia-encode", "libnvidia-fbc", "libnvidia-ngx", "libnvidia-opticalflow",
            "libnvoptix", "libvdpau_nvidia", "nvoptix.bin", "nvidia_icd.json",
            "nvidia_layers.json", "libnvidia-glcore", "libnvidia-eglcore", "libnvidia-glsi",
            "libnvidia-rtcore", "libnvidia-glvkspirv", "10_nvidia.json")


def graphics(paths_: list[str]) -> list[str]:
    return [p for p in paths_ if any(name in p for name in GRAPHICS)]


# --- (e) NVIDIA_DRIVER_CAPABILITIES in both link modes ---------------------------------------

# Every driver file a container can open under these folders (a dangling link is none).
PRESENT_FILES = r"""
for d in /usr/lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/vdpau /usr/share/nvidia \
         /usr/share/vulkan/icd.d /etc/vulkan/icd.d /etc/vulkan/implicit_layer.d \
         /usr/share/glvnd/egl_vendor.d; do
  for f in "$d"/*; do [ -f "$f" ] && echo "$f"; done
done
"""


@pytest.mark.parametrize("recording", recordings("capabilities-hooks", "capabilities-mounts",
                                                 "capabilities-mounts-cdi-on"))
def test_capabilities(replayed: Callable[[Path], Replayed], recording: Path) -> None:
    """NVIDIA_DRIVER_CAPABILITIES=compute,utility: no graphics, video or display file can be
    opened in the container, under its versioned name or any link name, in both link
    modes and where containerd's own CDI is on; =all: they are there."""
    done = replayed(recording)
    replay = done.replay
    replay.run(until=until_stops)
    assert not replay.mismatches(), "\n".join(replay.mismatches())
    trimmed, every = replay.live("caps-cu"), replay.live("caps-all")
    for ctr in (trimmed, every):
        assert done.gpus(ctr) == ["/dev/nvidia0"]
        assert "NRI_CDI_LD_LIBRARY_PATH" not in done.env(ctr)
    files = exec_out(done, trimmed, PRESENT_FILES).split()
    assert f"{LIB}/libcuda.so.1" in files and f"{LIB}/libnvidia-ml.so.1" in files, files
    assert not graphics(files), graphics(files)
    assert not graphics(done.mounts(trimmed)), graphics(done.mounts(trimmed))
    all_files = exec_out(done, every, PRESENT_FILES).split()
    assert f"{LIB}/libEGL_nvidia.so.0" in all_files and f"{LIB}/libnvcuvid.so.1" in all_files
    replay_all(done)


# --- (f) a refused pod, and a container stopped by fail-closed --------------------------------


@pytest.mark.parametrize("recording", recordings("refusal"))
def test_refusal_and_fail_closed(replayed: Callable[[Path], Replayed], recording: Path) -> None:
    """nvidia.com/gpu=7 fails every CreateContainer the kubelet retries, with the device
    and the annotation named; a container created and started while the plugin was killed
    is stopped once it is back (exit 137) and its next attempt gets its GPU, while the
    dead one stays (the kubelet never removes it) and the plugin's start guard still
    closes its connection."""
    done = replayed(recording)
    replay = done.replay
    replay.run(until=until_stops)
    assert not replay.mismatches(), "\n".join(replay.mismatches())
    refused = replay.created("refused")
    assert len(refused) >= 2, refused
    for outcome in refused:
        # what `kubectl describe pod` shows: the cause and the device, nothing internal
        assert outcome.code == "NOT_FOUND", outcome
        assert "desc = nri-cdi: unresolvable CDI devices: nvidia.com/gpu=7 (from pod " \
               "annotation 'cdi.k8s.io/gpu')" in outcome.message, outcome.message
        assert "Refusal" not in outcome.message and "CreateContainer:" not in outcome.message
    late = replay.created("late")
    assert len(late) == 2, late
    dead, alive = (o.container_id for o in late)
    status = done.cri.container_status(dead).status
    assert (status.state, status.exit_code) == (done.cri.pb.CONTAINER_EXITED, 137)
    # the reason, written where the kubelet reads the container's termination message
    assert termination_message(replay, late[0]) == (
        "nri-cdi: stopped: the container was created while the plugin was away, without its "
        "devices: it asked for nvidia.com/gpu=0 and does not have it\n")
    assert done.gpus(alive) == ["/dev/nvidia0"]
    # straddle: created while the plugin was away, started once it was back: refused
    starts = [o for o in replay.outcomes if o.call.short == "StartContainer"
              and o.container_id == "" and o.code != "OK"]
    assert [o.code for o in starts] == ["FAILED_PRECONDITION"], starts
    assert "desc = nri-cdi: container app was created while the plugin was away, without " \
           "its devices: it asked for nvidia.com/gpu=0 and does not have it" in starts[0].message
    straddle = replay.created("straddle")
    assert len(straddle) == 2 and done.gpus(straddle[1].container_id) == ["/dev/nvidia0"]
    guard_closes_while(done, [dead, straddle[0].container_id])
    replay_all(done)


def termination_message(replay: Replay, created: Outcome) -> str:
    """The termination-message file the kubelet gave a container (the host file)."""
    (mount,) = [m for m in created.call.request["config"]["mounts"]
                if m["container_path"] == "/dev/termination-log"]
    return Path(substitute(mount["host_path"], replay.names)).read_text()


def guard_closes_while(done: Replayed, dead: list[str], timeout: float = 40.0) -> None:
    """The plugin closes its start guard's connection (nothing in doubt) after its last
    start, while these dead containers are still there (no RemoveContainer for them)."""
    log = done.plugin.log()
    opened = log.rfind("start guard connection opening")
    assert opened >= 0, log[-3000:]
    done.plugin.wait_for_log("closing the start guard's connection", timeout, after=opened)
    states = {done.cri.container_status(c).status.state for c in dead}
    assert states == {done.cri.pb.CONTAINER_EXITED}, states


# --- (d) the plugin killed and restarted while pods churn and crash-loop ------------------------


@pytest.mark.parametrize("recording", recordings("churn"))
def test_churn_with_plugin_restarts(replayed: Callable[[Path], Replayed],
                                    recording: Path) -> None:
    """Pods created and deleted every few seconds and one crash-looping, the plugin killed
    twice and started again: every creation the kubelet saw succeed succeeds, each
    container created and started while the plugin was away is stopped when it is back,
    every GPU container alive at the end has its GPU, and the start guard's connection
    closes while the crash loop's dead containers stay."""
    done = replayed(recording)
    replay = done.replay
    # up to the end of the churn: the first stop of the pod that ran throughout
    replay.run(until=lambda call: call.short in STOPS and pod_of(replay, call) == "steady")
    assert not replay.mismatches(), "\n".join(replay.mismatches())
    marks = [c.request["event"] for c in replay.calls if c.method == "#mark"]
    assert marks.count("plugin killed") >= 2 and marks.count("plugin started") >= 2, marks
    stopped = [state for states in replay.evictions for state in states.values()]
    assert stopped, "no container was created and started while the plugin was away"
    assert set(stopped) == {done.cri.pb.CONTAINER_EXITED}, replay.evictions
    alive = [c for c in done.cri.list_containers()
             if c.state == done.cri.pb.CONTAINER_RUNNING]
    assert alive
    for container in alive:
        assert done.gpus(container.id) == ["/dev/nvidia0"], container.labels
    crash = [o.container_id for o in replay.created("crash") if o.container_id]
    assert len(crash) >= 3, crash
    guard_closes_while(done, crash[-1:])
    replay_all(done)


def pod_of(replay: Replay, call: Call) -> str:
    """The name of the pod a lifecycle call is about ("" when the replay does not know)."""
    wanted = call.request.get("container_id") or call.request.get("pod_sandbox_id")
    for earlier in replay.calls:
        if earlier.short == "RunPodSandbox" and earlier.response.get("pod_sandbox_id") == wanted:
            return str(earlier.request["config"]["metadata"]["name"])
        if earlier.short == "CreateContainer" and earlier.response.get("container_id") == wanted:
            return str(earlier.request["sandbox_config"]["metadata"]["name"])
    return ""


# --- (g) a GPU Job and a GPU pod, as a control plane created them under load ------------------


def control_plane_versions() -> list[Any]:
    return [pytest.param(v, id=control_plane_recording(v).stem
                         + ("" if recorded == v else f"-on-{v}"))
            for recorded, v in CONTROL_PLANE_REPLAYED_ON.items() if v in paths.runtimes()]


@pytest.mark.parametrize("version", control_plane_versions())
def test_control_plane_gpu_job_and_pod(replayed: Callable[..., Replayed],
                                       version: str) -> None:
    """A GPU Job's pod (restartPolicy Never: its container exits 3 without /dev/nvidia0)
    and a GPU pod, both asking by pod annotation in namespace gpu-lab, replayed as the
    kubelet sent them: each container gets /dev/nvidia0 and the driver, and runs to its
    end with exit 0, as the recorded run's did."""
    done = replayed(control_plane_recording(version), version)
    replay = done.replay
    (job,) = job_pods(replay.calls)
    ended = run_to_each_end(done)
    assert not replay.mismatches(), "\n".join(replay.mismatches())
    assert set(ended) == {job, *pod_names(replay)} and len(ended) == 2, ended
    for pod, (exit_code, gpus, log) in ended.items():
        assert gpus == ["/dev/nvidia0"], (pod, gpus)
        assert (exit_code, "HAVE" in log, "NODEV" in log) == (0, True, False), (pod, log)


def pod_names(replay: Replay) -> list[str]:
    return [c.request["config"]["metadata"]["name"] for c in replay.calls
            if c.short == "RunPodSandbox"]


def run_to_each_end(done: Replayed) -> dict[str, tuple[int, list[str], str]]:
    """Replays the whole recording; a pod whose container was never stopped (it ends by
    itself: restartPolicy Never) had ended when the kubelet stopped its sandbox, so before
    each pod's first StopPodSandbox its container is waited for (bounded). Each such pod:
    its container's exit code, GPUs and log."""
    replay = done.replay
    ended: dict[str, tuple[int, list[str], str]] = {}
    seen: set[int] = set()

    def next_stop(call: Call) -> bool:
        return call.short == "StopPodSandbox" and call.seq not in seen

    while True:
        replay.run(until=next_stop)
        if replay.position >= len(replay.calls):
            return ended
        call = replay.calls[replay.position]
        seen.add(call.seq)
        pod = pod_of(replay, call)
        stopped = any(c.short == "StopContainer" and pod_of(replay, c) == pod
                      for c in replay.calls[:replay.position])
        if pod in ended or stopped:
            continue
        ended[pod] = ended_by_itself(done, pod)


def ended_by_itself(done: Replayed, pod: str) -> tuple[int, list[str], str]:
    cid = done.replay.live(pod)
    wait_until(lambda: done.replay.state(cid) == done.cri.pb.CONTAINER_EXITED,
               f"the container of pod {pod} has ended by itself",
               seen=lambda: f"state {done.replay.state(cid)}")
    exit_code = int(done.cri.container_status(cid).status.exit_code)
    return exit_code, done.gpus(cid), container_log_text(done.replay, pod)


def container_log_text(replay: Replay, pod: str) -> str:
    """The container's log file, where the recorded requests had containerd write it."""
    (create,) = [c for c in replay.calls if c.short == "CreateContainer"
                 and c.request["sandbox_config"]["metadata"]["name"] == pod]
    folder = str(substitute(create.request["sandbox_config"]["log_directory"], replay.names))
    return (Path(folder) / str(create.request["config"]["log_path"])).read_text()
