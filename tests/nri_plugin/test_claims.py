"""Devices the runtime's own CDI injected (DRA claims, the device plugin's cdi-cri and
cdi-annotations) still get the plugin's checks: NVIDIA_REQUIRE_*, NVIDIA_DRIVER_CAPABILITIES
(mounts removed) and the policy's device rules; and a removed spec leaves the registry at
once, without the settle a burst of writes gets."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from cdi.cache import SpecCache
from cdi.watch import AutoRefresh, Timing
from nri_cdi_testbed.waiting import wait_until
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.dispatch import RpcError
from nri_plugin.nri.versions import CDI_OFF, NativeCdi, SpecDirs
from nri_plugin.plugins.cdi_injector.delegation import RuntimeCdiConfig
from nri_plugin.plugins.cdi_injector.injector import CdiInjector, Wiring
from nri_plugin.plugins.cdi_injector.policy import parse_policy
from nri_plugin.plugins.cdi_injector.vendor import RegistryHolder
from tests.helpers import simple_spec, write_specs
from tests.nri_plugin.test_no_io import _nvidia_registry


def _plugin(holder: RegistryHolder, **kwargs: object) -> CdiInjector:
    plugin = CdiInjector(holder.get, vendors=holder.vendors, wiring=Wiring(
        runtime_cdi=RuntimeCdiConfig(enabled=NativeCdi.ON, origin="test",
                                     spec_dirs=SpecDirs.of(holder.get().snapshot.spec_dirs))),
        **kwargs)  # type: ignore[arg-type]
    plugin.configure("", "containerd", "2.1.9")
    assert plugin.runtime.native_cdi is NativeCdi.ON
    return plugin


def _injected(env: list[str], *, annotations: dict[str, str] | None = None,
              cdi: tuple[str, ...] = ()) -> nri_pb2.Container:
    """A container as containerd's own CDI left it: GPU 0's node and its driver mounts."""
    ctr = nri_pb2.Container(id="c1", name="app", env=env, annotations=annotations or {})
    ctr.linux.devices.add(path="/dev/nvidia0", type="c", major=241, minor=0)
    for lib in ("libcuda.so.1", "libGLX_nvidia.so.0"):
        ctr.mounts.add(destination=f"/usr/lib64/{lib}", source="/x", type="bind")
    for name in cdi:
        ctr.CDI_devices.add(name=name)
    return ctr


POD = nri_pb2.PodSandbox(name="p", namespace="ml")
WAYS = {"CRI CDIDevices (NRI >= 0.10)": {"cdi": ("nvidia.com/gpu=0",)},
        "container annotation (kubelet < 1.31)": {
            "annotations": {"cdi.k8s.io/k8s.gpu.nvidia.com_claim-1": "nvidia.com/gpu=0"}},
        "device node only (kubelet >= 1.31, NRI < 0.10)": {}}


@pytest.mark.parametrize("way", WAYS)
def test_requirement_refused_on_a_runtime_injected_gpu(tmp_path: Path, need_root: None,
                                                        way: str) -> None:
    plugin = _plugin(_nvidia_registry(tmp_path))
    ctr = _injected(["NVIDIA_REQUIRE_CUDA=cuda>=99.0"], **WAYS[way])  # type: ignore[arg-type]
    with pytest.raises(RpcError) as info:
        plugin.create_container(POD, ctr)
    message = str(info.value)
    assert "cuda>=99.0" in message and "\n" not in message
    assert re.search(r"GPU[- ]0|gpu=0|12\.4", message), message
    # satisfied: nothing to change, nothing injected again
    assert plugin.create_container(POD, _injected(["NVIDIA_REQUIRE_CUDA=cuda>=12.0"],
                                                  **WAYS[way])) is None  # type: ignore[arg-type]


def test_capabilities_remove_the_runtimes_mounts_not_asked_for(tmp_path: Path,
                                                               need_root: None) -> None:
    plugin = _plugin(_nvidia_registry(tmp_path))
    adjustment = plugin.create_container(
        POD, _injected(["NVIDIA_DRIVER_CAPABILITIES=compute"], cdi=("nvidia.com/gpu=0",)))
    assert adjustment is not None
    assert [m.destination for m in adjustment.mounts] == ["-/usr/lib64/libGLX_nvidia.so.0"]
    assert not adjustment.linux.devices and not adjustment.env
    # unset: the runtime's full edits stay, as its native CDI gave them
    assert plugin.create_container(POD, _injected([], cdi=("nvidia.com/gpu=0",))) is None


def test_policy_device_rules_apply_to_runtime_injected_devices(tmp_path: Path,
                                                               need_root: None) -> None:
    holder = _nvidia_registry(tmp_path)
    policy = parse_policy({"devices": [{"deny": ["nvidia.com/gpu=0"], "namespaces": ["ml"]}]})
    plugin = _plugin(holder, policy=policy)
    with pytest.raises(RpcError, match=re.escape("nvidia.com/gpu=0")):
        plugin.create_container(POD, _injected([], cdi=("nvidia.com/gpu=0",)))


def test_a_removed_spec_leaves_the_registry_at_once(tmp_path: Path) -> None:
    folder = write_specs(tmp_path / "cdi", {"claim.yaml": simple_spec("k8s.example/claim", "a")})
    seen: list[int] = []
    # A settle of an hour: only the removal rule can make the refresh come in time.
    with AutoRefresh(SpecCache([str(folder)]),
                     Timing(rescan_interval=3600, settle=3600, max_delay=3600),
                     on_refresh=lambda s: seen.append(len(s.devices))) as ref:
        assert ref.cache.snapshot.devices
        (folder / "claim.yaml").unlink()
        wait_until(lambda: not ref.cache.snapshot.devices, "the removed spec's device gone",
                   seen=lambda: sorted(ref.cache.snapshot.devices))


def test_a_miss_reads_only_the_new_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import cdi.cache

    folder = write_specs(tmp_path / "cdi", {f"claim{i}.yaml": simple_spec(f"k8s.example/c{i}", "a")
                                            for i in range(5)})
    cache = SpecCache([str(folder)])
    cache.refresh()
    read: list[str] = []
    real = cdi.cache._read_stable
    monkeypatch.setattr(cdi.cache, "_read_stable", lambda p: read.append(p) or real(p))
    (folder / "fresh.yaml").write_text(simple_spec("k8s.example/new", "a"))
    snapshot = cache.add_new_files(1.0)
    assert snapshot is not None and "k8s.example/new=a" in snapshot.devices
    assert len(snapshot.devices) == 6 and read == [str(folder / "fresh.yaml")]
    # a new file defining a known device: the whole refresh decides (a conflict here)
    (folder / "twin.yaml").write_text(simple_spec("k8s.example/new", "a"))
    snapshot = cache.add_new_files(1.0)
    assert snapshot is not None and "k8s.example/new=a" in snapshot.conflicts


def test_a_container_after_a_removal_sees_it_without_polling(tmp_path: Path) -> None:
    """on_hit: right after unlink() returns, the registry a container is served from no
    longer has the removed spec's devices (the kernel queued the event within unlink)."""
    from nri_plugin.ops.daemon import removals_applied

    folder = write_specs(tmp_path / "cdi", {f"c{i}.yaml": simple_spec(f"k8s.example/c{i}", "a")
                                            for i in range(20)})
    holder = RegistryHolder([])
    with AutoRefresh(SpecCache([str(folder)]), Timing(rescan_interval=3600),
                     on_refresh=holder.update) as refresher:
        on_hit = removals_applied(refresher, holder)
        assert on_hit() is None  # nothing pending: no wait, no new registry
        for i in range(20):
            (folder / f"c{i}.yaml").unlink()
            registry = on_hit() or holder.get()
            assert f"k8s.example/c{i}=a" not in registry.snapshot.devices, i


def test_a_removal_is_never_seen_between_the_drain_and_its_flag(tmp_path: Path) -> None:
    """The watcher thread drains a removal's event, then marks it unapplied: a reader that
    looks between the two (queue empty, flag not yet set) would serve the removed spec.
    The watcher is held in that window here while another thread asks."""
    folder = write_specs(tmp_path / "cdi", {"c0.yaml": simple_spec("k8s.example/c0", "a")})
    refresher = AutoRefresh(SpecCache([str(folder)]), Timing(rescan_interval=3600))  # not started
    watcher = refresher._watcher
    drained, release = threading.Event(), threading.Event()
    read = watcher.read_changes

    def read_then_hold() -> bool:
        changed = read()
        drained.set()
        release.wait(10)  # the window between the drain and the flag
        return changed

    watcher.read_changes = read_then_hold  # type: ignore[method-assign]
    (folder / "c0.yaml").unlink()
    drain = threading.Thread(target=refresher._read_changes)
    drain.start()
    assert drained.wait(10)
    answers: list[bool] = []
    asker = threading.Thread(target=lambda: answers.append(refresher.removals_pending()))
    asker.start()
    asker.join(0.5)  # a reader that does not wait for the flag answers in this time
    release.set()
    drain.join(10)
    asker.join(10)
    assert answers == [True]


def test_cdi_devices_the_runtime_ignored_are_injected_by_the_plugin(tmp_path: Path,
                                                                    need_root: None) -> None:
    """NRI >= 0.10 shows CRI CDIDevices; with the runtime's CDI off it did not act on them,
    so the plugin injects them (a kubelet >= 1.31 sends a DRA claim only there)."""
    holder = _nvidia_registry(tmp_path)
    plugin = CdiInjector(holder.get, vendors=holder.vendors, wiring=Wiring(
        runtime_cdi=RuntimeCdiConfig(enabled=NativeCdi.OFF, spec_dirs=CDI_OFF, origin="test")))
    plugin.configure("", "containerd", "2.2.0")
    ctr = nri_pb2.Container(id="c1", name="app")
    ctr.CDI_devices.add(name="nvidia.com/gpu=1")
    adjustment = plugin.create_container(POD, ctr)
    assert adjustment is not None
    assert [d.path for d in adjustment.linux.devices] == ["/dev/nvidia1"]
