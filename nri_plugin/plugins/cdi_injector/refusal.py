"""The structured reason of a refused container.

A ``Refusal`` is the answer "this container must not be created": it carries a one-line
message for the user and a ``Reason`` for logs and metrics (which rule refused it, which
device, which annotation), so nobody has to recover them from the message text. The
injector raises it, and so do the vendor rules it asks (``vendor.py``).
"""

from __future__ import annotations

from typing import NamedTuple

from nri_plugin.nri.errors import NRIPluginError


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
