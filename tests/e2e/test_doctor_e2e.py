"""``nri-cdi doctor --e2e`` end to end on a simulated node: a real private containerd (each
version), our plugin, throwaway containers; every verdict, and nothing left behind. A spec
that gives GPU 0's container GPU 1 too is caught (FAIL, exit 1)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nri_cdi_testbed.simnode import NodeLayout, build_node
from nri_cdi_testbed.waiting import wait_until
from tests.e2e import paths
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.plugin import REPO

PREFIX = "nri-cdi-e2e-"
CHECKS = ["nvml vs procfs", "spec valid [hooks]", "spec valid [mounts]",
          "driver files in the spec", "device nodes [hooks]", "nvidia-smi -L [hooks]",
          "CUDA driver API [hooks]", "NVIDIA_DRIVER_CAPABILITIES=utility",
          "NVIDIA_REQUIRE_CUDA refused", "device nodes [mounts]", "nvidia-smi -L [mounts]",
          "CUDA driver API [mounts]"]


@pytest.fixture
def tmp() -> Iterator[Path]:
    """The temp folder of this test's doctor runs (TMPDIR), short for the sockets' paths:
    another doctor --e2e on the machine (a colleague's, another checkout's) is neither
    waited on nor counted as left behind."""
    folder = Path(tempfile.mkdtemp(prefix="dr-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "NRI_CDI_CACHE": str(paths.cache_dir()),
            "TMPDIR": str(tmp)}


def _doctor(tmp: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "doctor", "--e2e",
                           "--json", "--repeat", "1", *args],
                          capture_output=True, text=True, env=_env(tmp), cwd=REPO, timeout=240)
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, report, proc.stderr


def _leftovers(tmp: Path) -> list[str]:
    """Processes, mounts and temp folders of the doctor --e2e runs in ``tmp``."""
    found = [str(p) for p in tmp.glob(PREFIX + "*")]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if f"{tmp}/{PREFIX}".encode() in cmdline:
                found.append(f"pid {entry.name}: {cmdline[:200]!r}")
    with open("/proc/self/mountinfo") as mountinfo:
        found += [line.split()[4] for line in mountinfo
                  if line.split()[4].startswith(f"{tmp}/{PREFIX}")]
    return found


@pytest.mark.parametrize("version", paths.runtimes())
def test_doctor_e2e_passes_on_the_simulated_node(e2e_ready: None, version: str,
                                                 tmp: Path) -> None:
    rc, report, stderr = _doctor(tmp, "--simulated", "--runtime", version)
    verdicts = {c["name"]: c["status"] for c in report["checks"]}
    assert (rc, verdicts) == (0, dict.fromkeys(CHECKS, "PASS")), (stderr, report)
    assert report["node"].startswith("simulated")
    assert report["runtime"] == f"private containerd {version}"
    assert set(report["timings_ms"]) == {
        "generate nvml", "generate procfs", "create+start without GPU",
        "create+start with GPU [hooks]", "create+start with GPU [mounts]"}
    cuda = next(c for c in report["checks"] if c["name"] == "CUDA driver API [hooks]")
    assert "cuDeviceGetCount 0 1" in cuda["detail"] and "cuMemAlloc_v2 0" in cuda["detail"]
    assert _leftovers(tmp) == []


def test_a_container_given_another_gpu_fails(e2e_ready: None, tmp_path: Path,
                                             tmp: Path) -> None:
    node = build_node(tmp_path / "node", NodeLayout.uniform(2))
    spec = tmp_path / "spec" / "nvidia.yaml"
    spec.parent.mkdir()
    subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--mode", "nvml",
                    "--cdi-version", "0.6.0", "--driver-root", str(node.driver_root),
                    "--output", str(spec)], check=True, cwd=REPO, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    doc = yaml.safe_load(spec.read_text())
    devices = {d["name"]: d for d in doc["devices"]}
    # A broken spec: GPU 0's device also brings GPU 1's node.
    devices["0"]["containerEdits"]["deviceNodes"] += [
        n for n in devices["1"]["containerEdits"]["deviceNodes"] if n["path"] == "/dev/nvidia1"]
    spec.write_text(yaml.safe_dump(doc))
    rc, report, stderr = _doctor(tmp, "--sim-node", str(node.root), "--e2e-spec-dir",
                                 str(spec.parent))
    verdicts = {c["name"]: (c["status"], c["detail"]) for c in report["checks"]}
    assert rc == 1, stderr
    assert verdicts["device nodes [given]"][0] == "FAIL"
    assert "'/dev/nvidia1'" in verdicts["device nodes [given]"][1].split("visible")[1]
    assert verdicts["nvidia-smi -L [given]"][0] == "FAIL"
    assert verdicts["CUDA driver API [given]"][0] == "FAIL"
    assert "cuDeviceGetCount 0 2" in verdicts["CUDA driver API [given]"][1]
    assert verdicts["spec valid [given]"][0] == "PASS"
    assert _leftovers(tmp) == []


def test_without_grpcio_its_line_names_the_extra() -> None:
    code = ("import sys; sys.modules['grpc'] = None; from nri_plugin.ops.cli import main; "
            "sys.exit(main(['doctor', '--e2e']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "nri-cdi doctor --e2e: missing prerequisites:",
        "  - the python package grpcio (the CRI client): pip install 'nri-cdi[e2e]', or "
        "pip install grpcio"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_leaves_nothing(e2e_ready: None, signum: int, tmp: Path) -> None:
    # Ctrl-C as at a terminal: SIGINT at its default even where this suite was started
    # with it ignored (a shell's background job), which Python would then leave ignored.
    proc = subprocess.Popen([sys.executable, "-m", "nri_plugin.ops.cli", "doctor", "--e2e",
                             "--simulated", "--repeat", "1"], cwd=REPO, env=_env(tmp),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # Interrupt once our plugin is connected to the private containerd: a containerd, its
    # shims, a plugin, mounts and the temp folder are all there to clean up.

    def plugin_logged() -> bool:
        assert proc.poll() is None, proc.communicate()
        return any(log.stat().st_size for log in tmp.glob(PREFIX + "*/plugin-*.log"))

    wait_until(plugin_logged, "doctor's plugin to log", seen=lambda: sorted(tmp.rglob("*.log")))
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "interrupted; everything it started was removed" in stderr
    assert _leftovers(tmp) == []


def test_the_nodes_own_containerd(containerd: ContainerdFactory, tmp: Path) -> None:
    # Stands for the node's containerd: doctor starts none, connects our plugin to its NRI
    # socket, and takes away only the images it added and the pods it ran.
    ctrd = containerd()
    before = set(ctrd.ctr("images", "ls", "-q").stdout.split())
    rc, report, stderr = _doctor(tmp, "--simulated", "--containerd-address", ctrd.address,
                                 "--socket", ctrd.nri_socket, "--containerd-bin",
                                 str(ctrd.bin_dir))
    verdicts = {c["name"]: c["status"] for c in report["checks"]}
    assert (rc, verdicts) == (0, dict.fromkeys(CHECKS, "PASS")), (stderr, report)
    assert report["runtime"] == ctrd.address
    assert set(ctrd.ctr("images", "ls", "-q").stdout.split()) == before
    with ctrd.cri() as cri:
        assert cri.list_pods() == [] and cri.list_containers() == []
    assert _leftovers(tmp) == []


def test_a_missing_cache_says_what_and_how_naming_the_install_script(tmp_path: Path,
                                                                     tmp: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp)}
    proc = subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "doctor", "--e2e",
                           "--cache", str(tmp_path / "none")], capture_output=True, text=True,
                          env=env, cwd=REPO)
    assert proc.returncode == 2
    head, *lines = proc.stderr.strip().splitlines()
    assert head == "nri-cdi doctor --e2e: missing prerequisites:"
    # One line each, what then how; a checkout names its script.
    assert len(lines) == 2 and all(line.startswith("  - ") for line in lines), lines
    assert lines[0].startswith(f"  - containerd 1.7 (containerd, ctr, containerd-shim-runc-v2 "
                               f"in {tmp_path}/none/root/usr/bin): run: bash "
                               f"{REPO}/scripts/install-containerd.sh")
    assert lines[1].startswith(f"  - the CRI v1 messages ({tmp_path}/none/cri_gen/")
    assert _leftovers(tmp) == []
