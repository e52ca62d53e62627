"""The hook's command line: one process does every operation a container needs.

``OPERATION [--option VALUE]... [OPERATION [--option VALUE]...]...``, for example::

    create-symlinks --link TARGET::LINK ... --device-link DEVICE::TARGET::LINK ...
    enable-cuda-compat --host-driver-version=V
    update-ldcache --folder DIR ...
    disable-device-node-modification

The OCI state is read from stdin once, the container root opened once, and the operations
run in the order given; the first failure prints one line naming the operation and the
container path and exits 1, which makes the runtime fail the container's creation.  One
operation alone (``create-symlinks --link ...``) is the same command line as before, and as
``nvidia-cdi-hook``'s (the operations have its names and flags).  ``install-launcher PATH``
builds the static launcher (:mod:`cdi.hooks.launcher`).

Why one process: a hook is a Python interpreter started by the runtime for every container,
and starting one costs more than any operation's work; so the generator writes a single hook
entry with every operation, and this module, which is on that start-up path, imports
nothing the operations do not use (no ``argparse``, ``typing``, ``dataclasses``; an
operation's module is imported only when the operation is on the command line).  ``--help``
builds an ``argparse`` parser from the same table.

Adding an operation: a function ``run(root, args) -> list[str]`` (messages to print; raise
:class:`~cdi.hooks.rootfs.RootFSError` or ``OSError`` to fail) that imports its module
inside, and one :class:`Operation` in :data:`OPERATIONS` naming its options.  ``args``
holds one attribute per option (``--host-driver-version`` → ``args.host_driver_version``:
a list for a repeatable option, else a string or None) and ``args.container``, the
:class:`~cdi.hooks.state.ContainerRoot` (bundle, root path, ``linux.devices`` paths).
"""

from __future__ import annotations

import errno
import os
import sys

from cdi.hooks.rootfs import RootFS, RootFSError, read_only_message
from cdi.hooks.state import StateError, read_state

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from typing import IO, Any

    from cdi.hooks.state import ContainerRoot

__all__ = ["OPERATIONS", "Args", "Operation", "Option", "UsageError", "add_commands",
           "build_parser", "main", "parse_operations", "run_operations"]

_PROG = "nri-cdi hook"


class UsageError(Exception):
    """The command line names no operation, or an unknown one or option; says which."""


class Args:
    """One operation's option values (attributes named after the options) and the container."""

    container: ContainerRoot
    if TYPE_CHECKING:  # the options: one attribute each, typed by the operation that reads it
        def __getattr__(self, name: str) -> Any: ...

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def __repr__(self) -> str:
        return f"Args({', '.join(f'{k}={v!r}' for k, v in sorted(self.__dict__.items()))})"


class Option:
    """``--name VALUE`` (or ``--name=VALUE``); ``many``: repeatable, collected in a list."""

    __slots__ = ("dest", "help", "many", "metavar", "name")

    def __init__(self, name: str, metavar: str, help: str, *, many: bool = True) -> None:
        self.name, self.metavar, self.help, self.many = name, metavar, help, many
        self.dest = name.replace("-", "_")


class Operation:
    """A hook operation: its name, what it does (help), its options and its function."""

    __slots__ = ("help", "name", "options", "run")

    def __init__(self, name: str, run: Callable[[RootFS, Args], list[str]], help: str,
                 *options: Option) -> None:
        self.name, self.run, self.help = name, run, help
        self.options = {o.name: o for o in options}

    def defaults(self) -> dict[str, Any]:
        return {o.dest: [] if o.many else None for o in self.options.values()}


# --- the operations (their logic lives in their own modules) --------------------------------


def _create_symlinks(root: RootFS, args: Args) -> list[str]:
    from cdi.hooks.symlinks import Link, create_symlinks, parse_link

    links = [parse_link(s) for s in args.link]
    for spec in args.device_link:  # all checked, also those for devices not in this container
        device, sep, link = spec.partition("::")
        target, sep2, path = link.partition("::")
        if not sep or not sep2 or not device.startswith("/"):
            raise RootFSError(f"--device-link {spec!r}: want DEVICE::TARGET::LINK")
        found = Link(target=target, path=path)
        if device in args.container.devices:  # the link is for a device this container has
            links.append(found)
    results = create_symlinks(root, links)
    return [f"replaced {r.link.path} -> {r.link.target} (was {r.previous})"
            if r.action == "replaced" else f"{r.previous}; link not made"
            for r in results if r.action in ("replaced", "skipped")]


def _update_ldcache(root: RootFS, args: Args) -> list[str]:
    from cdi.hooks.ldconfig import update_ldcache

    result = update_ldcache(root, args.folder)
    return list(result.warnings)


def _mask_proc(root: RootFS, args: Args) -> list[str]:
    from cdi.hooks.mask_proc import MaskError, mask_proc

    try:
        mask_proc(root.path, args.gpu, args.proc_root or DEFAULT_PROC_ROOT)
    except MaskError as exc:
        raise RootFSError(str(exc)) from None
    return []


def _enable_cuda_compat(root: RootFS, args: Args) -> list[str]:
    from cdi.hooks.cuda_compat import COMPAT_ROOT, enable_cuda_compat

    result = enable_cuda_compat(root, host_driver=args.host_driver_version or "",
                                host_cuda=args.host_cuda_version or "",
                                compat_root=args.cuda_compat_container_root or COMPAT_ROOT)
    # silent either way, as the other operations are when they succeed, unless something
    # in the image was skipped
    return [result.warning] if result.warning else []


def _disable_device_node_modification(root: RootFS, args: Args) -> list[str]:
    from cdi.hooks.device_params import PARAMS, disable_device_node_modification

    disable_device_node_modification(root, host_params=args.host_params or PARAMS)
    return []


DEFAULT_PROC_ROOT = "/proc/driver/nvidia"

OPERATIONS: dict[str, Operation] = {op.name: op for op in (
    Operation("create-symlinks", _create_symlinks, "make LINK -> TARGET in the container",
              Option("link", "TARGET::LINK", "repeatable; LINK is an absolute container path"),
              Option("device-link", "DEVICE::TARGET::LINK",
                     "repeatable; made only when the container has the device node DEVICE "
                     "(a container path in its config's linux.devices)")),
    Operation("update-ldcache", _update_ldcache,
              "make the libraries in DIR findable by SONAME",
              Option("folder", "DIR", "repeatable; an absolute container path"),
              Option("ldconfig-path", "PATH", "accepted for nvidia-cdi-hook compatibility and "
                     "ignored: no ldconfig is run, the cache is written directly", many=False)),
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


# --- command line ---------------------------------------------------------------------------


def parse_operations(argv: Sequence[str]) -> list[tuple[Operation, Args]]:
    """``OPERATION [--option VALUE]...`` repeated, checked before anything is touched."""
    if not argv:
        raise UsageError(f"no operation given (want one of: {', '.join(OPERATIONS)})")
    steps: list[tuple[Operation, Args]] = []
    i = 0
    while i < len(argv):
        op = OPERATIONS.get(argv[i])
        if op is None:
            raise UsageError(f"{argv[i]!r}: not an operation (want one of: "
                             f"{', '.join(OPERATIONS)})")
        values = op.defaults()
        i += 1
        while i < len(argv) and argv[i].startswith("--"):
            name, eq, value = argv[i][2:].partition("=")
            option = op.options.get(name)
            if option is None:
                raise UsageError(f"{op.name}: unknown option --{name}")
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"{op.name} --{name}: needs a value")
                value = argv[i + 1]
            i += 1 if eq else 2
            if option.many:
                values[option.dest].append(value)
            else:
                values[option.dest] = value
        steps.append((op, Args(**values)))
    return steps


def run_operations(steps: Sequence[tuple[Operation, Args]], stdin: IO[bytes]) -> int:
    """Open the container named by the state on ``stdin`` and run ``steps`` in it."""
    name = steps[0][0].name if steps else "hook"
    try:
        container = read_state(stdin)
        with RootFS(container.path, container=container) as root:
            for op, args in steps:
                name = op.name
                args.container = container
                for line in op.run(root, args):
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
    if not argv or argv[0] in ("-h", "--help", "install-launcher"):
        args = build_parser().parse_args(argv)  # help, usage errors and the launcher
        return _install_launcher(args)
    try:
        steps = parse_operations(argv)
    except UsageError as exc:
        return _fail("usage", str(exc))
    return run_operations(steps, stdin or sys.stdin.buffer)


def _fail(where: str, message: str) -> int:
    print(f"{_PROG} {where}: error: {message}", file=sys.stderr)
    return 1


# --- argparse: --help, install-launcher and ``nri-cdi hook`` --------------------------------


def _describe() -> str:
    lines = ["operations (one or more, each followed by its options; they run in order, "
             "in one process):"]
    for op in OPERATIONS.values():
        lines.append(f"  {op.name}: {op.help}")
        lines += [f"    --{o.name} {o.metavar}: {o.help}" for o in op.options.values()]
    return "\n".join(lines)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    import argparse

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _describe() + "\n\ninstall-launcher PATH [--python PYTHON]: build the " \
        "static hook launcher at PATH (needs gcc)"
    parser.add_argument("operations", nargs=argparse.REMAINDER, metavar="OPERATION ...",
                        help="see below")


def build_parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(prog=_PROG, description="createContainer hooks")
    _add_arguments(parser)
    return parser


def add_commands(subparsers: Any) -> None:
    """Add ``hook`` to the ``nri-cdi`` command."""
    parser = subparsers.add_parser(
        "hook", help="the createContainer hook run by the OCI runtime (create-symlinks, "
                     "update-ldcache, ...)", description="createContainer hooks")
    _add_arguments(parser)
    parser.set_defaults(func=_from_nri_cdi)


def _from_nri_cdi(args: argparse.Namespace) -> int:
    """``nri-cdi hook``: re-execute as the isolated entry when started as a console script.

    The console script's interpreter ran without ``-I``; restarting with ``-I -S`` and
    :data:`~cdi.hooks.entry.HOOK_ENV` means at least the hook's own work runs in a clean
    interpreter.
    """
    from cdi.hooks.entry import ENTRY_SCRIPT, HOOK_ENV

    if (args.operations and args.operations[0] != "install-launcher"
            and not sys.flags.isolated and sys.argv[1:2] == ["hook"]
            and os.path.isabs(sys.executable)):
        env = dict(e.split("=", 1) for e in HOOK_ENV)
        os.execve(sys.executable, [sys.executable, "-I", "-S", ENTRY_SCRIPT, *sys.argv[2:]],
                  env)
    return main(args.operations)


def _install_launcher(args: argparse.Namespace) -> int:
    import argparse

    from cdi.hooks.launcher import LauncherError, build_launcher

    parser = argparse.ArgumentParser(prog=f"{_PROG} install-launcher")
    parser.add_argument("path")
    parser.add_argument("--python", help="interpreter to run (default: this one)")
    ops = args.operations
    if not ops or ops[0] != "install-launcher":
        build_parser().print_usage(sys.stderr)
        return _fail("usage", "no operation given")
    options = parser.parse_args(ops[1:])
    try:
        path = build_launcher(options.path, python=options.python)
    except LauncherError as exc:
        return _fail("install-launcher", str(exc))
    print(path)
    return 0
