"""What a hook operation is: its name, options and function (the table's entries).

The neutral operations (:data:`cdi.hooks.cli.OPERATIONS`) and each vendor's
(``cdi/<vendor>/hooks/operations.py``, found by :func:`cdi.hooks.cli.operations`) are
:class:`Operation` values.  This module is on every hook's start-up path: it imports nothing
(no ``typing``, ``dataclasses``: see tests/hooks/test_one_process.py).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from cdi.hooks.rootfs import RootFS
    from cdi.hooks.state import ContainerRoot


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


