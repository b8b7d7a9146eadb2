"""NRI events, subscription masks, and which events a plugin handles.

A plugin says what it handles by what it defines, as a Go plugin does by the
stub interfaces it implements (containerd/nri pkg/stub/stub.go setupHandlers):
a method per event whose reply carries something (`create_container`,
`update_container`, `stop_container`, `update_pod_sandbox`), and `pod_event` /
`container_event` for the events only taken note of, marked with `handles`
for the events they want. The subscription mask is derived from that, once;
there is no second list to keep in step.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import TypeVar


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


#: Events taken note of, delivered to a plugin's `pod_event`.
POD_EVENTS = frozenset(
    {
        Event.RUN_POD_SANDBOX,
        Event.STOP_POD_SANDBOX,
        Event.REMOVE_POD_SANDBOX,
        Event.POST_UPDATE_POD_SANDBOX,
    }
)
#: Events taken note of, delivered to a plugin's `container_event`.
CONTAINER_EVENTS = frozenset(
    {
        Event.POST_CREATE_CONTAINER,
        Event.START_CONTAINER,
        Event.POST_START_CONTAINER,
        Event.POST_UPDATE_CONTAINER,
        Event.REMOVE_CONTAINER,
    }
)
#: Events whose reply carries something: each has a plugin method of its own.
HANDLER_NAMES: dict[Event, str] = {
    Event.CREATE_CONTAINER: "create_container",
    Event.UPDATE_CONTAINER: "update_container",
    Event.STOP_CONTAINER: "stop_container",
    Event.UPDATE_POD_SANDBOX: "update_pod_sandbox",
}

F = TypeVar("F", bound=Callable[..., object])

_DECLARED = "nri_events"


def handles(*events: Event) -> Callable[[F], F]:
    """Mark a plugin's `pod_event` or `container_event` with the events it wants."""

    def declare(handler: F) -> F:
        setattr(handler, _DECLARED, frozenset(events))
        return handler

    return declare


def declared(handler: object) -> frozenset[Event]:
    """The events `handler` was marked with (none if it was not, or is missing)."""
    events: frozenset[Event] = getattr(handler, _DECLARED, frozenset())
    return events


def handled_events(plugin: object) -> frozenset[Event]:
    """The events `plugin` handles; TypeError if none, or if a mark names the wrong kind.

    As NRI's Go stub refuses a plugin with no handler: a mask of 0 would mean
    "everything" to the runtime.
    """
    events = {e for e, name in HANDLER_NAMES.items() if callable(getattr(plugin, name, None))}
    for method, allowed in (("pod_event", POD_EVENTS), ("container_event", CONTAINER_EVENTS)):
        wanted = declared(getattr(plugin, method, None))
        if not wanted <= allowed:
            names = ", ".join(sorted(e.name for e in wanted - allowed))
            raise TypeError(f"{type(plugin).__name__}.{method} cannot handle {names}")
        events |= wanted
    if not events:
        raise TypeError(f"{type(plugin).__name__} handles no NRI event")
    return frozenset(events)


def mask(events: frozenset[Event]) -> int:
    result = 0
    for event in events:
        result |= event.bit
    return result
