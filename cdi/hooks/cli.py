"""The hook's command line, ``OPERATION [--option VALUE]... [OPERATION ...]...`` (a vendor's
operations, :func:`operations`, anywhere among them) or ``build-static-launcher PATH``: one
process reads the OCI state, opens the container root and runs the operations in order; the
first failure prints one line and exits 1. The rules, why one process, and how to add an
operation: docs/developer/hook-safety.md.
"""

from __future__ import annotations

import errno
import os
import sys
from types import SimpleNamespace  # imported on the hook's start-up path anyway, by ctypes

from cdi.hooks.rootfs import RootFS, RootFSError, read_only_message
from cdi.hooks.state import StateError, read_state

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import IO, Any


_PROG = "nri-cdi hook"
_CDI = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the cdi package's folder


# --- what an operation is (a vendor's cdi/<vendor>/hooks/operations.py makes them too) ------

class UsageError(Exception):
    """The command line names no operation, or an unknown one or option; says which."""


class Option:
    """``--name VALUE`` (or ``--name=VALUE``); ``many``: repeatable, collected in a list."""

    __slots__ = ("dest", "help", "many", "metavar", "name")

    def __init__(self, name: str, metavar: str, help: str, *, many: bool = True) -> None:
        self.name, self.metavar, self.help, self.many = name, metavar, help, many
        self.dest = name.replace("-", "_")


class Operation:
    """A hook operation: its name, what it does (help), its options and the module whose
    ``run(root, args) -> list[str]`` does it, imported only when a command line names it."""

    __slots__ = ("help", "module", "name", "options")

    def __init__(self, name: str, module: str, help: str, *options: Option) -> None:
        self.name, self.module, self.help = name, module, help
        self.options = {o.name: o for o in options}


# --- the operations -------------------------------------------------------------------------


OPERATIONS: dict[str, Operation] = {op.name: op for op in (
    Operation("create-symlinks", "cdi.hooks.symlinks", "make LINK -> TARGET in the container",
              Option("link", "TARGET::LINK", "repeatable; LINK is an absolute container path"),
              Option("device-link", "DEVICE::TARGET::LINK",
                     "repeatable; made only when the container has the device node DEVICE "
                     "(a container path in its config's linux.devices)")),
    Operation("update-ldcache", "cdi.hooks.ldconfig",
              "make the libraries in DIR findable by SONAME",
              Option("folder", "DIR", "repeatable; an absolute container path"),
              Option("ldconfig-path", "PATH", "accepted for compatibility with other hook "
                     "programs and ignored: no ldconfig is run, the cache is written "
                     "directly", many=False)),
)}


def operations() -> dict[str, Operation]:
    """Every operation a command line may name: the neutral ones (:data:`OPERATIONS`) and
    those of every vendor's ``cdi/<vendor>/hooks/operations.py``. Called only for a name
    that is not neutral: a hook of neutral operations alone imports no vendor module."""
    table = dict(OPERATIONS)
    for vendor in sorted(os.listdir(_CDI)):
        if os.path.isfile(os.path.join(_CDI, vendor, "hooks", "operations.py")):
            module = __import__(f"cdi.{vendor}.hooks.operations", fromlist=["OPERATIONS"])
            table.update(module.OPERATIONS)
    return table


# --- command line ---------------------------------------------------------------------------


def parse_operations(argv: Sequence[str]) -> list[tuple[Operation, SimpleNamespace]]:
    """``OPERATION [--option VALUE]...`` repeated, checked before anything is touched: each
    operation's values, an attribute per option (``--device-link`` -> ``device_link``)."""
    if not argv:
        raise UsageError(f"no operation given (want one of: {', '.join(operations())})")
    table = OPERATIONS
    steps: list[tuple[Operation, SimpleNamespace]] = []
    todo = list(reversed(argv))
    while todo:
        word = todo.pop()
        op = table.get(word)
        if op is None and table is OPERATIONS:  # a vendor's operation, or a mistake
            table = operations()
            op = table.get(word)
        if op is None:
            raise UsageError(f"{word!r}: not an operation (want one of: {', '.join(table)})")
        values: dict[str, Any] = {o.dest: [] if o.many else None for o in op.options.values()}
        while todo and todo[-1].startswith("--"):
            name, eq, value = todo.pop()[2:].partition("=")
            option = op.options.get(name)
            if option is None:
                raise UsageError(f"{op.name}: unknown option --{name}")
            if not eq:
                if not todo:
                    raise UsageError(f"{op.name} --{name}: needs a value")
                value = todo.pop()
            if option.many:
                values[option.dest].append(value)
            else:
                values[option.dest] = value
        steps.append((op, SimpleNamespace(**values)))
    return steps


def run_operations(steps: Sequence[tuple[Operation, SimpleNamespace]], stdin: IO[bytes]) -> int:
    """Open the container named by the state on ``stdin`` and run ``steps`` in it."""
    name = steps[0][0].name if steps else "hook"
    try:
        container = read_state(stdin)
        with RootFS(container.path, container=container) as root:
            for op, args in steps:
                name = op.name
                args.container = container
                # __import__, not importlib: importing importlib slows every hook's start
                module = __import__(op.module, fromlist=["run"])
                for line in module.run(root, args):
                    print(f"{_PROG} {name}: {line}", file=sys.stderr)
    except (RootFSError, StateError) as exc:
        return _fail(name, str(exc))
    except OSError as exc:
        if exc.errno == errno.EROFS:
            return _fail(name, read_only_message(exc.filename or "container root"))
        return _fail(name, f"{exc.filename or ''}: {exc.strerror}".lstrip(": "))
    except Exception as exc:  # the last resort: the runtime shows one line
        # Each operation handles the image's input itself; reaching this is a bug of ours,
        # and it still must not print a traceback into the runtime's error.
        return _fail(name, f"unexpected {type(exc).__name__}: {exc}")
    return 0


def main(argv: Sequence[str] | None = None, *, stdin: IO[bytes] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["hook"]:  # a launcher given as --hook-path gets the `nri-cdi hook` argv
        argv = argv[1:]
    if argv[:1] == ["build-static-launcher"]:
        return _build_static_launcher(argv[1:])
    if argv[:1] in (["-h"], ["--help"]):
        build_parser().parse_args(argv)  # prints the operations and exits
    try:
        steps = parse_operations(argv)
    except UsageError as exc:
        return _fail("usage", str(exc))
    return run_operations(steps, stdin or sys.stdin.buffer)


def _fail(where: str, message: str) -> int:
    print(f"{_PROG} {where}: error: {message}", file=sys.stderr)
    return 1


# --- argparse: --help, build-static-launcher and ``nri-cdi hook`` --------------------------------


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The hook's command line for ``--help`` (on ``parser``, ``nri-cdi``'s subcommand)."""
    import argparse  # lazy: as costly as this module to import; --help only

    lines = ["operations (one or more, each followed by its options; they run in order, "
             "in one process):"]
    for op in operations().values():
        lines.append(f"  {op.name}: {op.help}")
        lines += [f"    --{o.name} {o.metavar}: {o.help}" for o in op.options.values()]
    lines += ["", "build-static-launcher PATH [--python PYTHON]: build the static hook "
              "launcher at PATH (needs gcc)"]
    parser = parser or argparse.ArgumentParser(prog=_PROG, description="createContainer hooks")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "\n".join(lines)
    parser.add_argument("operations", nargs=argparse.REMAINDER, metavar="OPERATION ...",
                        help="see below")
    return parser


def add_commands(subparsers: Any) -> None:
    """Add ``hook`` to the ``nri-cdi`` command."""
    build_parser(subparsers.add_parser(
        "hook", help="the createContainer hook run by the OCI runtime (create-symlinks, "
                     "update-ldcache, ...)", description="createContainer hooks",
    )).set_defaults(func=_from_nri_cdi)


def _from_nri_cdi(args: argparse.Namespace) -> int:
    """``nri-cdi hook``: re-executed as the isolated entry (``-I -S``,
    :data:`~cdi.hooks.entry.HOOK_ENV`) when started as a console script."""
    from cdi.hooks.entry import ENTRY_SCRIPT, HOOK_ENV  # lazy: it imports collections

    if (args.operations and args.operations[0] != "build-static-launcher"
            and not sys.flags.isolated and sys.argv[1:2] == ["hook"]
            and os.path.isabs(sys.executable)):
        env = dict(e.split("=", 1) for e in HOOK_ENV)
        os.execve(sys.executable, [sys.executable, "-I", "-S", ENTRY_SCRIPT, *sys.argv[2:]],
                  env)
    return main(args.operations)


def _build_static_launcher(argv: list[str]) -> int:
    import argparse  # lazy: as costly as this module to import; --help only

    from cdi.hooks.launcher import LauncherError, build_launcher  # lazy: subprocess

    parser = argparse.ArgumentParser(prog=f"{_PROG} build-static-launcher")
    parser.add_argument("path")
    parser.add_argument("--python", help="interpreter to run (default: this one)")
    options = parser.parse_args(argv)
    try:
        path = build_launcher(options.path, python=options.python)
    except LauncherError as exc:
        return _fail("build-static-launcher", str(exc))
    print(path)
    return 0
