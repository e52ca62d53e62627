"""The text of the files the driver shows in /proc, and the simulated nvidia-smi."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nri_cdi_testbed.simnode.layout import (
    CI_PER_GI,
    DRM_MAJOR,
    GI_PER_GPU,
    MIG_MINORS_GPUS,
    MINORS_PER_GI,
    NVIDIA_MAJOR,
    NodeLayout,
    det_uuid,
)


def gi_cap_minor(gpu_minor: int, gi: int) -> int:
    return 3 + gpu_minor * GI_PER_GPU * MINORS_PER_GI + gi * MINORS_PER_GI


def ci_cap_minor(gpu_minor: int, gi: int, ci: int) -> int:
    return gi_cap_minor(gpu_minor, gi) + 1 + ci


def mig_minors_text() -> str:
    lines = ["config 1", "monitor 2"]
    for g in range(MIG_MINORS_GPUS):
        for gi in range(GI_PER_GPU):
            lines.append(f"gpu{g}/gi{gi}/access {gi_cap_minor(g, gi)}")
            lines.extend(
                f"gpu{g}/gi{gi}/ci{ci}/access {ci_cap_minor(g, gi, ci)}"
                for ci in range(CI_PER_GI)
            )
    return "\n".join(lines) + "\n"


def cap_text(minor: int, mode: int) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


def version_text(v: str) -> str:
    return (
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  "
        "(simnode@builder)  Mon Jan  6 12:00:00 UTC 2025\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )


PARAMS = "".join(
    f"{k}: {v}\n"
    for k, v in (
        ("ResmanDebugLevel", "4294967295"),
        ("RmLogonRC", "1"),
        ("ModifyDeviceFiles", "1"),
        ("DeviceFileUID", "0"),
        ("DeviceFileGID", "0"),
        ("DeviceFileMode", "438"),
        ("InitializeSystemMemoryAllocations", "1"),
        ("UsePageAttributeTable", "4294967295"),
        ("EnableMSI", "1"),
        ("EnablePCIeGen3", "0"),
        ("MemoryPoolSize", "0"),
        ("KMallocHeapMaxSize", "0"),
        ("VMallocHeapMaxSize", "0"),
        ("IgnoreMMIOCheck", "0"),
        ("EnableStreamMemOPs", "0"),
        ("EnableUserNUMAManagement", "1"),
        ("NvLinkDisable", "0"),
        ("RmProfilingAdminOnly", "1"),
        ("PreserveVideoMemoryAllocations", "0"),
        ("EnableS0ixPowerManagement", "0"),
        ("DynamicPowerManagement", "3"),
        ("RegistryDwords", '""'),
        ("RmMsg", '""'),
        ("GpuBlacklist", '""'),
        ("TemporaryFilePath", '""'),
        ("ExcludedGpus", '""'),
        ("DmaRemapPeerMmio", "1"),
    )
)


def information_text(g: Mapping[str, Any]) -> str:
    rows = (
        ("Model", g["name"]),
        ("IRQ", str(200 + g["index"])),
        ("GPU UUID", g["uuid"]),
        ("Video BIOS", g["vbios"]),
        ("Bus Type", "PCIe"),
        ("DMA Size", "52 bits"),
        ("DMA Mask", "0xfffffffffffff"),
        ("Bus Location", g["bus_id"]),
        ("Device Minor", str(g["minor"])),
        ("GPU Excluded", "No"),
    )
    return "".join(f"{k}: \t {v}\n" for k, v in rows)


def proc_devices_text(lay: NodeLayout) -> str:
    chars = [
        (1, "mem"),
        (4, "/dev/vc/0"),
        (4, "tty"),
        (5, "/dev/tty"),
        (5, "/dev/console"),
        (5, "/dev/ptmx"),
        (10, "misc"),
        (13, "input"),
        (136, "pts"),
        (NVIDIA_MAJOR, "nvidia-frontend"),
        (DRM_MAJOR, "drm"),
        (lay.uvm_major, "nvidia-uvm"),
        (lay.caps_major, "nvidia-caps"),
    ]
    blocks = [(7, "loop"), (8, "sd"), (259, "blkext")]
    out = ["Character devices:"]
    out += [f"{m:3d} {n}" for m, n in sorted(chars, key=lambda x: x[0])]
    out += ["", "Block devices:"] + [f"{m:3d} {n}" for m, n in blocks]
    return "\n".join(out) + "\n"


def nvidia_smi_script(lay: NodeLayout) -> str:
    """A POSIX shell ``nvidia-smi`` (it runs in a busybox container too): ``-L`` lists the
    GPUs whose ``/dev/nvidia<minor>`` the caller sees, numbered as NVML would in there
    (``$SIMNODE_DEV`` names another dev folder, e.g. the node's, on the host)."""
    lines = ["n=0"]
    for i, gpu in enumerate(lay.gpus):
        listing = [f"GPU $n: {gpu.name} (UUID: {lay.gpu_uuid(i)})"]
        for j, (dev, gi) in enumerate(lay.mig_of(i)):
            mig_uuid = "MIG-" + det_uuid(lay.seed, "mig", i, gi, dev.ci)
            listing.append(f"  MIG {dev.profile:<11} Device {j:>2}: (UUID: {mig_uuid})")
        echo = "; ".join(f'echo "{line}"' for line in listing)
        lines.append(f"if [ -c $dev/nvidia{lay.minor_of(i)} ]; then {echo}; n=$((n+1)); fi")
    major, minor = lay.cuda_version
    return (
        "#!/bin/sh\n# simulated nvidia-smi ($SIMNODE_DEV: the node's /dev, to run it on the host)\n"
        "dev=${SIMNODE_DEV:-/dev}\n"
        '[ -c $dev/nvidiactl ] || { echo "NVIDIA-SMI has failed because it couldn\'t '
        'communicate with the NVIDIA driver." >&2; exit 9; }\n'
        'if [ "$1" = "-L" ]; then\n' + "\n".join(lines) + "\nexit 0\nfi\n"
        f"echo 'NVIDIA-SMI {lay.driver_version}  Driver Version: {lay.driver_version}  "
        f"CUDA Version: {major}.{minor}'\n"
    )

