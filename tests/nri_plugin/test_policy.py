"""Table tests: requirements grammar and evaluation, policy parsing and decisions,
capability filtering, NVIDIA_VISIBLE_DEVICES mapping, fail-closed detection."""

from __future__ import annotations

import re
from types import MappingProxyType

import pytest

from cdi.cache import Snapshot
from cdi.model import ContainerEdits, Mount
from nri_plugin.nri.api import nri_pb2
from nri_plugin.plugins.cdi_injector.context import is_privileged
from nri_plugin.plugins.cdi_injector.policy import Policy, PolicyDenied, PolicyError, parse_policy
from nri_plugin.vendors.nvidia.nodefacts import DeviceFacts, NodeFacts, NodeVersions, parse_sidecar
from nri_plugin.vendors.nvidia.requirements import (
    RequirementError,
    check,
    parse_requirement,
    requirements_from_env,
)
from nri_plugin.vendors.nvidia.rules import (
    CapabilityError,
    NvidiaRules,
    filter_edits,
    requested_capabilities,
)
from nri_plugin.vendors.nvidia.sources import VisibleDevicesError, visible_device_names

NODE = NodeVersions(driver="550.54.15", cuda="12.4")
A100 = DeviceFacts(name="nvidia.com/gpu=0", type="gpu", arch="8.0", brand="tesla")


# --- requirements ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, ok", [
    ("cuda>=12.4", True),
    ("cuda>=12.4.0", True),  # trailing .0 ignored
    ("cuda>12.4", False),
    ("cuda>=12.8", False),
    ("cuda=12.4", True),
    ("cuda!=12.4", False),
    ("cuda<13", True),
    ("driver>=550", True),
    ("driver>=550,driver<551", True),
    ("driver>=555", False),
    ("arch>=8.0", True),
    ("arch>=9.0", False),
    ("brand=tesla", True),
    ("brand=TESLA", True),
    ("brand!=tesla", False),
    ("cuda>=12.8 brand=tesla,driver>=550,driver<551", True),  # forward-compat alternative
    ("cuda>=12.8 brand=nvidia,driver>=550", False),
    ("CUDA>=12.0", True),  # names case-insensitive
])
def test_requirement_table(text: str, ok: bool) -> None:
    req = parse_requirement("NVIDIA_REQUIRE_CUDA", text)
    if ok:
        check([req], NODE, [A100])
    else:
        with pytest.raises(RequirementError):
            check([req], NODE, [A100])


def test_message_names_constraint_and_node() -> None:
    with pytest.raises(RequirementError) as info:
        check([parse_requirement("NVIDIA_REQUIRE_CUDA", "cuda>=12.8")], NODE, [A100])
    assert str(info.value).startswith(
        "requirement cuda>=12.8 not met: node driver 550.54.15 supports CUDA 12.4")


@pytest.mark.parametrize("text, error", [
    ("cuda~12", "cannot parse 'cuda~12'"),
    ("gpu>=1", "unknown name 'gpu'"),
    ("brand>=tesla", "brand takes only = or !="),
    ("cuda>=12.x", "is not a version"),
])
def test_malformed_requirements(text: str, error: str) -> None:
    with pytest.raises(RequirementError, match=re.escape(error)):
        parse_requirement("NVIDIA_REQUIRE_X", text)


@pytest.mark.parametrize("env, expected", [
    ({}, []),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0"}, ["cuda>=12.0"]),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_DISABLE_REQUIRE": "1"}, []),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_DISABLE_REQUIRE": "no"}, ["cuda>=12.0"]),
    ({"CUDA_VERSION": "11.8.0"}, ["cuda>=11.8"]),  # legacy image
    ({"CUDA_VERSION": "11.8.0", "NVIDIA_REQUIRE_CUDA": "cuda>=11.0"}, ["cuda>=11.0"]),
    ({"NVIDIA_REQUIRE_JETPACK": "csv-mounts=all"}, []),
    ({"NVIDIA_REQUIRE_A": "arch>=7.0", "NVIDIA_REQUIRE_B": "driver>=500"},
     ["arch>=7.0", "driver>=500"]),
])
def test_requirements_from_env(env: dict[str, str], expected: list[str]) -> None:
    assert [r.text for r in requirements_from_env(env)] == expected


def test_per_gpu_and_no_gpu() -> None:
    req = [parse_requirement("R", "arch>=8.0")]
    check(req, NODE, [])  # no GPU visible: arch holds
    old = DeviceFacts(name="nvidia.com/gpu=1", type="gpu", arch="7.5", brand="tesla")
    with pytest.raises(RequirementError, match=re.escape("GPU nvidia.com/gpu=1 has arch 7.5")):
        check(req, NODE, [A100, old])


def test_unknown_fact_fails_with_hint() -> None:
    with pytest.raises(RequirementError, match="not recorded"):
        check([parse_requirement("R", "cuda>=12")], NodeVersions(driver="550"), [])


# --- policy ------------------------------------------------------------------------------------

NVIDIA = (NvidiaRules(),)


def test_defaults_are_secure() -> None:
    p = Policy.defaults(NVIDIA)
    # What any pod can set asks in no namespace until the operator lists one; what the
    # kubelet sets from an allocation is served everywhere.
    for source in ("podAnnotations", "nriPluginsAnnotations", "nvidiaNriAnnotations"):
        why = p.source_allowed(source, "any", False) or ""
        assert f"sources.{source}.namespaces is empty" in why
        assert p.source_allowed(source, "any", True) == why  # privileged alike
    assert p.source_allowed("containerAnnotations", "any", False) is None
    listed = parse_policy({"sources": {"podAnnotations": {"namespaces": ["ml"]}}})
    assert listed.source_allowed("podAnnotations", "ml", False) is None
    assert "not allowed in namespace 'web'" in (
        listed.source_allowed("podAnnotations", "web", False) or "")
    assert "disabled" in (p.source_allowed("visibleDevicesEnv", "any", True) or "")
    with pytest.raises(PolicyDenied, match=re.escape("management.nvidia.com")):
        p.check_devices(["management.nvidia.com/gpu=all"], "default", False)
    p.check_devices(["nvidia.com/gpu=0"], "default", False)
    assert parse_policy(None) == Policy(origin="inline")


def test_the_parser_learns_source_names_and_denials_from_the_vendors() -> None:
    # Without a vendor the policy knows only the injector's own sources and denies nothing.
    with pytest.raises(PolicyError, match=re.escape("sources.visibleDevicesEnv: unknown key")):
        parse_policy({"sources": {"visibleDevicesEnv": {"enabled": True}}})
    Policy().check_devices(["management.nvidia.com/gpu=all"], "default", False)
    on = parse_policy({"sources": {"visibleDevicesEnv": {"enabled": True}}}, vendors=NVIDIA)
    assert on.source_allowed("visibleDevicesEnv", "any", True) is None
    with pytest.raises(PolicyDenied, match=re.escape("deny 'management.nvidia.com/*'")):
        on.check_devices(["management.nvidia.com/gpu=all"], "default", False)


POLICY = {
    "sources": {"podAnnotations": {"namespaces": ["ml-*"]},
                "visibleDevicesEnv": {"enabled": True}},
    "devices": [{"namespaces": ["ml-*"], "allow": ["nvidia.com/gpu=*"],
                 "deny": ["nvidia.com/gpu=all"]}],
    "privilegedExempt": True,
}


@pytest.mark.parametrize("source, ns, privileged, denied", [
    ("podAnnotations", "ml-a", False, None),
    ("podAnnotations", "web", False, "not allowed in namespace 'web'"),
    ("podAnnotations", "web", True, None),  # privileged exempt
    ("visibleDevicesEnv", "ml-a", False, "privileged containers only"),
    ("visibleDevicesEnv", "ml-a", True, None),
])
def test_source_rules(source: str, ns: str, privileged: bool, denied: str | None) -> None:
    why = parse_policy(POLICY, vendors=NVIDIA).source_allowed(source, ns, privileged)
    assert (why is None) if denied is None else (denied in (why or ""))


@pytest.mark.parametrize("name, ns, privileged, denied", [
    ("nvidia.com/gpu=0", "ml-a", False, None),
    ("nvidia.com/gpu=all", "ml-a", False, "devices[0] (namespaces ['ml-*']) deny"),
    ("other.com/x=1", "ml-a", False, "no allow pattern matches"),
    ("nvidia.com/gpu=0", "web", False, "no policy devices rule applies"),
    ("nvidia.com/gpu=all", "web", True, None),
])
def test_device_rules(name: str, ns: str, privileged: bool, denied: str | None) -> None:
    policy = parse_policy(POLICY, vendors=NVIDIA)
    if denied is None:
        policy.check_devices([name], ns, privileged)
    else:
        with pytest.raises(PolicyDenied) as info:
            policy.check_devices([name], ns, privileged)
        assert denied in str(info.value)


@pytest.mark.parametrize("doc, problem", [
    ([], "the document must be a mapping"),
    ({"sourcez": {}}, "sourcez: unknown key"),
    ({"sources": {"podAnnotations": {"enabled": "yes"}}},
     "sources.podAnnotations.enabled: must be true or false"),
    ({"sources": {"podAnnotations": {"namespaces": [1]}}},
     "sources.podAnnotations.namespaces: must be a list"),
    ({"devices": {"allow": ["*"]}}, "devices: must be a list of rules"),
    ({"devices": [{"namespaces": ["a"]}]}, "devices[0]: needs allow or deny"),
    ({"failClosed": {"action": "kill"}}, "failClosed.action: must be one of evict, report"),
    ({"requirements": {"unknownFacts": "maybe"}}, "requirements.unknownFacts: must be one of"),
    ({"version": 2}, "version: unsupported 2"),
])
def test_policy_errors(doc: object, problem: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(doc, origin="p.yaml")
    assert problem in str(info.value) and "p.yaml" in str(info.value)


# --- capabilities --------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (None, {"utility", "compute"}),
    ("", {"utility", "compute"}),
    ("compute", {"compute"}),
    ("video", {"video", "compute"}),
    ("display", {"display", "graphics"}),
    ("utility, graphics", {"utility", "graphics"}),
    ("all", {"compute", "compat32", "graphics", "utility", "video", "display", "ngx"}),
])
def test_requested_capabilities(value: str | None, expected: set[str]) -> None:
    env = {} if value is None else {"NVIDIA_DRIVER_CAPABILITIES": value}
    assert requested_capabilities(env) == expected


def test_unknown_capability() -> None:
    with pytest.raises(CapabilityError, match="'gaming'"):
        requested_capabilities({"NVIDIA_DRIVER_CAPABILITIES": "compute,gaming"})


def test_filter_edits_keeps_other_files() -> None:
    mounts = tuple(Mount(host_path="/h" + p, container_path=p)
                   for p in ("/l/libcuda.so.1", "/l/libGLX_nvidia.so.1", "/b/nvidia-smi",
                             "/l/libnvidia-egl-gbm.so.1", "/etc/x"))
    caps = {"/l/libcuda.so.1": "compute", "/l/libGLX_nvidia.so.1": "graphics",
            "/b/nvidia-smi": "utility", "/l/libnvidia-egl-gbm.so.1": "other"}
    edits = ContainerEdits(env=("A=1",), mounts=mounts)
    kept = filter_edits(edits, caps, frozenset({"compute"}))
    assert [m.container_path for m in kept.mounts] == [
        "/l/libcuda.so.1", "/l/libnvidia-egl-gbm.so.1", "/etc/x"]
    assert kept.env == ("A=1",)


def test_filter_edits_drops_the_link_mounts_of_a_dropped_library() -> None:
    """--link-mode mounts: ``libcuda.so.1`` is a second mount of the library the sidecar
    names (found on the arm64 e2e run: utility left libcuda.so.1 in the container)."""
    lib, gbm = "/h/l/nvidia/libcuda.so.550", "/h/l/libnvidia-egl-gbm.so.1.1.2"
    mounts = (Mount(host_path=lib, container_path="/l/nvidia/libcuda.so.550"),
              Mount(host_path=lib, container_path="/l/libcuda.so.1"),
              Mount(host_path=lib, container_path="/l/libcuda.so"),
              Mount(host_path=gbm, container_path="/l/libnvidia-egl-gbm.so.1.1.2"),
              Mount(host_path=gbm, container_path="/l/libnvidia-egl-gbm.so.1"))
    caps = {"/l/nvidia/libcuda.so.550": "compute", "/l/libnvidia-egl-gbm.so.1.1.2": "other"}
    kept = filter_edits(ContainerEdits(mounts=mounts), caps, frozenset({"utility"}))
    assert [m.container_path for m in kept.mounts] == [
        "/l/libnvidia-egl-gbm.so.1.1.2", "/l/libnvidia-egl-gbm.so.1"]
    whole = filter_edits(ContainerEdits(mounts=mounts), caps, frozenset({"compute"}))
    assert len(whole.mounts) == len(mounts)


# --- NVIDIA_VISIBLE_DEVICES ----------------------------------------------------------------

SIDECAR = {
    "driver": {"version": "550.54.15", "cudaVersion": "12.4"},
    "capabilities": {},
    "devices": {
        "0": {"type": "gpu", "gpuIndex": 0, "gpuUuid": "GPU-aaa", "busId": "0000:18:00.0",
              "arch": "8.0", "brand": "tesla"},
        "GPU-aaa": {"type": "gpu", "gpuIndex": 0, "gpuUuid": "GPU-aaa",
                    "busId": "0000:18:00.0", "arch": "8.0", "brand": "tesla"},
        "1": {"type": "gpu", "gpuIndex": 1, "gpuUuid": "GPU-bbb", "busId": "0000:2a:00.0"},
        "1:0": {"type": "mig", "gpuIndex": 1, "gpuUuid": "GPU-bbb", "migIndex": 0,
                "migUuid": "MIG-ccc"},
    },
}


def _facts() -> NodeFacts:
    spec = parse_sidecar("/s.yaml", "nvidia.com/gpu", SIDECAR)
    return NodeFacts(MappingProxyType({"/s.yaml": spec}), spec.devices)


@pytest.mark.parametrize("value, expected", [
    ("", []), ("void", []), ("none", []), ("0,void", []),
    ("0", ["nvidia.com/gpu=0"]),
    ("gpu-AAA", ["nvidia.com/gpu=0"]),  # one name per GPU: the first by name
    ("1:0", ["nvidia.com/gpu=1:0"]),
    ("MIG-ccc", ["nvidia.com/gpu=1:0"]),
    ("0000:2a:00.0", ["nvidia.com/gpu=1"]),
    ("0,0", ["nvidia.com/gpu=0"]),
    ("nvidia.com/gpu=1", ["nvidia.com/gpu=1"]),
    ("all", ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=1:0"]),
])
def test_visible_devices(value: str, expected: list[str]) -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": value}
    assert visible_device_names(env, Snapshot(), _facts()) == expected


def test_visible_devices_unknown_and_legacy() -> None:
    with pytest.raises(VisibleDevicesError, match="unknown device '9'"):
        visible_device_names({"NVIDIA_VISIBLE_DEVICES": "9"}, Snapshot(), _facts())
    assert visible_device_names({}, Snapshot(), _facts()) == []
    assert len(visible_device_names({}, Snapshot(), _facts(), legacy=True)) == 3


# --- privileged ----------------------------------------------------------------------------

def test_privileged_from_device_cgroup() -> None:
    ctr = nri_pb2.Container()
    ctr.linux.resources.devices.add(allow=False, access="rwm")
    assert not is_privileged(ctr)
    rule = ctr.linux.resources.devices.add(allow=True, type="c", access="rwm")
    rule.major.value = 195
    assert not is_privileged(ctr)
    ctr.linux.resources.devices.add(allow=True, access="rwm")
    assert is_privileged(ctr)
