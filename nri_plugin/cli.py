"""``nri-cdi``: one command for the CDI library, the generator, the hooks and the plugin."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cdi.cli import add_commands as add_cdi_commands
from cdi.hooks.cli import add_commands as add_hook_commands
from cdi.nvidia.cli import add_commands as add_nvidia_commands

from .daemon import add_command as add_plugin_command
from .doctor import add_commands as add_doctor_commands
from .refresh import add_commands as add_refresh_commands
from .settings import add_commands as add_config_commands
from .units import add_commands as add_unit_commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nri-cdi",
        description="CDI specs for GPU nodes and a containerd NRI plugin that applies them.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_cdi_commands(subparsers)
    add_nvidia_commands(subparsers)
    add_plugin_command(subparsers)
    add_hook_commands(subparsers)
    add_refresh_commands(subparsers)
    add_config_commands(subparsers)
    add_unit_commands(subparsers)
    add_doctor_commands(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
