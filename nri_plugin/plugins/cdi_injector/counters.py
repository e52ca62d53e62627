"""The plugin's counters, for its log and metrics: one object, shared by the injector and
the fail-closed guard (``ops.daemon`` hands the same one to both)."""

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
    unserved_evicted: int = 0  # fail-closed action "evict": stopped
