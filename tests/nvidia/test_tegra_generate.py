"""``nri-cdi generate --mode csv`` on a simulated Jetson (nri_cdi_testbed.tegra): what each CSV
line becomes, the two link modes, NVML's part (the compat hook, an Orin's compat root, more
GPUs than one), --mode auto, the options, the sidecar and the errors."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cdi.spec import parse_spec
from nri_cdi_testbed.tegra import BuiltTegraNode, TegraLayout
from tests.helpers import run_generate as generate
from tests.nvidia.csv_parity import ROOT, summary

TegraFactory = Callable[[str, TegraLayout], BuiltTegraNode]
LIB = "/usr/lib/aarch64-linux-gnu"
NV = f"{LIB}/nvidia"
ORIN = TegraLayout(nvml=("Orin (nvgpu)",), seed="orin")
needs_pynvml = pytest.mark.skipif(importlib.util.find_spec("pynvml") is None,
                                  reason="nvidia-ml-py (pynvml) is not installed")


@pytest.fixture(scope="module")
def node(tegra_factory: TegraFactory) -> BuiltTegraNode:
    return tegra_factory("tegra", TegraLayout())


def ours(node: BuiltTegraNode, *argv: str, env: dict[str, str] | None = None) -> str:
    rc, out, err = generate(["--mode", "csv", "--driver-root", str(node.root), *argv], env)
    assert rc == 0, err
    parse_spec(out, "nvidia.yaml")  # the strict parser takes it
    return out


def expected_mounts(node: BuiltTegraNode) -> set[tuple[str, str]]:
    """Every file the CSV files list that the node has, at the path it ends at."""
    files = [lib["path"] for lib in node.manifest["libraries"]]
    files += [f"{NV}/nvidia_icd.json", "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
              "/usr/lib/firmware/ga10b/gpmu_ucode_image.bin",  # listed as /lib/firmware/...
              "/opt/nvidia/vpi3", "/etc/nv_tegra_release"]
    return {(path, ROOT + path) for path in files}


EXPECTED_LINKS = {
    # beside the versioned libraries: libcuda.so always, SONAME links where the host has them
    f"libcuda.so.1::{NV}/libcuda.so",
    f"libcuda.so.1.1::{NV}/libcuda.so.1",
    f"libnvidia-ptxjitcompiler.so.540.4.0::{NV}/libnvidia-ptxjitcompiler.so.1",
    # the chains of the sym lines, each link with its own text
    f"nvidia/libcuda.so::{LIB}/libcuda.so",
    f"{NV}/libnvidia-ptxjitcompiler.so.1::{LIB}/libnvidia-ptxjitcompiler.so.1",
    "../../../usr/lib/aarch64-linux-gnu/nvidia/nvidia_icd.json::/etc/vulkan/icd.d/nvidia_icd.json",
}


def test_the_default_spec(node: BuiltTegraNode) -> None:
    rc, out, err = generate(["--mode", "csv", "--driver-root", str(node.root)])
    assert rc == 0, err
    spec = summary(out, node)
    assert sorted(spec["devices"]) == ["0", "all"]  # no UUID without NVML: no uuid name
    gpu = spec["devices"]["0"]
    assert gpu["nodes"] == sorted((n["path"], ROOT + n["path"])
                                  for n in node.manifest["device_nodes"])
    assert not set(node.manifest["absent_nodes"]) & {path for path, _ in gpu["nodes"]}
    assert gpu["gids"] == [44, 105]  # the 0660 video and render nodes
    assert spec["devices"]["all"] == gpu
    common = spec["common"]
    assert set(common["mounts"]) == expected_mounts(node)
    assert set(common["links"]) == EXPECTED_LINKS
    assert common["ldcache"] == [NV]
    # no NVML: no CUDA version to give enable-cuda-compat; no disable-device-node-modification
    assert common["hooks"] == ["create-symlinks", "update-ldcache"]
    assert common["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert common["nodes"] == []
    # three entries of the board's lists are not on this module, and are named
    assert "3 CSV entries found nothing on this node" in err
    assert "devices.csv:" in err and "dev /dev/nvhost-ctrl-nvdla0" in err


def test_debug_names_each_entry_left_out(node: BuiltTegraNode) -> None:
    rc, _, err = generate(["--mode", "csv", "--driver-root", str(node.root), "--debug"])
    assert rc == 0
    lines = [ln for ln in err.splitlines() if "not on this node" in ln]
    assert [ln.rsplit(": ", 2)[-1] for ln in lines] == [
        "dev /dev/nvhost-ctrl-nvdla0", "dev /dev/nvhost-nvdla0",
        f"lib {NV}/libnvdla_runtime.so"]
    assert all(f"{node.csv_folder}/" in ln for ln in lines)


def test_link_mode_mounts(node: BuiltTegraNode) -> None:
    spec = summary(ours(node, "--link-mode", "mounts"), node)["common"]
    assert spec["hooks"] == [] and spec["links"] == []
    links = {link.partition("::")[2] for link in EXPECTED_LINKS}
    mounted = dict(spec["mounts"])
    for path in links:  # each link a bind mount of the file it ends at
        end = Path(node.root, path.lstrip("/")).resolve()
        if path == f"{LIB}/libnvidia-ptxjitcompiler.so.1":  # absolute: ends in the root
            end = node.root / NV.lstrip("/") / "libnvidia-ptxjitcompiler.so.540.4.0"
        assert mounted[path] == ROOT + "/" + str(end.relative_to(node.root)), path
    assert set(spec["mounts"]) == expected_mounts(node) | {(p, mounted[p]) for p in links}
    assert spec["env"] == [f"NRI_CDI_LD_LIBRARY_PATH={NV}", "NVIDIA_VISIBLE_DEVICES=void"]


def test_links_resolve_inside_the_driver_root(node: BuiltTegraNode) -> None:
    """The absolute link of the folder above ends at the node's file, not the host's."""
    spec = summary(ours(node, "--link-mode", "mounts"), node)["common"]
    assert dict(spec["mounts"])[f"{LIB}/libnvidia-ptxjitcompiler.so.1"] == \
        f"{ROOT}{NV}/libnvidia-ptxjitcompiler.so.540.4.0"


def test_ignore_patterns(node: BuiltTegraNode) -> None:
    spec = summary(ours(node, "--csv.ignore-pattern", "**/libcuda.so",
                        "--csv.ignore-pattern", "/etc/vulkan/icd.d/*"), node)["common"]
    # the two sym lines named libcuda.so and the Vulkan one are gone with their chains; the
    # links made beside the library itself stay, as nvidia-ctk's do
    assert set(spec["links"]) == EXPECTED_LINKS - {
        f"nvidia/libcuda.so::{LIB}/libcuda.so",
        "../../../usr/lib/aarch64-linux-gnu/nvidia/nvidia_icd.json::"
        "/etc/vulkan/icd.d/nvidia_icd.json"}
    assert (f"{NV}/nvidia_icd.json", f"{ROOT}{NV}/nvidia_icd.json") not in spec["mounts"]
    env = {"NVIDIA_CTK_CDI_GENERATE_CSV_IGNORE_PATTERNS": "**/libcuda.so,/etc/vulkan/icd.d/*"}
    assert summary(ours(node, env=env), node)["common"] == spec


def test_csv_files_named(node: BuiltTegraNode) -> None:
    devices, drivers = (str(node.csv_folder / n) for n in ("devices.csv", "drivers.csv"))
    spec = summary(ours(node, "--csv.file", devices, "--csv.file", drivers), node)
    mounts = {path for path, _ in spec["common"]["mounts"]}
    assert f"{NV}/libcuda.so.1.1" in mounts and f"{NV}/libnvos.so" not in mounts  # l4t.csv's
    env = {"NVIDIA_CTK_CDI_GENERATE_CSV_FILES": f"{devices},{drivers}"}
    assert summary(ours(node, env=env), node) == spec


def test_library_search_path_finds_bare_names(node: BuiltTegraNode, tmp_path: Path) -> None:
    listing = tmp_path / "names.csv"
    listing.write_text("dev, nvmap\nlib, libnvos.so\n")
    spec = summary(ours(node, "--csv.file", str(listing), "--library-search-path", NV), node)
    assert spec["devices"]["0"]["nodes"] == [("/dev/nvmap", f"{ROOT}/dev/nvmap")]
    assert spec["common"]["mounts"] == sorted([(f"{NV}/libnvos.so", f"{ROOT}{NV}/libnvos.so"),
                                               ("/etc/nv_tegra_release",
                                                f"{ROOT}/etc/nv_tegra_release")])


def test_names_and_device_ids(node: BuiltTegraNode) -> None:
    def names(*argv: str) -> list[str]:
        return sorted(summary(ours(node, *argv), node)["devices"])

    assert names("--device-name-strategy", "type-index", "--device-name-strategy",
                 "index") == ["0", "all", "gpu0"]
    assert names("--no-all-device") == ["0"]
    assert names("--device-id", "0") == ["0", "all"]
    assert names("--device-id", "none") == ["none"]  # the files alone (nvidia-ctk refuses)
    rc, _, err = generate(["--mode", "csv", "--driver-root", str(node.root),
                           "--device-name-strategy", "uuid"])
    assert rc == 1 and "csv mode knows no UUID" in err and "add index or type-index" in err
    rc, _, err = generate(["--mode", "csv", "--driver-root", str(node.root), "--device-id", "1"])
    assert rc == 1 and "--device-id '1': no such GPU" in err


def test_nvidia_hook_program_entries(node: BuiltTegraNode) -> None:
    doc = parse_spec(ours(node, "--hook-path", "/usr/bin/nvidia-cdi-hook"), "x.yaml").data
    hooks = doc.container_edits.hooks
    assert [h.args[:2] for h in hooks] == [("nvidia-cdi-hook", "create-symlinks"),
                                           ("nvidia-cdi-hook", "update-ldcache")]
    assert all(h.env == ("NVIDIA_CTK_DEBUG=false",) for h in hooks)


def test_sidecar_and_if_changed(node: BuiltTegraNode, tmp_path: Path) -> None:
    out = tmp_path / "nvidia.yaml"
    rc, _, err = generate(["--mode", "csv", "--driver-root", str(node.root), "--output",
                           str(out), "--if-changed"])
    assert rc == 0, err
    meta: dict[str, Any] = json.loads((tmp_path / "nvidia.yaml.meta").read_text())
    assert meta["mode"] == "csv" and meta["capabilities"] == {}  # the plugin filters nothing
    assert meta["driver"]["libraryDirs"] == [NV]
    assert meta["devices"]["0"]["type"] == "gpu" and meta["devices"]["0"]["gpuUuid"] == ""
    rc, _, err = generate(["--mode", "csv", "--driver-root", str(node.root), "--output",
                           str(out), "--if-changed"])
    assert rc == 0 and "is up to date" in err
    # a sym line less whose file another line mounts changes only links: still seen
    drivers = (node.csv_folder / "drivers.csv").read_text()
    trimmed = tmp_path / "drivers.csv"
    trimmed.write_text(drivers.replace(f"sym, {LIB}/libcuda.so\n", ""))
    assert trimmed.read_text() != drivers
    files = ["--csv.file", str(node.csv_folder / "devices.csv"), "--csv.file"]
    for listing, rewritten in ((node.csv_folder / "drivers.csv", True),
                               (node.csv_folder / "drivers.csv", False), (trimmed, True)):
        rc, _, err = generate(["--mode", "csv", "--driver-root", str(node.root), "--output",
                               str(out), "--if-changed", *files, str(listing)])
        assert rc == 0 and ("is up to date" not in err) is rewritten, err
    assert f"{LIB}/libcuda.so" not in out.read_text()


def test_bad_csv_line_fails_naming_file_and_line(node: BuiltTegraNode, tmp_path: Path) -> None:
    listing = tmp_path / "bad.csv"
    listing.write_text("dev, /dev/nvmap\nlib: /usr/lib/libcuda.so\n")
    rc, out, err = generate(["--mode", "csv", "--driver-root", str(node.root),
                             "--csv.file", str(listing)])
    assert (rc, out) == (1, "")
    assert err == (f"nri-cdi generate: error: {listing}:2: want 'KIND, PATH' (KIND one of dev, "
                   "lib, sym, dir), got 'lib: /usr/lib/libcuda.so'\n")


def test_errors(node: BuiltTegraNode, tmp_path: Path) -> None:
    base = ["--mode", "csv", "--driver-root", str(node.root)]
    rc, _, err = generate([*base, "--csv.file", str(tmp_path / "missing.csv")])
    assert rc == 1 and f"{tmp_path}/missing.csv: cannot read: No such file" in err
    only_files = tmp_path / "files.csv"
    only_files.write_text(f"lib, {NV}/libnvos.so\n")
    rc, _, err = generate([*base, "--csv.file", str(only_files)])
    assert rc == 1 and "no dev line of" in err and "so there is no GPU device" in err
    rc, _, err = generate(["--mode", "csv", "--driver-root", str(tmp_path)])
    assert rc == 1 and "none of devices.csv, drivers.csv, l4t.csv in " \
        f"{tmp_path}/etc/nvidia-container-runtime/host-files-for-container.d" in err
    rc, _, err = generate([*base, "--csv.compat-container-root", "relative"])
    assert rc == 1 and "--csv.compat-container-root must be absolute" in err


def test_auto_picks_csv_on_a_jetson(node: BuiltTegraNode) -> None:
    rc, out, err = generate(["--driver-root", str(node.root)])
    assert rc == 0 and "mode auto: using csv (Tegra files, no NVML)" in err
    assert summary(out, node) == summary(ours(node), node)


# --- NVML -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def orin(tegra_factory: TegraFactory) -> BuiltTegraNode:
    return tegra_factory("orin", ORIN)


@needs_pynvml
def test_an_orin_gets_the_compat_hook_with_its_compat_root(orin: BuiltTegraNode) -> None:
    spec = summary(ours(orin), orin)
    common = spec["common"]
    assert common["hooks"] == ["create-symlinks", "enable-cuda-compat", "update-ldcache"]
    assert common["compat"] == ["--cuda-compat-container-root=/usr/local/cuda/compat_orin",
                                "--host-cuda-version=12.6"]
    assert sorted(spec["devices"]) == ["0", "all"]  # pure CSV mode: no UUID name either
    assert (f"{NV}/libnvidia-ml.so.540.4.0", f"{ROOT}{NV}/libnvidia-ml.so.540.4.0") in \
        common["mounts"]
    moved = summary(ours(orin, "--csv.compat-container-root", "/opt/compat"), orin)
    assert moved["common"]["compat"] == ["--cuda-compat-container-root=/opt/compat",
                                         "--host-cuda-version=12.6"]
    # the hook's order: links, compat, then the ld cache that puts the compat folder first
    doc = parse_spec(ours(orin, "--hook-path", "/usr/bin/nvidia-cdi-hook"), "x.yaml").data
    assert [h.args[1] for h in doc.container_edits.hooks] == [
        "create-symlinks", "enable-cuda-compat", "update-ldcache"]
    mounts_mode = summary(ours(orin, "--link-mode", "mounts"), orin)["common"]
    assert mounts_mode["hooks"] == [] and mounts_mode["compat"] == []


@needs_pynvml
def test_a_thor_gets_no_compat_root(tegra_factory: TegraFactory) -> None:
    thor = tegra_factory("thor", TegraLayout(nvml=("NVIDIA Thor",), seed="thor"))
    rc, out, err = generate(["--mode", "csv", "--driver-root", str(thor.root),
                             "--csv.compat-container-root", "/opt/compat"])
    assert rc == 0 and "--csv.compat-container-root /opt/compat: ignored, NVML names no Orin" \
        in err
    assert summary(out, thor)["common"]["compat"] == ["--host-cuda-version=12.6"]
    rc, _, err = generate(["--driver-root", str(thor.root)])
    assert rc == 0 and "mode auto: using csv (an integrated GPU)" in err


@needs_pynvml
def test_more_gpus_than_the_integrated_one(tegra_factory: TegraFactory) -> None:
    igx = tegra_factory("igx", TegraLayout(nvml=("Orin (nvgpu)", "NVIDIA RTX 6000 Ada"),
                                           seed="igx"))
    base = ["--mode", "csv", "--driver-root", str(igx.root)]
    rc, _, err = generate(base)
    assert rc == 1 and "NVML sees 2 GPUs (Orin (nvgpu), NVIDIA RTX 6000 Ada)" in err
    assert "--feature-flag disable-multiple-csv-devices" in err
    rc, out, err = generate([*base, "--feature-flag", "disable-multiple-csv-devices"])
    assert rc == 0, err
    assert sorted(summary(out, igx)["devices"]) == ["0", "all"]
