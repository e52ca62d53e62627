"""``nri-cdi hook ...`` and the isolated entry's command line.

``create-symlinks --link TARGET::LINK ...``, ``update-ldcache --folder DIR ...``,
``enable-cuda-compat --host-driver-version=V`` and ``disable-device-node-modification``
(nvidia-cdi-hook's names and flags) read the OCI state from stdin and act inside the
container root; ``install-launcher PATH`` builds the
static launcher (:mod:`cdi.hooks.launcher`).  A failure prints one line naming the container
path and exits 1, which makes the runtime fail the container's creation.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable, Sequence
from typing import IO, Any

from cdi.hooks.entry import ENTRY_SCRIPT, HOOK_ENV
from cdi.hooks.rootfs import RootFS, RootFSError, read_only_message
from cdi.hooks.state import StateError, read_state

__all__ = ["add_commands", "build_parser", "main"]

_PROG = "nri-cdi hook"


def add_commands(subparsers: Any) -> None:
    """Add ``hook`` to the ``nri-cdi`` command."""
    parser = subparsers.add_parser(
        "hook", help="createContainer hooks run by the OCI runtime (create-symlinks, "
                     "update-ldcache, enable-cuda-compat, disable-device-node-modification)")
    _add_subcommands(parser)
    parser.set_defaults(func=_from_nri_cdi)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=_PROG, description="createContainer hooks")
    _add_subcommands(parser)
    return parser


def main(argv: Sequence[str] | None = None, *, stdin: IO[bytes] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return _run(args, stdin)


def _add_subcommands(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="hook", required=True, metavar="HOOK")
    links = sub.add_parser("create-symlinks", help="make LINK -> TARGET in the container")
    links.add_argument("--link", action="append", default=[], metavar="TARGET::LINK",
                       help="repeatable; LINK is an absolute container path")
    links.set_defaults(action=_create_symlinks)
    cache = sub.add_parser("update-ldcache",
                           help="make the libraries in DIR findable by SONAME")
    cache.add_argument("--folder", action="append", default=[], metavar="DIR",
                       help="repeatable; an absolute container path")
    cache.add_argument("--ldconfig-path", help="accepted for nvidia-cdi-hook compatibility "
                       "and ignored: no ldconfig is run, the cache is written directly")
    cache.set_defaults(action=_update_ldcache)
    _add_nvidia_parity(sub)
    launcher = sub.add_parser("install-launcher",
                              help="build the static hook launcher at PATH (needs gcc)")
    launcher.add_argument("path")
    launcher.add_argument("--python", help="interpreter to run (default: this one)")
    launcher.set_defaults(action=None)


def _from_nri_cdi(args: argparse.Namespace) -> int:
    """``nri-cdi hook``: re-execute as the isolated entry when started as a console script.

    The console script's interpreter ran without ``-I``; restarting with ``-I -S`` and
    :data:`HOOK_ENV` means at least the hook's own work runs in a clean interpreter.
    """
    if not sys.flags.isolated and sys.argv[1:2] == ["hook"] and os.path.isabs(sys.executable):
        env = dict(e.split("=", 1) for e in HOOK_ENV)
        os.execve(sys.executable, [sys.executable, "-I", "-S", ENTRY_SCRIPT, *sys.argv[2:]],
                  env)
    return _run(args, None)


def _run(args: argparse.Namespace, stdin: IO[bytes] | None) -> int:
    if args.action is None:
        return _install_launcher(args)
    action: Callable[[RootFS, argparse.Namespace], list[str]] = args.action
    try:
        container = read_state(stdin or sys.stdin.buffer)
        with RootFS(container.path) as root:
            for line in action(root, args):
                print(f"{_PROG} {args.hook}: {line}", file=sys.stderr)
    except (RootFSError, StateError) as exc:
        return _fail(args.hook, str(exc))
    except OSError as exc:
        if exc.errno == errno.EROFS:
            return _fail(args.hook, read_only_message(exc.filename or "container root"))
        return _fail(args.hook, f"{exc.filename or ''}: {exc.strerror}".lstrip(": "))
    return 0


def _fail(hook: str, message: str) -> int:
    print(f"{_PROG} {hook}: error: {message}", file=sys.stderr)
    return 1


def _create_symlinks(root: RootFS, args: argparse.Namespace) -> list[str]:
    from cdi.hooks.symlinks import create_symlinks, parse_link

    links = [parse_link(s) for s in args.link]
    results = create_symlinks(root, links)
    return [f"replaced {r.link.path} -> {r.link.target} (was {r.previous})"
            for r in results if r.action == "replaced"]


def _update_ldcache(root: RootFS, args: argparse.Namespace) -> list[str]:
    from cdi.hooks.ldconfig import update_ldcache

    result = update_ldcache(root, args.folder)
    return list(result.warnings)


def _add_nvidia_parity(sub: Any) -> None:
    """The two other hooks nvidia-ctk's specs run by default (same names and flags)."""
    compat = sub.add_parser("enable-cuda-compat", help="put the image's CUDA forward-"
                            "compatibility libraries first when newer than the host driver")
    compat.add_argument("--host-driver-version", default="")
    compat.add_argument("--host-cuda-version", default="")
    compat.add_argument("--cuda-compat-container-root", default="/usr/local/cuda/compat")
    compat.set_defaults(action=_enable_cuda_compat)
    params = sub.add_parser("disable-device-node-modification",
                            help="show the container ModifyDeviceFiles: 0")
    params.add_argument("--host-params", default="/proc/driver/nvidia/params",
                        help=argparse.SUPPRESS)  # tests: a node's copy of the host file
    params.set_defaults(action=_disable_device_node_modification)


def _enable_cuda_compat(root: RootFS, args: argparse.Namespace) -> list[str]:
    from cdi.hooks.cuda_compat import enable_cuda_compat

    enable_cuda_compat(root, host_driver=args.host_driver_version,
                       host_cuda=args.host_cuda_version,
                       compat_root=args.cuda_compat_container_root)
    return []  # silent either way, as the other hooks are when they succeed


def _disable_device_node_modification(root: RootFS, args: argparse.Namespace) -> list[str]:
    from cdi.hooks.device_params import disable_device_node_modification

    disable_device_node_modification(root, host_params=args.host_params)
    return []


def _install_launcher(args: argparse.Namespace) -> int:
    from cdi.hooks.launcher import LauncherError, build_launcher

    try:
        path = build_launcher(args.path, python=args.python)
    except LauncherError as exc:
        return _fail("install-launcher", str(exc))
    print(path)
    return 0
