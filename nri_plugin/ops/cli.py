"""``nri-cdi``: one command for the CDI library, the generator, the hooks and the plugin.

A table of subcommands, each in the module that owns it. Only the module of the subcommand
being run is imported (all of them for ``--help`` or an unknown one): ``nri-cdi generate``
and the hooks, which the runtime starts for every container, must not pay for the plugin
or the doctor (bench/reports/2026-11-27-generator-stdlib-2-cores/).
``tests/nvidia/test_generate_command.py`` checks what ``nri-cdi generate`` loads.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from cdi.extras import MissingDependencyError
from cdi.process import finish

# subcommand -> (module, function that adds that module's subcommands), in help order;
# the module is imported when its subcommand is chosen (figures above).
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("cdi.nvidia.cdi_commands", "add_commands"),
    "validate": ("cdi.nvidia.cdi_commands", "add_commands"),
    "inject": ("cdi.nvidia.cdi_commands", "add_commands"),
    "generate": ("cdi.nvidia.cli", "add_commands"),
    "system": ("cdi.nvidia.devnodes", "add_commands"),
    "plugin": ("nri_plugin.ops.daemon", "add_command"),
    "hook": ("cdi.hooks.cli", "add_commands"),
    "watch": ("nri_plugin.ops.refresh", "add_commands"),
    "refresh": ("nri_plugin.ops.refresh", "add_commands"),
    "config": ("nri_plugin.ops.settings", "add_commands"),
    "install-units": ("nri_plugin.ops.units", "add_commands"),
    "uninstall-units": ("nri_plugin.ops.units", "add_commands"),
    "install-plugin-launcher": ("nri_plugin.ops.units", "add_commands"),
    "uninstall-plugin-launcher": ("nri_plugin.ops.units", "add_commands"),
    "doctor": ("nri_plugin.ops.doctor", "add_commands"),
}


DOCUMENTATION = ("Documentation: the docs/ folder of the nri-cdi source repository, the "
                 "nri-cdi documentation site (mkdocs); start at docs/index.md. Each "
                 "command's options: nri-cdi COMMAND --help.")


class _Version(argparse.Action):
    """``--version``: the installed distribution's version, its metadata read only when
    asked for."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("nri-cdi")
        except PackageNotFoundError:
            found = "unknown (nri-cdi is not installed: running from a source tree)"
        print(f"nri-cdi {found}")
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand, or only ``command``'s module when it is known."""
    parser = argparse.ArgumentParser(
        prog="nri-cdi",
        description="CDI specs for GPU nodes and a containerd NRI plugin that applies them.",
        epilog=DOCUMENTATION,
    )
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the installed nri-cdi's version and exit")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = [COMMANDS[command]] if command in COMMANDS else list(COMMANDS.values())
    for module, function in dict.fromkeys(wanted):
        getattr(importlib.import_module(module), function)(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        return int(args.func(args))
    except MissingDependencyError as exc:  # one line, no traceback: it says what to install
        print(f"nri-cdi {args.command}: {exc}", file=sys.stderr)
        return 2


def entry() -> None:
    """The ``nri-cdi`` console script: ``main`` in a process of its own."""
    finish(main())


if __name__ == "__main__":
    entry()
