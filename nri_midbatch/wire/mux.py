"""NRI's connection multiplexer, as a sans-IO codec.

One socket carries several logical byte streams. Each frame is an 8-byte
big-endian header (connection id, payload length) and the payload. The Go
reader hands ttrpc one whole frame per read through a 4096-byte buffer, which
dictates how we must frame what we send (see `frame_message`).
"""

from __future__ import annotations

import struct

from nri_midbatch.wire.errors import RemoteProtocolError
from nri_midbatch.wire.status import Code
from nri_midbatch.wire.ttrpc import HEADER as TTRPC_HEADER
from nri_midbatch.wire.ttrpc import MessageType, encode_message

HEADER = struct.Struct(">II")

#: The plugin serves `nri.pkg.api.v1alpha1.Plugin` here; the runtime is the client.
PLUGIN_SERVICE_CONN = 1
#: The runtime serves `nri.pkg.api.v1alpha1.Runtime` here; the plugin is the client.
RUNTIME_SERVICE_CONN = 2

#: Go's bufio default: the largest frame the runtime can take at a message start.
FIRST_FRAME_MAX = 4096

#: Largest frame payload we accept. Go writers split at 4 MiB + 10 since NRI
#: v0.7 and refused writes above 16 MiB before it; anything larger is garbage,
#: and trusting it would let one header make us buffer gigabytes.
MAX_FRAME_PAYLOAD = 1 << 24


class MuxDecoder:
    """Splits a socket byte stream into (connection id, payload) frames.

    Frames for connections not in `known` are dropped, as the Go mux drops
    frames for connections nobody opened; `dropped_frames` counts them.
    """

    def __init__(self, known: frozenset[int]) -> None:
        self._known = known
        self._buffer = bytearray()
        self.dropped_frames = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buffer
        if buf:
            buf += data
            with memoryview(buf) as view:
                frames, offset = self._split(view)
            del buf[:offset]
        else:
            # Nothing pending, the usual case: frames are cut straight out of
            # `data`, and only an incomplete tail is buffered.
            with memoryview(data) as view:
                frames, offset = self._split(view)
                if offset < len(view):
                    buf += view[offset:]
        return frames

    def _split(self, view: memoryview) -> tuple[list[tuple[int, bytes]], int]:
        """The complete frames in `view`, and where the first incomplete one starts."""
        frames: list[tuple[int, bytes]] = []
        known = self._known
        size = len(view)
        offset = 0
        while size - offset >= HEADER.size:
            conn_id, length = HEADER.unpack_from(view, offset)
            if length > MAX_FRAME_PAYLOAD:
                raise RemoteProtocolError(
                    f"mux frame for connection {conn_id} declares {length} bytes, "
                    f"more than the {MAX_FRAME_PAYLOAD} any runtime sends",
                    status_hint=Code.RESOURCE_EXHAUSTED,
                )
            end = offset + HEADER.size + length
            if end > size:
                break
            if conn_id in known:
                frames.append((conn_id, view[offset + HEADER.size : end].tobytes()))
            else:
                self.dropped_frames += 1
            offset = end
        return frames, offset

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buffer)


def frame_message(conn_id: int, message: bytes) -> bytes:
    """Frame one complete ttrpc message for the mux.

    The runtime can only read a frame larger than 4096 bytes straight into the
    body of a message it has already started, so: at most 4096 bytes in the
    first frame, everything else in exactly one second frame (many small frames
    would overflow its 256-frame queue), and never two messages in one frame.
    The result goes out in one write so concurrent senders cannot interleave.
    """
    if len(message) <= FIRST_FRAME_MAX:
        return HEADER.pack(conn_id, len(message)) + message
    head = memoryview(message)[:FIRST_FRAME_MAX]
    rest = memoryview(message)[FIRST_FRAME_MAX:]
    return b"".join(
        (
            HEADER.pack(conn_id, FIRST_FRAME_MAX),
            head,
            HEADER.pack(conn_id, len(rest)),
            rest,
        )
    )


#: A mux frame header followed by a ttrpc message header.
_MUX_AND_TTRPC = struct.Struct(">II" + TTRPC_HEADER.format.removeprefix(">"))


def frame_ttrpc(conn_id: int, stream_id: int, msg_type: MessageType, data: bytes) -> bytes:
    """`frame_message(conn_id, encode_message(stream_id, msg_type, data))`, flags 0.

    Most NRI messages fit in one frame; for those both headers are packed in
    one go, without the intermediate copies.
    """
    size = len(data) + TTRPC_HEADER.size
    if size <= FIRST_FRAME_MAX:
        return _MUX_AND_TTRPC.pack(conn_id, size, len(data), stream_id, msg_type, 0) + data
    return frame_message(conn_id, encode_message(stream_id, msg_type, data))
