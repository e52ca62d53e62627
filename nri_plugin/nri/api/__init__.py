"""NRI and ttrpc protobuf messages (generated, see ``generate.py``) and event masks."""

from __future__ import annotations

from nri_plugin.nri.api import nri_pb2, ttrpc_pb2
from nri_plugin.nri.api.events import LEGACY_VALID_EVENTS, VALID_EVENTS, Event, EventMask

# Service names are part of the wire format (docs/developer/nri-protocol.md §1.5): take them from
# our descriptor.
PLUGIN_SERVICE: str = nri_pb2.DESCRIPTOR.services_by_name["Plugin"].full_name
RUNTIME_SERVICE: str = nri_pb2.DESCRIPTOR.services_by_name["Runtime"].full_name

__all__ = [
    "LEGACY_VALID_EVENTS",
    "PLUGIN_SERVICE",
    "RUNTIME_SERVICE",
    "VALID_EVENTS",
    "Event",
    "EventMask",
    "nri_pb2",
    "ttrpc_pb2",
]
