"""A ttrpc service as a table: method name -> request type and handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import Message


@dataclass(frozen=True, slots=True)
class CallContext:
    """What a handler may want to know about the call besides its request."""

    service: str
    method: str
    stream_id: int
    #: Seconds the caller gives us (from `timeout_nano`), or None for no deadline.
    timeout: float | None
    #: The request's size as it came, in bytes.
    request_bytes: int
    metadata: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


Handler = Callable[[Any, CallContext], Awaitable[Message]]
#: Runs a handler for every method of a service: what all its calls share
#: (checks, recording) in one named frame, not a wrapper closure per method.
Around = Callable[[Handler, Any, CallContext], Awaitable[Message]]


@dataclass(frozen=True, slots=True)
class Method:
    request_type: type[Message]
    handler: Handler


@dataclass(frozen=True, slots=True)
class Service:
    name: str
    methods: Mapping[str, Method]
    around: Around | None = None

    def call(self, request: Any, context: CallContext) -> Awaitable[Message]:
        """Serve `request` to `context.method`'s handler (through `around`, if any)."""
        handler = self.methods[context.method].handler
        if self.around is None:
            return handler(request, context)
        return self.around(handler, request, context)
