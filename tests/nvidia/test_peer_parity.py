"""Side by side with NVIDIA's ``nvidia-ctk cdi generate`` on 13 simulated node layouts, both
in NVML mode on the same node through its simulated libnvidia-ml: everything the two specs
carry must agree, field by field (``peer_parity``), apart from the normalisations in
``peer_parity.NORMALISED`` and the differences in ``peer_parity.INTENDED``, each of which
must still be needed by some case.

nvidia-ctk is not part of this repository. With it at hand ($NRI_CDI_PEERS) each case runs
it live and checks its recording in tests/data/nvidia-ctk-<version>/ still says the same
(or, with $NRI_CDI_RECORD_PEERS=1, rewrites it); without it, each case compares with the
recording (docs/developer/nvidia-ctk-parity.md)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest
import yaml

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


ALL_CASES = {**CASES, "mig-device-id-0": (MIG, ("--device-id", "0"))}


def nvidia_ctk(case: str, node: BuiltNode, options: tuple[str, ...]) -> str:
    """nvidia-ctk's spec for ``case``: live where it runs here (its recording checked, or
    rewritten when asked), else the recording."""
    if LIVE_REASON is not None:
        if recording_requested():
            pytest.fail(f"{RECORD_ENV}=1 needs nvidia-ctk: {LIVE_REASON}")
        recorded = peer_parity.Recording.load(case)
        assert recorded.arguments == options, (
            f"{case!r} was recorded with {recorded.arguments}, the case now says {options}: "
            f"rerun with nvidia-ctk and {RECORD_ENV}=1")
        return recorded.text
    live = peer_parity.run(peer_parity.ctk_argv(node, options), node)
    fresh = peer_parity.Recording(case, options, live)
    version = peer_parity.peer_version()
    if recording_requested():
        fresh.save(version)
        return live
    recorded = peer_parity.Recording.load(case)
    index = peer_parity.Recording.index()
    assert (index["version"], recorded.arguments, recorded.text) == (
        version, fresh.arguments, fresh.text), (
        f"the recording of {case!r} ({index['version']}) is not what the live nvidia-ctk "
        f"({version}) says: rerun with {RECORD_ENV}=1 and review the diff")
    return live


def ours(node: BuiltNode, options: tuple[str, ...]) -> str:
    return peer_parity.run(peer_parity.ours_argv(node, options), node)


@pytest.fixture(scope="module")
def compared(built: Callable[[NodeLayout], BuiltNode],
             gcc_m32: bool) -> dict[str, peer_parity.Comparison]:
    """Every case compared once: the per-case tests read their own, the waiver check all."""
    out = {}
    for case, (layout, extra) in sorted(ALL_CASES.items()):
        if layout.compat32 and not gcc_m32:
            continue
        node = built(layout)
        options = ("--mode", "nvml", *extra)
        out[case] = peer_parity.compare(ours(node, options), nvidia_ctk(case, node, options),
                                        node)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_as_nvidia_ctk(case: str, compared: dict[str, peer_parity.Comparison]) -> None:
    if case not in compared:
        pytest.skip("gcc -m32 (multilib) is needed to build i386 libraries")
    assert list(compared[case].differences) == []


def test_every_intended_difference_is_still_needed(
        compared: dict[str, peer_parity.Comparison], gcc_m32: bool) -> None:
    """A waiver no case needs any more is stale: drop it from INTENDED (and the docs)."""
    if not gcc_m32:
        pytest.skip("the compat32 case needs gcc -m32 (multilib)")
    used = set().union(*(c.used for c in compared.values()))
    assert sorted(set(peer_parity.INTENDED) - used) == []


def test_a_different_device_set_is_reported(built: Callable[[NodeLayout], BuiltNode]) -> None:
    node = built(MIG)
    theirs = nvidia_ctk("mig-device-id-0", node, ("--mode", "nvml", "--device-id", "0"))
    lines = peer_parity.compare(ours(node, ("--mode", "nvml")), theirs, node).differences
    assert any("device names" in line for line in lines)


# --- the comparison bites: each class of difference fails it --------------------------------


def _edited(text: str, edit: Callable[[dict[str, Any]], None]) -> str:
    doc = yaml.safe_load(text)
    edit(doc)
    return str(yaml.safe_dump(doc))


def _add_env(doc: dict[str, Any]) -> None:
    doc["containerEdits"]["env"].append("LD_PRELOAD=/tmp/x.so")


def _rw_mount(doc: dict[str, Any]) -> None:
    doc["containerEdits"]["mounts"][0]["options"].append("rw")


def _minor(doc: dict[str, Any]) -> None:
    node = doc["devices"][0]["containerEdits"]["deviceNodes"][0]
    node["minor"] = node.get("minor", 0) + 1


def _shadow_at_an_allowed_path(doc: dict[str, Any]) -> None:
    """A mount at a path an intended difference allows (NvAPI's), of another file."""
    doc["containerEdits"]["mounts"].append({
        "hostPath": "/etc/shadow", "containerPath": "/usr/lib/x86_64-linux-gnu/libnvidia-api.so.1",
        "options": list(peer_parity.LIBRARY_OPTIONS)})


def _permissions(doc: dict[str, Any]) -> None:
    doc["containerEdits"]["deviceNodes"][0]["permissions"] = "rw"


def _owner(doc: dict[str, Any]) -> None:
    doc["containerEdits"]["deviceNodes"][0]["uid"] = 1000


def _file_mode(doc: dict[str, Any]) -> None:
    doc["containerEdits"]["deviceNodes"][0]["fileMode"] = 0o777


def _node_type(doc: dict[str, Any]) -> None:
    doc["containerEdits"]["deviceNodes"][0]["type"] = "b"


def _cdi_version(doc: dict[str, Any]) -> None:
    doc["cdiVersion"] = "0.6.0"


def _hook_argument(doc: dict[str, Any]) -> None:
    args = doc["containerEdits"]["hooks"][0]["args"]
    args.insert(args.index("update-ldcache") + 1, "--folder=/tmp")


def _hook_env(doc: dict[str, Any]) -> None:
    doc["containerEdits"]["hooks"][0]["env"].append("LD_PRELOAD=/tmp/x.so")


def _mount_order(doc: dict[str, Any]) -> None:
    mounts = doc["containerEdits"]["mounts"]
    mounts[0], mounts[1] = mounts[1], mounts[0]


def _gid(doc: dict[str, Any]) -> None:
    doc["devices"][0]["containerEdits"].setdefault("additionalGids", []).append(0)


def _device_name(doc: dict[str, Any]) -> None:
    doc["devices"][0]["name"] = "gpu0"


def _kind(doc: dict[str, Any]) -> None:
    doc["kind"] = "example.com/gpu"


BITES = {"env LD_PRELOAD": _add_env, "rw mount option": _rw_mount, "node minor": _minor,
         "/etc/shadow at an allowed path": _shadow_at_an_allowed_path,
         "permissions": _permissions, "owner": _owner, "fileMode": _file_mode,
         "node type": _node_type, "cdiVersion": _cdi_version, "hook argument": _hook_argument,
         "hook env": _hook_env, "mount order": _mount_order, "additionalGids": _gid,
         "device name": _device_name, "kind": _kind}


@pytest.mark.parametrize("change", sorted(BITES))
def test_each_class_of_difference_fails(change: str,
                                        built: Callable[[NodeLayout], BuiltNode]) -> None:
    """Our spec of the MIG case, changed in one way, no longer agrees with nvidia-ctk's."""
    node = built(MIG)
    options = ("--mode", "nvml")
    mine, theirs = ours(node, options), nvidia_ctk("mig", node, options)
    assert peer_parity.compare(mine, theirs, node).differences == ()
    try:
        lines = peer_parity.compare(_edited(mine, BITES[change]), theirs, node).differences
    except peer_parity.SpecError as refused:  # a broken premise fails the comparison too
        lines = (str(refused),)
    assert lines, change


def test_every_case_is_recorded_and_every_recording_is_a_case() -> None:
    assert set(peer_parity.cases_recorded()) == set(ALL_CASES)
    index = peer_parity.Recording.index()
    assert set(index["cases"]) == set(ALL_CASES)
    assert index["version"].startswith(f"NVIDIA Container Toolkit CLI version "
                                       f"{peer_parity.VERSION} ")


def test_intended_differences_and_normalisations_are_documented() -> None:
    """INTENDED and NORMALISED are the lists; the docs page names each entry."""
    page = (peer_parity.REPO / "docs/developer/nvidia-ctk-parity.md").read_text()
    names = [*peer_parity.INTENDED, *peer_parity.NORMALISED]
    assert [name for name in names if f"`{name}`" not in page] == []
