"""The node as the simulated libnvidia-ml reads it (``simnode-nvml.txt``)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from nri_cdi_testbed.simnode.layout import SimNodeError

# What the simulated libnvidia-ml reads; it finds it by walking up from its own file.
NVML_DESCRIPTION = "simnode-nvml.txt"

_ARCH_BY_CC = {3: 2, 5: 3, 6: 4, 7: 5, 8: 7, 9: 9, 10: 10, 12: 10}
# Compute-instance profile ids (nvmlComputeInstanceProfile) by slice count.
_CI_PROFILE_IDS = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}


def _arch(cc: Sequence[int]) -> int:
    if tuple(cc[:2]) == (7, 5):
        return 6  # Turing
    if tuple(cc[:2]) == (8, 9):
        return 8  # Ada
    return _ARCH_BY_CC.get(int(cc[0]), 0xFFFFFFFF)  # NVML_DEVICE_ARCH_UNKNOWN


def memory_mb(name: str) -> int:
    match = re.search(r"(\d+)GB", name)
    return int(match.group(1)) * 1024 if match else 81920


NVML_MAX_MIG = 16  # MAXMIG in the C source


def nvml_description(manifest: Mapping[str, Any]) -> str:
    """The node as the simulated ``libnvidia-ml`` reads it (``simnode-nvml.txt``): one
    ``gpu`` line per GPU in NVML index order, each followed by its ``mig`` lines in MIG
    index order; names run to the end of the line."""
    version = manifest["driver_version"]
    major = int(manifest["cuda_driver_version"]) // 1000
    lines = ["simnode-nvml 1", f"driver {version}", f"nvml {major}.{version}",
             f"cuda {manifest['cuda_driver_version']}"]
    for g in manifest["gpus"]:
        if len(g["mig_devices"]) > NVML_MAX_MIG or len(g["name"]) >= 96:
            raise SimNodeError(f"GPU {g['index']}: the simulated NVML holds at most "
                               f"{NVML_MAX_MIG} MIG devices and 95-character names")
        lines.append(
            f"gpu {g['minor']} {int(g['mig_capable'])} {int(g['mig_enabled'])} "
            f"{g['max_mig_devices']} {g['pci_device_id']:x} {g['brand']} "
            f"{g['compute_capability'][0]} {g['compute_capability'][1]} "
            f"{_arch(g['compute_capability'])} {memory_mb(g['name'])} {g['uuid']} "
            f"{g['nvml_bus_id']} {g['nvml_bus_id_legacy']} {g['name']}")
        for m in g["mig_devices"]:
            slices = int(m["profile"].split("g.", 1)[0])
            mem = int(m["profile"].split(".", 1)[1].split("gb", 1)[0]) * 1024
            lines.append(
                f"mig {m['gi']} {m['ci']} {m['profile_id']} {_CI_PROFILE_IDS.get(slices, 0)} "
                f"{slices} {mem} {m['uuid']} {m['name']}")
    return "\n".join(lines) + "\n"
