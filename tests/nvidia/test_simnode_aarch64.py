"""The simulated node built for aarch64 on this machine: its C cross-compiled by
aarch64-linux-gnu-gcc, its ld.so.cache written by the arm64 glibc's own ldconfig under
qemu-aarch64 (tests/arm64.py; no binfmt_misc), its fake libraries answering inside the
emulator, and the generator's spec for it naming Debian's aarch64 folders."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdi.linux import elf, ldcache
from nri_cdi_testbed.simnode import BuiltNode, NodeLayout, SimNodeError, build_node, main
from tests import arm64

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.uname().machine == "aarch64",
                                reason="builds another machine's node; this one is aarch64")


def _ldconfig(parts: arm64.Arm64) -> list[str]:
    return [str(parts.qemu), str(parts.ldconfig)]


@pytest.fixture(scope="module")
def parts() -> arm64.Arm64:
    return arm64.parts()


@pytest.fixture(scope="module")
def node(parts: arm64.Arm64, tmp_path_factory: pytest.TempPathFactory) -> BuiltNode:
    layout = NodeLayout.uniform(2, machine="aarch64", seed="arm64",
                                device_nodes=os.geteuid() == 0)
    return build_node(tmp_path_factory.mktemp("arm64") / "node", layout,
                      cache_dir=tmp_path_factory.mktemp("cache"), ldconfig=_ldconfig(parts))


def test_libraries_and_cache_are_aarch64(node: BuiltNode, parts: arm64.Arm64) -> None:
    assert node.manifest["machine"] == "aarch64"
    assert node.manifest["lib_dir"] == f"/usr/lib/{arm64.TRIPLET}"
    libraries = node.manifest["libraries"]
    assert {elf.read_header(node.host_path(e["path"])).architecture for e in libraries} == {
        "aarch64"}
    entries = ldcache.read_ldcache(node.driver_root / "etc/ld.so.cache")
    assert {e.arch_flag for e in entries} == {0x0A00}  # ldconfig's FLAG_AARCH64_LIB64
    cached = (node.manifest["lib_dir"], node.manifest["lib_dir"] + "/vdpau")
    assert {e["soname"] for e in libraries if e["soname"]
            and os.path.dirname(e["path"]) in cached} <= {e.key for e in entries}
    printed = subprocess.run(
        parts.under_qemu([str(parts.ldconfig), "-p", "-C",
                          str(node.driver_root / "etc/ld.so.cache")]),
        capture_output=True, text=True, check=True, timeout=120).stdout
    assert (f"libcuda.so.1 (libc6,AArch64) => /usr/lib/{arm64.TRIPLET}/libcuda.so.1"
            in printed), printed


def test_fake_libcuda_answers_in_the_emulator(node: BuiltNode, parts: arm64.Arm64) -> None:
    code = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); v = ctypes.c_int(); "
            "lib.fake_gpu_node_id.restype = ctypes.c_char_p; "
            "print(lib.cuDriverGetVersion(ctypes.byref(v)), v.value, "
            "lib.fake_gpu_node_id().decode())")
    done = subprocess.run(
        parts.under_qemu([*parts.python_argv(), "-I", "-S", "-c", code,
                          str(node.lib_dir / "libcuda.so.1")]),
        capture_output=True, text=True, check=False, timeout=120)
    assert done.stdout.split() == ["0", "13000", node.manifest["node_id"]], done.stderr


def test_the_generator_on_the_aarch64_node(node: BuiltNode, tmp_path: Path) -> None:
    base = [sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--driver-root",
            str(node.driver_root), "--cdi-version", "0.6.0"]
    done = subprocess.run([*base, "--mode", "procfs", "--output", str(tmp_path / "s.yaml")],
                          cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "s.yaml").read_text()
    assert f"containerPath: /usr/lib/{arm64.TRIPLET}/libcuda.so.580.82.07" in text
    assert "x86_64-linux-gnu" not in text
    nvml = subprocess.run([*base, "--mode", "nvml"], cwd=REPO, capture_output=True,
                          text=True, check=False)
    lib = node.lib_dir / "libnvidia-ml.so.580.82.07"
    assert nvml.stderr.splitlines() == [
        f"nri-cdi generate: error: NVML unavailable: {lib} is built for aarch64, and this "
        f"machine is {os.uname().machine}"], nvml.stderr


def test_another_machine_needs_its_ldconfig(tmp_path: Path) -> None:
    with pytest.raises(SimNodeError, match="needs that machine's ldconfig"):
        build_node(tmp_path / "node", NodeLayout(machine="aarch64"))
    assert not (tmp_path / "node" / "usr").exists()  # said before anything is built
    with pytest.raises(SimNodeError, match="x86_64 nodes only"):
        NodeLayout(machine="aarch64", compat32=True)


def test_cli(parts: arm64.Arm64, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main([str(tmp_path / "node"), "--machine", "aarch64", "--no-device-nodes",
               "--ldconfig", " ".join(_ldconfig(parts)), "--cache-dir", str(tmp_path / "c")])
    assert rc == 0
    assert "aarch64 driver 580.82.07" in capsys.readouterr().out
