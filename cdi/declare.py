"""Options declared once: each a field of a frozen dataclass, with its default, and in its
metadata a :class:`Declared` (what it means, its flags), which a subclass extends with
what its reader needs. A command's flags and their help, and the reference pages, are
derived from these declarations.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

DECLARED = "cdi_declared"  # the field metadata entry holding the declaration
T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Declared:
    """What an option means (``help``), and its flags (the first is the one other commands
    pass; none: not on the command line). ``repeatable``: a list, one element per flag;
    ``choices``: the values it takes, checked by the parser unless not ``checked`` (where
    the reader checks them itself); ``default_text`` says what the default means where its
    value does not."""

    help: str
    flags: tuple[str, ...] = ()
    metavar: str | None = None
    repeatable: bool = False
    choices: tuple[str, ...] = ()
    checked: bool = True
    default_text: str | None = None

    def shown_default(self, value: Any) -> str:
        """The default ``value`` as help and reference pages show it."""
        if self.default_text is not None:
            return self.default_text
        if isinstance(value, tuple):
            return ", ".join(value) if value else "none"
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value)

    def argument(self, default: Any, again: str, prefix: str = "") -> dict[str, Any]:
        """``add_argument``'s keywords for the flags, but ``dest``: None when not given (a
        flag wins only when given); the help ends in ``again`` for a repeatable option, and
        in the ``default`` after ``prefix``."""
        shown = self.shown_default(default)
        options: dict[str, Any] = {
            "default": None, "metavar": self.metavar,
            "help": f"{self.help}{again if self.repeatable else ''} ({prefix}default: {shown})"}
        if self.repeatable:
            options["action"] = "append"
        if self.choices and self.checked:
            options["choices"] = self.choices
        return options


def declare(default: T, declaration: Declared) -> T:
    """A dataclass field: its default, and ``declaration`` in its metadata."""
    return field(default=default, metadata={DECLARED: declaration})


def declarations(cls: type) -> dict[str, Any]:
    """The declaration of each field of the dataclass ``cls``, in declaration order."""
    return {f.name: f.metadata[DECLARED] for f in fields(cls)}
