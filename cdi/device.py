"""A device as the registry knows it: its qualified name, its spec and its edits."""

from __future__ import annotations

from dataclasses import dataclass

from cdi.model import ContainerEdits, DeviceData
from cdi.spec import Spec


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    qualified_name: str
    spec: Spec
    data: DeviceData
    # The device's own edits with device nodes filled in from the host at load time.
    edits: ContainerEdits
    # Why the device cannot be used (e.g. its host device node is missing); raised when
    # the device is requested, so that one broken node does not hide its neighbours.
    error: str | None = None
