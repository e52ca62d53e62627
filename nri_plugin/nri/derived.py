"""What a runtime's NRI derives from an adjustment by itself, NRI version by version.

Pure; knows nothing of CDI. containerd (``pkg/cri/nri``, ``internal/cri/nri``) and CRI-O
(``server/nri-api.go``) both apply a plugin's adjustment with the generator of the NRI
version they vendor (``pkg/runtime-tools/generate``), so what they derive depends on that
version only (facts read from containerd/nri tags v0.2.0-v0.6.1, v0.8.0, v0.9.0, v0.10.0, v0.11.0,
v0.12.0; docs/reference/runtime-cdi.md, "What each NRI version does"):

* every device node added through ``linux.devices`` gets an allow rule of its own in
  ``linux.resources.devices``, with the access NRI's ``LinuxDevice.AccessString`` gives:
  ``rw``, plus ``m`` for a block device; the node's fileMode is not consulted (every
  version, for every node type);
* explicit ``linux.resources.devices`` rules of an adjustment are relayed and applied from
  NRI v0.10.0 on (containerd/nri commit cbc87ec); older versions drop them silently.

So a rule equal to the derived one must never be sent (from 0.10 it would be there twice),
and a rule that asks for more than the derived one (``m`` on a char device) takes effect
only from 0.10, and then as a second rule after NRI's own.
"""

from __future__ import annotations

Version = tuple[int, int, int]

DEVICE_RULES_FROM: Version = (0, 10, 0)


def derived_access(device_type: str) -> str:
    """The access of the allow rule NRI adds for a device node it creates."""
    return "rwm" if device_type == "b" else "rw"


def applies_device_rules(nri_version: Version | None) -> bool:
    """Whether explicit device-cgroup rules of an adjustment reach the container (unknown
    version: assumed not, so nothing is ever doubled)."""
    return nri_version is not None and nri_version >= DEVICE_RULES_FROM


def beyond_derived(device_type: str, access: str) -> str:
    """The letters of ``access`` that NRI's derived rule does not grant ("" if none)."""
    granted = derived_access(device_type)
    return "".join(c for c in access if c not in granted)


def explicit_rule_needed(device_type: str, access: str, nri_version: Version | None) -> bool:
    """Whether a plugin adding this node must send its own rule for it: only where the
    wanted access grants more than NRI derives and this NRI version applies such rules."""
    return bool(beyond_derived(device_type, access)) and applies_device_rules(nri_version)
