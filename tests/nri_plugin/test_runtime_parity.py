"""The plan gives what the runtime's own CDI would give, runtime version by version:
device-node fileMode (filled from the host only by CDI v1.1.0+), permissions never
widened by NRI's own device rules, and the runtime facts table behind both."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdi.cache import Snapshot, SpecCache
from nri_plugin.nri.versions import RuntimeInfo
from nri_plugin.plugins.cdi_injector.context import DeviceRequest
from nri_plugin.plugins.cdi_injector.plan import InjectionError, narrowed_permissions
from tests.helpers import make_char_device, plan_injection, write_specs

C1724 = RuntimeInfo.from_configure("containerd", "1.7.24~ds1")
C1730 = RuntimeInfo.from_configure("containerd", "v1.7.30")
C219 = RuntimeInfo.from_configure("containerd", "2.1.9+unknown")
C221 = RuntimeInfo.from_configure("containerd", "v2.2.1")
CRIO134 = RuntimeInfo.from_configure("cri-o", "1.34.2")
CRIO135 = RuntimeInfo.from_configure("cri-o", "1.35.0")


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Snapshot:
    if os.geteuid() != 0:
        pytest.skip("device nodes need root")
    root = tmp_path_factory.mktemp("parity")
    ro = make_char_device(root / "ro", major=241, minor=0, mode=0o644)
    rw = make_char_device(root / "rw", major=241, minor=1, mode=0o640)
    specs = write_specs(root / "cdi", {
        "a.yaml": f"""\
            cdiVersion: 0.5.0
            kind: example.com/a
            devices:
            - name: plain
              containerEdits:
                deviceNodes: [{{path: /dev/a0, hostPath: {rw}}}]
            - name: moded
              containerEdits:
                deviceNodes: [{{path: /dev/a1, hostPath: {rw}, fileMode: 384}}]
            - name: readonly
              containerEdits:
                deviceNodes: [{{path: /dev/ro, hostPath: {ro}, permissions: r}}]
            - name: env
              containerEdits:
                env: [ONLY=env]
            """,
        "b.yaml": f"""\
            cdiVersion: 0.5.0
            kind: example.com/b
            devices:
            - name: same-number
              containerEdits:
                deviceNodes: [{{path: /dev/also-ro, hostPath: {ro}}}]
            """,
    })
    snap = SpecCache([str(specs)]).refresh()
    assert not snap.errors, snap.errors
    return snap


def _modes(plan: object) -> dict[str, int | None]:
    devices = plan.adjustment.linux.devices  # type: ignore[attr-defined]
    return {d.path: d.file_mode.value if d.HasField("file_mode") else None for d in devices}


@pytest.mark.parametrize("runtime, filled", [
    (C1724, False), (C1730, False), (C219, False), (CRIO134, False),
    (C221, True), (CRIO135, True),
])
def test_unset_file_mode_is_what_the_runtimes_cdi_library_gives(
        snapshot: Snapshot, runtime: RuntimeInfo, filled: bool) -> None:
    requests = [DeviceRequest("example.com/a=plain", "s"),
                DeviceRequest("example.com/a=moded", "s")]
    plan = plan_injection(snapshot, requests, runtime)
    # Unset: runc creates the node 0666, as native CDI before v1.1.0 leaves it; from v1.1.0
    # the host node's mode (0640). An explicit fileMode is kept everywhere.
    assert _modes(plan) == {"/dev/a0": 0o640 if filled else None, "/dev/a1": 0o600}


def test_read_only_device_is_refused_where_nri_would_widen_it(snapshot: Snapshot) -> None:
    with pytest.raises(InjectionError, match=r"permissions 'r' of /dev/ro \(NRI allows 'rw' "
                       r"on every device node it adds: 'w' would be granted\)"):
        plan_injection(snapshot, [DeviceRequest("example.com/a=readonly", "s")], C1724)


@pytest.mark.parametrize("runtime", [C1730, C219, CRIO134])
def test_read_only_device_goes_to_the_runtime_with_the_whole_request(
        snapshot: Snapshot, runtime: RuntimeInfo) -> None:
    # b=same-number has the same device number from another spec file: NRI's rw rule for
    # it would open /dev/ro for writing too, so the runtime gets every device.
    requests = [DeviceRequest("example.com/b=same-number", "s"),
                DeviceRequest("example.com/a=readonly", "s"),
                DeviceRequest("example.com/a=env", "s")]
    plan = plan_injection(snapshot, requests, runtime)
    assert plan.delegated == tuple(r.name for r in requests) and not plan.devices
    assert [d.name for d in plan.adjustment.CDI_devices] == list(plan.delegated)
    assert not plan.adjustment.linux.devices and not plan.adjustment.linux.resources.devices
    assert not plan.adjustment.env


def test_narrowed_permissions_per_node_type(snapshot: Snapshot, tmp_path: Path) -> None:
    from cdi.model import ContainerEdits, DeviceNode

    def reasons(*nodes: DeviceNode) -> list[str]:
        return narrowed_permissions(ContainerEdits(device_nodes=nodes))

    assert reasons(DeviceNode("/dev/x", type="c", major=1, permissions="rw")) == []
    assert reasons(DeviceNode("/dev/x", type="c", major=1)) == []  # rwm
    assert reasons(DeviceNode("/dev/x", type="p")) == []  # no cgroup rule at all
    assert reasons(DeviceNode("/dev/x", type="b", major=8, permissions="rw")) == [
        "permissions 'rw' of /dev/x (NRI allows 'rwm' on every device node it adds: 'm' "
        "would be granted)"]
    assert len(reasons(DeviceNode("/dev/x", type="c", major=1, permissions="w"))) == 1


def test_runtime_facts_table() -> None:
    assert (C1724.cdi_version, C219.cdi_version, C221.cdi_version) == (
        (0, 7, 2), (1, 0, 1), (1, 1, 0))
    assert C1724.native_mount_order_by_name and not C219.native_mount_order_by_name
    assert C219.max_spec_version == (1, 0, 0) and C221.max_spec_version == (1, 1, 0)
    assert C219.native_cdi_on_by_default and not C1724.native_cdi_on_by_default
    unknown = RuntimeInfo.from_configure("other", "1.0")
    assert unknown.cdi_version is None and unknown.native_fills_file_mode


def test_one_delegated_device_takes_the_whole_request_to_the_runtime(
        tmp_path: Path) -> None:
    # NRI applies the plugin's edits before the runtime's CDI: a mix would merge env (and
    # mounts, rules) in another order than native CDI. All or nothing.
    folder = write_specs(tmp_path / "cdi", {
        "a.yaml": """\
            cdiVersion: 0.7.0
            kind: example.com/first
            containerEdits: {env: [SHARED=a]}
            devices:
            - {name: gids, containerEdits: {additionalGids: [44]}}
            """,
        "b.yaml": """\
            cdiVersion: 0.5.0
            kind: example.com/second
            containerEdits: {env: [SHARED=b]}
            devices:
            - {name: other, containerEdits: {env: [B=1]}}
            """})
    snap = SpecCache([str(folder)]).refresh()
    requests = [DeviceRequest("example.com/first=gids", "s"),
                DeviceRequest("example.com/second=other", "s")]
    plan = plan_injection(snap, requests, C219)
    assert plan.delegated == tuple(r.name for r in requests) and not plan.adjustment.env
    alone = plan_injection(snap, requests[1:], C219)
    assert alone.devices == ("example.com/second=other",) and not alone.delegated
