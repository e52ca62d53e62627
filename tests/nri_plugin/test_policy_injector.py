"""The injector under a policy, with node facts: sources, duplicates, requirements,
capabilities; and fail-closed detection at Synchronize. No sockets, no containerd."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from cdi.cache import SpecCache
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.dispatch import RpcError
from nri_plugin.plugins.cdi_injector.injector import CdiInjector
from nri_plugin.plugins.cdi_injector.policy import Policy, PolicyDenied
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.plugins.cdi_injector.startguard import StartGuard
from nri_plugin.plugins.cdi_injector.unserved import find_unserved
from nri_plugin.plugins.cdi_injector.vendor import Registry, RegistryHolder
from nri_plugin.vendors.nvidia.nodefacts import load_facts
from nri_plugin.vendors.nvidia.requirements import RequirementError
from nri_plugin.vendors.nvidia.rules import NvidiaRules
from tests.helpers import annotations_policy, write_specs

# How the facts' log says a sidecar belongs to another version of its spec.
STALE = "belongs to another version of the spec"

SPEC = """\
cdiVersion: 0.5.0
kind: nvidia.com/gpu
containerEdits:
  mounts:
  - {hostPath: /drv/libcuda.so.550, containerPath: /lib/libcuda.so.550, options: [ro, bind]}
  - {hostPath: /drv/libGLX_nvidia.so.550, containerPath: /lib/libGLX_nvidia.so.550,
     options: [ro, bind]}
  - {hostPath: /drv/nvidia-smi, containerPath: /bin/nvidia-smi, options: [ro, bind]}
devices:
- name: "0"
  containerEdits:
    deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]
- name: "1"
  containerEdits:
    deviceNodes: [{path: /dev/nvidia1, type: c, major: 195, minor: 1}]
"""


def _sidecar(spec: bytes) -> dict[str, object]:
    return {
        "spec": {"sha256": hashlib.sha256(spec).hexdigest()},
        "driver": {"version": "550.54.15", "cudaVersion": "12.4"},
        "capabilities": {"compute": ["/lib/libcuda.so.550"],
                         "graphics": ["/lib/libGLX_nvidia.so.550"],
                         "utility": ["/bin/nvidia-smi"]},
        "devices": {"0": {"type": "gpu", "gpuIndex": 0, "gpuUuid": "GPU-a", "arch": "8.0",
                          "brand": "tesla"},
                    "1": {"type": "gpu", "gpuIndex": 1, "gpuUuid": "GPU-b", "arch": "7.0",
                          "brand": "tesla"}},
    }


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    folder = write_specs(tmp_path / "cdi", {"nvidia.yaml": SPEC})
    spec = folder / "nvidia.yaml"
    (folder / "nvidia.yaml.meta").write_text(json.dumps(_sidecar(spec.read_bytes())))
    snapshot = SpecCache([str(folder)]).refresh()
    return Registry.load(snapshot, [NvidiaRules()])


def injector(registry: Registry, policy: Policy | None = None) -> CdiInjector:
    plugin = CdiInjector(lambda: registry, vendors=[NvidiaRules()],
                         policy=policy or annotations_policy())
    plugin.configure("", "containerd", "1.7.24")
    return plugin


def pod(namespace: str = "default", **annotations: str) -> nri_pb2.PodSandbox:
    return nri_pb2.PodSandbox(id="p1", name="pod", namespace=namespace, annotations=annotations)


def container(*env: str, name: str = "app", **annotations: str) -> nri_pb2.Container:
    return nri_pb2.Container(id="c1", pod_sandbox_id="p1", name=name, env=list(env),
                             annotations=annotations)


def mounts(adjustment: nri_pb2.ContainerAdjustment) -> list[str]:
    return [m.destination for m in adjustment.mounts]


def test_facts_loaded_from_sidecar(registry: Registry) -> None:
    facts = registry.facts[0]
    assert facts.devices["nvidia.com/gpu=0"].arch == "8.0"
    assert next(iter(facts.specs.values())).versions.cuda == "12.4"


def test_stale_sidecar_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", "nri_cdi.facts")
    folder = write_specs(tmp_path / "cdi", {"nvidia.yaml": SPEC})
    (folder / "nvidia.yaml.meta").write_text(json.dumps(_sidecar(b"other")))
    facts = load_facts(SpecCache([str(folder)]).refresh())
    assert not facts.specs and STALE in caplog.text


@pytest.mark.parametrize("caps, expected", [
    ("", ["/lib/libcuda.so.550", "/bin/nvidia-smi"]),
    ("compute", ["/lib/libcuda.so.550"]),
    ("graphics", ["/lib/libGLX_nvidia.so.550"]),
    ("all", ["/lib/libcuda.so.550", "/lib/libGLX_nvidia.so.550", "/bin/nvidia-smi"]),
])
def test_capability_filtering(registry: Registry, caps: str,
                              expected: list[str]) -> None:
    env = [f"NVIDIA_DRIVER_CAPABILITIES={caps}"] if caps else []
    adj = injector(registry).create_container(
        pod(**{"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}), container(*env))
    assert adj is not None and mounts(adj) == expected


def test_capability_filter_off_by_policy(registry: Registry) -> None:
    plugin = injector(registry, annotations_policy({"capabilities": {"filter": False}}))
    adj = plugin.create_container(pod(**{"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}), container())
    assert adj is not None and len(adj.mounts) == 3


@pytest.mark.parametrize("env, device, error", [
    ("NVIDIA_REQUIRE_CUDA=cuda>=12.8", "0",
     "requirement cuda>=12.8 not met: node driver 550.54.15 supports CUDA 12.4"),
    ("NVIDIA_REQUIRE_ARCH=arch>=8.0", "1", "GPU nvidia.com/gpu=1 has arch 7.0"),
    ("CUDA_VERSION=12.6.1", "0", "requirement cuda>=12.6 not met"),
    ("NVIDIA_REQUIRE_CUDA=cuda>=12.0", "0", None),
    ("NVIDIA_REQUIRE_ARCH=arch>=8.0", "0", None),
])
def test_requirements(registry: Registry, env: str, device: str,
                      error: str | None) -> None:
    plugin = injector(registry)
    args = (pod(**{"cdi.k8s.io/gpu": f"nvidia.com/gpu={device}"}), container(env))
    if error is None:
        assert plugin.create_container(*args) is not None
    else:
        with pytest.raises(RpcError, match=re.escape(error)) as info:
            plugin.create_container(*args)
        assert isinstance(info.value.__cause__, RequirementError)
    off = injector(registry, annotations_policy({"requirements": {"enforce": False}}))
    assert off.create_container(*args) is not None


def test_source_denial_and_env_ignored(registry: Registry) -> None:
    policy = annotations_policy({"sources": {"podAnnotations": {"namespaces": ["ml"]}}})
    plugin = injector(registry, policy)
    with pytest.raises(RpcError, match=re.escape("sources.podAnnotations.namespaces")) as info:
        plugin.create_container(pod("web", **{"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}),
                                container())
    assert isinstance(info.value.__cause__, PolicyDenied)
    # NVIDIA_VISIBLE_DEVICES is off by default: ignored, not refused.
    assert plugin.create_container(pod("web"), container("NVIDIA_VISIBLE_DEVICES=all")) is None
    on = injector(registry, annotations_policy(
        {"sources": {"visibleDevicesEnv": {"enabled": True, "privilegedOnly": False}}}))
    adj = on.create_container(pod("web"), container("NVIDIA_VISIBLE_DEVICES=1"))
    assert adj is not None and [d.path for d in adj.linux.devices] == ["/dev/nvidia1"]


def test_devices_already_injected_are_skipped(registry: Registry) -> None:
    plugin = injector(registry)
    ctr = container(**{"cdi.k8s.io/dp_0": "nvidia.com/gpu=0"})
    ctr.linux.devices.add(path="/dev/nvidia0", type="c", major=195, minor=0)
    assert plugin.create_container(pod(), ctr) is None
    ctr2 = container(**{"cdi.k8s.io/dp_0": "nvidia.com/gpu=1"})
    ctr2.CDI_devices.add(name="nvidia.com/gpu=1")
    assert plugin.create_container(pod(), ctr2) is None


# --- fail-closed -----------------------------------------------------------------------------

def live(cid: str, name: str, **annotations: str) -> nri_pb2.Container:
    return nri_pb2.Container(id=cid, pod_sandbox_id="p1", name=name, pid=0,
                             state=nri_pb2.CONTAINER_RUNNING, annotations=annotations)


def test_find_unserved(registry: Registry) -> None:
    served = live("c1", "served", **{"cdi.k8s.io/dp_0": "nvidia.com/gpu=0"})
    served.linux.devices.add(path="/dev/nvidia0", type="c", major=195, minor=0)
    starved = live("c2", "starved", **{"cdi.k8s.io/dp_0": "nvidia.com/gpu=1"})
    plain = live("c3", "plain")
    stopped = live("c4", "stopped", **{"cdi.k8s.io/dp_0": "nvidia.com/gpu=1"})
    stopped.state = nri_pb2.CONTAINER_STOPPED
    judge = CdiInjector(lambda: registry, vendors=[NvidiaRules()], policy=Policy())
    found = find_unserved([pod()], [served, starved, plain, stopped], judge)
    assert [(u.name, u.missing, u.exited) for u in found] == [
        ("starved", ("nvidia.com/gpu=1",), False), ("stopped", ("nvidia.com/gpu=1",), True)]


def test_a_container_that_ran_without_its_devices_and_exited_is_said_not_acted_on(
        registry: Registry, caplog: pytest.LogCaptureFixture) -> None:
    """A Job created while the plugin was away ran without its GPU and exited before the
    plugin came back: nothing is left to stop, but it was said nowhere (seen on a real
    control plane during an upgrade with no overlap)."""
    job = live("c5", "job", **{"cdi.k8s.io/dp_0": "nvidia.com/gpu=1"})
    job.state = nri_pb2.CONTAINER_STOPPED
    plugin = StartGuard(injector(registry))
    plugin.synchronize([pod()], [job])
    assert plugin.counters.unserved_found == 1 and plugin.counters.unserved_evicted == 0
    assert ("1 container(s) ran without their devices while the plugin was away and have "
            "exited") in caplog.text and "job (c5) of pod" in caplog.text
    caplog.clear()
    plugin.synchronize([pod()], [job])  # listed again at the next connection: said once
    assert plugin.counters.unserved_found == 1 and "have exited" not in caplog.text


def test_report_action_stops_nothing(registry: Registry,
                                     caplog: pytest.LogCaptureFixture) -> None:
    starved = live("c2", "starved", **{"cdi.k8s.io/dp_0": "nvidia.com/gpu=1"})
    starved.pid = 4242
    plugin = StartGuard(injector(registry,
                                 annotations_policy({"failClosed": {"action": "report"}})))
    plugin.synchronize([pod()], [starved])
    assert plugin.counters.unserved_reported == 1 and plugin.counters.unserved_evicted == 0
    assert "fail-closed report: container starved" in caplog.text


def test_synchronize_acts_after_its_reply_on_started_containers_only(
        registry: Registry) -> None:
    later: list[object] = []
    plugin = StartGuard(injector(registry), defer=later.append)
    starved = live("c2", "starved", **{"cdi.k8s.io/dp_0": "nvidia.com/gpu=1"})
    starved.pid = 4242  # started: acted on now (not started: when it starts)
    waiting = live("c4", "waiting", **{"cdi.k8s.io/dp_0": "nvidia.com/gpu=1"})
    waiting.state = nri_pb2.CONTAINER_CREATED
    assert plugin.synchronize([pod()], [starved, live("c3", "plain"), waiting]) is None
    assert len(later) == 1  # the stopping of "starved", after the reply
    assert plugin.counters.unserved_found == 2 and list(plugin._pending) == ["c4"]


# --- registry and facts swapped together, structured refusal reasons ----------------------

def test_stale_sidecar_keeps_the_facts_of_the_unchanged_spec(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The generator writes the sidecar first: until the new spec arrives, the old spec
    keeps the facts read for it; a changed spec with a sidecar of another spec gets none."""
    folder = write_specs(tmp_path / "cdi", {"nvidia.yaml": SPEC})
    spec, meta = folder / "nvidia.yaml", folder / "nvidia.yaml.meta"
    meta.write_text(json.dumps(_sidecar(spec.read_bytes())))
    cache, holder = SpecCache([str(folder)]), RegistryHolder([NvidiaRules()])
    first = holder.update(cache.refresh())
    assert first.facts[0].specs
    caplog.set_level("INFO", "nri_cdi.facts")
    meta.write_text(json.dumps(_sidecar(b"the next spec")))  # sidecar of the next version
    kept = holder.update(cache.refresh())
    assert kept.snapshot.generation == first.snapshot.generation + 1
    assert kept.facts[0].specs and f"{spec}.meta {STALE}" in caplog.text
    caplog.clear()
    spec.write_text(SPEC.replace("550", "560"))  # a spec the sidecar does not describe
    changed = holder.update(cache.refresh())
    assert not changed.facts[0].specs and STALE in caplog.text


def test_registry_holder_swaps_snapshot_and_facts_in_one_object(registry: Registry) -> None:
    holder = RegistryHolder([NvidiaRules()])
    before = holder.get()
    after = holder.update(registry.snapshot)
    assert holder.get() is after and after is not before
    assert after.snapshot is registry.snapshot
    # The facts were read for this very snapshot's spec objects.
    loaded_for = after.facts[0].loaded_for
    assert loaded_for and all(loaded_for[path] is loaded.spec
                              for path, loaded in registry.snapshot.specs.items())


@pytest.mark.parametrize("policy, env, annotations, rule, device", [
    ({"devices": [{"namespaces": ["*"], "deny": ["nvidia.com/gpu=1"], "allow": ["*"]}]}, [],
     {"cdi.k8s.io/gpu": "nvidia.com/gpu=1"}, "devices[0]", "nvidia.com/gpu=1"),
    ({"sources": {"podAnnotations": {"enabled": False}}}, [],
     {"cdi.k8s.io/gpu": "nvidia.com/gpu=1"}, "sources.podAnnotations.enabled", None),
    ({}, ["NVIDIA_REQUIRE_CUDA=cuda>=13.0"], {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"},
     "nvidia.requirements", None),
    ({}, [], {"cdi.k8s.io/gpu": "nvidia.com/gpu=9"}, "unresolvable", "nvidia.com/gpu=9"),
    ({}, [], {"cdi.k8s.io/gpu": "nvidia.com/gpu=0,"}, "request.annotation", None),
])
def test_refusals_carry_a_structured_reason(registry: Registry, policy: dict[str, object],
                                            env: list[str], annotations: dict[str, str],
                                            rule: str, device: str | None) -> None:
    plugin = injector(registry, annotations_policy(policy))
    with pytest.raises(RpcError) as info:
        plugin.create_container(pod(**annotations), container(*env))
    cause = info.value.__cause__
    assert isinstance(cause, Refusal)
    assert cause.reason.rule == rule
    assert cause.reason.device == device
    if rule == "request.annotation":
        assert cause.reason.annotation == "cdi.k8s.io/gpu"
