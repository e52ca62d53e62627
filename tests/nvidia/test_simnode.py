"""Simulated node builder: files, device nodes, /proc and /sys, SONAME links, loadable libs."""

from __future__ import annotations

import ctypes
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cdi.linux import elf, ldcache
from nri_cdi_testbed.simnode import (
    BuiltNode,
    GpuSpec,
    MigDevice,
    NodeLayout,
    SimNodeError,
    build_node,
    main,
    parse_mig_arg,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def node1(node_factory) -> BuiltNode:  # type: ignore[no-untyped-def]
    return node_factory("node1", NodeLayout())


@pytest.fixture(scope="module")
def node_rhel(node_factory) -> BuiltNode:  # type: ignore[no-untyped-def]
    return node_factory("rhel", NodeLayout.uniform(2, distro="rhel", seed="rhel"))


@pytest.fixture(scope="module")
def node_ctr(node_factory, gcc_m32: bool) -> BuiltNode:  # type: ignore[no-untyped-def]
    layout = NodeLayout.uniform(
        2,
        mig={1: "1g.10gb*2"},
        driver_container=True,
        bmc_vga=True,
        compat32=gcc_m32,
        uvm_major=235,
        caps_major=236,
        seed="ctr",
        mps_pipe_dir=True,
    )
    return node_factory("ctr", layout)


ALL_NODES = ["node1", "node8", "node_rhel", "node_ctr"]


@pytest.fixture(params=ALL_NODES)
def any_node(request: pytest.FixtureRequest) -> BuiltNode:
    return request.getfixturevalue(request.param)


# --- files -----------------------------------------------------------------------------------


def test_manifest_files_exist(any_node: BuiltNode) -> None:
    m = any_node.manifest
    for lib in m["libraries"]:
        path = any_node.host_path(lib["path"])
        assert path.is_file() and not path.is_symlink(), lib["path"]
        assert os.access(path, os.X_OK)
        for link in lib["links"]:
            assert any_node.host_path(link).resolve() == path.resolve(), link
    for key in ("binaries", "firmware", "configs"):
        assert m[key], key
        for p in m[key]:
            assert any_node.host_path(p).is_file(), p
    for b in m["binaries"]:
        assert os.access(any_node.host_path(b), os.X_OK)
    assert f"/lib/firmware/nvidia/{m['driver_version']}/gsp_ga10x.bin" in m["firmware"]


def test_library_set_is_driver_like(node1: BuiltNode) -> None:
    v = node1.driver_version
    names = {os.path.basename(lib["path"]) for lib in node1.manifest["libraries"]}
    for stem in (
        "libcuda",
        "libnvidia-ml",
        "libnvidia-ptxjitcompiler",
        "libnvidia-nvvm",
        "libnvidia-gpucomp",
        "libnvidia-opencl",
        "libnvidia-eglcore",
        "libnvidia-glcore",
        "libnvidia-glsi",
        "libnvidia-tls",
        "libGLX_nvidia",
        "libEGL_nvidia",
        "libGLESv2_nvidia",
        "libGLESv1_CM_nvidia",
        "libnvidia-encode",
        "libnvcuvid",
        "libvdpau_nvidia",
        "libnvidia-fbc",
        "libnvidia-ngx",
        "libnvoptix",
        "libnvidia-rtcore",
        "libnvidia-cfg",
        "libnvidia-allocator",
    ):
        assert f"{stem}.so.{v}" in names, stem
    assert any(n.startswith("libnvidia-egl-wayland.so.1.1.") for n in names)
    assert (node1.lib_dir / "vdpau" / f"libvdpau_nvidia.so.{v}").is_file()
    links = sum(len(lib["links"]) for lib in node1.manifest["libraries"])
    assert len(names) >= 35 and 50 <= len(names) + links <= 80


def test_soname_links_as_ldconfig_makes_them(node1: BuiltNode) -> None:
    v = node1.driver_version
    lib = node1.lib_dir
    assert os.readlink(lib / "libcuda.so.1") == f"libcuda.so.{v}"
    assert os.readlink(lib / "libcuda.so") == "libcuda.so.1"
    assert os.readlink(lib / "libnvidia-ml.so.1") == f"libnvidia-ml.so.{v}"
    assert os.readlink(lib / "libGLX_nvidia.so.0") == f"libGLX_nvidia.so.{v}"
    assert os.readlink(lib / "gbm/nvidia-drm_gbm.so") == "../libnvidia-allocator.so.1"
    # Libraries whose SONAME is the full file name have no extra link.
    assert elf.read_soname(lib / f"libnvidia-glcore.so.{v}") == f"libnvidia-glcore.so.{v}"
    for entry in node1.manifest["libraries"]:
        path = node1.host_path(entry["path"])
        assert elf.read_soname(path) == entry["soname"]
        if entry["soname"] and entry["soname"] != path.name:
            assert os.readlink(path.parent / entry["soname"]) == path.name


def test_ldcache_written_by_ldconfig(any_node: BuiltNode) -> None:
    data = any_node.ldcache_path.read_bytes()
    # ldconfig writes an extension directory (naming itself); our writer writes none.
    assert data.startswith(ldcache.NEW_MAGIC) and b"ldconfig (" in data
    entries = ldcache.parse_ldcache(data)
    lib_dir = any_node.manifest["lib_dir"]
    conf = (any_node.driver_root / "etc/ld.so.conf").read_text().splitlines()
    assert conf[0] == lib_dir
    v = any_node.driver_version
    found = ldcache.find_libraries(entries, "libcuda.so.*.*", root=any_node.driver_root)
    assert found == [any_node.lib_dir / f"libcuda.so.{v}"]


def test_rhel_layout(node_rhel: BuiltNode) -> None:
    assert node_rhel.manifest["lib_dir"] == "/usr/lib64"
    assert (node_rhel.driver_root / "usr/lib64/libcuda.so.1").is_symlink()
    assert (node_rhel.driver_root / "usr/lib64/xorg/modules/drivers/nvidia_drv.so").is_file()
    assert not (node_rhel.driver_root / "usr/lib/x86_64-linux-gnu").exists()


def test_driver_container_layout(node_ctr: BuiltNode, gcc_m32: bool) -> None:
    assert node_ctr.driver_root == node_ctr.root / "run/nvidia/driver"
    assert node_ctr.dev_root == node_ctr.root
    assert (node_ctr.driver_root / "usr/bin/nvidia-smi").is_file()
    assert not (node_ctr.root / "usr/bin").exists()
    assert (node_ctr.dev_root / "dev").is_dir()
    assert not (node_ctr.driver_root / "dev").exists()
    assert (node_ctr.proc_root / "proc/driver/nvidia/version").is_file()
    assert (node_ctr.driver_root / "tmp/nvidia-mps/control").exists()
    reloaded = BuiltNode.load(node_ctr.root)
    assert reloaded.driver_root == node_ctr.driver_root
    if gcc_m32:
        entries = ldcache.read_ldcache(node_ctr.ldcache_path)
        lib32 = [e for e in entries if "/i386-linux-gnu/" in e.path]
        assert lib32 and not any(e.is_64bit for e in lib32)
        only64 = ldcache.find_libraries(entries, "libcuda.so.1", root=node_ctr.driver_root)
        assert [p.parent for p in only64] == [node_ctr.lib_dir]


def test_ipc_socket(node1: BuiltNode) -> None:
    sock = node1.driver_root / "run/nvidia-persistenced/socket"
    assert stat.S_ISSOCK(sock.lstat().st_mode)


def test_configs(node1: BuiltNode) -> None:
    root = node1.driver_root
    egl = json.loads((root / "usr/share/glvnd/egl_vendor.d/10_nvidia.json").read_text())
    assert egl["ICD"]["library_path"] == "libEGL_nvidia.so.0"
    vk = json.loads((root / "etc/vulkan/icd.d/nvidia_icd.json").read_text())
    assert vk["ICD"]["library_path"] == "libGLX_nvidia.so.0"
    assert (root / "etc/OpenCL/vendors/nvidia.icd").read_text().strip() == "libnvidia-opencl.so.1"
    assert (root / "usr/share/nvidia/nvoptix.bin").is_file()


# --- devices ---------------------------------------------------------------------------------


def _stat_node(node: BuiltNode, path: str) -> os.stat_result:
    st = node.host_path(path, where="dev").lstat()
    assert stat.S_ISCHR(st.st_mode), path
    return st


def test_device_nodes(any_node: BuiltNode, can_mknod: bool) -> None:
    if not can_mknod:
        pytest.skip("device nodes need root (CAP_MKNOD)")
    m = any_node.manifest
    for n in m["device_nodes"]:
        st = _stat_node(any_node, n["path"])
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (n["major"], n["minor"])
        assert stat.S_IMODE(st.st_mode) == n["mode"], n["path"]
        assert st.st_gid == n["gid"]
    paths = {n["path"]: n for n in m["device_nodes"]}
    assert (paths["/dev/nvidiactl"]["major"], paths["/dev/nvidiactl"]["minor"]) == (195, 255)
    assert (paths["/dev/nvidia-modeset"]["minor"]) == 254
    assert paths["/dev/nvidia-uvm"]["major"] == m["majors"]["nvidia-uvm"]
    assert paths["/dev/nvidia-uvm-tools"]["minor"] == 1
    for g in m["gpus"]:
        assert paths[f"/dev/nvidia{g['minor']}"]["major"] == 195
        assert paths[f"/dev/dri/{g['drm']['card']}"]["gid"] == m["gids"]["video"]
        assert paths[f"/dev/dri/{g['drm']['render']}"]["mode"] == 0o660


def test_minors_differ_from_indices(node8: BuiltNode, can_mknod: bool) -> None:
    gpus = node8.manifest["gpus"]
    assert [g["minor"] for g in gpus] == [0, 1, 2, 3, 7, 6, 5, 4]
    info = node8.proc_root / f"proc/driver/nvidia/gpus/{gpus[4]['bus_id']}/information"
    assert "Device Minor: \t 7" in info.read_text()
    if can_mknod:
        st = _stat_node(node8, "/dev/nvidia7")
        assert os.minor(st.st_rdev) == 7


def test_proc_devices_lists_majors(node_ctr: BuiltNode) -> None:
    text = (node_ctr.proc_root / "proc/devices").read_text()
    chars = text.split("Block devices:")[0]
    majors = {name: int(num) for num, name in re.findall(r"^\s*(\d+) (\S+)$", chars, re.M)}
    assert majors["nvidia-frontend"] == 195
    assert majors["nvidia-uvm"] == 235
    assert majors["nvidia-caps"] == 236
    assert majors["drm"] == 226


def test_gpu_information_files(node8: BuiltNode) -> None:
    for g in node8.manifest["gpus"]:
        text = (node8.proc_root / f"proc/driver/nvidia/gpus/{g['bus_id']}/information").read_text()
        fields = dict(
            (k.strip(), v.strip()) for k, v in (ln.split(":", 1) for ln in text.splitlines())
        )
        assert fields["Model"] == g["name"]
        assert fields["GPU UUID"] == g["uuid"] and g["uuid"].startswith("GPU-")
        assert fields["Bus Location"] == g["bus_id"]
        assert fields["Device Minor"] == str(g["minor"])
        for key in ("IRQ", "Video BIOS", "Bus Type", "DMA Size", "DMA Mask", "GPU Excluded"):
            assert key in fields
    version = (node8.proc_root / "proc/driver/nvidia/version").read_text()
    assert re.match(rf"NVRM version: NVIDIA .* {re.escape(node8.driver_version)} ", version)


def test_drm_sysfs_and_by_path(node8: BuiltNode) -> None:
    for g in node8.manifest["gpus"]:
        drm = node8.sys_root / f"sys/bus/pci/devices/{g['bus_id']}/drm"
        assert sorted(os.listdir(drm)) == sorted(g["drm"].values())
        link = node8.dev_root / f"dev/dri/by-path/pci-{g['bus_id']}-render"
        assert os.readlink(link) == f"../{g['drm']['render']}"


def test_bmc_vga_shifts_cards(node_ctr: BuiltNode) -> None:
    cards = [g["drm"]["card"] for g in node_ctr.manifest["gpus"]]
    assert cards == ["card1", "card2"]
    assert (node_ctr.sys_root / "sys/bus/pci/devices/0000:03:00.0/drm/card0").is_dir()


def test_mig_layout(node8: BuiltNode, can_mknod: bool) -> None:
    gpus = node8.manifest["gpus"]
    assert [g["mig_enabled"] for g in gpus] == [True, False, False, True] + [False] * 4
    mig0 = gpus[0]["mig_devices"]
    assert [d["gi"] for d in mig0] == list(range(7, 14))
    assert all(d["ci"] == 0 and d["profile"] == "1g.10gb" and not d["gfx"] for d in mig0)
    assert all(d["uuid"].startswith("MIG-") for d in mig0)
    assert len({d["uuid"] for d in mig0}) == 7
    mig3 = gpus[3]["mig_devices"]
    assert [(d["profile"], d["gi"], d["gfx"]) for d in mig3] == [
        ("3g.40gb", 1, False),
        ("2g.20gb+gfx", 3, True),
    ]
    assert mig3[1]["profile_id"] == 0xB  # NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX


def test_mig_minors_and_caps(node8: BuiltNode, can_mknod: bool) -> None:
    proc = node8.proc_root / "proc"
    minors = dict(
        line.rsplit(" ", 1)
        for line in (proc / "driver/nvidia-caps/mig-minors").read_text().splitlines()
    )
    assert minors["config"] == "1" and minors["monitor"] == "2"
    for g in node8.manifest["gpus"]:
        for d in g["mig_devices"]:
            gi_key = f"gpu{g['minor']}/gi{d['gi']}/access"
            ci_key = f"gpu{g['minor']}/gi{d['gi']}/ci{d['ci']}/access"
            assert int(minors[gi_key]) == d["gi_cap_minor"]
            assert int(minors[ci_key]) == d["ci_cap_minor"]
            cap = proc / f"driver/nvidia/capabilities/gpu{g['minor']}/mig/gi{d['gi']}"
            assert f"DeviceFileMinor: {d['gi_cap_minor']}" in (cap / "access").read_text()
            ci_text = (cap / f"ci{d['ci']}/access").read_text()
            assert f"DeviceFileMinor: {d['ci_cap_minor']}" in ci_text
            if can_mknod:
                for minor in (d["gi_cap_minor"], d["ci_cap_minor"]):
                    st = _stat_node(node8, f"/dev/nvidia-caps/nvidia-cap{minor}")
                    assert os.major(st.st_rdev) == node8.manifest["majors"]["nvidia-caps"]
                    assert os.minor(st.st_rdev) == minor


# --- the fake libraries load and answer ------------------------------------------------------


def test_fake_libcuda_loads_and_answers(node8: BuiltNode) -> None:
    lib = ctypes.CDLL(str(node8.lib_dir / "libcuda.so.1"))
    version = ctypes.c_int()
    assert lib.cuDriverGetVersion(ctypes.byref(version)) == 0
    assert version.value == node8.manifest["cuda_driver_version"] == 13000
    assert lib.cuDriverGetVersion(None) != 0
    lib.fake_gpu_node_id.restype = ctypes.c_char_p
    assert lib.fake_gpu_node_id().decode() == node8.manifest["node_id"]
    count = ctypes.c_int(-1)
    assert lib.cuDeviceGetCount(ctypes.byref(count)) == 0
    host = [
        n
        for n in os.listdir("/dev")
        if re.fullmatch(r"nvidia\d+", n) and stat.S_ISCHR(os.stat(f"/dev/{n}").st_mode)
    ]
    assert count.value == len(host)  # what this process (our "container") can see


def test_every_fake_library_is_loadable(node1: BuiltNode) -> None:
    for entry in node1.manifest["libraries"]:
        if entry["bits"] != 64:
            continue
        lib = ctypes.CDLL(str(node1.host_path(entry["path"])))
        lib.fake_nvidia_library.restype = ctypes.c_char_p
        assert lib.fake_nvidia_library().decode() == os.path.basename(entry["path"])


def test_real_nvidia_ml_py_initialises_through_fake_library(node8: BuiltNode) -> None:
    """The driver-root library, pre-loaded by path, serves the real pynvml's dlopen."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py not installed")
    code = (
        "import ctypes, sys, pynvml\n"
        "ctypes.CDLL(sys.argv[1])\n"
        "pynvml.nvmlInit()\n"
        "print(pynvml.nvmlSystemGetDriverVersion(), pynvml.nvmlDeviceGetCount(),\n"
        "      pynvml.nvmlSystemGetCudaDriverVersion_v2())\n"
        "pynvml.nvmlShutdown()\n"
    )
    lib = node8.lib_dir / "libnvidia-ml.so.1"
    out = subprocess.run(
        [sys.executable, "-c", code, str(lib)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [node8.driver_version, "8", "13000"]


def test_nvidia_smi_lists_gpus(node8: BuiltNode, can_mknod: bool) -> None:
    smi = str(node8.driver_root / "usr/bin/nvidia-smi")
    env = {**os.environ, "SIMNODE_DEV": str(node8.dev_root / "dev")}
    if not can_mknod:  # no device nodes: it cannot talk to the driver, as the real one
        assert subprocess.run([smi, "-L"], env=env, capture_output=True).returncode == 9
        return
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, check=True,
                         env=env).stdout
    # A node gone (a container not given that GPU): not listed, the others renumbered.
    os.rename(node8.dev_root / "dev/nvidia0", node8.dev_root / "dev/hidden0")
    try:
        fewer = subprocess.run([smi, "-L"], capture_output=True, text=True, check=True,
                               env=env).stdout
    finally:
        os.rename(node8.dev_root / "dev/hidden0", node8.dev_root / "dev/nvidia0")
    uuids = [g["uuid"] for g in node8.manifest["gpus"]]
    assert uuids[0] not in fewer and f"GPU 0: {node8.manifest['gpus'][1]['name']} " \
        f"(UUID: {uuids[1]})" in fewer
    for g in node8.manifest["gpus"]:
        assert f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})" in out
        for d in g["mig_devices"]:
            assert d["uuid"] in out


# --- builder behaviour -----------------------------------------------------------------------


def test_big_node_compiles_nothing_with_a_warm_cache(  # type: ignore[no-untyped-def]
        node_factory, simnode_cache: Path, node8: BuiltNode) -> None:
    """What makes a second node cheap: every object comes from the cache, none from gcc
    (a compile replaces its cache entry: a new inode)."""
    layout = NodeLayout.uniform(8, mig={i: "1g.10gb*7" for i in range(8)}, seed="eight")
    node_factory("warmup", layout)  # compiles this seed's libcuda/libnvidia-ml once

    def cached() -> dict[str, int]:
        return {entry.name: entry.stat().st_ino for entry in simnode_cache.iterdir()}

    before = cached()
    node = node_factory("big", layout)
    assert sum(len(g["mig_devices"]) for g in node.manifest["gpus"]) == 56
    assert cached() == before


def test_uuids_are_deterministic(node8: BuiltNode) -> None:
    layout = NodeLayout.uniform(8, seed="eight")
    assert [layout.gpu_uuid(i) for i in range(8)] == [g["uuid"] for g in node8.manifest["gpus"]]
    assert NodeLayout(seed="other").gpu_uuid(0) != layout.gpu_uuid(0)


def test_root_must_be_empty(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("")
    with pytest.raises(SimNodeError, match="not empty"):
        build_node(tmp_path, NodeLayout())


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: NodeLayout.uniform(2, minors=[1, 1]), "distinct"),
        (lambda: NodeLayout.uniform(1, mig={0: "1g.10gb*8"}), "at most 7"),
        (lambda: MigDevice(profile="big"), "profile"),
        (lambda: MigDevice(gi=15), "out of range"),
        (lambda: NodeLayout.uniform(1, mig={0: [MigDevice(gi=7), MigDevice(gi=7)]}), "given twice"),
        (lambda: GpuSpec(mig_devices=(MigDevice(),)), "MIG disabled"),
        (lambda: GpuSpec(bus_id="65:00.0"), "bus id"),
        (lambda: NodeLayout(driver_version="latest"), "driver version"),
        (lambda: NodeLayout.uniform(1, mig={3: "1g.10gb"}), "unknown GPU"),
    ],
)
def test_invalid_layouts(make, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SimNodeError, match=match):
        make()


def test_parse_mig_arg() -> None:
    index, devices = parse_mig_arg("2:1g.10gb*2,3g.40gb+gfx")
    assert index == 2
    assert [d.profile for d in devices] == ["1g.10gb", "1g.10gb", "3g.40gb+gfx"]
    assert devices[2].gfx and devices[2].nvml_profile_id == 0x11
    with pytest.raises(SimNodeError):
        parse_mig_arg("1g.10gb")


def test_cli(
    tmp_path: Path, simnode_cache: Path, capsys: pytest.CaptureFixture[str], can_mknod: bool
) -> None:
    args = [
        str(tmp_path / "n"),
        "--gpus",
        "2",
        "--mig",
        "1:2g.20gb*2",
        "--minors",
        "1,0",
        "--layout",
        "rhel",
        "--cache-dir",
        str(simnode_cache),
        "--seed",
        "cli",
    ]
    if not can_mknod:
        args.append("--no-device-nodes")
    assert main(args) == 0
    node = BuiltNode.load(tmp_path / "n")
    assert [g["minor"] for g in node.manifest["gpus"]] == [1, 0]
    assert len(node.manifest["gpus"][1]["mig_devices"]) == 2
    assert "GPU 1 minor 0" in capsys.readouterr().out
    assert main([str(tmp_path / "m"), "--mig", "x"]) == 2


def test_importable_without_gcc(tmp_path: Path) -> None:
    """Import needs no compiler; building without one fails with a clear message."""
    code = (
        "import sys\n"
        "from nri_cdi_testbed.simnode import build_node, NodeLayout, SimNodeError\n"
        "try:\n"
        "    build_node(sys.argv[1], NodeLayout(device_nodes=False), cache_dir=sys.argv[2])\n"
        "except SimNodeError as e:\n"
        "    print('ERR', e)\n"
    )
    env = {**os.environ, "PATH": str(tmp_path / "empty")}
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "n"), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=True,
    ).stdout
    assert out.startswith("ERR") and "gcc" in out


def test_library_sources_are_c_files_of_the_test_bed() -> None:
    """The simulated libraries' C lives in nri_cdi_testbed/simnode/c/, read from the checkout
    (the wheel carries no test bed: tests/ops/test_product_wheel.py)."""
    folder = REPO / "nri_cdi_testbed" / "simnode" / "c"
    sources = sorted(p.relative_to(REPO / "nri_cdi_testbed").as_posix() for p in folder.glob("*"))
    assert {Path(s).name for s in sources} >= {"generic.c", "cuda.c", "nvml.c", "node_id.c"}
    # No Python formatting left in the C: the node's values come as #define lines.
    for path in folder.glob("*.c"):
        assert "{{" not in path.read_text() and "{export}" not in path.read_text(), path
