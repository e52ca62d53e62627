"""``nri-cdi generate`` on NVIDIA's real driver as Debian ships it (tests/nvidia_debian.py):
every driver file where the capability table says, every link anchored to what the spec
provides (none through /etc/alternatives, none dangling), NVML failing cleanly."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import pytest
import yaml

from cdi.spec import parse_spec
from nri_cdi_testbed.simnode import BuiltNode
from tests.helpers import annotations_policy, hook_links
from tests.helpers import run_generate as generate
from tests.nvidia_debian import DATA as DATA_DIR
from tests.nvidia_debian import VERSION, capability_table, driver_root, file_list, kernel_side

LINK_MODES = ("hooks", "mounts")
LIB64 = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture(scope="module")
def root() -> Path:
    return driver_root()


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> BuiltNode:
    if os.geteuid() != 0:
        pytest.skip("the kernel side's device nodes need root (mknod)")
    return kernel_side(tmp_path_factory.mktemp("debian-kernel") / "node")


@pytest.fixture(scope="module")
def specs(root: Path, kernel: BuiltNode) -> dict[str, dict[str, object]]:
    out = {}
    for mode in LINK_MODES:
        rc, text, err = generate(["--mode", "procfs", "--driver-root", str(root), "--dev-root",
                                  str(kernel.dev_root), "--link-mode", mode,
                                  "--hook-path", "/usr/local/bin/nri-cdi"])
        assert rc == 0, err
        parse_spec(text, f"debian-{mode}.yaml")  # our validator accepts it
        out[mode] = yaml.safe_load(text[text.index("---"):])
    return out


def _mounts(spec: dict[str, object]) -> list[dict[str, str]]:
    edits = spec["containerEdits"]
    assert isinstance(edits, dict)
    return list(edits["mounts"])


def _links(spec: dict[str, object]) -> dict[str, str]:
    """The create-symlinks hook's links, {container path: target text}."""
    edits = spec["containerEdits"]
    assert isinstance(edits, dict)
    return hook_links(hook["args"] for hook in edits.get("hooks", []))


def test_the_installed_root_is_the_one_the_expectations_describe(root: Path) -> None:
    # The packages' own maintainer scripts made the links: a change in them (or in how
    # scripts/debian_maintscripts.py runs them) shows here first.
    want = (DATA_DIR / "files.txt").read_text().splitlines()
    assert file_list(root) == want
    assert "l usr/lib/x86_64-linux-gnu/libcuda.so.1 -> " \
        "/etc/alternatives/nvidia--libcuda.so.1-x86_64-linux-gnu" in want


@pytest.mark.parametrize("mode", LINK_MODES)
def test_every_driver_file_is_included_or_excluded_as_the_table_says(
        root: Path, specs: dict[str, dict[str, object]], mode: str) -> None:
    real = os.path.realpath(root)
    mounted = {os.path.relpath(os.path.realpath(m["hostPath"]), real) for m in
               _mounts(specs[mode])}
    wrong = [f"{row.path}: expected {'in' if row.included else 'out'}"
             for row in capability_table() if (row.path.lstrip("/") in mounted) != row.included]
    assert not wrong, "\n".join(wrong)
    listed = {line.split()[1] for line in (DATA_DIR / "files.txt").read_text().splitlines()
              if line.startswith("f ")}
    assert {row.path.lstrip("/") for row in capability_table()} == listed


@pytest.mark.parametrize("mode", LINK_MODES)
def test_no_spec_entry_points_at_a_missing_host_file(
        specs: dict[str, dict[str, object]], mode: str) -> None:
    missing = [m["hostPath"] for m in _mounts(specs[mode]) if not os.path.exists(m["hostPath"])]
    assert not missing


def test_no_link_dangles_or_leaves_the_spec(specs: dict[str, dict[str, object]]) -> None:
    spec = specs["hooks"]
    links = _links(spec)
    files = {m["containerPath"] for m in _mounts(spec)}
    dangling = []
    for path in links:
        seen, here = set(), path
        while here in links and here not in seen:  # follow the chain inside the container
            seen.add(here)
            here = posixpath.normpath(posixpath.join(posixpath.dirname(here), links[here]))
        if here not in files:
            dangling.append(f"{path} -> {links[path]} (ends at {here})")
    assert not dangling, "\n".join(dangling)
    assert not [t for t in links.values() if "/etc/alternatives" in t]
    # defects 1 and 2 of issue 23, by name
    assert links[f"{LIB64}/gbm/nvidia-drm_gbm.so"] == \
        f"../nvidia/current/libnvidia-allocator.so.{VERSION}"
    assert links[f"{LIB64}/libcuda.so.1"] == f"nvidia/current/libcuda.so.{VERSION}"


def test_mounts_mode_puts_the_libraries_where_the_loader_looks(
        root: Path, specs: dict[str, dict[str, object]]) -> None:
    # Native CDI with --link-mode mounts: no hook and no LD_LIBRARY_PATH, so the files must
    # be in the default folder under the names the alternatives give them there.
    by_path = {m["containerPath"]: m["hostPath"] for m in _mounts(specs["mounts"])}
    for name in ("libcuda.so.1", "libnvidia-ml.so.1", "libGLX_nvidia.so.0", "libEGL_nvidia.so.0",
                 "libnvidia-ptxjitcompiler.so.1", "libnvidia-api.so.1", "gbm/nvidia-drm_gbm.so",
                 "vdpau/libvdpau_nvidia.so.1"):
        assert f"{LIB64}/{name}" in by_path, name
    assert by_path[f"{LIB64}/libcuda.so.1"].endswith(
        f"/nvidia/current/libcuda.so.{VERSION}")
    assert by_path["/usr/bin/nvidia-smi"].endswith("/usr/lib/nvidia/current/nvidia-smi")


@pytest.mark.parametrize("mode", LINK_MODES)
def test_each_file_is_where_its_consumer_looks(
        specs: dict[str, dict[str, object]], mode: str) -> None:
    paths = {m["containerPath"] for m in _mounts(specs[mode])} | set(_links(specs[mode]))
    for path in ("/usr/lib/xorg/modules/drivers/nvidia_drv.so",
                 "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so",
                 f"{LIB64}/vdpau/libvdpau_nvidia.so.1", f"{LIB64}/gbm/nvidia-drm_gbm.so",
                 "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
                 "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
                 "/etc/vulkan/icd.d/nvidia_icd.json", "/etc/OpenCL/vendors/nvidia.icd",
                 f"{LIB64}/libnvidia-api.so.1", f"{LIB64}/nvidia/wine/nvngx.dll",
                 f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",
                 "/usr/lib/i386-linux-gnu/libcuda.so.1"):
        assert path in paths, path
    assert "/usr/lib/nvidia/current/nvidia_drv.so" not in paths


def test_the_sidecar_names_the_i386_libraries_compat32(
        root: Path, kernel: BuiltNode, tmp_path: Path) -> None:
    import json

    out = tmp_path / "nvidia.yaml"
    rc, _, err = generate(["--mode", "procfs", "--driver-root", str(root), "--dev-root",
                           str(kernel.dev_root), "--output", str(out)])
    assert rc == 0, err
    caps = json.loads((tmp_path / "nvidia.yaml.meta").read_text())["capabilities"]
    assert f"{root}/usr/lib/i386-linux-gnu/nvidia/current/libcuda.so.{VERSION}" in caps["compat32"]
    assert not [p for p in caps["compute"] if "i386" in p]


def test_nvml_fails_cleanly_and_auto_falls_back(root: Path, kernel: BuiltNode) -> None:
    args = ["--driver-root", str(root), "--dev-root", str(kernel.dev_root)]
    rc, _, err = generate(["--mode", "nvml", *args])
    assert rc != 0
    assert "Driver Not Loaded" in err and len(err.strip().splitlines()) == 1, err
    rc, out, err = generate(["--mode", "auto", *args])
    assert rc == 0, err
    assert "using procfs" in err and "nvidia.com/gpu" in out


def test_mounts_mode_gives_the_by_path_names_and_one_rule_per_node(
        specs: dict[str, dict[str, object]]) -> None:
    # No hook makes the /dev/dri/by-path links in mounts mode: each link's node is mounted
    # at its name (applications pick a GPU by PCI address through it), not listed as a
    # device node of its own, which would bring a second, identical device-cgroup rule.
    devices = specs["mounts"]["devices"]
    assert isinstance(devices, list)
    (gpu0,) = [d["containerEdits"] for d in devices if d["name"] == "0"]
    nodes = {n["path"]: n for n in gpu0["deviceNodes"]}
    assert "/dev/dri/card0" in nodes
    assert not [p for p in nodes if p.startswith("/dev/dri/by-path/")]
    numbers = [(n.get("major"), n.get("minor")) for n in gpu0["deviceNodes"]]
    assert len(numbers) == len(set(numbers))
    by_path = {m["containerPath"].rsplit("-", 1)[1]: m for m in gpu0["mounts"]
               if m["containerPath"].startswith("/dev/dri/by-path/pci-")}
    assert sorted(by_path) == ["card", "render"]
    assert by_path["card"]["hostPath"] == nodes["/dev/dri/card0"].get(
        "hostPath", "/dev/dri/card0")
    assert by_path["render"]["hostPath"] == nodes["/dev/dri/renderD128"].get(
        "hostPath", "/dev/dri/renderD128")
    for mount in by_path.values():  # the node must open for writing through its name
        assert not {"ro", "nodev"} & set(mount["options"]), mount


# Files of the graphics and video capabilities, whatever name a spec mounts them at.
NOT_COMPUTE = ("libEGL_nvidia.so", "libGLX_nvidia.so", "libGLESv2_nvidia.so", "libnvcuvid.so",
               "libnvidia-encode.so", "libnvidia-opticalflow.so", "libnvoptix.so",
               "libvdpau_nvidia.so", "libnvidia-glcore.so", "nvoptix.bin", "nvidia_icd.json",
               "10_nvidia.json", "libnvidia-fbc.so", "libnvidia-egl-gbm.so",
               "libnvidia-egl-wayland.so", "15_nvidia_gbm.json", "nvidia_drv.so",
               "libglxserver_nvidia.so")


@pytest.mark.parametrize("mode", LINK_MODES)
def test_driver_capabilities_leave_out_every_mount_of_a_file_they_do_not_ask_for(
        root: Path, kernel: BuiltNode, tmp_path: Path, mode: str) -> None:
    """A hook-free spec mounts one library at its versioned name and at each link name
    (libEGL_nvidia.so.0 too): a container asking for compute,utility gets none of them,
    and none of the graphics configuration files either (real Debian driver files)."""
    from cdi.cache import SpecCache
    from nri_plugin.nri.api import nri_pb2
    from nri_plugin.plugins.cdi_injector.injector import CdiInjector
    from nri_plugin.plugins.cdi_injector.vendor import Registry
    from nri_plugin.vendors.nvidia.rules import NvidiaRules

    folder = tmp_path / "cdi"
    folder.mkdir()
    rc, _, err = generate(["--mode", "procfs", "--driver-root", str(root), "--dev-root",
                           str(kernel.dev_root), "--link-mode", mode, "--hook-path",
                           "/usr/local/bin/nri-cdi", "--output", str(folder / "nvidia.yaml")])
    assert rc == 0, err
    registry = Registry.load(SpecCache([str(folder)]).refresh(), [NvidiaRules()])
    injector = CdiInjector(lambda: registry, vendors=[NvidiaRules()],
                           policy=annotations_policy())
    injector.configure("", "containerd", "1.7.24")
    pod = nri_pb2.PodSandbox(id="p", name="pod", namespace="default",
                             annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})

    def mounted(*env: str) -> dict[str, str]:
        ctr = nri_pb2.Container(id="c", pod_sandbox_id="p", name="app", env=list(env))
        injection = injector.decide(pod, ctr)
        assert injection is not None
        return {m.destination: m.source for m in injection.adjustment.mounts}

    everything = mounted("NVIDIA_DRIVER_CAPABILITIES=all")
    trimmed = mounted("NVIDIA_DRIVER_CAPABILITIES=compute,utility")
    graphics = {path for path, source in everything.items()
                if posixpath.basename(source).startswith(NOT_COMPUTE)}
    assert any(p.endswith("/libEGL_nvidia.so.0") for p in graphics) == (mode == "mounts")
    assert graphics and not graphics & set(trimmed)
    assert any(p.endswith("/libcuda.so.1") for p in trimmed) == (mode == "mounts")
    assert [p for p in trimmed if "/libcuda.so." in p]
