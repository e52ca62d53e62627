"""What a hook operation is: its name, options and function; the entries of
:data:`cdi.hooks.cli.OPERATIONS` and of each vendor's ``cdi/<vendor>/hooks/operations.py``.
On every hook's start-up path: it imports nothing heavy (tests/hooks/test_one_process.py).
"""

from __future__ import annotations

from types import SimpleNamespace  # imported on the hook's start-up path anyway, by ctypes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from cdi.hooks.rootfs import RootFS


# One operation's option values, an attribute per option (``--device-link`` ->
# ``device_link``), and ``container``, the :class:`cdi.hooks.state.ContainerRoot`.
Args = SimpleNamespace


class UsageError(Exception):
    """The command line names no operation, or an unknown one or option; says which."""


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


