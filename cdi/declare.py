"""Options declared once: each a field of a frozen dataclass whose metadata holds a
:class:`Declared` (a subclass adds what its reader needs), from which the flags, their
help and the reference pages are derived.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

DECLARED = "cdi_declared"  # the field metadata entry holding the declaration


@dataclass(frozen=True, slots=True, kw_only=True)
class Declared:
    """An option's default, what it means, and its flags (the first is the one other
    commands pass; none: not on the command line). ``choices``: the values it takes, checked
    by the parser unless not ``checked`` (where the reader checks them itself);
    ``default_text`` says what the default means where its value does not."""

    default: Any
    help: str
    flags: tuple[str, ...] = ()
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    checked: bool = True
    default_text: str | None = None

    @property
    def repeatable(self) -> bool:
        """A list (its default a tuple), given one element per flag."""
        return isinstance(self.default, tuple)

    def shown_default(self) -> str:
        if self.default_text is not None:
            return self.default_text
        if isinstance(self.default, tuple):
            return ", ".join(self.default) if self.default else "none"
        if isinstance(self.default, float) and self.default.is_integer():
            return str(int(self.default))
        return str(self.default)

    def argument(self, again: str, prefix: str = "") -> dict[str, Any]:
        """``add_argument``'s keywords but ``dest``: None when not given (a flag wins only
        when given); the help ends in ``again`` if repeatable, then the default after
        ``prefix``."""
        options: dict[str, Any] = {
            "default": None, "metavar": self.metavar,
            "help": f"{self.help}{again if self.repeatable else ''} "
                    f"({prefix}default: {self.shown_default()})"}
        if self.repeatable:
            options["action"] = "append"
        if self.choices and self.checked:
            options["choices"] = self.choices
        return options


def declarations(cls: type) -> dict[str, Any]:
    """The declaration of each field of the dataclass ``cls``, in declaration order."""
    return {f.name: f.metadata[DECLARED] for f in fields(cls)}
