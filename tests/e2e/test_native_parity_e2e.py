"""The plugin against the runtime's own CDI, on every containerd version of the suite.

One containerd per version with native CDI on (enable_cdi, the spec folder shared with the
plugin, as docs/install/containerd.md recommends) and the plugin connected. For each case
the same devices are asked for twice: through the CRI CDIDevices field (native CDI alone)
and through a pod annotation (the plugin alone). The containers must come out the same:
device nodes with their file modes, cgroup rules, mounts and their order, env, hooks,
additional gids, and what a process inside may do with a read-only device. The differences
the runtime version imposes are asserted as such (``expected_difference``), nothing else
may differ.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient
from tests.e2e.images import BUSYBOX_IMAGE
from tests.e2e.parity import node_mode_seen, nri_mount_order, runtime_of
from tests.e2e.plugin import PluginProcess
from tests.nri_wire import KMSG, MAJOR, SLEEP, parity_node

NUMBERS = {(MAJOR, 0), (MAJOR, 1), (MAJOR, 2), KMSG}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, e2e_ready: None) -> Path:
    root = tmp_path_factory.mktemp("parity")
    parity_node(root)
    return root


@pytest.fixture(scope="module")
def ctrd(containerd: ContainerdFactory, node: Path) -> Containerd:
    return containerd(enable_cdi=True, cdi_spec_dirs=[node / "cdi"])


@pytest.fixture(scope="module")
def plugin(ctrd: Containerd, node: Path) -> Iterator[PluginProcess]:
    process = PluginProcess(ctrd.nri_socket, [node / "cdi"],
                            node / f"plugin-{ctrd.version}.log").start()
    yield process
    process.kill()


def _ours(spec: dict[str, Any]) -> dict[str, Any]:
    linux = spec["linux"]
    return {
        "devices": [d for d in linux.get("devices", []) if d["path"].startswith("/dev/par")],
        "cgroup": [r for r in linux["resources"]["devices"]
                   if (r.get("major"), r.get("minor")) in NUMBERS],
        "mounts": [m for m in spec["mounts"]
                   if m["destination"] in ("/usr/lib/par", "/usr/lib/aaa", "/opt/b")],
        "mount_order": [m["destination"] for m in spec["mounts"]],
        "env": [e for e in spec["process"]["env"] if e.startswith("PAR_")],
        "hooks": spec.get("hooks", {}).get("createContainer", []),
        "gids": spec["process"]["user"].get("additionalGids", []),
    }


def _both(cri: CriClient, devices: list[str]) -> tuple[tuple[str, dict[str, Any]],
                                                        tuple[str, dict[str, Any]]]:
    native_pod = cri.run_pod("native")
    native = cri.run_container(native_pod, "app", BUSYBOX_IMAGE, command=SLEEP,
                               cdi_devices=devices)
    ours_pod = cri.run_pod("ours", annotations={"cdi.k8s.io/dev": ",".join(devices)})
    ours = cri.run_container(ours_pod, "app", BUSYBOX_IMAGE, command=SLEEP)
    return (native, _ours(cri.runtime_spec(native))), (ours, _ours(cri.runtime_spec(ours)))


def _assert_same(ctrd: Containerd, native: dict[str, Any], ours: dict[str, Any], *,
                 delegated: bool) -> None:
    assert ours["devices"] == native["devices"]
    # the order is checked below, with all the container's mounts
    assert sorted(ours["mounts"], key=_dest) == sorted(native["mounts"], key=_dest)
    assert ours["env"] == native["env"]
    assert ours["hooks"] == native["hooks"]
    assert ours["gids"] == native["gids"]
    if delegated or not native["mounts"]:
        # the runtime's own CDI applied them, or NRI had no mounts to re-sort
        assert ours["mount_order"] == native["mount_order"]
    else:
        # NRI re-sorts by (depth, path); CDI < 1.0 (containerd 1.7) does so too, CDI 1.0+
        # (containerd 2.1) keeps the spec's order within one depth.
        assert ours["mount_order"] == nri_mount_order(native["mount_order"])
        if ctrd.major == 1:
            assert ours["mount_order"] == native["mount_order"]
    if delegated:
        assert ours["cgroup"] == native["cgroup"]
    else:
        # NRI < 0.10 adds "rw" for each device node and drops explicit rules (the plugin
        # sends none): never wider, only mknod ("m") is missing for char devices.
        assert [dict(r, access="rwm") for r in ours["cgroup"]] == native["cgroup"]
        assert {r["access"] for r in ours["cgroup"]} <= {"rw"}


def _dest(mount: dict[str, Any]) -> str:
    return str(mount["destination"])


def _mode(cri: CriClient, cid: str, path: str) -> str:
    return str(cri.exec_sync(cid, ["ls", "-l", path]).stdout.split()[0])


@pytest.mark.parametrize("devices", [
    ["parity.example/first=node", "parity.example/first=moded"],
    ["parity.example/first=node", "parity.example/first=envonly"],
    ["parity.example/first=envonly", "parity.example/second=other", "parity.example/first=node"],
], ids=["file-modes", "env-only", "two-spec-files"])
def test_same_as_native_cdi(ctrd: Containerd, plugin: PluginProcess, cri: CriClient,
                            node: Path, devices: list[str]) -> None:
    (native_id, native), (ours_id, ours) = _both(cri, devices)
    # A CDI device node asks for rwm unless its spec says otherwise, and NRI grants rw: where
    # the runtime's own CDI can take the request (containerd 2.1, its folders shared), the
    # plugin hands it over and the result is native's, rules included. 1.7.24: rw.
    _assert_same(ctrd, native, ours, delegated=ctrd.major >= 2)
    # the container sees the same node modes: unset fileMode -> runc's 0666 on CDI < 1.1,
    # the host node's mode on CDI 1.1 (containerd 2.2.1+)
    assert _mode(cri, ours_id, "/dev/par0") == _mode(cri, native_id, "/dev/par0") \
        == node_mode_seen(runtime_of(cri), str(node / "host" / "dev0"))
    if "parity.example/first=moded" in devices:
        assert _mode(cri, ours_id, "/dev/par1") == _mode(cri, native_id, "/dev/par1") \
            == "crw-r-----"


@pytest.mark.parametrize("devices, reason", [
    (["parity.example/first=readonly", "parity.example/first=node"],
     r"permissions 'r' of /dev/par-ro \(NRI allows 'rw'"),
    (["parity.example/first=gids", "parity.example/second=other"],
     r"additionalGids \(NRI cannot add supplementary groups\)"),
], ids=["permissions-r", "additional-gids"])
def test_what_nri_cannot_carry(ctrd: Containerd, plugin: PluginProcess, cri: CriClient,
                               devices: list[str], reason: str) -> None:
    if ctrd.major == 1 and "parity.example/first=gids" in devices:
        # containerd 1.7.24 (NRI 0.6.1) cannot take CDI_devices, and NRI cannot add
        # groups: policy additionalGids: drop (the default) creates the container without
        # them (narrower, never wider) and says so.
        pod = cri.run_pod("dropped", annotations={"cdi.k8s.io/dev": ",".join(devices)})
        cid = cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP)
        assert 4242 not in _ours(cri.runtime_spec(cid))["gids"]
        plugin.wait_for_log("additionalGids 4242 left out")
        return
    if ctrd.major == 1:
        # containerd 1.7.24 (NRI 0.6.1) cannot take CDI_devices: refused, with the reason,
        # rather than widened.
        pod = cri.run_pod("refused", annotations={"cdi.k8s.io/dev": ",".join(devices)})
        with pytest.raises(cri.grpc.RpcError, match=reason):
            cri.create_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP)
        return
    # containerd 2.1: handed to its own CDI, so exactly native, rules included
    (native_id, native), (ours_id, ours) = _both(cri, devices)
    _assert_same(ctrd, native, ours, delegated=True)
    if "parity.example/first=readonly" in devices:
        for cid in (native_id, ours_id):
            opened = cri.exec_sync(cid, ["sh", "-c", ": > /dev/par-ro"])
            assert opened.exit_code != 0 and "Operation not permitted" in opened.stderr
    else:
        assert 4242 in ours["gids"]
    plugin.wait_for_log("handed to the runtime's own CDI")  # logged once the reply is out
    # Confirmed when the container goes (no StartContainer round trip to confirm it).
    cri.stop_container(ours_id)
    cri.remove_container(ours_id)
    plugin.wait_for_log("the runtime's own CDI injected")


def test_runtime_injected_annotations_are_not_injected_again(
        ctrd: Containerd, plugin: PluginProcess, cri: CriClient) -> None:
    # containerd's own CDI (on, as 2.x's default) injects container cdi.k8s.io annotations
    # before NRI; the plugin must leave them alone: the hook once, the env as native.
    devices = "parity.example/first=envonly,parity.example/first=node"
    pod = cri.run_pod("annotated")
    cid = cri.run_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP,
                            annotations={"cdi.k8s.io/dev": devices})
    spec = _ours(cri.runtime_spec(cid))
    assert [h["args"] for h in spec["hooks"]] == [["true", "parity"]]
    assert "PAR_SHARED=from-env-device" in spec["env"]
    assert "container=app pod=default/annotated" not in plugin.log()


# --- handing devices to the runtime: the set-ups that fail, and what the plugin says -------

GIDS = "parity.example/first=gids"
READ_ONLY = "parity.example/first=readonly"  # narrower than NRI's rw: never dropped


@pytest.mark.containerd_versions("2.1")
@pytest.mark.parametrize("enable_cdi", [True, False], ids=["cdi-on", "cdi-off"])
def test_handing_over_to_a_runtime_that_reads_other_folders_is_refused_with_the_cause(
        containerd: ContainerdFactory, node: Path, tmp_path: Path, enable_cdi: bool) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # cdi-off: containerd 2.1 resolves CDI_devices from the library defaults then
    ctrd = containerd(enable_cdi=enable_cdi, cdi_spec_dirs=[elsewhere])
    theirs = str(elsewhere) if enable_cdi else "/etc/cdi, /var/run/cdi"
    process = PluginProcess(ctrd.nri_socket, [node / "cdi"], tmp_path / "plugin.log").start()
    try:
        with ctrd.cri() as cri, cri.cleanup():
            pod = cri.run_pod("far", annotations={"cdi.k8s.io/dev": READ_ONLY})
            with pytest.raises(cri.grpc.RpcError,
                               match=rf"its spec .*a\.json is not in a folder the runtime's own "
                                     rf"CDI reads \({theirs}\)"):
                cri.create_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP)
    finally:
        process.kill()


@pytest.mark.containerd_versions("2.1")
def test_a_handed_over_device_the_runtime_fails_is_reported_as_failed(
        containerd: ContainerdFactory, node: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ctrd = containerd(enable_cdi=True, cdi_spec_dirs=[elsewhere])
    # A wrong claim in the plugin's settings: it cannot tell ahead, the runtime fails.
    config = tmp_path / "config.yaml"
    config.write_text(f"runtime_cdi: {{spec_dirs: ['{node / 'cdi'}']}}\nlog: {{level: debug}}\n"
                      "policy: {sources: {podAnnotations: {namespaces: ['*']}}}\n")
    process = PluginProcess(ctrd.nri_socket, [node / "cdi"], tmp_path / "plugin.log",
                            extra_args=["--config", str(config)]).start()
    try:
        with ctrd.cri() as cri, cri.cleanup():
            pod = cri.run_pod("lied", annotations={"cdi.k8s.io/dev": GIDS})
            with pytest.raises(cri.grpc.RpcError, match="unresolvable CDI devices"):
                cri.create_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP)
        process.wait_for_log("the runtime did not create container=app pod=default/lied: its "
                             f"own CDI could not inject {GIDS}")
        assert "injected container=app" not in process.log()
    finally:
        process.kill()
