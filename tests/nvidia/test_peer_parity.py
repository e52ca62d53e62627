"""Side by side with NVIDIA's ``nvidia-ctk cdi generate`` on 13 simulated node layouts, both
in NVML mode on the same node through its simulated libnvidia-ml: device names, device
nodes, mounts, links, ld-cache folders, additionalGids and hooks by subcommand must agree,
apart from the differences listed in ``peer_parity.INTENDED``.

nvidia-ctk is not part of this repository. With it at hand ($NRI_CDI_PEERS) each case runs
it live, checks its recording in tests/data/peers/nvidia-ctk/ still says the same (or, with
$NRI_CDI_RECORD_PEERS=1, rewrites it); without it, each case compares with the recording
(docs/reference/nvidia-ctk.md)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest

from nri_cdi_testbed.simnode import BuiltNode, NodeLayout
from tests.nvidia import peer_parity
from tests.nvidia.conftest import CAN_MKNOD
from tests.peers import RECORD_ENV, recording_requested

LIVE_REASON = peer_parity.why_not_runnable()  # None: nvidia-ctk runs here
REASON = ("nvidia-ml-py (pynvml) is not installed" if not importlib.util.find_spec("pynvml")
          else None if CAN_MKNOD  # the recordings are of nodes with their device nodes
          else "the simulated nodes' device nodes need root (mknod)")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

NodeFactory = Callable[[str, NodeLayout], BuiltNode]
MIG = NodeLayout.uniform(3, mig={1: "3g.40gb,2g.20gb,1g.10gb"}, minors=[2, 0, 1], seed="p-mig")

# name -> (layout, extra options for both tools)
CASES: dict[str, tuple[NodeLayout, tuple[str, ...]]] = {
    "mig": (MIG, ()),
    "rhel": (NodeLayout.uniform(2, distro="rhel", seed="p-rhel"), ()),
    "driver-container": (NodeLayout.uniform(2, driver_container=True, seed="p-dc"), ()),
    "compat32": (NodeLayout.uniform(1, compat32=True, seed="p-32"), ()),
    "mig-graphics-profile": (
        NodeLayout.uniform(2, mig={0: "1g.10gb*2,2g.20gb+gfx"}, seed="p-gfx"), ()),
    "bmc-vga": (NodeLayout.uniform(2, bmc_vga=True, seed="p-bmc"), ()),
    "type-index": (MIG, ("--device-name-strategy", "type-index")),
    "device-id-subset": (MIG, ("--device-id", "2", "--device-id", "1:2")),
    "device-id-none": (MIG, ("--device-id", "none")),
    "disable-hook-all": (MIG, ("--disable-hook", "all")),
    "debian-nvidia-current": (NodeLayout.uniform(1, distro="debian-current", seed="p-deb"), ()),
    "extra-files-gke": (NodeLayout.uniform(
        1, driver_version="525.147.05", cuda_version=(12, 0), seed="p-gke",
        extras=("vulkan-icd-at-root", "vulkan-producer", "configs-in-local-share")), ()),
    "extra-files-fabric": (NodeLayout.uniform(
        2, seed="p-fab", mps_pipe_dir=True, extras=("imex", "fabricmanager")), ()),
}


@pytest.fixture(scope="module")
def built(node_factory: NodeFactory) -> Callable[[NodeLayout], BuiltNode]:
    cache: dict[NodeLayout, BuiltNode] = {}

    def get(layout: NodeLayout) -> BuiltNode:
        if layout not in cache:
            cache[layout] = node_factory(f"parity-{layout.seed}", layout)
        return cache[layout]

    return get


def test_thirteen_layouts() -> None:
    assert len(CASES) == 13


def nvidia_ctk(case: str, node: BuiltNode, options: tuple[str, ...]) -> dict[str, Any]:
    """nvidia-ctk's summary for ``case``: live where it runs here (its recording checked,
    or rewritten when asked), else the recording."""
    if LIVE_REASON is not None:
        if recording_requested():
            pytest.fail(f"{RECORD_ENV}=1 needs nvidia-ctk: {LIVE_REASON}")
        return peer_parity.Recording.load(case).summary
    live = peer_parity.summary(peer_parity.run(peer_parity.ctk_argv(node, options)), node)
    fresh = peer_parity.Recording(case, peer_parity.peer_version(), options, live)
    if recording_requested():
        fresh.save()
        return live
    recorded = peer_parity.Recording.load(case)
    assert (recorded.version, recorded.arguments, recorded.summary) == (
        fresh.version, fresh.arguments, fresh.summary), (
        f"the recording of {case!r} ({recorded.version}) is not what the live nvidia-ctk "
        f"({fresh.version}) says: rerun with {RECORD_ENV}=1 and review the diff")
    return live


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_as_nvidia_ctk(case: str, built: Callable[[NodeLayout], BuiltNode],
                            gcc_m32: bool) -> None:
    layout, extra = CASES[case]
    if layout.compat32 and not gcc_m32:
        pytest.skip("gcc -m32 (multilib) is needed to build i386 libraries")
    node = built(layout)
    options = ("--mode", "nvml", *extra)
    ours = peer_parity.summary(peer_parity.run(peer_parity.ours_argv(node, options)), node)
    theirs = nvidia_ctk(case, node, options)
    assert peer_parity.differences(ours, theirs) == []
    # The comparison is not vacuous: there is something to agree on.
    assert ours["devices"] and ours["common"]["mounts"]
    if extra != ("--device-id", "none"):
        assert any(d["nodes"] for d in ours["devices"].values())


def test_a_difference_is_reported(built: Callable[[NodeLayout], BuiltNode]) -> None:
    node = built(MIG)
    ours = peer_parity.summary(peer_parity.run(peer_parity.ours_argv(node, ["--mode", "nvml"])),
                               node)
    theirs = nvidia_ctk("mig-device-id-0", node, ("--mode", "nvml", "--device-id", "0"))
    assert any(line.startswith("device names") for line in peer_parity.differences(ours, theirs))


def test_every_case_is_recorded_and_every_recording_is_a_case() -> None:
    recorded = {path.stem for path in peer_parity.Recording.path("x").parent.glob("*.yaml")}
    assert recorded == {*CASES, "mig-device-id-0"}
    versions = {peer_parity.Recording.load(case).version for case in recorded}
    assert len(versions) == 1, f"recorded with different nvidia-ctk versions: {versions}"


def test_intended_differences_are_documented() -> None:
    """INTENDED is the list; the docs page names each entry, so a reader finds them."""
    page = (peer_parity.REPO / "docs/developer/nvidia-ctk-parity.md").read_text()
    assert all(f"`{key}`" in page for key in peer_parity.INTENDED), [
        key for key in peer_parity.INTENDED if f"`{key}`" not in page]
