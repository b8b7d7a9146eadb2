"""NRI events and subscription masks."""

from __future__ import annotations

from enum import IntEnum


class Event(IntEnum):
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
    UPDATE_POD_SANDBOX = 12
    POST_UPDATE_POD_SANDBOX = 13
    VALIDATE_CONTAINER_ADJUSTMENT = 14

    @property
    def bit(self) -> int:
        return 1 << (self.value - 1)


POD_EVENTS = frozenset(
    {
        Event.RUN_POD_SANDBOX,
        Event.STOP_POD_SANDBOX,
        Event.REMOVE_POD_SANDBOX,
        Event.POST_UPDATE_POD_SANDBOX,
    }
)


def mask(events: frozenset[Event]) -> int:
    result = 0
    for event in events:
        result |= event.bit
    return result
