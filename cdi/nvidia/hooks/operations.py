"""NVIDIA's hook operations, the table :func:`cdi.hooks.cli.operations` adds to the neutral
ones. Each function imports its operation's module when it runs: the table is on the start-up
path of every hook that names one of them."""

from __future__ import annotations

from cdi.hooks.cli import Args, Operation, Option
from cdi.hooks.rootfs import RootFS

DEFAULT_PROC_ROOT = "/proc/driver/nvidia"


def _mask_proc(root: RootFS, args: Args) -> list[str]:
    from cdi.nvidia.hooks.mask_proc import mask_proc

    mask_proc(root.path, args.gpu, args.proc_root or DEFAULT_PROC_ROOT)
    return []


def _enable_cuda_compat(root: RootFS, args: Args) -> list[str]:
    from cdi.nvidia.hooks.cuda_compat import COMPAT_ROOT, enable_cuda_compat

    result = enable_cuda_compat(root, host_driver=args.host_driver_version or "",
                                host_cuda=args.host_cuda_version or "",
                                compat_root=args.cuda_compat_container_root or COMPAT_ROOT)
    # silent either way, as the other operations are when they succeed, unless something
    # in the image was skipped
    return [result.warning] if result.warning else []


def _disable_device_node_modification(root: RootFS, args: Args) -> list[str]:
    from cdi.nvidia.hooks.device_params import PARAMS, disable_device_node_modification

    disable_device_node_modification(root, host_params=args.host_params or PARAMS)
    return []


OPERATIONS: dict[str, Operation] = {op.name: op for op in (
    # The generator runs it before update-ldcache, which puts the folders of the
    # 00-compat-*.conf it writes first (the table's order is only the help's).
    Operation("enable-cuda-compat", _enable_cuda_compat,
              "put the image's CUDA forward-compatibility libraries first when newer than "
              "the host driver",
              Option("host-driver-version", "V", "the host driver's version", many=False),
              Option("host-cuda-version", "V", "the host's CUDA version", many=False),
              Option("cuda-compat-container-root", "DIR", "the compat libraries' container "
                     "folder (default /usr/local/cuda/compat)", many=False)),
    Operation("disable-device-node-modification", _disable_device_node_modification,
              "show the container ModifyDeviceFiles: 0 in /proc/driver/nvidia/params",
              Option("host-params", "FILE", "the driver's params file on the host (default "
                     "/proc/driver/nvidia/params)", many=False)),
    Operation("mask-proc", _mask_proc,
              "show only the given GPUs under /proc/driver/nvidia/gpus",
              Option("gpu", "BUS_ID", "repeatable; a PCI bus id the container was given"),
              Option("proc-root", "DIR", "the driver's procfs folder on the host (default "
                     f"{DEFAULT_PROC_ROOT})", many=False)),
)}
