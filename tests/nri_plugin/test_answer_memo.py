"""The injector's answers kept by request shape (``shape.RequestShape``): a repeat gets
exactly what a fresh injector would answer, whatever part of the request changes, and what
the answer does not read (ids, pod names, service variables, kubelet's mounts) never makes
it read the request again."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from cdi.cache import SpecCache
from nri_plugin.nri.api import nri_pb2
from nri_plugin.plugins.cdi_injector import injector as injector_module
from nri_plugin.plugins.cdi_injector.failclosed import MAX_NAMES
from nri_plugin.plugins.cdi_injector.injector import CdiInjector, Injection
from nri_plugin.plugins.cdi_injector.policy import Policy
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.plugins.cdi_injector.shape import KEY_CHARS_MAX, RequestShape
from nri_plugin.plugins.cdi_injector.vendor import Registry, RequestSource
from nri_plugin.vendors.nvidia.rules import NvidiaRules
from tests.helpers import nvidia_policy, write_specs
from tests.nri_plugin.test_nvidia_drop_in import SPEC, nvidia_registry

# The env and volume-mount sources allowed in one namespace only, so that the namespace,
# the env and the mounts all change answers.
POLICY = nvidia_policy({"sources": {
    "visibleDevicesEnv": {"enabled": True, "privilegedOnly": False, "namespaces": ["gpu-*"]},
    "volumeMounts": {"enabled": True, "namespaces": ["gpu-*"]}}})
DEVICE_ROOT = "/var/run/nvidia-container-devices"
# Each part of a request the answer may read, with values that change it.
PARTS: dict[str, list[object]] = {
    "namespace": ["default", "gpu-jobs"],
    "name": ["app", "side"],
    "privileged": [False, True],
    "uid": [0, 1000],
    "pod": [{}, {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}, {"cdi.k8s.io/ctr.app": "nvidia.com/gpu=1"},
            {"cdi.nri.io/pod": "nvidia.com/gpu=0"},
            {"nvidia.cdi.k8s.io/container.app": "nvidia.com/gpu=1:0"},
            {"cdi.k8s.io/gpu": "nvidia.com/gpu=9"}, {"cdi.k8s.io/gpu": "nvidia.com/gpu=0,"}],
    "container": [{}, {"cdi.k8s.io/nvidia_dev1": "nvidia.com/gpu=1"}],
    "env": [(), ("NVIDIA_VISIBLE_DEVICES=0",), ("NVIDIA_DRIVER_CAPABILITIES=utility",),
            ("LD_LIBRARY_PATH=/opt/x",), ("NVIDIA_VISIBLE_DEVICES=none",),
            ("NVIDIA_REQUIRE_CUDA=cuda>=99.0",), ("CUDA_VERSION=12.0",),
            ("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=1")],
    "mounts": [(), ((f"{DEVICE_ROOT}/0", "/dev/null"),), ((f"{DEVICE_ROOT}/1", "/dev//null"),)],
    "devices": [(), ("/dev/nvidia0",)],
    "cdi_devices": [(), ("nvidia.com/gpu=0",)],
}


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return nvidia_registry(tmp_path / "cdi")


def injector(registry: Callable[[], Registry], version: str = "2.1.9",
             policy: Policy = POLICY) -> CdiInjector:
    plugin = CdiInjector(registry, vendors=[NvidiaRules()], policy=policy)
    plugin.configure("", "containerd", version)
    return plugin


def request(parts: dict[str, object], noise: int) -> tuple[nri_pb2.PodSandbox, nri_pb2.Container]:
    """The request ``parts`` describe, with ``noise`` in everything the answer must not
    depend on: ids, the pod's name and UID, service variables, kubelet's own mounts."""
    pod = nri_pb2.PodSandbox(id=f"p{noise}", name=f"pod-{noise}", uid=f"u{noise}",
                             namespace=str(parts["namespace"]), annotations={
                                 **parts["pod"], "kubernetes.io/config.seen": str(noise)})
    ctr = nri_pb2.Container(id=f"c{noise}", pod_sandbox_id=f"p{noise}", name=str(parts["name"]),
                            annotations={**parts["container"],
                                         "io.kubernetes.cri.sandbox-name": f"pod-{noise}"},
                            env=[f"SVC{noise}_SERVICE_HOST=10.0.0.{noise % 250}",
                                 f"HOSTNAME=pod-{noise}", *parts["env"]])
    ctr.user.uid = ctr.user.gid = int(parts["uid"])  # type: ignore[call-overload]
    for destination, source in (("/etc/hosts", f"/var/lib/kubelet/pods/u{noise}/etc-hosts"),
                                *parts["mounts"]):
        ctr.mounts.add(destination=destination, source=source, type="bind")
    if parts["privileged"]:
        ctr.linux.resources.devices.add(allow=True, access="rwm")
    else:
        ctr.linux.resources.devices.add(allow=False, access="rwm")
    for path in parts["devices"]:
        ctr.linux.devices.add(path=path, type="c", major=195, minor=0)
    for name in parts["cdi_devices"]:
        ctr.CDI_devices.add(name=name)
    return pod, ctr


def outcome(plugin: CdiInjector, pod: nri_pb2.PodSandbox,
            ctr: nri_pb2.Container) -> tuple[object, ...] | None:
    try:
        injection = plugin.adjustment_for(pod, ctr)
    except Refusal as exc:
        return ("refused", type(exc).__name__, str(exc))
    if injection is None:
        return None
    return (injection.adjustment.SerializeToString(deterministic=True), injection.devices,
            injection.delegated, injection.dropped_gids)


def counting(plugin: CdiInjector) -> list[int]:
    """How many times ``plugin`` decided a request afresh."""
    calls = [0]
    answer = plugin._answer

    def counted(*args: object) -> tuple[Injection | None, bool, bool]:
        calls[0] += 1
        return answer(*args)  # type: ignore[arg-type]

    plugin._answer = counted  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("version", ["1.7.24", "2.1.9"])
def test_a_repeat_gets_what_a_fresh_injector_answers(registry: Registry, version: str) -> None:
    draw = random.Random(24)  # each part left as it is half the time, else any of its values
    bases = [{part: values[0] if draw.random() < 0.5 else draw.choice(values)
              for part, values in PARTS.items()} for _ in range(25)]
    # Each base with one part changed to each of its values, one after the other: a part
    # the key left out would have two of them share an answer.
    shapes = [{**base, part: value} for base in bases
              for part, values in PARTS.items() for value in values]
    kept = injector(lambda: registry, version)
    calls = counting(kept)
    served, kinds = 0, set()
    for round_ in range(2):
        for index, parts in enumerate(shapes):
            pod, ctr = request(parts, noise=round_ * 1000 + index)
            key = kept._shape.key(pod, ctr)
            known, before = key in kept._answers, calls[0]
            got = outcome(kept, pod, ctr)
            assert got == outcome(injector(lambda: registry, version), pod, ctr), parts
            assert (calls[0] == before) is known  # served again exactly when kept
            served += known
            kinds.add("none" if got is None else "refused" if got[0] == "refused" else "inj")
    # Refusals are decided afresh each time (never kept); the draw covered every kind.
    assert served >= len(shapes) // 4 and kinds == {"none", "refused", "inj"}


def test_what_the_answer_does_not_read_never_makes_it_read_again(registry: Registry) -> None:
    plugin = injector(lambda: registry)
    calls = counting(plugin)
    parts = {part: values[0] for part, values in PARTS.items()}
    parts["pod"] = {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}
    answers = {outcome(plugin, *request(parts, noise)) for noise in range(5)}
    assert calls[0] == 1 and len(answers) == 1 and None not in answers


def test_another_registry_or_policy_is_asked_afresh(registry: Registry, tmp_path: Path) -> None:
    current = [registry]
    plugin = injector(lambda: current[0])
    calls = counting(plugin)
    parts = {part: values[0] for part, values in PARTS.items()}
    parts["pod"] = {"cdi.k8s.io/gpu": "nvidia.com/gpu=1"}
    assert outcome(plugin, *request(parts, 1)) is not None
    # The same specs without device 1: a repeat of the same shape is refused now.
    folder = write_specs(tmp_path / "other", {"nvidia.yaml": SPEC.split('- name: "1"')[0]})
    current[0] = Registry.load(SpecCache([str(folder)]).refresh(), [NvidiaRules()])
    refused = outcome(plugin, *request(parts, 2))
    assert refused is not None and refused[0] == "refused" and "nvidia.com/gpu=1" in refused[2]
    current[0] = registry
    assert outcome(plugin, *request(parts, 3)) is not None
    plugin.set_policy(nvidia_policy({"sources": {"podAnnotations": {"enabled": False}}}))
    denied = outcome(plugin, *request(parts, 4))
    assert denied is not None and denied[1] == "PolicyDenied"
    assert calls[0] == 4


def test_a_removal_pending_on_a_repeat_is_applied_first(registry: Registry,
                                                        tmp_path: Path) -> None:
    """``on_hit`` (a spec file removed, the registry not updated yet) is asked on a repeat
    too, and the registry it gives decides: a deleted claim never serves again."""
    folder = write_specs(tmp_path / "other", {"nvidia.yaml": SPEC.split('- name: "1"')[0]})
    without = Registry.load(SpecCache([str(folder)]).refresh(), [NvidiaRules()])
    current = [registry]
    pending: list[Registry] = []

    def on_hit() -> Registry | None:
        if not pending:
            return None
        current[0] = pending.pop()
        return current[0]

    plugin = CdiInjector(lambda: current[0], vendors=[NvidiaRules()], policy=POLICY,
                         on_hit=on_hit)
    plugin.configure("", "containerd", "2.1.9")
    parts = {part: values[0] for part, values in PARTS.items()}
    parts["pod"] = {"cdi.k8s.io/gpu": "nvidia.com/gpu=1"}
    assert outcome(plugin, *request(parts, 1)) is not None
    assert outcome(plugin, *request(parts, 2)) is not None  # a repeat: served again
    pending.append(without)
    refused = outcome(plugin, *request(parts, 3))
    assert refused is not None and refused[0] == "refused"


def test_kept_answers_and_their_keys_are_bounded(registry: Registry) -> None:
    plugin = injector(lambda: registry)
    calls = counting(plugin)
    parts = {part: values[0] for part, values in PARTS.items()}
    parts["env"] = (f"NVIDIA_DRIVER_CAPABILITIES={'x' * KEY_CHARS_MAX}",)
    for noise in range(3):  # over the key limit: decided each time, never kept
        outcome(plugin, *request(parts, noise))
    assert calls[0] == 3 and not plugin._answers
    for noise in range(plugin.PLAN_CACHE_SIZE + 20):
        parts["env"] = (f"NVIDIA_DRIVER_CAPABILITIES=utility{noise}",)
        outcome(plugin, *request(parts, noise))
    assert len(plugin._answers) == plugin.PLAN_CACHE_SIZE


def test_the_mounts_in_the_key_are_those_a_mounts_source_can_read() -> None:
    nvidia = RequestShape.of((), (), NvidiaRules.sources, [NvidiaRules()])
    assert nvidia.mount_marks == ("null",)
    assert "nvidia.cdi.k8s.io/" in nvidia.annotation_prefixes
    ctr = nri_pb2.Container(name="app")
    ctr.mounts.add(destination="/etc/hosts", source="/var/lib/kubelet/pods/u/etc-hosts")
    ctr.mounts.add(destination=f"{DEVICE_ROOT}/0", source="/dev/null")
    key = nvidia.key(nri_pb2.PodSandbox(), ctr)
    assert key is not None and ((f"{DEVICE_ROOT}/0", "/dev/null"),) in key
    anything = RequestShape.of((), (), [RequestSource(
        name="m", default=NvidiaRules.sources[1].default, read_from="mounts",
        read=lambda *_: [])], [])
    assert anything.mount_marks == ()
    key = anything.key(nri_pb2.PodSandbox(), ctr)
    assert key is not None and len(key[8]) == 2  # type: ignore[arg-type]
    assert RequestShape.of((), (), [], []).key(nri_pb2.PodSandbox(), ctr)[8] == ()  # type: ignore[index]


def test_names_are_counted_for_a_new_shape_only(registry: Registry,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap on device names is checked before a new shape is read, by the injector alone
    (no guard in front), and not again for a repeat: its shape was counted when it was
    first answered, and a refused shape is never kept."""
    counted = [0]
    real = injector_module.too_many_names

    def count(*args: object) -> str | None:
        counted[0] += 1
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(injector_module, "too_many_names", count)
    plugin = injector(lambda: registry)
    parts = {part: values[0] for part, values in PARTS.items()}
    parts["pod"] = {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}
    first = outcome(plugin, *request(parts, 1))
    assert first is not None and first[0] != "refused" and counted[0] == 1
    assert outcome(plugin, *request(parts, 2)) == first and counted[0] == 1
    parts["pod"] = {"cdi.k8s.io/gpu": ",".join(f"nvidia.com/gpu={i % 2}"
                                                for i in range(MAX_NAMES + 1))}
    for noise in (3, 4):  # refused each time, counted each time
        refused = outcome(plugin, *request(parts, noise))
        assert refused is not None and refused[:2] == ("refused", "TooManyNamesError")
        assert f"over {MAX_NAMES}" in str(refused[2])
    assert counted[0] == 3
