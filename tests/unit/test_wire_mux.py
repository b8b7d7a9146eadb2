"""The NRI mux codec (reference §2, checklist items 1-3)."""

from __future__ import annotations

import struct

import pytest

from nri_midbatch.wire.errors import ProtocolError
from nri_midbatch.wire.mux import (
    FIRST_FRAME_MAX,
    HEADER,
    PLUGIN_SERVICE_CONN,
    RUNTIME_SERVICE_CONN,
    MuxDecoder,
    frame_message,
)
from nri_midbatch.wire.ttrpc import Message, MessageDecoder, MessageType, encode_message

KNOWN = frozenset({PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN})


def raw_frame(conn: int, payload: bytes) -> bytes:
    return struct.pack(">II", conn, len(payload)) + payload


def pattern(size: int) -> bytes:
    return (bytes(range(251)) * (size // 251 + 1))[:size]


def parse_frames(data: bytes) -> list[tuple[int, bytes]]:
    """An independent parser of mux framing, to check frame_message's output."""
    frames = []
    offset = 0
    while offset < len(data):
        conn, length = struct.unpack_from(">II", data, offset)
        offset += 8
        assert offset + length <= len(data), "truncated frame"
        frames.append((conn, data[offset : offset + length]))
        offset += length
    return frames


def test_constants_match_the_reference() -> None:
    assert HEADER.size == 8
    assert PLUGIN_SERVICE_CONN == 1
    assert RUNTIME_SERVICE_CONN == 2
    assert FIRST_FRAME_MAX == 4096


def test_header_is_big_endian_conn_then_length() -> None:
    assert frame_message(2, b"abc") == bytes.fromhex("00000002 00000003") + b"abc"
    assert MuxDecoder(KNOWN).feed(bytes.fromhex("00000001 00000002") + b"hi") == [(1, b"hi")]


# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------

STREAM_FRAMES = [
    (1, b"first"),
    (2, b""),
    (2, bytes(range(256)) * 3),
    (1, b"\x00" * 9),
    (1, b""),
    (2, b"last frame"),
]
STREAM = b"".join(raw_frame(c, p) for c, p in STREAM_FRAMES)


def test_several_frames_in_one_feed() -> None:
    decoder = MuxDecoder(KNOWN)
    assert decoder.feed(STREAM) == STREAM_FRAMES
    assert decoder.buffered == 0
    assert decoder.dropped_frames == 0


def test_split_at_every_offset_reassembles_identically() -> None:
    for split in range(len(STREAM) + 1):
        decoder = MuxDecoder(KNOWN)
        first = decoder.feed(STREAM[:split])
        frames = first + decoder.feed(STREAM[split:])
        assert frames == STREAM_FRAMES, split
        assert decoder.buffered == 0


def test_split_at_every_pair_of_offsets() -> None:
    # Three chunks: every frame boundary can fall anywhere in a header or body.
    expected = [(1, b"ab"), (2, b""), (1, b"x" * 20), (2, b"end")]
    data = b"".join(raw_frame(c, p) for c, p in expected)
    for i in range(len(data) + 1):
        for j in range(i, len(data) + 1):
            decoder = MuxDecoder(KNOWN)
            frames = decoder.feed(data[:i]) + decoder.feed(data[i:j]) + decoder.feed(data[j:])
            assert frames == expected, (i, j)


def test_byte_by_byte_feed() -> None:
    decoder = MuxDecoder(KNOWN)
    frames = []
    for i in range(len(STREAM)):
        frames += decoder.feed(STREAM[i : i + 1])
    assert frames == STREAM_FRAMES


def test_partial_frame_is_buffered_not_emitted() -> None:
    decoder = MuxDecoder(KNOWN)
    assert decoder.feed(raw_frame(1, b"0123456789")[:-1]) == []
    assert decoder.buffered == 8 + 9
    assert decoder.feed(b"9") == [(1, b"0123456789")]
    assert decoder.buffered == 0


def test_zero_length_frames() -> None:
    decoder = MuxDecoder(KNOWN)
    assert decoder.feed(raw_frame(1, b"") * 3) == [(1, b""), (1, b""), (1, b"")]
    # A lone header is a whole zero-length frame.
    assert decoder.feed(HEADER.pack(2, 0)) == [(2, b"")]


def test_unknown_connections_are_dropped_and_counted() -> None:
    data = b"".join(
        (
            raw_frame(0, b"reserved"),
            raw_frame(1, b"a"),
            raw_frame(3, b"x" * 100),
            raw_frame(2, b"b"),
            raw_frame(0xFFFFFFFF, b""),
            raw_frame(1, b"c"),
        )
    )
    decoder = MuxDecoder(KNOWN)
    assert decoder.feed(data) == [(1, b"a"), (2, b"b"), (1, b"c")]
    assert decoder.dropped_frames == 3
    assert decoder.buffered == 0


def test_unknown_connection_split_across_feeds_is_dropped_once() -> None:
    data = raw_frame(7, b"y" * 50) + raw_frame(1, b"ok")
    decoder = MuxDecoder(KNOWN)
    out = []
    for i in range(0, len(data), 5):
        out += decoder.feed(data[i : i + 5])
    assert out == [(1, b"ok")]
    assert decoder.dropped_frames == 1


def test_only_the_known_set_is_accepted() -> None:
    decoder = MuxDecoder(frozenset({1}))
    assert decoder.feed(raw_frame(2, b"x") + raw_frame(1, b"y")) == [(1, b"y")]
    assert decoder.dropped_frames == 1


def test_the_two_logical_connections_are_kept_apart() -> None:
    # Both connections carry stream 1; one conn-1 message spans three frames
    # interleaved with a whole conn-2 message.
    m1 = encode_message(1, MessageType.REQUEST, b"to the plugin " * 20)
    m2 = encode_message(1, MessageType.RESPONSE, b"to the runtime")
    data = b"".join(
        (
            raw_frame(1, m1[:7]),
            raw_frame(2, m2),
            raw_frame(1, m1[7:100]),
            raw_frame(1, m1[100:]),
        )
    )
    for split in range(len(data) + 1):
        decoders = {1: MessageDecoder(), 2: MessageDecoder()}
        got: dict[int, list[object]] = {1: [], 2: []}
        mux = MuxDecoder(KNOWN)
        for chunk in (data[:split], data[split:]):
            for conn, payload in mux.feed(chunk):
                got[conn] += decoders[conn].feed(payload)
        assert got == {
            1: [Message(1, MessageType.REQUEST, 0, b"to the plugin " * 20)],
            2: [Message(1, MessageType.RESPONSE, 0, b"to the runtime")],
        }


def test_absurd_frame_length_is_a_protocol_error() -> None:
    decoder = MuxDecoder(KNOWN)
    # Raised on the header alone: no waiting for (or buffering) gigabytes.
    with pytest.raises(ProtocolError):
        decoder.feed(HEADER.pack(1, 0xFFFFFFFF))
    with pytest.raises(ProtocolError):
        MuxDecoder(KNOWN).feed(raw_frame(1, b"ok") + HEADER.pack(2, (1 << 24) + 1))


def test_absurd_length_on_unknown_connection_is_also_an_error() -> None:
    with pytest.raises(ProtocolError):
        MuxDecoder(KNOWN).feed(HEADER.pack(9, 0x7FFFFFFF))


def test_largest_go_frame_is_accepted() -> None:
    # NRI >= v0.7 writers split at 4 MiB + 10; the reader must take that.
    size = (4 << 20) + 10
    decoder = MuxDecoder(KNOWN)
    assert decoder.feed(HEADER.pack(2, size)) == []
    assert decoder.feed(b"z" * size) == [(2, b"z" * size)]


# ---------------------------------------------------------------------------
# Encoding: the framing rule of §2.1
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 10, 4095, 4096])
def test_small_message_is_one_frame(size: int) -> None:
    message = pattern(size)
    out = frame_message(1, message)
    assert out == struct.pack(">II", 1, size) + message
    assert parse_frames(out) == [(1, message)]


@pytest.mark.parametrize("size", [4097, 4106, 40_000, 3_000_000])
def test_large_message_is_4096_then_one_remainder(size: int) -> None:
    message = pattern(size)
    out = frame_message(2, message)
    frames = parse_frames(out)
    assert [(c, len(p)) for c, p in frames] == [(2, 4096), (2, size - 4096)]
    assert frames[0][1] + frames[1][1] == message
    assert len(out) == size + 16


def test_frames_never_mix_messages() -> None:
    sizes = [0, 10, 4096, 4097, 9000, 3, 20_000]
    messages = [bytes([n % 256]) * n for n in sizes]
    stream = b"".join(frame_message(1, m) for m in messages)
    frames = parse_frames(stream)
    # Walk the frames against the message boundaries: a frame never crosses one,
    # and each message's first frame is at most 4096 bytes with at most one more.
    index = 0
    for message in messages:
        _conn, first = frames[index]
        assert len(first) <= 4096
        parts = [first]
        index += 1
        if len(message) > 4096:
            parts.append(frames[index][1])
            index += 1
        assert b"".join(parts) == message
    assert index == len(frames)


def test_frame_message_output_decodes_back() -> None:
    messages = [b"", b"a" * 4096, b"b" * 4097, b"c" * 70_000]
    decoder = MuxDecoder(KNOWN)
    frames = decoder.feed(b"".join(frame_message(1, m) for m in messages))
    reassembled = b"".join(p for _, p in frames)
    assert reassembled == b"".join(messages)
    assert len(frames) == 1 + 1 + 2 + 2
