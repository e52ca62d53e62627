"""The error root of ``nri_plugin`` and the structured reason of a refused container.

Every error the plugin runtime, the shipped injector, the vendor rules and the operations
raise on purpose derives from ``NRIPluginError``. The sans-IO core keeps its own root
(``nri_plugin.wire.ProtocolError``): it imports nothing of ours, so that it stays usable on
its own; a transport failure is a different kind of thing from a refused container anyway.

A ``Refusal`` is the answer "this container must not be created": it carries a one-line
message for the user and a ``Reason`` for logs and metrics (which rule refused it, which
device, which annotation), so nobody has to recover them from the message text.
"""

from __future__ import annotations

from typing import NamedTuple


class NRIPluginError(Exception):
    """Root of every error ``nri_plugin`` raises on purpose."""


class Reason(NamedTuple):
    """Why a container was refused. ``rule`` is a short stable id for metrics
    (``policy.devices[1]``, ``request.annotation``, a vendor's own rules, ...)."""

    rule: str
    device: str | None = None
    annotation: str | None = None


class Refusal(NRIPluginError):
    """A container refused on purpose; ``reason`` says by what (no parsing of messages)."""

    default_rule = "refused"

    def __init__(self, message: str, *, rule: str | None = None, device: str | None = None,
                 annotation: str | None = None) -> None:
        super().__init__(message)
        self.reason = Reason(rule or self.default_rule, device, annotation)

    @property
    def rule(self) -> str:
        return self.reason.rule
