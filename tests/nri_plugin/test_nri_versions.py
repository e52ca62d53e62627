"""The OCI result through the plugin equals native CDI's, NRI version by version.

The runtime peer applies the plugin's adjustment as each NRI version's generator does
(tests/nri_apply.py, written from containerd/nri's source) to a container as the runtime
made it; native CDI is the CDI library's own ``apply`` of the same devices. The real
containerds 1.7 and 2.1 are the end-to-end truth (tests/e2e/test_native_parity_e2e.py);
2.2, 2.3 and CRI-O cannot be installed here, so this is where they are checked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from pathlib import Path
from typing import Any

import pytest

from cdi.cache import Snapshot, SpecCache
from cdi.edits import apply
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.api.events import EventMask
from nri_plugin.nri.stub import Stub, StubOptions
from nri_plugin.nri.versions import CDI_OFF, NativeCdi, RuntimeInfo, SpecDirs
from nri_plugin.plugins.cdi_injector.context import DeviceRequest
from nri_plugin.plugins.cdi_injector.delegation import RuntimeCdiConfig
from nri_plugin.plugins.cdi_injector.injector import CdiInjector, Wiring
from nri_plugin.plugins.cdi_injector.plan import PlanFor
from nri_plugin.plugins.cdi_injector.startguard import StartGuard
from nri_plugin.plugins.cdi_injector.vendor import Registry
from tests.helpers import annotations_policy, plan_injection, write_specs
from tests.nri_apply import CONTAINER_BEFORE_NRI, apply_adjustment
from tests.nri_runtime_peer import RuntimePeer

# (runtime, version it reports): NRI 0.2.0 ... 0.12.0, with and without CDI_devices
RUNTIMES = [("containerd", "1.7.0"), ("containerd", "1.7.24"), ("containerd", "1.7.30"),
            ("containerd", "2.1.9"), ("containerd", "2.2.0"), ("containerd", "2.2.1"),
            ("containerd", "2.3.4"), ("cri-o", "1.26.0"), ("cri-o", "1.31.0"),
            ("cri-o", "1.34.0"), ("cri-o", "1.35.0")]
IDS = [f"{n}-{v}" for n, v in RUNTIMES]
SPEC = """\
cdiVersion: 0.5.0
kind: example.com/v
containerEdits:
  env: [V_SPEC=1]
  hooks: [{hookName: createContainer, path: /bin/true, args: ["true", v]}]
devices:
- name: rw
  containerEdits:
    deviceNodes: [{path: /dev/v-rw, type: c, major: 241, minor: 0, fileMode: 420,
                   permissions: rw}]
- name: rwm
  containerEdits:
    deviceNodes: [{path: /dev/v-rwm, type: c, major: 241, minor: 1, fileMode: 416,
                   permissions: rwm}]
    mounts: [{hostPath: /srv/v, containerPath: /opt/v, options: [ro, rbind]}]
- name: default
  containerEdits:
    deviceNodes: [{path: /dev/v-default, type: c, major: 241, minor: 2, fileMode: 384}]
    env: [V_DEFAULT=1]
- name: block
  containerEdits:
    deviceNodes: [{path: /dev/v-blk, type: b, major: 7, minor: 9, fileMode: 432}]
"""
BASE = CONTAINER_BEFORE_NRI


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Snapshot:
    folder = write_specs(tmp_path_factory.mktemp("cdi"), {"v.yaml": SPEC})
    snap = SpecCache([str(folder)]).refresh()
    assert not snap.errors, snap.errors
    return snap


def _runtime(name: str, version: str, snapshot: Snapshot, *, known: bool) -> RuntimeInfo:
    runtime = RuntimeInfo.from_configure(name, version)
    if not known:
        return runtime  # the runtime's CDI set-up unknown: nothing handed over for access
    return RuntimeCdiConfig(enabled=NativeCdi.ON,
                            spec_dirs=SpecDirs.of(snapshot.spec_dirs)).applied_to(runtime)


def _native(snapshot: Snapshot, spec: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return apply(spec, snapshot.resolve(names))


def _through_plugin(snapshot: Snapshot, runtime: RuntimeInfo,
                    names: list[str]) -> tuple[dict[str, Any], Any]:
    plan = plan_injection(snapshot, [DeviceRequest(n, "test") for n in names], runtime)
    cdi = (lambda spec, wanted: _native(snapshot, spec, wanted)) \
        if runtime.supports_cdi_devices else None
    assert runtime.nri_version is not None
    return apply_adjustment(BASE, plan.adjustment, runtime.nri_version, cdi), plan


def _rules(spec: dict[str, Any], minors: set[int]) -> list[dict[str, Any]]:
    return [r for r in spec["linux"]["resources"]["devices"]
            if r.get("major") in (241, 7) and r.get("minor") in minors]


def _effective(spec: dict[str, Any], key: tuple[str, int, int]) -> set[str]:
    return {c for r in spec["linux"]["resources"]["devices"] if r["allow"]
            and (r.get("type"), r.get("major"), r.get("minor")) == key for c in r["access"]}


@pytest.mark.parametrize("name, version", RUNTIMES, ids=IDS)
@pytest.mark.parametrize("known", [True, False], ids=["cdi-known", "cdi-unknown"])
def test_rw_and_block_devices_get_their_rule_once(snapshot: Snapshot, name: str, version: str,
                                                  known: bool) -> None:
    # NRI derives rw (rwm for block) itself: the plugin's rule must not come on top (it did
    # on NRI >= 0.10: every device's rule twice)
    runtime = _runtime(name, version, snapshot, known=known)
    names = ["example.com/v=rw", "example.com/v=block"]
    ours, plan = _through_plugin(snapshot, runtime, names)
    native = _native(snapshot, BASE, names)
    assert plan.devices == tuple(names) and not plan.delegated
    assert ours["linux"] == native["linux"]
    assert ours["process"]["env"] == native["process"]["env"]
    assert ours["hooks"] == native["hooks"]


@pytest.mark.parametrize("name, version", RUNTIMES, ids=IDS)
def test_mknod_access_as_native_where_the_runtime_can_give_it(
        snapshot: Snapshot, name: str, version: str) -> None:
    runtime = _runtime(name, version, snapshot, known=True)
    names = ["example.com/v=default", "example.com/v=rwm", "example.com/v=rw"]
    ours, plan = _through_plugin(snapshot, runtime, names)
    native = _native(snapshot, BASE, names)
    assert ours["linux"]["devices"] == native["linux"]["devices"]
    assert ours["process"]["env"] == native["process"]["env"]
    if runtime.supports_cdi_devices:
        # handed to the runtime's own CDI: exactly native, rules and mount order included
        assert plan.delegated == tuple(names) and ours == native
        return
    # containerd < 1.7.30, CRI-O < 1.34: NRI's "rw" alone; never wider, only mknod missing
    assert not plan.delegated
    assert [dict(r, access="rwm") if r["minor"] != 0 else r for r in _rules(ours, {0, 1, 2})] \
        == _rules(native, {0, 1, 2})
    assert {r["access"] for r in _rules(ours, {0, 1, 2})} == {"rw"}


@pytest.mark.parametrize("name, version", RUNTIMES, ids=IDS)
def test_mknod_access_without_the_runtimes_cdi(snapshot: Snapshot, name: str,
                                               version: str) -> None:
    # The runtime's CDI set-up unknown: the plugin injects itself. From NRI 0.10 its rwm
    # rule follows NRI's rw one: the same access as native, one rule more; before, rw.
    runtime = _runtime(name, version, snapshot, known=False)
    names = ["example.com/v=default"]
    ours, plan = _through_plugin(snapshot, runtime, names)
    native = _native(snapshot, BASE, names)
    assert not plan.delegated
    key = ("c", 241, 2)
    assert _effective(native, key) == set("rwm")
    assert runtime.nri_version is not None
    if runtime.nri_version >= (0, 10, 0):
        assert _effective(ours, key) == _effective(native, key)
        assert [r["access"] for r in _rules(ours, {2})] == ["rw", "rwm"]
    else:
        assert _effective(ours, key) == set("rw")
    assert ours["linux"]["devices"] == native["linux"]["devices"]


def test_mknod_access_not_handed_over_when_a_filter_leaves_something_out(
        snapshot: Snapshot) -> None:
    class Filter:
        def __init__(self, drop_env: bool) -> None:
            self.cache_key = drop_env
            self.drop_env = drop_env

        def apply(self, edits: Any) -> Any:
            return edits._replace(env=()) if self.drop_env else edits

    runtime = _runtime("containerd", "2.1.9", snapshot, known=True)
    wanted = [DeviceRequest("example.com/v=default", "t")]
    kept = plan_injection(snapshot, wanted, runtime, PlanFor(edit_filter=Filter(False)))  # type: ignore[arg-type]
    assert kept.delegated == ("example.com/v=default",)  # the filter changes nothing
    cut = plan_injection(snapshot, wanted, runtime, PlanFor(edit_filter=Filter(True)))  # type: ignore[arg-type]
    assert not cut.delegated and cut.devices == ("example.com/v=default",)


def test_peer_applies_as_nri_does(tmp_path: Path) -> None:
    # the peer itself: NRI's own rule for every device, explicit rules only from 0.10
    adj = nri_pb2.ContainerAdjustment()
    adj.linux.devices.add(path="/dev/x", type="c", major=1, minor=2)
    rule = adj.linux.resources.devices.add(allow=True, type="c", access="rwm")
    rule.major.value, rule.minor.value = 1, 2
    old = apply_adjustment(BASE, adj, (0, 8, 0), None)["linux"]["resources"]["devices"]
    new = apply_adjustment(BASE, adj, (0, 10, 0), None)["linux"]["resources"]["devices"]
    assert [r["access"] for r in old[2:]] == ["rw"]
    assert [r["access"] for r in new[2:]] == ["rw", "rwm"]


@pytest.mark.parametrize("version, nri", [("1.7.24", (0, 6, 1)), ("2.3.4", (0, 12, 0))])
def test_over_the_wire_as_containerd(snapshot: Snapshot, version: str,
                                     nri: tuple[int, int, int]) -> None:
    # The shipped plugin (start guard and all) against the runtime peer speaking as
    # containerd: two events per container, and the created container as native's.
    plugin = StartGuard(CdiInjector(
        lambda: Registry(snapshot), policy=annotations_policy(nvidia=False),
        wiring=Wiring(runtime_cdi=RuntimeCdiConfig(enabled=NativeCdi.OFF, spec_dirs=CDI_OFF,
                                                   origin="test"))))
    # (nothing handed over: NRI alone)
    names = ["example.com/v=rw", "example.com/v=block"]

    async def main() -> dict[str, Any]:
        ours, theirs = socket.socketpair()
        stub = Stub(plugin, StubOptions(sock=ours, env={"NRI_PLUGIN_NAME": "cdi",
                                                        "NRI_PLUGIN_IDX": "10"}))
        runner = asyncio.create_task(stub.run())
        reader, writer = await asyncio.open_unix_connection(sock=theirs)
        peer = RuntimePeer(reader, writer)
        try:
            _, conf = await peer.handshake(runtime_name="containerd", runtime_version=version)
            events = EventMask(conf.events)
            assert events & EventMask.START_CONTAINER
            assert not events & (EventMask.POST_CREATE_CONTAINER
                                 | EventMask.POST_START_CONTAINER)
            pod = nri_pb2.PodSandbox(id="p", name="p", namespace="default",
                                     annotations={"cdi.k8s.io/v": ",".join(names)})
            return await peer.create_and_apply(
                pod, nri_pb2.Container(id="c", pod_sandbox_id="p", name="app"), BASE, nri,
                None)
        finally:
            peer.close()
            await asyncio.wait_for(runner, 60)

    ours = asyncio.run(asyncio.wait_for(main(), 10))
    native = _native(snapshot, BASE, names)
    assert ours["linux"] == native["linux"] and ours["process"] == native["process"]


def test_spec_folders_say_unknown_off_and_none_apart() -> None:
    # Three states, by name: unknown (assume the runtime sees every folder), its CDI off
    # (it resolves nothing handed over), and folders, an empty list of them included.
    from nri_plugin.nri.versions import UNKNOWN_DIRS, Reach
    from nri_plugin.plugins.cdi_injector.delegation import visible_to_runtime

    runtime = RuntimeInfo.from_configure("containerd", "2.1.9")
    assert runtime.cdi_spec_dirs is UNKNOWN_DIRS
    assert visible_to_runtime("/x/a.yaml", runtime)
    for dirs in (CDI_OFF, SpecDirs.of(())):
        assert not visible_to_runtime("/x/a.yaml", dataclasses.replace(runtime,
                                                                       cdi_spec_dirs=dirs))
    assert {UNKNOWN_DIRS.reach, CDI_OFF.reach, SpecDirs.of(()).reach} == set(Reach)
    assert SpecDirs.of(()) != CDI_OFF and SpecDirs.of(()) != UNKNOWN_DIRS
    assert [d.describe() for d in (UNKNOWN_DIRS, SpecDirs.of(("/a", "/b")), CDI_OFF)] == [
        "unknown folders", "/a, /b", "no folders"]
