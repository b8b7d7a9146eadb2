"""The ttrpc connection over NRI's mux, sans-IO: every protocol rule, no sockets.

One `Connection` is one socket's worth of protocol: it serves requests on one
mux connection and calls the peer on the other. Bytes go in through
`receive_data`, come out as events from `next_event`, one message at a time;
whatever we send is returned as bytes for the caller to write. It owns:

- stream ids: ours (odd, increasing) and the Go server's rules for the peer's;
- which requests it may pass on: bad ones (undecodable, unknown service or
  method, Data on a unary stream, oversized, too many in flight) are answered
  here, with Go's status and text, and surface as `Refused`;
- the pending-call table and what a reply must look like: a call ends as
  `CallSucceeded` (a decoded reply) or `CallFailed` (a status), whatever the
  peer sends on its stream. Nothing the peer sends raises, except framing
  garbage after which the stream is lost, and a flood of messages it has to
  refuse or ignore (`RemoteProtocolError` both).

The asyncio layer (`nri_midbatch.rpc.connection`) moves bytes and runs handlers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from google.protobuf.message import DecodeError, Message

from nri_midbatch.api import rpc_status_pb2, ttrpc_pb2
from nri_midbatch.wire.errors import LocalProtocolError, RemoteProtocolError
from nri_midbatch.wire.mux import MuxDecoder, frame_ttrpc
from nri_midbatch.wire.ratelimit import RateLimit
from nri_midbatch.wire.status import Code
from nri_midbatch.wire.ttrpc import (
    Message as TtrpcMessage,
)
from nri_midbatch.wire.ttrpc import (
    MessageDecoder,
    MessageType,
    OversizedMessage,
    StreamCheck,
    StreamIds,
)

T = TypeVar("T")

#: Requests passed on and not yet answered. A runtime calls its plugins one at a
#: time under a global lock (containerd/nri pkg/adaptation/adaptation.go), so a
#: handful is already a lot; beyond this the peer gets RESOURCE_EXHAUSTED, not a
#: task each.
MAX_REQUESTS_IN_FLIGHT = 256
#: Our own calls awaiting a reply. Each has a deadline; this caps what a peer
#: that never answers can make us hold even so.
MAX_PENDING_CALLS = 64
#: Messages refused or ignored per second before the connection is dropped. A
#: runtime breaks no rule in normal work (an unknown method is refused once,
#: then it falls back to StateChange), while one 16 MiB frame of empty messages
#: holds 1.6 million of them, several seconds of work that would hold up the
#: next real request past its deadline. Past this the peer is treated as
#: broken, as HTTP/2 servers treat an empty-frame flood; the plugin registers
#: again on a new connection.
MAX_VIOLATIONS_PER_SECOND = 100


@dataclass(frozen=True, slots=True)
class Request:
    """A well-formed request for a method we serve; answer it with `reply`/`reply_status`."""

    stream_id: int
    envelope: ttrpc_pb2.Request
    message: Message  # the envelope's payload, decoded as the method's request type
    #: The payload's length: the message's size, without walking it (ByteSize()
    #: of a 4 MiB Synchronize chunk costs as much as decoding it).
    payload_size: int


@dataclass(frozen=True, slots=True)
class Refused:
    """A request the connection answered itself; `data` is that answer, to be written."""

    stream_id: int
    code: Code
    message: str
    data: bytes


@dataclass(frozen=True, slots=True)
class CallSucceeded(Generic[T]):
    token: T
    reply: Message


@dataclass(frozen=True, slots=True)
class CallFailed(Generic[T]):
    token: T
    code: Code
    message: str


@dataclass(frozen=True, slots=True)
class Dropped:
    """A message with no effect: an unknown type, or a reply for no pending call."""

    stream_id: int
    reason: str


Event = Request | Refused | CallSucceeded[T] | CallFailed[T] | Dropped
#: The events a flood is made of; a tuple built once, where `Refused | Dropped` in the
#: check would build a union object for every message.
_VIOLATIONS = (Refused, Dropped)


@dataclass(slots=True)
class _Call(Generic[T]):
    token: T
    method: str
    response_type: type[Message]


class Connection(Generic[T]):
    """Protocol state of one socket; `T` is what the caller ties to each of its calls."""

    def __init__(
        self,
        methods: Mapping[str, Mapping[str, type[Message]]],
        *,
        server_conn: int,
        client_conn: int,
        max_requests_in_flight: int = MAX_REQUESTS_IN_FLIGHT,
        max_pending_calls: int = MAX_PENDING_CALLS,
        max_violations_per_second: int = MAX_VIOLATIONS_PER_SECOND,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: service -> method -> request type: what we serve.
        self._methods = methods
        self._server_conn = server_conn
        self._client_conn = client_conn
        self._max_in_flight = max_requests_in_flight
        self._max_pending = max_pending_calls
        self._mux = MuxDecoder(frozenset((server_conn, client_conn)))
        self._frames: deque[tuple[int, bytes]] = deque()
        self._decoders = {server_conn: MessageDecoder(), client_conn: MessageDecoder()}
        self._draining: int | None = None  # the conn whose decoder may hold messages
        self._stream_check = StreamCheck()
        self._stream_ids = StreamIds()
        self._in_flight: set[int] = set()
        self._pending: dict[int, _Call[T]] = {}
        self._max_violations = max_violations_per_second
        self._violations: RateLimit[None] = RateLimit(
            max_violations_per_second, 1.0, clock=clock, max_keys=1
        )

    # -- receiving -----------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Take bytes from the socket; raises RemoteProtocolError on framing garbage."""
        self._frames.extend(self._mux.feed(data))

    def next_event(self) -> Event[T] | None:
        """The effect of the next received message, or None until more bytes arrive.

        Raises RemoteProtocolError once the peer has sent more than
        `max_violations_per_second` messages in a second that were refused or ignored.
        """
        while True:
            if self._draining is not None:
                message = self._decoders[self._draining].next_event()
                if message is not None:
                    if self._draining == self._server_conn:
                        event = self._on_request(message)
                    else:
                        event = self._on_reply(message)
                    if isinstance(event, _VIOLATIONS) and self._violations.admit(None) is None:
                        raise RemoteProtocolError(
                            f"more than {self._max_violations} messages refused or ignored "
                            "in one second: a flood",
                            status_hint=Code.RESOURCE_EXHAUSTED,
                        )
                    return event
                self._draining = None
            if not self._frames:
                return None
            conn_id, payload = self._frames.popleft()
            self._decoders[conn_id].receive(payload)
            self._draining = conn_id

    @property
    def holds_input(self) -> bool:
        """Bytes have been received that `next_event` has not yet turned into events.

        A message under way (not all of it here yet) counts: a request is arriving.
        """
        return bool(
            self._frames
            or self._mux.buffered
            or any(decoder.buffered for decoder in self._decoders.values())
        )

    def _on_request(self, message: TtrpcMessage | OversizedMessage) -> Event[T]:
        stream_id = message.stream_id
        if isinstance(message, OversizedMessage):
            return self._refuse(stream_id, Code.RESOURCE_EXHAUSTED, message.error_text)
        if message.type == MessageType.DATA:
            # Every NRI call is unary: no stream is ever open for data.
            return self._refuse(stream_id, Code.INVALID_ARGUMENT, "StreamID is no longer active")
        if message.type != MessageType.REQUEST:
            return Dropped(stream_id, f"message type {message.type}")  # Go ignores these
        violation = self._stream_check.check(stream_id)
        if violation is not None:
            return self._refuse(stream_id, Code.INVALID_ARGUMENT, violation)
        try:
            envelope = ttrpc_pb2.Request.FromString(message.data)
        except DecodeError as exc:
            return self._refuse(stream_id, Code.INVALID_ARGUMENT, f"unmarshal request error: {exc}")
        methods = self._methods.get(envelope.service)
        if methods is None:
            return self._refuse(stream_id, Code.UNIMPLEMENTED, f"service {envelope.service}")
        request_type = methods.get(envelope.method)
        if request_type is None:
            return self._refuse(stream_id, Code.UNIMPLEMENTED, f"method {envelope.method}")
        payload = envelope.payload
        try:
            request = request_type.FromString(payload)
        except DecodeError as exc:
            return self._refuse(
                stream_id, Code.INVALID_ARGUMENT, f"unmarshal {envelope.method} payload: {exc}"
            )
        if len(self._in_flight) >= self._max_in_flight:
            return self._refuse(
                stream_id,
                Code.RESOURCE_EXHAUSTED,
                f"more than {self._max_in_flight} requests in flight",
            )
        self._in_flight.add(stream_id)
        return Request(stream_id, envelope, request, len(payload))

    def _refuse(self, stream_id: int, code: Code, message: str) -> Refused:
        return Refused(stream_id, code, message, self._status_bytes(stream_id, code, message))

    def _on_reply(self, message: TtrpcMessage | OversizedMessage) -> Event[T]:
        call = self._pending.pop(message.stream_id, None)
        if call is None:
            return Dropped(message.stream_id, "reply for no pending call")
        if isinstance(message, OversizedMessage):
            return CallFailed(call.token, Code.RESOURCE_EXHAUSTED, message.error_text)
        if message.type != MessageType.RESPONSE:
            return CallFailed(
                call.token,
                Code.INTERNAL,
                f"{call.method}: message type {message.type} where a response was expected",
            )
        try:
            response = ttrpc_pb2.Response.FromString(message.data)
        except DecodeError as exc:
            return CallFailed(call.token, Code.INTERNAL, f"{call.method}: undecodable reply: {exc}")
        if response.HasField("status") and response.status.code != Code.OK:
            return CallFailed(call.token, _code(response.status.code), response.status.message)
        try:
            reply = call.response_type.FromString(response.payload)
        except DecodeError as exc:
            return CallFailed(
                call.token, Code.INTERNAL, f"{call.method}: undecodable reply payload: {exc}"
            )
        return CallSucceeded(call.token, reply)

    # -- serving -------------------------------------------------------------

    def reply(self, stream_id: int, reply: Message) -> bytes:
        """The bytes of a success reply to request `stream_id`.

        A reply larger than the peer takes becomes a RESOURCE_EXHAUSTED status
        (LocalProtocolError is not raised: the request is answered either way).
        """
        self._in_flight.discard(stream_id)
        payload = reply.SerializeToString()
        # Success replies carry no status, as the Go server's do; an empty reply
        # message makes the whole Response zero bytes.
        data = _response_with_payload(payload) if payload else b""
        try:
            return frame_ttrpc(self._server_conn, stream_id, MessageType.RESPONSE, data)
        except LocalProtocolError as exc:
            return self._status_bytes(stream_id, exc.status_hint, str(exc))

    def reply_status(self, stream_id: int, code: Code, message: str) -> bytes:
        """The bytes of an error reply to request `stream_id`."""
        self._in_flight.discard(stream_id)
        return self._status_bytes(stream_id, code, message)

    def _status_bytes(self, stream_id: int, code: Code, message: str) -> bytes:
        # Errors carry an empty payload: the Go client decodes the payload
        # before it looks at the status.
        response = ttrpc_pb2.Response(status=rpc_status_pb2.Status(code=code, message=message))
        return frame_ttrpc(
            self._server_conn, stream_id, MessageType.RESPONSE, response.SerializeToString()
        )

    @property
    def requests_in_flight(self) -> int:
        return len(self._in_flight)

    # -- calling -------------------------------------------------------------

    def call(
        self,
        service: str,
        method: str,
        request: Message,
        response_type: type[Message],
        token: T,
        *,
        timeout_nano: int = 0,
    ) -> tuple[int, bytes]:
        """Start a call: its stream id and the bytes to write.

        Raises LocalProtocolError (with its status hint) for a request too large
        to send or one call too many pending.
        """
        if len(self._pending) >= self._max_pending:
            raise LocalProtocolError(
                f"{method}: more than {self._max_pending} calls awaiting a reply",
                status_hint=Code.RESOURCE_EXHAUSTED,
            )
        envelope = ttrpc_pb2.Request(
            service=service,
            method=method,
            payload=request.SerializeToString(),
            timeout_nano=timeout_nano,
        )
        stream_id = self._stream_ids.allocate()
        data = frame_ttrpc(
            self._client_conn, stream_id, MessageType.REQUEST, envelope.SerializeToString()
        )
        self._pending[stream_id] = _Call(token, method, response_type)
        return stream_id, data

    def forget_call(self, stream_id: int) -> None:
        """Give up on a call (its deadline passed); a late reply is then Dropped."""
        self._pending.pop(stream_id, None)

    def close(self) -> list[T]:
        """End the connection; returns the tokens of the calls that get no reply."""
        tokens = [call.token for call in self._pending.values()]
        self._pending.clear()
        self._in_flight.clear()
        return tokens

    @property
    def pending_calls(self) -> int:
        return len(self._pending)


# Field 2 (payload), wire type 2 (length-delimited): the tag of Response.payload.
_PAYLOAD_TAG = b"\x12"


def _response_with_payload(payload: bytes) -> bytes:
    """ttrpc_pb2.Response(payload=payload).SerializeToString(), without copying into a message."""
    size = len(payload)
    if size < 0x80:
        return _PAYLOAD_TAG + bytes((size,)) + payload
    length = bytearray()
    while size >= 0x80:
        length.append((size & 0x7F) | 0x80)
        size >>= 7
    length.append(size)
    return b"".join((_PAYLOAD_TAG, length, payload))


def _code(value: int) -> Code:
    try:
        return Code(value)
    except ValueError:
        return Code.UNKNOWN
