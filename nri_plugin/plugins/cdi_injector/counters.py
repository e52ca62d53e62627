"""The plugin's counters, for its log and metrics: one object, made by the injector and
shared with the fail-closed guard; the metrics export every field."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Counters:
    """Plain ints, bumped on the event loop and read without locking."""

    injected: int = 0  # CreateContainer answered with devices
    refused: int = 0  # CreateContainer refused (policy, requirements, bad request)
    delegation_failed: int = 0  # handed to the runtime's own CDI, which failed them
    unserved_found: int = 0  # found by Synchronize without their devices
    unserved_reported: int = 0  # fail-closed action "report"
    unserved_evicted: int = 0  # fail-closed action "evict": stopped, or its start refused
    gids_dropped: int = 0  # containers given their devices without the spec's additionalGids
