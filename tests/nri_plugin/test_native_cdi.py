"""With the runtime's own CDI on, devices named in container cdi.k8s.io annotations are the
runtime's: the plugin neither injects them again nor counts them as missing at Synchronize.
Env-only devices are judged by the values all requested devices give together."""

from __future__ import annotations

import pytest

from cdi.cache import Snapshot, SpecCache
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.versions import CDI_OFF, NativeCdi, RuntimeInfo, SpecDirs
from nri_plugin.plugins.cdi_injector.delegation import RuntimeCdiConfig
from nri_plugin.plugins.cdi_injector.injector import CdiInjector, Wiring
from nri_plugin.plugins.cdi_injector.policy import Policy
from nri_plugin.plugins.cdi_injector.unserved import find_unserved
from nri_plugin.plugins.cdi_injector.vendor import Registry
from tests.helpers import write_specs

SPEC = """\
cdiVersion: 0.5.0
kind: example.com/dev
devices:
- name: envonly
  containerEdits: {env: [FOO=from-env-device]}
- name: node
  containerEdits:
    env: [FOO=bar]
    deviceNodes: [{path: /dev/ex0, type: c, major: 241, minor: 0}]
    hooks: [{hookName: createContainer, path: /bin/true}]
"""
BOTH = "example.com/dev=envonly,example.com/dev=node"


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Snapshot:
    folder = write_specs(tmp_path_factory.mktemp("cdi"), {"dev.yaml": SPEC})
    return SpecCache([str(folder)]).refresh()


def _pod() -> nri_pb2.PodSandbox:
    return nri_pb2.PodSandbox(id="p1", name="p", namespace="default")


def _native_result(annotations: dict[str, str]) -> nri_pb2.Container:
    """A container as containerd's own CDI left it: FOO=bar (node after envonly), the node."""
    ctr = nri_pb2.Container(id="c1", pod_sandbox_id="p1", name="app", annotations=annotations,
                            env=["PATH=/bin", "FOO=bar"], state=nri_pb2.CONTAINER_RUNNING)
    ctr.linux.devices.add(path="/dev/ex0", type="c", major=241, minor=0)
    return ctr


def _plugin(snapshot: Snapshot, enabled: NativeCdi, version: str = "2.1.9") -> CdiInjector:
    plugin = CdiInjector(lambda: Registry(snapshot), wiring=Wiring(runtime_cdi=RuntimeCdiConfig(
        enabled=enabled, spec_dirs=SpecDirs.of(snapshot.spec_dirs), origin="test")))
    plugin.configure("", "containerd", version)
    return plugin


def test_runtime_injected_annotations_are_left_alone(snapshot: Snapshot) -> None:
    plugin = _plugin(snapshot, NativeCdi.UNKNOWN)  # containerd 2.x: on by default
    assert plugin.runtime.native_cdi is NativeCdi.ON
    assert plugin.create_container(_pod(), _native_result({"cdi.k8s.io/x": BOTH})) is None


def test_without_native_cdi_the_env_only_device_would_flip_the_value(
        snapshot: Snapshot) -> None:
    # What the issue saw with 2.x defaults: only the node device was recognised, the
    # env-only one applied again over FOO=bar.
    plugin = _plugin(snapshot, NativeCdi.OFF)
    adjustment = plugin.create_container(_pod(), _native_result({"cdi.k8s.io/x": BOTH}))
    assert adjustment is not None
    assert [(kv.key, kv.value) for kv in adjustment.env] == [("FOO", "from-env-device")]


def test_native_cdi_set_but_evidently_off_injects(snapshot: Snapshot) -> None:
    # containerd 2.0 takes no CDI_devices: the plugin injects itself (2.1 would be handed
    # the request, for the node's rwm: see test_nri_versions.py)
    plugin = _plugin(snapshot, NativeCdi.ON, "2.0.5")
    bare = nri_pb2.Container(id="c2", pod_sandbox_id="p1", name="app",
                             annotations={"cdi.k8s.io/x": BOTH})  # no /dev/ex0: not injected
    adjustment = plugin.create_container(_pod(), bare)
    assert adjustment is not None and [d.path for d in adjustment.linux.devices] == ["/dev/ex0"]


def test_synchronize_does_not_evict_what_the_runtime_injected(
        snapshot: Snapshot) -> None:
    ctr = _native_result({"cdi.k8s.io/x": BOTH})
    # env-only device: FOO's final value is the node device's; the container has it
    judge = CdiInjector(lambda: Registry(snapshot), policy=Policy())
    assert find_unserved([_pod()], [ctr], judge) == []
    bare = nri_pb2.Container(id="c2", pod_sandbox_id="p1", name="app", env=["FOO=bar"],
                             annotations={"cdi.k8s.io/x": BOTH},
                             state=nri_pb2.CONTAINER_RUNNING)
    found = find_unserved([_pod()], [bare], judge)
    assert [u.missing for u in found] == [("example.com/dev=node",)]
    # With the runtime's CDI on, container annotations are its business, not ours...
    assert find_unserved([_pod()], [ctr], judge, NativeCdi.ON) == []
    # ...where the container shows it did inject them: judged as the injector judges it
    # (its node is not there, so the runtime's CDI did not run and the device is missing).
    on = find_unserved([_pod()], [bare], judge, NativeCdi.ON)
    assert [u.missing for u in on] == [("example.com/dev=node",)]
    plugin = _plugin(snapshot, NativeCdi.ON)
    decided = plugin.decide(_pod(), bare)
    assert decided is not None and (*decided.devices, *decided.delegated) == (
        "example.com/dev=envonly", "example.com/dev=node")


def test_runtime_info_from_config() -> None:
    c17 = RuntimeInfo.from_configure("containerd", "1.7.30")
    off = RuntimeCdiConfig(enabled=NativeCdi.UNKNOWN,
                           spec_dirs=SpecDirs.of(("/etc/cdi",))).applied_to(c17)
    assert off.native_cdi is NativeCdi.OFF and off.cdi_spec_dirs == CDI_OFF  # 1.7 needs enable_cdi
    c21 = RuntimeInfo.from_configure("containerd", "2.1.9")
    off21 = RuntimeCdiConfig(enabled=NativeCdi.OFF,
                             spec_dirs=SpecDirs.of(("/opt/x",))).applied_to(c21)
    # the library's defaults
    assert off21.cdi_spec_dirs == SpecDirs.of(("/etc/cdi", "/var/run/cdi"))
    on21 = RuntimeCdiConfig(spec_dirs=SpecDirs.of(("/opt/x",))).applied_to(c21)
    assert on21.native_cdi is NativeCdi.ON and on21.cdi_spec_dirs == SpecDirs.of(("/opt/x",))


def test_cdi_devices_names_count_unless_the_runtimes_cdi_is_known_off(
        snapshot: Snapshot) -> None:
    from nri_plugin.plugins.cdi_injector.already import not_yet_in
    from nri_plugin.plugins.cdi_injector.context import DeviceRequest, bare_context

    # containerd 2.3 lists CRI CDIDevices in Container.CDI_devices, injected only with its
    # own CDI on.
    ctr = nri_pb2.Container(id="c", name="app")
    ctr.CDI_devices.add(name="example.com/dev=envonly")
    wanted = [DeviceRequest("example.com/dev=envonly", "s")]
    bare = bare_context(None, ctr)
    assert not_yet_in(wanted, bare, ctr, snapshot, NativeCdi.UNKNOWN) == []
    assert not_yet_in(wanted, bare, ctr, snapshot, NativeCdi.ON) == []
    assert not_yet_in(wanted, bare, ctr, snapshot, NativeCdi.OFF) == wanted


def test_handed_over_creation_is_judged_at_removal_with_no_start_round_trip(
        snapshot: Snapshot, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    plugin = _plugin(snapshot, NativeCdi.ON)
    mask = plugin.configure("", "containerd", "2.1.9")
    # Neither PostCreate (0x10) nor Start (0x20): nothing inside a container's creation
    # and start but CreateContainer itself.
    assert mask & 0x10 == 0 and mask & 0x20 == 0 and mask & 0x400
    for cid in ("b", "c", "d"):
        plugin.delegations[cid] = (f"container={cid}", ("example.com/dev=node",))
    plugin.remove_container(_pod(), nri_pb2.Container(id="b",
                                                      state=nri_pb2.CONTAINER_STOPPED))
    # containerd 2.3 (criContainer.GetStatus): an exited container has no state, only a
    # reason, and the times from its store
    plugin.remove_container(_pod(), nri_pb2.Container(
        id="d", created_at=1_764_000_000_000_000_000, status_reason="Completed"))
    plugin.remove_container(_pod(), nri_pb2.Container(id="c"))  # not in the runtime's store
    assert caplog.text.count("the runtime's own CDI injected") == 2
    assert "the runtime did not create container=c" in caplog.text
    assert plugin.counters.delegation_failed == 1
