"""What a runtime's NRI derives from an adjustment by itself, NRI version by version. Pure;
knows nothing of CDI. Every device node added gets an allow rule of NRI's own (``rw``,
plus ``m`` for a block device), and explicit device rules are relayed only from NRI
v0.10.0 on (docs/reference/runtime-cdi.md, "What each NRI version does"). So a rule equal
to the derived one is never sent, and one asking for more takes effect only from 0.10.
"""

from __future__ import annotations

from nri_plugin.nri.versions import Version

DEVICE_RULES_FROM: Version = (0, 10, 0)


def derived_access(device_type: str) -> str:
    """The access of the allow rule NRI adds for a device node it creates."""
    return "rwm" if device_type == "b" else "rw"


def beyond_derived(device_type: str, access: str) -> str:
    """The letters of ``access`` that NRI's derived rule does not grant ("" if none)."""
    return "".join(c for c in access if c not in derived_access(device_type))


def explicit_rule_needed(device_type: str, access: str, nri_version: Version | None) -> bool:
    """Whether a plugin adding this node must send its own rule for it: only where the
    wanted access grants more than NRI derives and this NRI version applies such rules."""
    return (bool(beyond_derived(device_type, access)) and nri_version is not None
            and nri_version >= DEVICE_RULES_FROM)
