"""Graphics parts of a generated spec: additionalGids for group-only DRM nodes, the Vulkan
ICD at the top of a GKE driver root, $XDG_DATA_DIRS, and the vulkan-producer link."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from cdi.spec import parse_spec
from nri_cdi_testbed.simnode import BuiltNode, NodeLayout
from tests.helpers import run_generate as generate

needs_nodes = pytest.mark.skipif(os.geteuid() != 0, reason="needs real device nodes (root)")
NodeFactory = Callable[[str, NodeLayout], BuiltNode]


@pytest.fixture(scope="module")
def gke(node_factory: NodeFactory) -> BuiltNode:
    return node_factory("gke", NodeLayout.uniform(
        2, driver_version="525.147.05", cuda_version=(12, 0), seed="gke",
        extras=("vulkan-icd-at-root", "vulkan-producer", "configs-in-local-share")))


def _args(node: BuiltNode, *extra: str) -> list[str]:
    return ["--driver-root", str(node.driver_root), "--mode", "procfs", *extra]


@needs_nodes
def test_group_only_nodes_bring_their_groups(gke: BuiltNode) -> None:
    rc, out, err = generate(_args(gke))
    assert rc == 0, err
    spec = parse_spec(out).data
    assert spec.cdi_version == "0.7.0"
    gids = gke.manifest["gids"]
    for device in spec.devices:
        edits = device.container_edits
        groups = {n.gid for n in edits.device_nodes
                  if n.gid and (n.file_mode or 0) & 0o006 != 0o006}
        assert groups == {gids["video"], gids["render"]}  # 0660 card*/renderD* of each GPU
        assert set(edits.additional_gids) == groups
    # The control nodes are 0666: no group needed, none added.
    assert spec.container_edits.additional_gids == ()


@needs_nodes
def test_world_accessible_nodes_need_no_groups(gke: BuiltNode, tmp_path: Path) -> None:
    card = gke.dev_root / "dev/dri/card0"
    render = gke.dev_root / "dev/dri/renderD128"
    modes = {p: os.stat(p).st_mode & 0o777 for p in (card, render)}
    try:
        for path in modes:
            os.chmod(path, 0o666)
        rc, out, _ = generate(_args(gke, "--device-id", "0"))
        assert rc == 0
        gpu0 = next(d for d in parse_spec(out).data.devices if d.name == "0")
        assert gpu0.container_edits.additional_gids == ()
    finally:
        for path, mode in modes.items():
            os.chmod(path, mode)


@needs_nodes
def test_older_cdi_version_leaves_groups_out_and_says_so(gke: BuiltNode) -> None:
    rc, out, err = generate(_args(gke, "--cdi-version", "0.6.0"))
    assert rc == 0, err
    spec = parse_spec(out).data
    assert spec.cdi_version == "0.6.0"  # 0.6.0 allows our annotations, not the groups
    assert not any(d.container_edits.additional_gids for d in spec.devices)
    assert "additionalGids left out (--cdi-version 0.6.0 < 0.7.0)" in err
    assert "/dev/dri/renderD128" in err


@needs_nodes
def test_vulkan_icd_at_the_driver_root(gke: BuiltNode) -> None:
    rc, out, _ = generate(_args(gke))
    assert rc == 0
    mounts = {m.container_path: m.host_path for m in parse_spec(out).data.container_edits.mounts}
    assert mounts["/etc/vulkan/icd.d/nvidia_icd.json"] == str(
        gke.driver_root / "vulkan/icd.d/nvidia_icd.json")
    # found under /usr/local/share (an XDG data folder), mounted where the loader looks
    assert mounts["/usr/share/glvnd/egl_vendor.d/10_nvidia.json"] == str(
        gke.driver_root / "usr/local/share/glvnd/egl_vendor.d/10_nvidia.json")


@needs_nodes
def test_xdg_data_dirs_are_searched(gke: BuiltNode) -> None:
    rc, out, _ = generate(_args(gke), {"XDG_DATA_DIRS": "/usr/share"})
    assert rc == 0
    mounts = {m.container_path for m in parse_spec(out).data.container_edits.mounts}
    assert "/usr/share/glvnd/egl_vendor.d/10_nvidia.json" not in mounts  # only in local/share
    rc, out, _ = generate(_args(gke), {"XDG_DATA_DIRS": "relative/ignored:/usr/local/share"})
    mounts = {m.container_path for m in parse_spec(out).data.container_edits.mounts}
    assert "/usr/share/glvnd/egl_vendor.d/10_nvidia.json" in mounts


@needs_nodes
def test_vulkan_producer_link(gke: BuiltNode) -> None:
    lib = gke.manifest["lib_dir"]
    assert not (gke.lib_dir / "libnvidia-vulkan-producer.so").exists()  # as on such hosts
    rc, out, _ = generate(_args(gke))
    assert rc == 0
    args = [a for h in parse_spec(out).data.container_edits.hooks for a in h.args]
    assert f"libnvidia-vulkan-producer.so.525.147.05::{lib}/libnvidia-vulkan-producer.so" in args
