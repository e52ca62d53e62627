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
import os
import sys
from collections.abc import Sequence
from typing import Any

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


class _Formatter(argparse.HelpFormatter):
    """argparse's help layout, with the terminal's width found through ``os``: argparse
    imports shutil for it (and shutil bz2 and lzma) while it builds any parser, help or
    not, which every ``nri-cdi generate`` (that prints none) would pay
    (bench/reports/2026-11-27-generator-stdlib-2-cores). The width is the one
    shutil.get_terminal_size gives: $COLUMNS, else stdout's terminal, else 80."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         _columns() - 2 if width is None else width)


def _columns() -> int:
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


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


class _Parser(argparse.ArgumentParser):
    """The command's parser; its subcommands' parsers are of this class too (argparse
    makes them of the parent's class), so none of them imports shutil."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand, or only ``command``'s module when it is known."""
    parser = _Parser(
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
