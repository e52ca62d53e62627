"""NVIDIA's other ways of asking, parsed and applied by the injector (no containerd):
``NVIDIA_VISIBLE_DEVICES=none``, MIG config/monitor capabilities, IMEX channels, compat32,
the device plugin's volume mounts, NVIDIA's NRI plugin keys and nri-plugins' keys."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cdi.cache import SpecCache
from nri_plugin.nri.api import nri_pb2
from nri_plugin.plugins.cdi_injector.context import RequestError, nri_plugins_requests
from nri_plugin.plugins.cdi_injector.injector import CdiInjector
from nri_plugin.plugins.cdi_injector.policy import Policy
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.plugins.cdi_injector.vendor import Registry
from nri_plugin.vendors.nvidia.rules import NvidiaRules
from nri_plugin.vendors.nvidia.sources import (
    ExtrasError,
    imex_channel_ids,
    nvidia_nri_requests,
    volume_mount_ids,
    wants_driver_only,
    wants_mig_capability,
)
from tests.helpers import annotations_policy, nvidia_policy, write_specs

SPEC = """\
cdiVersion: 0.5.0
kind: nvidia.com/gpu
containerEdits:
  env: [NVIDIA_VISIBLE_DEVICES=void]
  deviceNodes: [{path: /dev/nvidiactl, type: c, major: 195, minor: 255}]
  mounts:
  - {hostPath: /drv/libcuda.so.550, containerPath: /lib/libcuda.so.550, options: [ro, bind]}
  - {hostPath: /drv/lib32/libcuda.so.550, containerPath: /lib32/libcuda.so.550,
     options: [ro, bind]}
  - {hostPath: /drv/nvidia-smi, containerPath: /bin/nvidia-smi, options: [ro, bind]}
devices:
- name: "0"
  containerEdits:
    deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]
- name: "1"
  containerEdits:
    deviceNodes: [{path: /dev/nvidia1, type: c, major: 195, minor: 1}]
- name: "1:0"
  containerEdits:
    deviceNodes: [{path: /dev/nvidia1, type: c, major: 195, minor: 1}]
"""
# What NVIDIA's device plugin writes for its CDI strategies: no sidecar, no facts.
PLUGIN_SPEC = """\
cdiVersion: 0.5.0
kind: k8s.device-plugin.nvidia.com/gpu
devices:
- name: GPU-aaa
  containerEdits:
    deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]
"""
CAP = {"major": 509, "fileMode": 0o400, "gid": 0}


def _sidecar(spec: bytes) -> dict[str, object]:
    return {
        "spec": {"sha256": hashlib.sha256(spec).hexdigest()},
        "driver": {"version": "550.54.15", "cudaVersion": "12.4"},
        "capabilities": {"compute": ["/lib/libcuda.so.550"], "compat32": ["/lib32/libcuda.so.550"],
                         "utility": ["/bin/nvidia-smi"]},
        "devices": {"0": {"type": "gpu", "gpuIndex": 0, "gpuUuid": "GPU-aaa",
                          "busId": "00000000:18:00.0", "minor": 0},
                    "1": {"type": "gpu", "gpuIndex": 1, "gpuUuid": "GPU-bbb",
                          "busId": "00000000:2a:00.0"},
                    "1:0": {"type": "mig", "gpuIndex": 1, "migIndex": 0, "gpuUuid": "GPU-bbb",
                            "busId": "00000000:2a:00.0"}},
        "nodes": {"migConfig": {"path": "/dev/nvidia-caps/nvidia-cap1", "minor": 1, **CAP},
                  "migMonitor": {"path": "/dev/nvidia-caps/nvidia-cap2", "minor": 2, **CAP},
                  "imexChannels": {
                      "0": {"path": "/dev/nvidia-caps-imex-channels/channel0", "major": 510,
                            "minor": 0},
                      "3": {"path": "/dev/nvidia-caps-imex-channels/channel3", "major": 510,
                            "minor": 3}}},
        "procMask": {"procRoot": "/proc/driver/nvidia",
                     "hook": {"path": "/usr/bin/python3",
                              "args": ["python3", "-I", "hook.py", "mask-proc", "--proc-root",
                                       "/proc/driver/nvidia"],
                              "env": ["PATH=/usr/bin"]}},
    }


def nvidia_registry(folder: Path) -> Registry:
    """SPEC with its sidecar and PLUGIN_SPEC in ``folder``, loaded with NVIDIA's facts."""
    write_specs(folder, {"nvidia.yaml": SPEC, "plugin.yaml": PLUGIN_SPEC})
    spec = folder / "nvidia.yaml"
    (folder / "nvidia.yaml.meta").write_text(json.dumps(_sidecar(spec.read_bytes())))
    return Registry.load(SpecCache([str(folder)]).refresh(), [NvidiaRules()])


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return nvidia_registry(tmp_path / "cdi")


def run(registry: Registry, *env: str, policy: Policy | None = None, privileged: bool = False,
        mounts: tuple[tuple[str, str], ...] = (),
        **annotations: str) -> nri_pb2.ContainerAdjustment | None:
    plugin = CdiInjector(lambda: registry, vendors=[NvidiaRules()],
                         policy=policy or annotations_policy())
    plugin.configure("", "containerd", "1.7.24")
    ctr = nri_pb2.Container(id="c1", pod_sandbox_id="p1", name="app", env=list(env))
    for destination, source in mounts:
        ctr.mounts.add(destination=destination, source=source, type="bind")
    if privileged:
        ctr.linux.resources.devices.add(allow=True, access="rwm")
    pod = nri_pb2.PodSandbox(id="p1", name="pod", namespace="default", annotations=annotations)
    injection = plugin.decide(pod, ctr)
    return None if injection is None else injection.adjustment


def nodes(adj: nri_pb2.ContainerAdjustment | None) -> list[str]:
    return sorted(d.path for d in adj.linux.devices) if adj is not None else []


ENV_ON = annotations_policy({"sources": {"visibleDevicesEnv": {"enabled": True,
                                                         "privilegedOnly": False}}})


# --- grammar ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    ("none", True), (" none ", True), ("none,none", True), ("", False), ("void", False),
    ("none,void", False), ("all", False), ("0", False), ("none,0", False)])
def test_driver_only_grammar(value: str, expected: bool) -> None:
    assert wants_driver_only({"NVIDIA_VISIBLE_DEVICES": value}) is expected


@pytest.mark.parametrize("value, expected", [("all", True), ("ALL", True), (",all,", True),
                                             ("", False), (",", False)])
def test_mig_capability_grammar(value: str, expected: bool) -> None:
    assert wants_mig_capability({"NVIDIA_MIG_CONFIG_DEVICES": value},
                                "NVIDIA_MIG_CONFIG_DEVICES") is expected


@pytest.mark.parametrize("value", ["0", "none", "all,0", "GPU-aaa"])
def test_mig_capability_accepts_only_all(value: str) -> None:
    with pytest.raises(ExtrasError, match="only 'all' is supported"):
        wants_mig_capability({"NVIDIA_MIG_MONITOR_DEVICES": value}, "NVIDIA_MIG_MONITOR_DEVICES")


@pytest.mark.parametrize("value, expected", [
    ("", []), ("void", []), ("none", []), ("0", [0]), ("3,0,3", [0, 3]), ("all", [0, 3]),
    ("0,,3", [0, 3])])
def test_imex_grammar(value: str, expected: list[int]) -> None:
    assert imex_channel_ids({"NVIDIA_IMEX_CHANNELS": value}, [0, 3]) == expected


@pytest.mark.parametrize("value, message", [("1", "channel 1 does not exist"),
                                            ("x", "not a channel number"),
                                            ("-1", "not a channel number")])
def test_imex_errors(value: str, message: str) -> None:
    with pytest.raises(ExtrasError, match=message):
        imex_channel_ids({"NVIDIA_IMEX_CHANNELS": value}, [0, 3])


def _mounts(pairs: list[tuple[str, str]]) -> list[nri_pb2.Mount]:
    return [nri_pb2.Mount(destination=d, source=s) for d, s in pairs]


def test_volume_mount_ids() -> None:
    mounts = [("/var/run/nvidia-container-devices/GPU-aaa", "/dev/null"),
              ("/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/1", "/dev/null"),
              ("/var/run/nvidia-container-devices/GPU-bbb", "/tmp/forged"),  # not /dev/null
              ("/var/run/nvidia-container-devices", "/dev/null"),  # no id
              ("/etc/hosts", "/dev/null")]
    assert volume_mount_ids(_mounts(mounts)) == [
        ("GPU-aaa", "/var/run/nvidia-container-devices/GPU-aaa"),
        ("cdi/nvidia.com/gpu/1", "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/1")]
    # Spellings that normpath makes /dev/null count; a source that only looks like it does
    # not (normpath keeps a leading "//", which POSIX leaves to the implementation).
    spelled = [(f"/var/run/nvidia-container-devices/GPU-{i}", source) for i, source in
               enumerate(("/dev//null", "/dev/./null", "/dev/x/../null", "/dev/null/",
                          "//dev/null", "/dev/nullx", "/tmp/null", "dev/null"))]
    assert [device for device, _ in volume_mount_ids(_mounts(spelled))] == [
        "GPU-0", "GPU-1", "GPU-2", "GPU-3"]


def test_nvidia_nri_keys() -> None:
    own = {"nvidia.cdi.k8s.io/container.app": "nvidia.com/gpu=0",
           "nvidia.cdi.k8s.io/container.*": "nvidia.com/gpu=1"}
    assert [r.name for r in nvidia_nri_requests(own, "app")] == ["nvidia.com/gpu=0"]
    assert [r.name for r in nvidia_nri_requests(own, "other")] == ["nvidia.com/gpu=1"]
    assert nvidia_nri_requests({"nvidia.cdi.k8s.io/container.x": "a.com/b=c"}, "app") == []


# Every key NVIDIA's NRI plugin reads, as it reads them: the container's own key, else the
# pod's, else the bare key (one key only: containerd/nri's effective annotation).
@pytest.mark.parametrize(("annotations", "expected"), [
    ({"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=0"}, ["nvidia.com/gpu=0"]),
    ({"nvidia.cdi.k8s.io": "nvidia.com/gpu=0,nvidia.com/gpu=1"},
     ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]),
    ({"nvidia.cdi.k8s.io/container.app": "nvidia.com/gpu=1",
      "nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=0", "nvidia.cdi.k8s.io": "nvidia.com/gpu=0"},
     ["nvidia.com/gpu=1"]),
    ({"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=1", "nvidia.cdi.k8s.io": "nvidia.com/gpu=0"},
     ["nvidia.com/gpu=1"]),
    ({"nvidia.cdi.k8s.io/container.other": "nvidia.com/gpu=1",
      "nvidia.cdi.k8s.io": "nvidia.com/gpu=0"}, ["nvidia.com/gpu=0"]),
])
def test_every_key_nvidias_nri_plugin_reads(annotations: dict[str, str],
                                            expected: list[str]) -> None:
    assert [r.name for r in nvidia_nri_requests(annotations, "app")] == expected


def test_nri_plugins_keys_all_apply() -> None:
    annotations = {"cdi.nri.io/container.app": "a.com/x=1", "cdi.nri.io/pod": "a.com/x=2",
                   "cdi.nri.io": "a.com/x=3,a.com/x=4", "cdi.nri.io/container.b": "a.com/x=5"}
    assert [r.name for r in nri_plugins_requests(annotations, "app")] == [
        "a.com/x=1", "a.com/x=2", "a.com/x=3", "a.com/x=4"]
    with pytest.raises(RequestError, match="'gpu0' is not a fully qualified"):
        nri_plugins_requests({"cdi.nri.io/pod": "gpu0"}, "app")


# --- through the injector --------------------------------------------------------------------

def test_none_gives_the_driver_and_no_gpu(registry: Registry) -> None:
    adj = run(registry, "NVIDIA_VISIBLE_DEVICES=none", policy=ENV_ON)
    assert adj is not None
    assert nodes(adj) == ["/dev/nvidiactl"]
    # default capabilities utility,compute: the compat32 file is left out
    assert sorted(m.destination for m in adj.mounts) == ["/bin/nvidia-smi", "/lib/libcuda.so.550"]


def test_none_needs_the_env_source(registry: Registry) -> None:
    assert run(registry, "NVIDIA_VISIBLE_DEVICES=none") is None  # source off by default


def test_compat32_selects_the_32bit_files(registry: Registry) -> None:
    adj = run(registry, "NVIDIA_VISIBLE_DEVICES=none",
              "NVIDIA_DRIVER_CAPABILITIES=compute,compat32", policy=ENV_ON)
    assert adj is not None
    assert sorted(m.destination for m in adj.mounts) == ["/lib/libcuda.so.550",
                                                         "/lib32/libcuda.so.550"]


def test_mig_config_privileged_only_by_default(registry: Registry) -> None:
    with pytest.raises(Refusal, match="privileged containers only"):
        run(registry, "NVIDIA_MIG_CONFIG_DEVICES=all")
    adj = run(registry, "NVIDIA_MIG_CONFIG_DEVICES=all", "NVIDIA_MIG_MONITOR_DEVICES=all",
              privileged=True)
    assert nodes(adj) == ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]


def test_mig_monitor_allowed_by_policy(registry: Registry) -> None:
    policy = annotations_policy({"sources": {"migCapabilitiesEnv": {"privilegedOnly": False,
                                                              "namespaces": ["default"]}}})
    adj = run(registry, "NVIDIA_MIG_MONITOR_DEVICES=all", policy=policy,
              **{"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
    assert nodes(adj) == ["/dev/nvidia-caps/nvidia-cap2", "/dev/nvidia0", "/dev/nvidiactl"]


def test_mig_config_refused_with_specific_mig_devices(registry: Registry) -> None:
    with pytest.raises(Refusal, match="specific MIG devices"):
        run(registry, "NVIDIA_MIG_CONFIG_DEVICES=all", privileged=True,
            **{"cdi.k8s.io/gpu": "nvidia.com/gpu=1:0"})


def test_imex_channels_where_allowed(registry: Registry) -> None:
    assert run(registry, "NVIDIA_IMEX_CHANNELS=0") is None  # source off: ignored, as the env
    adj = run(registry, "NVIDIA_IMEX_CHANNELS=3,0", privileged=True,
              policy=annotations_policy({"sources": {"imexChannelsEnv": {"enabled": True}}}))
    assert nodes(adj) == ["/dev/nvidia-caps-imex-channels/channel0",
                          "/dev/nvidia-caps-imex-channels/channel3"]
    with pytest.raises(Refusal, match="channel 1 does not exist"):
        run(registry, "NVIDIA_IMEX_CHANNELS=1", privileged=True,
            policy=annotations_policy({"sources": {"imexChannelsEnv": {"enabled": True}}}))


def test_volume_mounts_source(registry: Registry) -> None:
    mount = (("/var/run/nvidia-container-devices/GPU-bbb", "/dev/null"),)
    with pytest.raises(Refusal, match=r"sources\.volumeMounts\.enabled"):
        run(registry, mounts=mount)  # off by default
    policy = annotations_policy({"sources": {"volumeMounts": {"enabled": True}}})
    assert nodes(run(registry, mounts=mount, policy=policy)) == ["/dev/nvidia1", "/dev/nvidiactl"]
    cdi = (("/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/0", "/dev/null"),)
    assert nodes(run(registry, mounts=cdi, policy=policy)) == ["/dev/nvidia0", "/dev/nvidiactl"]
    with pytest.raises(Refusal, match="unknown device 'GPU-zzz'"):
        run(registry, mounts=(("/var/run/nvidia-container-devices/GPU-zzz", "/dev/null"),),
            policy=policy)


def test_volume_mounts_env_marker_is_no_env_request(registry: Registry) -> None:
    # What the device plugin sets beside the mounts; the mounts are the request.
    adj = run(registry, "NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices",
              policy=annotations_policy({"sources": {"volumeMounts": {"enabled": True},
                                               "visibleDevicesEnv": {"enabled": True,
                                                                     "privilegedOnly": False}}}),
              mounts=(("/var/run/nvidia-container-devices/GPU-aaa", "/dev/null"),))
    assert nodes(adj) == ["/dev/nvidia0", "/dev/nvidiactl"]


def test_volume_mount_requirement_checked(registry: Registry) -> None:
    policy = annotations_policy({"sources": {"volumeMounts": {"enabled": True}}})
    with pytest.raises(Refusal, match=r"cuda>=12\.8"):
        run(registry, "NVIDIA_REQUIRE_CUDA=cuda>=12.8", policy=policy,
            mounts=(("/var/run/nvidia-container-devices/GPU-aaa", "/dev/null"),))


@pytest.mark.parametrize("key", ["nvidia.cdi.k8s.io/container.app", "nvidia.cdi.k8s.io/pod",
                                 "nvidia.cdi.k8s.io"])
def test_nvidia_nri_annotation_source(registry: Registry, key: str) -> None:
    asked = {key: "nvidia.com/gpu=1"}
    assert nodes(run(registry, **asked)) == ["/dev/nvidia1", "/dev/nvidiactl"]
    policy = annotations_policy({"sources": {"nvidiaNriAnnotations": {"enabled": False}}})
    with pytest.raises(Refusal, match=r"sources\.nvidiaNriAnnotations\.enabled"):
        run(registry, policy=policy, **asked)
    with pytest.raises(Refusal, match=r"sources\.nvidiaNriAnnotations\.namespaces is empty"):
        run(registry, policy=nvidia_policy({}), **asked)  # the built-in policy


ALL_FILES = ["/bin/nvidia-smi", "/lib/libcuda.so.550", "/lib32/libcuda.so.550"]


@pytest.mark.parametrize("key", ["nvidia.cdi.k8s.io/container.app", "nvidia.cdi.k8s.io/pod",
                                 "nvidia.cdi.k8s.io"])
def test_nvidias_nri_annotations_give_the_whole_device_as_its_plugin_does(
        registry: Registry, key: str) -> None:
    # NVIDIA's NRI plugin hands the names to the runtime's CDI: every file of the spec.
    whole = run(registry, **{key: "nvidia.com/gpu=0"})
    assert whole is not None and sorted(m.destination for m in whole.mounts) == ALL_FILES
    # An image that names its capabilities gets those, as from any other source...
    named = run(registry, "NVIDIA_DRIVER_CAPABILITIES=utility", **{key: "nvidia.com/gpu=0"})
    assert named is not None and [m.destination for m in named.mounts] == ["/bin/nvidia-smi"]
    # ...and a pod that also asks another way gets NVIDIA's runtime default.
    mixed = run(registry, **{key: "nvidia.com/gpu=0", "cdi.k8s.io/gpu": "nvidia.com/gpu=1"})
    assert mixed is not None and sorted(m.destination for m in mixed.mounts) == [
        "/bin/nvidia-smi", "/lib/libcuda.so.550"]


def test_nri_plugins_annotation_source(registry: Registry) -> None:
    assert nodes(run(registry, **{"cdi.nri.io/pod": "nvidia.com/gpu=0"})) == [
        "/dev/nvidia0", "/dev/nvidiactl"]
    policy = annotations_policy({"sources": {"nriPluginsAnnotations": {"namespaces": ["ml"]}}})
    with pytest.raises(Refusal, match=r"sources\.nriPluginsAnnotations\.namespaces"):
        run(registry, policy=policy, **{"cdi.nri.io": "nvidia.com/gpu=0"})


MASK = annotations_policy({"procMasking": {"enabled": True},
                     "sources": {"visibleDevicesEnv": {"enabled": True, "privilegedOnly": False}}})


def mask_args(adj: nri_pb2.ContainerAdjustment | None) -> list[list[str]]:
    assert adj is not None
    return [list(h.args[3:]) for h in adj.hooks.create_container]


def test_proc_masking_off_by_default(registry: Registry) -> None:
    adj = run(registry, **{"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
    assert adj is not None and not adj.hooks.create_container


@pytest.mark.parametrize("request_, gpus", [
    ({"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}, ["00000000:18:00.0"]),
    ({"cdi.k8s.io/gpu": "nvidia.com/gpu=1:0"}, ["00000000:2a:00.0"]),  # a MIG device: parent
    ({"cdi.k8s.io/gpu": "nvidia.com/gpu=0,nvidia.com/gpu=1"},
     ["00000000:18:00.0", "00000000:2a:00.0"]),
])
def test_proc_masking_names_the_given_gpus(registry: Registry, request_: dict[str, str],
                                           gpus: list[str]) -> None:
    args = ["mask-proc", "--proc-root", "/proc/driver/nvidia"]
    for bus in gpus:
        args += ["--gpu", bus]
    assert mask_args(run(registry, policy=MASK, **request_)) == [args]


def test_proc_masking_with_none_shows_no_gpu(registry: Registry) -> None:
    adj = run(registry, "NVIDIA_VISIBLE_DEVICES=none", policy=MASK)
    assert mask_args(adj) == [["mask-proc", "--proc-root", "/proc/driver/nvidia"]]


def test_requirements_apply_to_gpus_of_another_spec(registry: Registry) -> None:
    asks = {"cdi.k8s.io/gpu": "k8s.device-plugin.nvidia.com/gpu=GPU-aaa"}
    with pytest.raises(Refusal, match=r"cuda>=12\.8 not met"):
        run(registry, "NVIDIA_REQUIRE_CUDA=cuda>=12.8", **asks)
    assert nodes(run(registry, "NVIDIA_REQUIRE_CUDA=cuda>=12.2", **asks)) == ["/dev/nvidia0"]


def test_fail_closed_sees_volume_mounts_and_other_keys(registry: Registry) -> None:
    from nri_plugin.plugins.cdi_injector.unserved import find_unserved

    policy = annotations_policy({"sources": {"volumeMounts": {"enabled": True}}})
    pods = [nri_pb2.PodSandbox(id="p1", name="a", namespace="default"),
            nri_pb2.PodSandbox(id="p2", name="b", namespace="default",
                               annotations={"nvidia.cdi.k8s.io/container.app": "nvidia.com/gpu=0"})]
    by_mount = nri_pb2.Container(id="c1", pod_sandbox_id="p1", name="app",
                                 state=nri_pb2.CONTAINER_RUNNING)
    by_mount.mounts.add(destination="/var/run/nvidia-container-devices/GPU-aaa",
                        source="/dev/null")
    by_key = nri_pb2.Container(id="c2", pod_sandbox_id="p2", name="app",
                               state=nri_pb2.CONTAINER_RUNNING)
    judge = CdiInjector(lambda: registry, vendors=[NvidiaRules()], policy=policy)
    found = find_unserved(pods, [by_mount, by_key], judge)
    assert [(u.container_id, u.missing) for u in found] == [
        ("c1", ("nvidia.com/gpu=0",)), ("c2", ("nvidia.com/gpu=0",))]


def test_the_documented_default_policy_is_the_default() -> None:
    import yaml

    page = (Path(__file__).resolve().parents[2] / "docs/usage/policy.md").read_text()
    block = page.split("this is the default policy written out:\n\n```yaml\n", 1)[1]
    origin = "docs/usage/policy.md"
    written = nvidia_policy(yaml.safe_load(block.split("```", 1)[0]), origin=origin)
    assert written == Policy.defaults([NvidiaRules()], origin=origin)
