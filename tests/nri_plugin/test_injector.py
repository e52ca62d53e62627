"""Requests → adjustments, without sockets: annotations, the pure plan, the NRI mapping."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pytest

from cdi.cache import Device, Snapshot, SpecCache
from cdi.model import ContainerEdits, IntelRdt, NetDevice
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.dispatch import Dispatcher, RpcError
from nri_plugin.nri.stub import Stub, StubOptions
from nri_plugin.nri.versions import RuntimeInfo, SpecDirs
from nri_plugin.nri.wire import Code
from nri_plugin.plugins.cdi_injector.asked import read_asked
from nri_plugin.plugins.cdi_injector.context import (
    ContainerContext,
    DeviceRequest,
    RequestError,
    bare_context,
    container_requests,
    pod_requests,
    read_context,
    unique_requests,
)
from nri_plugin.plugins.cdi_injector.injector import CdiInjector, Wiring
from nri_plugin.plugins.cdi_injector.plan import (
    InjectionError,
    PlanFor,
    UnsupportedEditsError,
    to_adjustment,
)
from nri_plugin.plugins.cdi_injector.policy import Policy
from nri_plugin.plugins.cdi_injector.vendor import Registry, RequestSource
from nri_plugin.vendors.nvidia.rules import NvidiaRules
from tests.helpers import annotations_policy, plan_injection, write_specs
from tests.nri_runtime_peer import RuntimePeer

# The injector's own annotation sources allowed everywhere: these tests ask by annotation.
OPEN = annotations_policy(nvidia=False)

CONTAINERD_17 = RuntimeInfo.from_configure("containerd", "v1.7.24")
CONTAINERD_21 = RuntimeInfo.from_configure("containerd", "v2.1.3")
CONTAINERD_23 = RuntimeInfo.from_configure("containerd", "2.3.0")

SPEC = """\
cdiVersion: 0.7.0
kind: example.com/gpu
containerEdits:
  env: [GPU_SPEC=1, SHARED=spec]
  deviceNodes: [{path: /dev/ctl, type: c, major: 195, minor: 255, fileMode: 438}]
  mounts:
  - {hostPath: /drv/lib/libx.so.1, containerPath: /usr/lib/libx.so.1, options: [ro, bind]}
  - {hostPath: /drv/lib, containerPath: /usr/lib/drv, options: [ro, rbind]}
  hooks:
  - {hookName: createContainer, path: /usr/bin/nri-cdi, args: [nri-cdi, hook, x], timeout: 5}
devices:
- name: "0"
  containerEdits:
    env: [SHARED=dev0]
    deviceNodes:
    - {path: /dev/gpu0, type: c, major: 195, minor: 0, permissions: rw, uid: 1, gid: 2}
- name: "1"
  containerEdits:
    deviceNodes: [{path: /dev/gpu1, type: c, major: 195, minor: 1}]
- name: grouped
  containerEdits:
    deviceNodes: [{path: /dev/gpu2, type: c, major: 195, minor: 2}]
    additionalGids: [44]
"""
NET_SPEC = """\
cdiVersion: 1.1.0
kind: example.com/nic
devices:
- name: n0
  containerEdits:
    netDevices: [{hostInterfaceName: eth9, name: net0}]
    intelRdt: {closID: gold, schemata: ["L3:0=f"], enableMonitoring: true}
"""


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Snapshot:
    folder = write_specs(tmp_path_factory.mktemp("cdi"), {"gpu.yaml": SPEC, "nic.yaml": NET_SPEC})
    snap = SpecCache([str(folder)]).refresh()
    assert not snap.errors
    return snap


def requested_devices(pod: dict[str, str], name: str, ctr: dict[str, str]) -> list[DeviceRequest]:
    """The annotation sources in the order ``context.read_context`` joins them."""
    return unique_requests(pod_requests(pod, name) + container_requests(ctr))


def names(requests: list[DeviceRequest]) -> list[str]:
    return [r.name for r in requests]


def test_requests_from_pod_container_key_and_container_annotations() -> None:
    pod = {"cdi.k8s.io/gpu": "example.com/gpu=0", "cdi.k8s.io/ctr.worker": "example.com/gpu=1",
           "cdi.k8s.io/ctr.other": "example.com/gpu=grouped", "unrelated": "x"}
    ctr = {"cdi.k8s.io/nvidia.gpu_dev1": "example.com/gpu=1,example.com/gpu=9"}
    assert names(requested_devices(pod, "worker", ctr)) == [  # pod keys sorted, then container
        "example.com/gpu=1", "example.com/gpu=0", "example.com/gpu=9"]
    assert names(requested_devices(pod, "sidecar", {})) == ["example.com/gpu=0"]
    assert requested_devices({}, "x", {"io.kubernetes.cri.container-type": "container"}) == []
    sources = {r.name: r.source for r in requested_devices(pod, "worker", ctr)}
    assert sources["example.com/gpu=1"] == "pod annotation 'cdi.k8s.io/ctr.worker'"
    assert sources["example.com/gpu=9"] == "container annotation 'cdi.k8s.io/nvidia.gpu_dev1'"


@pytest.mark.parametrize("pod, ctr, message", [
    ({"cdi.k8s.io/gpu": "nvidia.com/gpu=0,"}, {}, "pod annotation 'cdi.k8s.io/gpu': invalid CDI"),
    ({}, {"cdi.k8s.io/x": "gpu0"}, "container annotation 'cdi.k8s.io/x': invalid CDI device"),
    ({"cdi.k8s.io/-bad-": "a.com/b=c"}, {}, "pod annotation 'cdi.k8s.io/-bad-': invalid key"),
])
def test_malformed_annotations_name_the_annotation(pod: dict, ctr: dict, message: str) -> None:
    with pytest.raises(RequestError, match=message) as info:
        requested_devices(pod, "c", ctr)
    assert info.value.reason.annotation == next(iter({**pod, **ctr}))
    assert info.value.reason.rule == "request.annotation"


def test_annotations_are_read_apart_and_a_bad_one_fails_every_time() -> None:
    ask = {"cdi.k8s.io/gpu": "vendor.com/gpu=0,vendor.com/gpu=1"}
    assert pod_requests(ask, "a") == pod_requests(ask, "b")
    assert [r.source for r in container_requests(ask)] == [
        "container annotation 'cdi.k8s.io/gpu'"] * 2  # kept apart from the pod's
    for _ in range(2):
        with pytest.raises(RequestError, match=r"cdi\.k8s\.io/bad"):
            pod_requests({"cdi.k8s.io/bad": "not-a-name"}, "a")


def test_plan_matches_cdi_semantics(snapshot: Snapshot) -> None:
    requests = [DeviceRequest("example.com/gpu=1", "s"), DeviceRequest("example.com/gpu=0", "s")]
    plan = plan_injection(snapshot, requests, CONTAINERD_17, PlanFor(uid=1000, gid=100))
    adj = plan.adjustment
    assert plan.devices == ("example.com/gpu=1", "example.com/gpu=0") and not plan.delegated
    assert [(kv.key, kv.value) for kv in adj.env] == [("GPU_SPEC", "1"), ("SHARED", "dev0")]
    assert [(d.path, d.major, d.minor, d.file_mode.value if d.HasField("file_mode") else None,
             d.uid.value, d.gid.value) for d in adj.linux.devices] == [
        ("/dev/ctl", 195, 255, 0o666, 1000, 100),
        ("/dev/gpu1", 195, 1, None, 1000, 100),
        ("/dev/gpu0", 195, 0, None, 1, 2)]
    # NRI 0.6 derives "rw" for each node and drops explicit rules: none sent
    assert not adj.linux.resources.devices
    # NRI 0.12 applies them: only what its own "rw" rule lacks (m), never "rw" twice
    newer = plan_injection(snapshot, requests, CONTAINERD_23, PlanFor(uid=1000, gid=100)).adjustment
    assert [(r.type, r.major.value, r.minor.value, r.access)
            for r in newer.linux.resources.devices] == [
        ("c", 195, 255, "rwm"), ("c", 195, 1, "rwm")]
    assert [m.destination for m in adj.mounts] == ["/usr/lib/libx.so.1", "/usr/lib/drv"]
    assert list(adj.mounts[1].options) == ["ro", "rbind"] and adj.mounts[1].source == "/drv/lib"
    hook = adj.hooks.create_container[0]
    assert (hook.path, list(hook.args), hook.timeout.value) == (
        "/usr/bin/nri-cdi", ["nri-cdi", "hook", "x"], 5)
    assert not adj.CDI_devices


def test_unresolvable_names_device_and_annotation(snapshot: Snapshot) -> None:
    requests = [DeviceRequest("example.com/gpu=7", "pod annotation 'cdi.k8s.io/gpu'")]
    with pytest.raises(InjectionError) as info:
        plan_injection(snapshot, requests, CONTAINERD_17)
    assert str(info.value) == (
        "unresolvable CDI devices: example.com/gpu=7 (from pod annotation 'cdi.k8s.io/gpu'): "
        "no such device in the spec directories")


def test_inexpressible_edits_fail_on_old_runtimes(snapshot: Snapshot) -> None:
    requests = [DeviceRequest("example.com/gpu=grouped", "s")]
    with pytest.raises(InjectionError, match=r"additionalGids \(NRI cannot add supplementary"):
        plan_injection(snapshot, requests, CONTAINERD_17)


def test_gids_alone_are_dropped_on_old_runtimes_when_the_policy_says_drop(
        snapshot: Snapshot) -> None:
    requests = [DeviceRequest("example.com/gpu=grouped", "s")]
    plan = plan_injection(snapshot, requests, CONTAINERD_17, PlanFor(drop_gids=True))
    assert plan.dropped_gids == (44,) and not plan.delegated
    assert [d.path for d in plan.adjustment.linux.devices] == ["/dev/ctl", "/dev/gpu2"]
    # a runtime that can take the devices gets them, gids and all, as native CDI
    plan = plan_injection(snapshot, requests, CONTAINERD_21, PlanFor(drop_gids=True))
    assert plan.delegated == ("example.com/gpu=grouped",) and not plan.dropped_gids


def test_the_injector_drops_gids_by_default_and_refuses_them_on_request(
        snapshot: Snapshot, caplog: pytest.LogCaptureFixture) -> None:

    def create(policy: dict[str, str]) -> nri_pb2.ContainerAdjustment | None:
        plugin = CdiInjector(lambda: Registry(snapshot),
                             policy=annotations_policy(policy, nvidia=False))
        plugin.configure("", "containerd", "v1.7.24")
        return plugin.create_container(
            nri_pb2.PodSandbox(name="p", namespace="ns",
                               annotations={"cdi.k8s.io/gpu": "example.com/gpu=grouped"}),
            nri_pb2.Container(name="c"))

    adjusted = create({})
    assert adjusted is not None and [d.path for d in adjusted.linux.devices][-1] == "/dev/gpu2"
    assert "additionalGids 44 left out" in caplog.text
    with pytest.raises(RpcError, match=r"additionalGids \(NRI cannot add"):
        create({"additionalGids": "refuse"})


def test_inexpressible_edits_go_to_the_runtimes_cdi_when_it_can(snapshot: Snapshot) -> None:
    requests = [DeviceRequest("example.com/gpu=grouped", "s")]
    plan = plan_injection(snapshot, requests, CONTAINERD_21)
    assert plan.delegated == ("example.com/gpu=grouped",)
    assert [d.name for d in plan.adjustment.CDI_devices] == list(plan.delegated)
    assert not plan.adjustment.linux.devices and not plan.adjustment.env


class DropMounts:
    """A vendor's filter that leaves out every mount (as NVIDIA_DRIVER_CAPABILITIES leaves
    out the driver files of capabilities not asked for)."""

    def apply(self, edits: ContainerEdits) -> ContainerEdits:
        return edits._replace(mounts=())


def test_nothing_is_handed_to_the_runtimes_cdi_that_would_lose_the_plugins_work(
        snapshot: Snapshot) -> None:
    """Seen with a real kubelet on containerd 2.x (its CDI on, folders shared): devices
    carrying additionalGids were all handed over, and the runtime then applied the spec
    whole, ignoring the capability trim and the hook-free library path. Only what loses
    nothing is handed over; otherwise the plugin applies the devices itself and the groups
    go by the policy."""
    requests = [DeviceRequest("example.com/gpu=grouped", "s")]
    trimmed = plan_injection(snapshot, requests, CONTAINERD_21,
                             PlanFor(edit_filter=DropMounts(), drop_gids=True))
    assert not trimmed.delegated and not trimmed.adjustment.CDI_devices
    assert trimmed.dropped_gids == (44,) and not trimmed.adjustment.mounts
    assert "driver mount(s) the container did not ask for" in trimmed.kept_because
    with pytest.raises(InjectionError, match=r"would lose this: 2 driver mount"):
        plan_injection(snapshot, requests, CONTAINERD_21, PlanFor(edit_filter=DropMounts()))


def test_a_hook_free_spec_is_not_handed_over_its_library_path_would_be_lost(
        tmp_path: Path) -> None:
    folder = write_specs(tmp_path / "cdi", {"v.yaml": """\
cdiVersion: 0.7.0
kind: vendor.com/gpu
containerEdits:
  env: [NRI_CDI_LD_LIBRARY_PATH=/usr/lib/drv]
devices:
- name: "0"
  containerEdits:
    deviceNodes: [{path: /dev/vgpu0, type: c, major: 195, minor: 0}]
    additionalGids: [44]
"""})
    snap = SpecCache([str(folder)]).refresh()
    shared = dataclasses.replace(CONTAINERD_21, cdi_spec_dirs=SpecDirs.of((str(folder),)))
    plan = plan_injection(snap, [DeviceRequest("vendor.com/gpu=0", "s")], shared,
                          PlanFor(library_path="/opt/image/lib", drop_gids=True))
    assert not plan.delegated and plan.dropped_gids == (44,)
    env = {kv.key: kv.value for kv in plan.adjustment.env}
    assert env == {"LD_LIBRARY_PATH": "/opt/image/lib:/usr/lib/drv"}


def test_delegation_the_runtimes_cdi_cannot_read_is_refused_with_the_cause(
        snapshot: Snapshot) -> None:
    # nic.yaml is cdiVersion 1.1.0: containerd 2.1's CDI library (1.0.1) would fail it
    # with "unresolvable CDI devices" after we answered; we say why instead.
    requests = [DeviceRequest("example.com/gpu=grouped", "s"),
                DeviceRequest("example.com/nic=n0", "s")]
    with pytest.raises(InjectionError, match=r"nic=n0: its spec .*nic.yaml is cdiVersion "
                       r"1\.1\.0, and containerd's CDI library 1\.0\.1 of containerd 2\.1\.3 "
                       r"\(NRI 0\.8\.0\) reads up to 1\.0\.0"):
        plan_injection(snapshot, requests, CONTAINERD_21)
    elsewhere = dataclasses.replace(CONTAINERD_21,
                                    cdi_spec_dirs=SpecDirs.of(("/etc/cdi", "/var/run/cdi")))
    with pytest.raises(InjectionError, match=r"gpu=grouped: its spec .*gpu.yaml is not in a "
                       r"folder the runtime's own CDI reads \(/etc/cdi, /var/run/cdi\)"):
        plan_injection(snapshot, requests[:1], elsewhere)
    folder = str(Path(snapshot.devices["example.com/gpu=grouped"].spec.path).parent)
    seen = dataclasses.replace(CONTAINERD_21, cdi_spec_dirs=SpecDirs.of(("/etc/cdi", folder)))
    assert plan_injection(snapshot, requests[:1], seen).delegated == (requests[0].name,)


def test_net_devices_and_rdt_are_native_from_nri_0_11(snapshot: Snapshot) -> None:
    plan = plan_injection(snapshot, [DeviceRequest("example.com/nic=n0", "s")], CONTAINERD_23)
    linux = plan.adjustment.linux
    assert linux.net_devices["eth9"].name == "net0"
    assert (linux.rdt.clos_id.value, list(linux.rdt.schemata.value),
            linux.rdt.enable_monitoring.value) == ("gold", ["L3:0=f"], True)
    with pytest.raises(UnsupportedEditsError, match="l3CacheSchema"):
        to_adjustment(ContainerEdits(intel_rdt=IntelRdt(l3_cache_schema="L3:0=1")),
                      runtime=CONTAINERD_23)
    with pytest.raises(UnsupportedEditsError, match="netDevices"):
        to_adjustment(ContainerEdits(net_devices=(NetDevice(host_interface_name="a", name="b"),)),
                      runtime=CONTAINERD_17)


class CountingVendor:
    """A vendor with no rules of its own that records each time it is asked."""

    name = "counting"
    sources: tuple[RequestSource, ...] = ()
    default_denials: tuple[str, ...] = ()
    hooks: tuple[str, ...] = ()
    annotation_prefixes: tuple[str, ...] = ()
    env_request_prefixes: tuple[str, ...] = ()
    verdict_env: tuple[str, ...] = ()
    extras_env: tuple[str, ...] = ()
    filter_env: tuple[str, ...] = ()

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def load_facts(self, snapshot: Snapshot) -> object:
        return None

    def verdict(self, context: ContainerContext, names: Sequence[str], policy: Policy,
                snapshot: Snapshot, facts: object) -> None:
        self.calls.append(f"verdict {','.join(names)} for {context.container_name}")


@pytest.mark.parametrize("runtime", ["1.7.24", "2.1.3"])
def test_one_pass_asks_each_vendor_once_and_looks_each_device_up_once(
        snapshot: Snapshot, runtime: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    lookup = Snapshot.lookup

    def counted(self: Snapshot, names: Iterable[str]) -> list[Device]:
        calls.append("lookup")
        return lookup(self, names)

    monkeypatch.setattr(Snapshot, "lookup", counted)
    plugin = CdiInjector(lambda: Registry(snapshot), vendors=[CountingVendor(calls)],
                         policy=OPEN)
    plugin.PLAN_CACHE_SIZE = 0  # nothing cached: every step runs
    plugin.configure("", "containerd", runtime)  # 2.1: the devices are handed over
    pod = nri_pb2.PodSandbox(name="p", namespace="ns",
                             annotations={"cdi.k8s.io/g": "example.com/gpu=grouped"})
    assert plugin.create_container(pod, nri_pb2.Container(name="c")) is not None
    assert calls == ["lookup", "verdict example.com/gpu=grouped for c"]


@pytest.mark.parametrize("name, version, cdi_devices", [
    ("containerd", "v1.7.24", False), ("containerd", "1.7.30", True),
    ("containerd", "v2.0.5", False), ("containerd", "v2.1.0", True),
    ("cri-o", "1.33.2", False), ("cri-o", "1.34.0", True), ("other", "9.9", False),
])
def test_runtime_capabilities(name: str, version: str, cdi_devices: bool) -> None:
    assert RuntimeInfo.from_configure(name, version).supports_cdi_devices is cdi_devices


def test_dispatch_create_container(snapshot: Snapshot) -> None:
    plugin = CdiInjector(lambda: Registry(snapshot), policy=OPEN)
    plugin.configure("", "containerd", "v1.7.24")
    request = nri_pb2.CreateContainerRequest(
        pod=nri_pb2.PodSandbox(name="p", namespace="ns",
                               annotations={"cdi.k8s.io/gpu": "example.com/gpu=0"}),
        container=nri_pb2.Container(name="c"))
    reply = nri_pb2.CreateContainerResponse.FromString(
        Dispatcher(plugin).dispatch("CreateContainer", request.SerializeToString()))
    assert [d.path for d in reply.adjust.linux.devices] == ["/dev/ctl", "/dev/gpu0"]
    empty = nri_pb2.CreateContainerRequest(pod=nri_pb2.PodSandbox(), container=nri_pb2.Container())
    assert Dispatcher(plugin).dispatch("CreateContainer", empty.SerializeToString()) == b""


def test_create_container_over_a_socket_refuses_only_the_bad_request(
    snapshot: Snapshot, tmp_path: Path
) -> None:
    async def main() -> None:
        ours, theirs = socket.socketpair()
        stub = Stub(CdiInjector(lambda: Registry(snapshot), policy=OPEN),
                    StubOptions(sock=ours, name="nri-cdi", idx="10", env={}))
        runner = asyncio.create_task(stub.run())
        peer = RuntimePeer(*await asyncio.open_unix_connection(sock=theirs))
        await peer.handshake()
        bad = nri_pb2.CreateContainerRequest(
            pod=nri_pb2.PodSandbox(annotations={"cdi.k8s.io/gpu": "example.com/gpu=nope"}),
            container=nri_pb2.Container(name="c"))
        good = nri_pb2.CreateContainerRequest(
            pod=nri_pb2.PodSandbox(annotations={"cdi.k8s.io/gpu": "example.com/gpu=1"}),
            container=nri_pb2.Container(name="c"))
        bad_stream = peer.send_request("CreateContainer", bad)
        good_stream = peer.send_request("CreateContainer", good)
        failed = await peer.response_to(bad_stream)
        # What the pod's user reads (the runtime quotes code and message): the cause and
        # the device, and nothing internal.
        assert failed.status.code == Code.NOT_FOUND
        assert failed.status.message == (
            "nri-cdi: unresolvable CDI devices: example.com/gpu=nope (from pod annotation "
            "'cdi.k8s.io/gpu'): no such device in the spec directories")
        ok = await peer.response_to(good_stream)
        reply = nri_pb2.CreateContainerResponse.FromString(ok.payload)
        assert [d.path for d in reply.adjust.linux.devices] == ["/dev/ctl", "/dev/gpu1"]
        peer.close()
        await asyncio.wait_for(runner, 60)

    asyncio.run(asyncio.wait_for(main(), 20))


def test_hook_free_folders_are_appended_to_the_images_library_path() -> None:
    edits = ContainerEdits(env=("A=1", "NRI_CDI_LD_LIBRARY_PATH=/usr/lib64:/usr/lib64/vdpau"))
    adj = to_adjustment(edits, runtime=CONTAINERD_17, image_library_path="/opt/own::/usr/lib64")
    assert [(kv.key, kv.value) for kv in adj.env] == [
        ("A", "1"), ("LD_LIBRARY_PATH", "/opt/own:/usr/lib64:/usr/lib64/vdpau")]
    alone = to_adjustment(edits, runtime=CONTAINERD_17)
    assert [(kv.key, kv.value) for kv in alone.env] == [
        ("A", "1"), ("LD_LIBRARY_PATH", "/usr/lib64:/usr/lib64/vdpau")]


def test_the_context_keeps_only_the_env_names_the_injector_and_vendors_read(
        snapshot: Snapshot) -> None:
    """Kubernetes' service variables are neither parsed nor kept; what the NVIDIA vendor
    and the injector read is, the last entry of a name winning as in execve."""
    vendors = (NvidiaRules(),)
    wanted = {"NVIDIA_VISIBLE_DEVICES": "none", "NVIDIA_DRIVER_CAPABILITIES": "utility",
              "CUDA_VERSION": "12.4", "LD_LIBRARY_PATH": "/opt/lib"}
    ctr = nri_pb2.Container(name="app", env=[
        *(f"SVC{i}_SERVICE_HOST=10.0.{i // 250}.{i % 250}" for i in range(300)),
        "NVIDIA_VISIBLE_DEVICES=all", *(f"{k}={v}" for k, v in wanted.items()),
        "PATH=/bin", "NVIDIA_NO_VALUE"])
    context = read_asked(nri_pb2.PodSandbox(namespace="n"), ctr, Registry(snapshot, (None,)),
                         Policy.defaults(vendors), vendors)
    assert context.env == {**wanted, "NVIDIA_NO_VALUE": ""}
    everything = read_context(bare_context(None, ctr), (), Policy.defaults(vendors), snapshot)
    assert len(everything.env) == 300 + 5 + 1


def test_plans_are_kept_for_the_registry_in_force_and_never_changed(
        snapshot: Snapshot, tmp_path: Path) -> None:
    """The one cache: a repeat gets the plan made before (the same object, unchanged); a
    new registry snapshot empties it; another user gets a plan of its own."""
    registry = [Registry(snapshot)]
    plugin = CdiInjector(lambda: registry[0], policy=OPEN)
    plugin.configure("", "containerd", "v1.7.24")
    pod = nri_pb2.PodSandbox(name="p", namespace="ns",
                             annotations={"cdi.k8s.io/gpu": "example.com/gpu=0"})
    first = plugin.decide(pod, nri_pb2.Container(name="c"))
    again = plugin.decide(pod, nri_pb2.Container(name="d"))
    assert first is not None and again is first
    other_user = nri_pb2.Container(name="c")
    other_user.user.uid = 1000
    assert plugin.decide(pod, other_user) is not first
    registry[0] = Registry(SpecCache([str(Path(snapshot.spec_dirs[0]))]).refresh())
    fresh = plugin.decide(pod, nri_pb2.Container(name="c"))
    assert fresh is not None and fresh is not first
    assert fresh.adjustment == first.adjustment


def test_the_per_container_line_is_logged_after_the_reply(
        snapshot: Snapshot, caplog: pytest.LogCaptureFixture) -> None:
    """The runtime waits for the reply, not for the log line: the daemon hands the line to
    the event loop, which runs it once the reply is written."""
    later: list[Callable[[], None]] = []
    plugin = CdiInjector(lambda: Registry(snapshot), wiring=Wiring(after_reply=later.append),
                         policy=OPEN)
    plugin.configure("", "containerd", "v1.7.24")
    pod = nri_pb2.PodSandbox(name="p", namespace="ns",
                             annotations={"cdi.k8s.io/gpu": "example.com/gpu=0"})
    caplog.set_level(logging.INFO)
    assert plugin.create_container(pod, nri_pb2.Container(name="c")) is not None
    assert "injected container=c" not in caplog.text and len(later) == 1
    later[0]()
    assert "injected container=c pod=ns/p devices=example.com/gpu=0" in caplog.text
