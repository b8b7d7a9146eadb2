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
    """Reassembles ttrpc messages from one logical connection's byte stream."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._discard = 0

    def feed(self, data: bytes) -> list[Event]:
        if self._discard:
            skipped = min(self._discard, len(data))
            self._discard -= skipped
            data = data[skipped:]
        buf = self._buffer
        if buf:
            buf += data
            with memoryview(buf) as view:
                events, offset = self._split(view)
            if offset is None:
                buf.clear()
            else:
                del buf[:offset]
        else:
            # Nothing pending, the usual case: messages are cut straight out
            # of `data`, and only an incomplete tail is buffered.
            with memoryview(data) as view:
                events, offset = self._split(view)
                if offset is not None and offset < len(view):
                    buf += view[offset:]
        return events

    def _split(self, view: memoryview) -> tuple[list[Event], int | None]:
        """The complete messages in `view`, and where the first incomplete one starts.

        None for the offset: everything was consumed, the rest of an
        oversized message is still to be skipped (`_discard`).
        """
        events: list[Event] = []
        size = len(view)
        offset = 0
        while size - offset >= HEADER.size:
            length, stream_id, msg_type, flags = HEADER.unpack_from(view, offset)
            start = offset + HEADER.size
            if length > MESSAGE_LENGTH_MAX:
                events.append(OversizedMessage(stream_id, msg_type, length))
                available = size - start
                if available >= length:
                    offset = start + length
                    continue
                self._discard = length - available
                return events, None
            end = start + length
            if end > size:
                break
            events.append(Message(stream_id, msg_type, flags, view[start:end].tobytes()))
            offset = end
        return events, offset

    @property
    def buffered(self) -> int:
        """Bytes of a message received so far but not yet complete."""
        return len(self._buffer)


def encode_message(stream_id: int, msg_type: MessageType, data: bytes, flags: int = 0) -> bytes:
    """One ttrpc message; refuses what the peer would reject as oversized."""
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
