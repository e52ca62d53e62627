"""A driver root with broken or hostile files: generate skips what it cannot trust, says
so, and still writes the spec of everything else."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cdi.spec import parse_spec
from nri_cdi_testbed.simnode import BuiltNode, NodeLayout
from tests.helpers import hook_links, run_generate

NodeFactory = Callable[[str, NodeLayout], BuiltNode]


@pytest.fixture
def node(node_factory: NodeFactory) -> BuiltNode:
    return node_factory("hostile", NodeLayout(seed="hostile"))


def _spec_text(node: BuiltNode, *extra: str) -> tuple[str, str]:
    """(spec, stderr) of ``generate`` run in-process on ``node``."""
    rc, out, err = run_generate(["--driver-root", str(node.driver_root), "--dev-root",
                                 str(node.dev_root), "--mode", "procfs", *extra])
    assert rc == 0, err
    parse_spec(out)  # still a valid spec
    return out, err


def test_symlink_loop_is_skipped_with_a_warning(node: BuiltNode) -> None:
    before, _ = _spec_text(node)
    icd = node.driver_root / "etc/vulkan/icd.d/nvidia_icd.json"
    assert "/etc/vulkan/icd.d/nvidia_icd.json" in before
    icd.unlink()
    icd.symlink_to(icd.name)  # a link to itself
    after, err = _spec_text(node)
    assert f"skipped {icd}: too many levels of symbolic links" in err
    assert "/etc/vulkan/icd.d/nvidia_icd.json" not in after
    # everything else is still there
    assert after.count("hostPath:") == before.count("hostPath:") - 1


def test_library_folder_in_a_loop_costs_only_that_folder(node: BuiltNode) -> None:
    loop = node.driver_root / "usr/lib64"  # searched, absent on a Debian-layout node
    assert not loop.exists()
    loop.symlink_to("lib64")
    out, err = _spec_text(node)
    assert "too many levels of symbolic links" in err
    assert "libcuda.so" in out


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the hostile library")
def test_soname_naming_another_folder_makes_no_link(node: BuiltNode, tmp_path: Path) -> None:
    version = str(node.manifest["driver_version"])
    lib = node.lib_dir / f"libnvidia-hostile.so.{version}"
    src = tmp_path / "hostile.c"
    src.write_text("int hostile(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,../hostile.so.1", "-o", str(lib),
                    str(src)], check=True)
    # The link the SONAME names exists (pointing at the library), outside the lib folder.
    outside = node.lib_dir.parent / "hostile.so.1"
    outside.symlink_to(os.path.relpath(lib, outside.parent))
    out, err = _spec_text(node)
    assert f"skipped {lib}: its SONAME '../hostile.so.1' names another folder" in err
    assert f"libnvidia-hostile.so.{version}" in out  # the library itself is mounted
    assert "hostile.so.1" not in out  # but no link is made for its SONAME
    assert "/.." not in out


# --- links in the default folders (issue 23: Debian's /etc/alternatives layout) -------------


def _links(text: str) -> dict[str, str]:
    return hook_links(hook.args for hook in parse_spec(text).data.container_edits.hooks)


def test_alternatives_chain_is_anchored_at_the_mounted_file(node: BuiltNode) -> None:
    # A distribution's link through /etc/alternatives: reproduced, pointing at the file
    # the spec mounts, never at /etc/alternatives (which the container lacks).
    version = str(node.manifest["driver_version"])
    lib = str(node.manifest["lib_dir"])
    alt = node.driver_root / "etc/alternatives/test--libcuda.so.1"
    alt.parent.mkdir(parents=True, exist_ok=True)
    alt.symlink_to(f"{lib}/libcuda.so.1")
    gbm = node.driver_root / lib.lstrip("/") / "gbm"
    gbm.mkdir(exist_ok=True)
    (gbm / "test_gbm.so").symlink_to("/etc/alternatives/test--libcuda.so.1")
    out, _ = _spec_text(node)
    links = _links(out)
    assert links[f"{lib}/gbm/test_gbm.so"] == f"../libcuda.so.{version}"
    assert not [t for t in links.values() if t.startswith("/etc/alternatives")]


def test_link_ending_at_no_driver_file_is_not_reproduced(node: BuiltNode) -> None:
    lib = str(node.manifest["lib_dir"])
    folder = node.driver_root / lib.lstrip("/")
    (folder / "libother.so.3").write_bytes(b"not the driver")
    (folder / "libother.so").symlink_to("libother.so.3")
    (folder / "libdangling.so").symlink_to("/etc/alternatives/none")
    out, _ = _spec_text(node)
    assert f"{lib}/libother.so" not in _links(out)
    assert f"{lib}/libdangling.so" not in _links(out)
    assert "libother" not in out
