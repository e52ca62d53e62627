"""A Jetson's CSV spec through the plugin: a container asking for ``nvidia.com/gpu=0`` gets from
the injector what the runtime's own CDI gives, on every runtime version of the compatibility
table, in both link modes, with and without the additionalGids of the board's ``video`` and
``render`` nodes; and NVIDIA's rules drop none of the board's files whatever
NVIDIA_DRIVER_CAPABILITIES says (the sidecar records no capability table in CSV mode).

With additionalGids the devices are handed to the runtime's own CDI where it can take them
(NRI cannot add groups) and nothing of the plugin's work is lost, and are then exactly native;
elsewhere (containerd 1.7.24, CRI-O 1.31, a hook-free spec) the default policy injects them
without the groups (docs/reference/runtime-cdi.md, "additionalGids and the runtimes").
Without them the plugin applies the edits itself, folding a hook-free spec's library folders
into LD_LIBRARY_PATH."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cdi.cache import Snapshot, SpecCache
from cdi.edits import apply
from cdi.libpath import merge_library_path
from nri_cdi_testbed.tegra import BuiltTegraNode, TegraLayout
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.versions import NativeCdi, RuntimeInfo, SpecDirs
from nri_plugin.plugins.cdi_injector.context import DeviceRequest
from nri_plugin.plugins.cdi_injector.delegation import RuntimeCdiConfig
from nri_plugin.plugins.cdi_injector.injector import CdiInjector
from nri_plugin.plugins.cdi_injector.plan import PlanFor
from nri_plugin.plugins.cdi_injector.vendor import Registry
from nri_plugin.vendors.nvidia.rules import NvidiaRules
from tests.helpers import annotations_policy, plan_injection
from tests.helpers import run_generate as generate
from tests.nri_apply import CONTAINER_BEFORE_NRI, apply_adjustment

TegraFactory = Callable[[str, TegraLayout], BuiltTegraNode]
# (link mode, extra generate options)
SPECS = {"hooks": ("hooks", ()), "mounts": ("mounts", ()),
         "hooks-no-gids": ("hooks", ("--feature-flag", "no-additional-gids-for-device-nodes")),
         "mounts-no-gids": ("mounts", ("--feature-flag", "no-additional-gids-for-device-nodes"))}
RUNTIMES = [("containerd", "1.7.24"), ("containerd", "1.7.30"), ("containerd", "2.1.9"),
            ("containerd", "2.2.1"), ("containerd", "2.3.4"), ("cri-o", "1.31.0"),
            ("cri-o", "1.35.0")]
NAMES = ["nvidia.com/gpu=0"]


@pytest.fixture(scope="module", params=sorted(SPECS))
def folder(request: pytest.FixtureRequest, tegra_factory: TegraFactory,
           tmp_path_factory: pytest.TempPathFactory) -> Path:
    node = tegra_factory("tegra-plugin", TegraLayout(seed="plugin"))
    out = tmp_path_factory.mktemp(f"csv-{request.param}")
    link_mode, extra = SPECS[request.param]
    rc, _, err = generate(["--mode", "csv", "--driver-root", str(node.root), "--link-mode",
                           link_mode, *extra, "--output", str(out / "nvidia.yaml")])
    assert rc == 0, err
    return out


@pytest.fixture(scope="module")
def snapshot(folder: Path) -> Snapshot:
    snap = SpecCache([str(folder)]).refresh()
    assert not snap.errors, snap.errors
    return snap


def _native(snapshot: Snapshot, spec: dict[str, Any]) -> dict[str, Any]:
    return apply(spec, snapshot.resolve(NAMES))


@pytest.mark.parametrize("name, version", RUNTIMES, ids=[f"{n}-{v}" for n, v in RUNTIMES])
def test_gpu_0_through_the_plugin_is_native_cdi(snapshot: Snapshot, name: str,
                                                version: str) -> None:
    runtime = RuntimeCdiConfig(enabled=NativeCdi.ON, spec_dirs=SpecDirs.of(
        snapshot.spec_dirs)).applied_to(RuntimeInfo.from_configure(name, version))
    # the default policy (additionalGids: drop) where neither NRI nor the runtime can add them
    plan = plan_injection(snapshot, [DeviceRequest(n, "test") for n in NAMES], runtime,
                          PlanFor(drop_gids=True))
    cdi = (lambda spec, wanted: apply(spec, snapshot.resolve(wanted))) \
        if runtime.supports_cdi_devices else None
    assert runtime.nri_version is not None
    ours = apply_adjustment(CONTAINER_BEFORE_NRI, plan.adjustment, runtime.nri_version, cdi)
    native = _native(snapshot, CONTAINER_BEFORE_NRI)
    gids = native["process"]["user"].get("additionalGids")
    if plan.delegated:  # handed to the runtime's own CDI: exactly native
        assert runtime.supports_cdi_devices and ours == native
        return
    assert plan.dropped_gids == tuple(gids or ())
    # Kept from the runtime's own CDI only where handing over would lose something (a
    # hook-free spec's library folders, which the runtime would leave out of
    # LD_LIBRARY_PATH).
    assert not gids or not runtime.supports_cdi_devices or "LD_LIBRARY_PATH" in plan.kept_because
    assert ours["linux"]["devices"] == native["linux"]["devices"]
    assert {d["path"] for d in native["linux"]["devices"]} >= {"/dev/nvgpu/igpu0/ctrl",
                                                               "/dev/nvmap"}
    assert ours["process"]["env"] == list(merge_library_path(native["process"]["env"]))
    assert ours.get("hooks") == native.get("hooks")
    assert ours["mounts"] == native["mounts"]
    assert "additionalGids" not in ours["process"]["user"]


@pytest.mark.parametrize("capabilities", ["", "compute", "graphics,utility", "all"])
def test_nvidia_rules_keep_every_file_of_the_board(folder: Path, snapshot: Snapshot,
                                                   capabilities: str) -> None:
    registry = Registry.load(snapshot, [NvidiaRules()])
    plugin = CdiInjector(lambda: registry, vendors=[NvidiaRules()],
                         policy=annotations_policy())
    plugin.configure("", "containerd", "1.7.24")  # NRI 0.8: the plugin applies it all
    env = [f"NVIDIA_DRIVER_CAPABILITIES={capabilities}"] if capabilities else []
    ctr = nri_pb2.Container(id="c1", pod_sandbox_id="p1", name="app", env=env)
    pod = nri_pb2.PodSandbox(id="p1", name="pod", namespace="default",
                             annotations={"cdi.k8s.io/gpu": NAMES[0]})
    injection = plugin.decide(pod, ctr)
    assert injection is not None
    got = {m.destination for m in injection.adjustment.mounts}
    native = {m["destination"] for m in _native(snapshot, CONTAINER_BEFORE_NRI)["mounts"]}
    assert got == native - {"/proc"}
    # graphics libraries a compute-only image would lose to a capability table
    assert "/usr/lib/aarch64-linux-gnu/nvidia/libEGL_nvidia.so.0" in got
