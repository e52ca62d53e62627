"""``python -m nri_cdi_testbed.simnode ROOT``: build a simulated node from the command line."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from nri_cdi_testbed.simnode.builder import build_node
from nri_cdi_testbed.simnode.driverfiles import DIRS, TRIPLETS
from nri_cdi_testbed.simnode.layout import (
    DEFAULT_DRIVER_VERSION,
    EXTRAS,
    NodeLayout,
    SimNodeError,
    host_machine,
    parse_mig_arg,
)
from nri_cdi_testbed.simnode.node import BuiltNode


def _arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m nri_cdi_testbed.simnode",
        description="Build a simulated NVIDIA GPU node (driver files, /dev, /proc, /sys).",
    )
    p.add_argument("root", type=Path, help="folder to build in (created, must be empty)")
    p.add_argument("--gpus", type=int, default=1, help="number of GPUs (default 1)")
    p.add_argument(
        "--mig",
        action="append",
        default=[],
        metavar="INDEX:PROFILES",
        help="enable MIG on a GPU, e.g. 0:1g.10gb*7 or 1:3g.40gb,2g.20gb "
        "(repeatable; '+gfx' marks a graphics profile)",
    )
    p.add_argument("--minors", help="comma-separated device minors by GPU index")
    p.add_argument("--layout", choices=sorted(DIRS), default="debian")
    p.add_argument("--extra", action="append", default=[], choices=sorted(EXTRAS),
                   help="optional parts (repeatable)")
    p.add_argument(
        "--driver-container",
        action="store_true",
        help="driver under ROOT/run/nvidia/driver, device nodes under ROOT/dev",
    )
    p.add_argument("--driver-version", default=DEFAULT_DRIVER_VERSION)
    p.add_argument("--cuda", default="13.0", help="CUDA version the driver supports")
    p.add_argument("--seed", default="simnode", help="seed for UUIDs")
    p.add_argument("--compat32", action="store_true", help="also build i386 libraries")
    p.add_argument("--bmc-vga", action="store_true", help="an on-board VGA owns card0")
    p.add_argument("--no-device-nodes", action="store_true", help="skip mknod (no root)")
    p.add_argument("--machine", choices=sorted(TRIPLETS), default=host_machine() or "x86_64",
                   help="what the libraries are built for (default: this machine; another "
                        "needs its cross compiler, <triplet>-gcc, and --ldconfig)")
    p.add_argument("--ldconfig", type=shlex.split, default=[], metavar="COMMAND",
                   help="the command that runs --machine's ldconfig, e.g. 'qemu-aarch64 "
                        "ROOT/sbin/ldconfig' (default: this machine's ldconfig)")
    p.add_argument("--cache-dir", type=Path, help="compiled-object cache")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _arg_parser().parse_args(argv)
    try:
        mig = dict(parse_mig_arg(m) for m in args.mig)
        minors = [int(x) for x in args.minors.split(",")] if args.minors else None
        if minors is not None and len(minors) != args.gpus:
            raise SimNodeError("--minors needs one minor per GPU")
        cuda_major, _, cuda_minor = args.cuda.partition(".")
        layout = NodeLayout.uniform(
            args.gpus,
            mig=mig,
            minors=minors,
            driver_version=args.driver_version,
            cuda_version=(int(cuda_major), int(cuda_minor or 0)),
            distro=args.layout,
            driver_container=args.driver_container,
            seed=args.seed,
            compat32=args.compat32,
            bmc_vga=args.bmc_vga,
            device_nodes=not args.no_device_nodes,
            extras=tuple(args.extra),
            machine=args.machine,
        )
        node = build_node(args.root, layout, cache_dir=args.cache_dir, ldconfig=args.ldconfig)
    except (SimNodeError, ValueError) as e:
        print(f"simnode: error: {e}", file=sys.stderr)
        return 2
    _print_summary(node)
    return 0


def _print_summary(node: BuiltNode) -> None:
    m = node.manifest
    print(f"driver root: {node.driver_root}")
    print(f"dev root:    {node.dev_root}")
    print(f"manifest:    {node.manifest_path}")
    print(
        f"{m['machine']} driver {m['driver_version']}, CUDA {m['cuda_version']}, "
        f"{len(m['libraries'])} libraries, {len(m['device_nodes'])} device nodes"
    )
    for g in m["gpus"]:
        mig = f", MIG: {len(g['mig_devices'])} devices" if g["mig_enabled"] else ""
        print(f"  GPU {g['index']} minor {g['minor']} {g['bus_id']} {g['uuid']}{mig}")
