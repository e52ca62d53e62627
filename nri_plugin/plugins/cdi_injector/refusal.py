"""The structured reason of a refused container (``Reason``, for logs and metrics), and the
words its user reads in the runtime's error (docs/developer/architecture.md, step 8).
"""

from __future__ import annotations

from typing import NamedTuple

from nri_plugin.nri.errors import NRIPluginError
from nri_plugin.nri.wire import Code

# Every message the runtime shows for us starts so: the user sees who refused.
USER_PREFIX = "nri-cdi: "
# The status a rule gets whatever the refusal's class: a device no spec names is not found.
_RULE_CODES = {"unresolvable": Code.NOT_FOUND}


class Reason(NamedTuple):
    """Why a container was refused; ``rule``: a short stable id for metrics."""

    rule: str
    device: str | None = None
    annotation: str | None = None


class Refusal(NRIPluginError):
    """A container refused on purpose; ``code`` is the status the runtime gets (its
    rule's, else its class's)."""

    default_rule = "refused"
    default_code = Code.FAILED_PRECONDITION

    def __init__(self, message: str, *, rule: str | None = None, device: str | None = None,
                 annotation: str | None = None, node_detail: str = "") -> None:
        super().__init__(message)
        self.reason = Reason(rule or self.default_rule, device, annotation)
        self.code = _RULE_CODES.get(self.reason.rule, self.default_code)
        # What only the node's operator needs (host paths): the log's, not the pod's user's.
        self.node_detail = node_detail

    def user_message(self) -> str:
        return USER_PREFIX + str(self)

    def log_message(self) -> str:
        return f"{self} ({self.node_detail})" if self.node_detail else str(self)
