"""NVIDIA's hook operations, the table :func:`cdi.hooks.cli.operations` adds to the neutral
ones; an operation's module is imported only when a command line names it."""

from __future__ import annotations

from cdi.hooks.cli import Operation, Option

OPERATIONS: dict[str, Operation] = {op.name: op for op in (
    # The generator runs it before update-ldcache, which puts the folders of the
    # 00-compat-*.conf it writes first (the table's order is only the help's).
    Operation("enable-cuda-compat", "cdi.nvidia.hooks.cuda_compat",
              "put the image's CUDA forward-compatibility libraries first when newer than "
              "the host driver",
              Option("host-driver-version", "V", "the host driver's version", many=False),
              Option("host-cuda-version", "V", "the host's CUDA version", many=False),
              Option("cuda-compat-container-root", "DIR", "the compat libraries' container "
                     "folder (default /usr/local/cuda/compat)", many=False)),
    Operation("disable-device-node-modification", "cdi.nvidia.hooks.device_params",
              "show the container ModifyDeviceFiles: 0 in /proc/driver/nvidia/params",
              Option("host-params", "FILE", "the driver's params file on the host (default "
                     "/proc/driver/nvidia/params)", many=False)),
    Operation("mask-proc", "cdi.nvidia.hooks.mask_proc",
              "show only the given GPUs under /proc/driver/nvidia/gpus",
              Option("gpu", "BUS_ID", "repeatable; a PCI bus id the container was given"),
              Option("proc-root", "DIR", "the driver's procfs folder on the host (default "
                     "/proc/driver/nvidia)", many=False)),
)}
