"""NRI lifecycle events and the subscription mask (docs/developer/nri-protocol.md §3.4)."""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Event(enum.IntEnum):
    """Event numbers as in the ``Event`` enum of the NRI API."""

    RUN_POD_SANDBOX = 1
    STOP_POD_SANDBOX = 2
    REMOVE_POD_SANDBOX = 3
    CREATE_CONTAINER = 4
    POST_CREATE_CONTAINER = 5
    START_CONTAINER = 6
    POST_START_CONTAINER = 7
    UPDATE_CONTAINER = 8
    POST_UPDATE_CONTAINER = 9
    STOP_CONTAINER = 10
    REMOVE_CONTAINER = 11
    UPDATE_POD_SANDBOX = 12  # NRI v0.10.0+
    POST_UPDATE_POD_SANDBOX = 13  # NRI v0.10.0+
    VALIDATE_CONTAINER_ADJUSTMENT = 14  # NRI v0.10.0+


class EventMask(enum.IntFlag):
    """Subscription bits: event E is bit ``1 << (E - 1)``, named as the event."""

    RUN_POD_SANDBOX = 1 << 0
    STOP_POD_SANDBOX = 1 << 1
    REMOVE_POD_SANDBOX = 1 << 2
    CREATE_CONTAINER = 1 << 3
    POST_CREATE_CONTAINER = 1 << 4
    START_CONTAINER = 1 << 5
    POST_START_CONTAINER = 1 << 6
    UPDATE_CONTAINER = 1 << 7
    POST_UPDATE_CONTAINER = 1 << 8
    STOP_CONTAINER = 1 << 9
    REMOVE_CONTAINER = 1 << 10
    UPDATE_POD_SANDBOX = 1 << 11
    POST_UPDATE_POD_SANDBOX = 1 << 12
    VALIDATE_CONTAINER_ADJUSTMENT = 1 << 13

    @classmethod
    def of(cls, events: Iterable[Event]) -> EventMask:
        mask = cls(0)
        for event in events:
            mask |= cls[event.name]
        return mask


# Runtimes reject a Configure reply with any bit outside their ValidEvents
# (docs/developer/nri-protocol.md §3.4, §5.3). Up to NRI v0.9 (containerd 1.7.x, 2.0, 2.1) LAST was
# 12, so only bits up to 0x400 are safe; v0.10.0+ accept up to 0x2000.
LEGACY_VALID_EVENTS = EventMask((1 << 11) - 1)  # 0x7FF
VALID_EVENTS = EventMask((1 << 14) - 1)  # 0x3FFF
