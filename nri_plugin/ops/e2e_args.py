"""``nri-cdi doctor --e2e``'s flags, declared without the test bed that runs the check
(``nri_cdi_testbed.node_check``): building the command line, ``--help`` included, imports
none of it; ``doctor --e2e`` imports it when asked (:func:`run`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# The private containerds the check can start (nri_cdi_testbed.node_check.paths.RUNTIMES
# says where each one's files are; a test keeps the two in step).
RUNTIMES = ("1.7", "2.1")
DEFAULT_RUNTIME = "1.7"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--e2e (a throwaway GPU container on this node)")
    group.add_argument("--e2e", action="store_true", help="run the end-to-end node check")
    group.add_argument("--runtime", default=DEFAULT_RUNTIME, choices=RUNTIMES,
                       help="the private containerd's version (default %(default)s)")
    group.add_argument("--cache", type=Path, help="scripts/install-containerd.sh's cache "
                       "(default $NRI_CDI_CACHE, else .cache/containerd in the source tree)")
    group.add_argument("--containerd-bin", type=Path, metavar="DIR",
                       help="a folder holding containerd, ctr and containerd-shim-runc-v2")
    group.add_argument("--runc", type=Path, metavar="PATH",
                       help="the runc for the private containerd (default $NRI_CDI_RUNC, "
                       "else /usr/sbin/runc)")
    group.add_argument("--containerd-address", metavar="SOCK",
                       help="use the node's containerd at SOCK (our plugin connects to --socket)")
    group.add_argument("--simulated", action="store_true",
                       help="use a simulated node even where a GPU is present")
    group.add_argument("--sim-node", type=Path, metavar="DIR",
                       help="an already built simulated node (nri_cdi_testbed/simnode/)")
    group.add_argument("--e2e-spec-dir", type=Path, metavar="DIR",
                       help="check the specs in DIR instead of generating them")
    group.add_argument("--driver-root", type=Path, help="the real node's driver root (default /)")
    group.add_argument("--gpu", type=int, default=0, help="the GPU index to ask for (default 0)")
    group.add_argument("--repeat", type=int, default=3,
                       help="containers per timing (median; default %(default)s)")
    group.add_argument("--record-node", type=Path, metavar="FILE",
                       help="on a real node: also write to FILE what the generator reads "
                            "there (driver files, device nodes, /proc), so its spec can be "
                            "regenerated from the record later")


def run(args: argparse.Namespace) -> int:
    """The node check, from the test bed; without it (an installed wheel carries only the
    product) one line says where it is."""
    try:
        from nri_cdi_testbed.node_check import check  # here: only --e2e needs the test bed
    except ModuleNotFoundError as exc:
        if exc.name not in ("nri_cdi_testbed", "nri_cdi_testbed.node_check"):
            raise  # the test bed is there but something it needs is not
        print("nri-cdi doctor --e2e: needs the test bed (nri_cdi_testbed), which the installed "
              "package does not carry: run `python3 -m nri_plugin.ops.cli doctor --e2e` in a "
              "checkout of the nri-cdi repository", file=sys.stderr)
        return 2
    if args.record_node is not None:
        if args.simulated:
            print("nri-cdi doctor: --record-node records a real node, not --simulated's",
                  file=sys.stderr)
            return 2
        from nri_cdi_testbed.node_record import record  # only when asked

        args.record_node.write_text(json.dumps(
            record(args.driver_root or "/", "/"), indent=1, sort_keys=True) + "\n")
    return check.cmd(args)
