"""A hosted (GKE-like) node: the whole driver under /usr/local/nvidia (lib64, bin), not in
the loader's cache. ``generate --mode auto`` finds it with no search-path flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cdi.linux.ldcache import read_ldcache
from nri_cdi_testbed.simnode import NodeLayout
from tests.nvidia.conftest import NodeFactory

REPO = Path(__file__).resolve().parents[2]


def test_auto_mode_finds_the_driver_under_usr_local_nvidia(node_factory: NodeFactory) -> None:
    node = node_factory("gke", NodeLayout.uniform(2, distro="gke"))
    cache = node.driver_root / "etc" / "ld.so.cache"
    # The loader's cache does not list the driver: only the search folders can find it.
    assert not any("libcuda" in str(e) for e in read_ldcache(cache))
    proc = subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--mode",
                           "auto", "--driver-root", str(node.driver_root), "--format", "json",
                           "--link-mode", "mounts"],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert "mode auto: using nvml" in proc.stderr
    spec = json.loads(proc.stdout)
    paths = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert {"/usr/local/nvidia/lib64/libcuda.so.1", "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
            "/usr/local/nvidia/bin/nvidia-smi"} <= paths
    assert [d["name"] for d in spec["devices"]][:2] == ["0", "1"]


# The wrapper found on a real H100 node (driver 580 under /usr/local/nvidia): the first
# nvidia-smi on PATH is a script that runs the driver's program by its host path.
SMI_WRAPPER = "#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n"


def _generate_json(driver_root: Path) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--mode",
                           "procfs", "--driver-root", str(driver_root), "--format", "json",
                           "--link-mode", "mounts"],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def _smi_mounts(spec: dict[str, object]) -> list[tuple[str, str]]:
    edits = spec["containerEdits"]
    assert isinstance(edits, dict)
    return [(m["containerPath"], m["hostPath"]) for m in edits["mounts"]
            if m["containerPath"].endswith("/nvidia-smi")]


def test_a_wrapper_script_on_path_gets_the_drivers_program(node_factory: NodeFactory,
                                                           tmp_path: Path) -> None:
    node = node_factory("gke-wrapper", NodeLayout.uniform(1, distro="gke"))
    root = node.driver_root
    program = root / "usr/local/nvidia/bin/nvidia-smi"
    src = tmp_path / "smi.c"
    src.write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-o", str(program), str(src)], check=True)
    wrapper = root / "usr/bin/nvidia-smi"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(SMI_WRAPPER)
    wrapper.chmod(0o755)
    # Where a container's PATH finds it, the driver's ELF program (the wrapper's target is
    # not in the container).
    assert _smi_mounts(_generate_json(root)) == [("/usr/bin/nvidia-smi", str(program))]
    # With no ELF program anywhere (a simulated node's scripts), the first one found.
    program.write_text("#!/bin/sh\necho simulated\n")
    assert _smi_mounts(_generate_json(root)) == [("/usr/bin/nvidia-smi", str(wrapper))]
