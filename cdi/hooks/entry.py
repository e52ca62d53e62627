"""How a CDI spec must start a hook so that nothing from the container can get into it: an
explicit, fixed ``env`` (:data:`HOOK_ENV`), Python isolated (``-I -S``), optionally the
static launcher (:mod:`cdi.hooks.launcher`); why: docs/developer/hook-safety.md §1. One
entry runs every operation a container needs (:mod:`cdi.hooks.cli`).
"""

import os
import sys
from collections.abc import Iterable

HOOK_ENV: tuple[str, ...] = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin",)
ENTRY_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")


class HookCommand:
    """The ``path``, ``args`` and ``env`` of one CDI hook entry (``hookName: createContainer``)."""

    __slots__ = ("args", "env", "path")

    def __init__(self, path: str, args: tuple[str, ...], env: tuple[str, ...] = HOOK_ENV) -> None:
        if not os.path.isabs(path):
            raise ValueError(f"hook path {path!r} must be absolute")
        if not env:
            raise ValueError("a hook needs an explicit env, or it inherits the container's")
        self.path, self.args, self.env = path, args, env


def isolated_python(subcommand: str, args: Iterable[str]) -> HookCommand:
    """The recommended entry: ``PYTHON -I -S .../cdi/hooks/__main__.py SUBCOMMAND ARGS``.
    ``args[0]`` is the interpreter's absolute path: CPython finds its standard library from
    ``argv[0]``, and a bare name would be searched on ``PATH``."""
    exe = interpreter()
    return HookCommand(path=exe, args=(exe, "-I", "-S", ENTRY_SCRIPT, subcommand, *args))


def launcher(path: str, subcommand: str, args: Iterable[str]) -> HookCommand:
    """The static launcher made by ``nri-cdi hook build-static-launcher PATH``."""
    return HookCommand(path=path, args=(path, subcommand, *args))


def nri_cdi(executable: str, subcommand: str, args: Iterable[str]) -> HookCommand:
    """``nri-cdi hook SUBCOMMAND``: accepted, and it re-executes itself as
    :func:`isolated_python` before doing anything, but its console script's interpreter has
    already started without ``-I``; safe only because of the explicit ``env``."""
    return HookCommand(path=executable, args=("nri-cdi", "hook", subcommand, *args))


def interpreter() -> str:
    exe = sys.executable
    if not exe or not os.path.isabs(exe):
        raise ValueError("cannot tell this interpreter's absolute path (sys.executable)")
    return exe
