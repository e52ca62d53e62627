"""A hosted (GKE-like) node: the whole driver under /usr/local/nvidia (lib64, bin), not in
the loader's cache. ``generate --mode auto`` finds it with no search-path flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cdi.linux.ldcache import read_ldcache
from cdi.nvidia.simnode import NodeLayout
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
