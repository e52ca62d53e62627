"""Error types of the CDI library: one root, messages that say what and where."""

from collections.abc import Iterable, Mapping
from typing import NamedTuple


def printable(text: str) -> str:
    """``text`` with every character that is not printable (newlines, escape sequences,
    lone surrogates, NUL) written as a Python escape, so that a message stays on one line
    and cannot drive a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class CDIError(Exception):
    """Root of every error this package raises on purpose."""


class FieldError(NamedTuple):
    """One problem in a spec, located by a field path such as
    ``devices[2].containerEdits.deviceNodes[0].type``."""

    path: str
    message: str

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        return printable(text)


class SpecError(CDIError):
    """A spec document that cannot be used: bad syntax, bad structure or a broken rule.

    Carries every problem found (not only the first), each with its field path, and the
    file it came from when there is one.
    """

    def __init__(self, errors: Iterable[FieldError], *, file: str | None = None) -> None:
        self.errors: tuple[FieldError, ...] = tuple(errors)
        self.file = file
        super().__init__("\n".join(self.lines()))

    def lines(self) -> list[str]:
        prefix = f"{printable(self.file)}: " if self.file else ""
        return [f"{prefix}{err}" for err in self.errors]


class AnnotationError(CDIError, ValueError):
    """A ``cdi.k8s.io/`` annotation key or value that breaks the convention."""


class DeviceNodeError(CDIError):
    """A device node whose host side cannot be used (missing, wrong type)."""


class UnresolvedDevicesError(CDIError):
    """Some requested devices cannot be resolved; names every one of them."""

    def __init__(self, reasons: Mapping[str, str]) -> None:
        self.reasons = dict(reasons)
        detail = "; ".join(f"{name}: {why}" for name, why in self.reasons.items())
        super().__init__(f"unresolvable CDI devices {', '.join(self.reasons)} ({detail})")
