"""ttrpc message framing, as a sans-IO codec.

A message is a 10-byte big-endian header (data length, stream id, type,
flags) followed by the data. This module knows nothing of protobuf: the data
of a Request or Response is an envelope that `nri_midbatch.rpc` decodes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from nri_midbatch.wire.errors import OversizedMessageError

HEADER = struct.Struct(">IIBB")

#: ttrpc's `messageLengthMax`: the largest data either side will take.
MESSAGE_LENGTH_MAX = 4 << 20


class MessageType(IntEnum):
    REQUEST = 1
    RESPONSE = 2
    DATA = 3


@dataclass(frozen=True, slots=True)
class Message:
    stream_id: int
    type: int  # a MessageType value, or an unknown type the receiver ignores
    flags: int
    data: bytes


@dataclass(frozen=True, slots=True)
class OversizedMessage:
    """A message whose declared length exceeds MESSAGE_LENGTH_MAX.

    Its data is skipped without being buffered. Go answers such a request with
    RESOURCE_EXHAUSTED on its stream, and so can the caller.
    """

    stream_id: int
    type: int
    length: int

    @property
    def error_text(self) -> str:
        return f"message length {self.length} exceed maximum message size of {MESSAGE_LENGTH_MAX}"


Event = Message | OversizedMessage


class MessageDecoder:
    """Reassembles ttrpc messages from one logical connection's byte stream.

    `receive` takes bytes, `next_event` cuts one message at a time, so a
    frame packed with a million tiny messages costs one message of work per
    call, and its caller can yield to the event loop between them. The buffer
    holds at most what the mux delivered and not yet consumed: one frame's
    payload (MAX_FRAME_PAYLOAD) and an incomplete message (MESSAGE_LENGTH_MAX).
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._offset = 0  # where the next message starts in `_buffer`
        self._discard = 0  # bytes of an oversized message still to skip

    def receive(self, data: bytes) -> None:
        if self._discard:
            skipped = min(self._discard, len(data))
            self._discard -= skipped
            data = data[skipped:]
        if self._offset:
            del self._buffer[: self._offset]
            self._offset = 0
        self._buffer += data

    def next_event(self) -> Event | None:
        """The next complete message, or None until more bytes arrive."""
        buf = self._buffer
        offset = self._offset
        size = len(buf)
        if size - offset < HEADER.size:
            return None
        length, stream_id, msg_type, flags = HEADER.unpack_from(buf, offset)
        start = offset + HEADER.size
        if length > MESSAGE_LENGTH_MAX:
            # Skipped without being buffered: Go answers RESOURCE_EXHAUSTED.
            available = size - start
            if available >= length:
                self._offset = start + length
            else:
                self._discard = length - available
                self._offset = size
            return OversizedMessage(stream_id, msg_type, length)
        end = start + length
        if end > size:
            return None
        self._offset = end
        # Through a view: slicing the bytearray itself would copy the message
        # twice (a bytearray, then bytes), 4 MiB each for a Synchronize chunk.
        with memoryview(buf) as view:
            data = view[start:end].tobytes()
        return Message(stream_id, msg_type, flags, data)

    def feed(self, data: bytes) -> list[Event]:
        """`receive(data)`, then every message now complete."""
        self.receive(data)
        events: list[Event] = []
        while (event := self.next_event()) is not None:
            events.append(event)
        return events

    @property
    def buffered(self) -> int:
        """Bytes received but not yet cut into messages."""
        return len(self._buffer) - self._offset


def encode_message(stream_id: int, msg_type: int, data: bytes, flags: int = 0) -> bytes:
    """One ttrpc message; refuses what the peer would reject as oversized.

    `msg_type` is a plain int: a peer (or a test) may send types ttrpc does not define.
    """
    if len(data) > MESSAGE_LENGTH_MAX:
        raise OversizedMessageError(
            f"message length {len(data)} exceed maximum message size of {MESSAGE_LENGTH_MAX}"
        )
    return HEADER.pack(len(data), stream_id, msg_type, flags) + data


class StreamIds:
    """Stream ids for calls we originate: odd, starting at 1, strictly increasing."""

    def __init__(self) -> None:
        self._next = 1

    def allocate(self) -> int:
        stream_id = self._next
        self._next += 2
        return stream_id


class StreamCheck:
    """The Go server's rules for stream ids of incoming requests, per connection.

    `check` returns None for an acceptable new stream, else the exact
    INVALID_ARGUMENT text the Go server replies with.
    """

    def __init__(self) -> None:
        self._last = 0

    def check(self, stream_id: int) -> str | None:
        if stream_id % 2 == 0:
            return "StreamID must be odd for client initiated streams"
        if stream_id <= self._last:
            return "StreamID cannot be re-used and must increment"
        self._last = stream_id
        return None
