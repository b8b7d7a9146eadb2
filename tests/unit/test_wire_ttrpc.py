"""The ttrpc message codec (reference §1, checklist items 4-5), alone and under the mux."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nri_midbatch.api import nri_pb2, rpc_status_pb2, ttrpc_pb2
from nri_midbatch.wire.errors import OversizedMessageError, ProtocolError
from nri_midbatch.wire.mux import MuxDecoder, frame_message
from nri_midbatch.wire.ttrpc import (
    HEADER,
    MESSAGE_LENGTH_MAX,
    Message,
    MessageDecoder,
    MessageType,
    OversizedMessage,
    StreamCheck,
    StreamIds,
    encode_message,
)

KNOWN = frozenset({1, 2})


def raw_frame(conn: int, payload: bytes) -> bytes:
    return struct.pack(">II", conn, len(payload)) + payload


def feed_all(decoder: MessageDecoder, chunks: list[bytes]) -> list[object]:
    events: list[object] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    return events


# ---------------------------------------------------------------------------
# Header and constants
# ---------------------------------------------------------------------------


def test_constants_match_the_reference() -> None:
    assert HEADER.size == 10
    assert MESSAGE_LENGTH_MAX == 4_194_304
    assert (MessageType.REQUEST, MessageType.RESPONSE, MessageType.DATA) == (1, 2, 3)


def test_header_layout_is_len_stream_type_flags_big_endian() -> None:
    assert encode_message(0x01020304, MessageType.DATA, b"xyz", flags=0x05) == (
        bytes.fromhex("00000003 01020304 03 05") + b"xyz"
    )


def test_zero_length_message_is_just_a_header() -> None:
    data = encode_message(7, MessageType.RESPONSE, b"")
    assert data == bytes.fromhex("00000000 00000007 02 00")
    assert MessageDecoder().feed(data) == [Message(7, MessageType.RESPONSE, 0, b"")]


def test_worked_example_of_reference_1_6() -> None:
    request = ttrpc_pb2.Request(
        service="nri.pkg.api.v1alpha1.Runtime",
        method="RegisterPlugin",
        payload=nri_pb2.RegisterPluginRequest(
            plugin_name="demo", plugin_idx="10"
        ).SerializeToString(),
        timeout_nano=5_000_000_000,
    )
    wire = frame_message(2, encode_message(1, MessageType.REQUEST, request.SerializeToString()))
    expected = (
        "00000002" "0000004a"  # mux: conn 2, 74 bytes
        "00000040" "00000001" "01" "00"  # ttrpc: len 64, stream 1, Request, flags 0
        "0a1c" + b"nri.pkg.api.v1alpha1.Runtime".hex()
        + "120e" + b"RegisterPlugin".hex()
        + "1a0a" + "0a04" + b"demo".hex() + "1202" + b"10".hex()
        + "2080e497d012"
    )  # fmt: skip
    assert wire.hex() == expected


def test_worked_example_replies_of_reference_1_6() -> None:
    configure = nri_pb2.ConfigureResponse(events=0x28).SerializeToString()
    assert configure.hex() == "1028"
    assert ttrpc_pb2.Response(payload=configure).SerializeToString().hex() == "12021028"
    error = ttrpc_pb2.Response(status=rpc_status_pb2.Status(code=12, message="method Foo"))
    assert error.SerializeToString().hex() == "0a0e080c120a" + b"method Foo".hex()


# ---------------------------------------------------------------------------
# Decoding: reassembly
# ---------------------------------------------------------------------------

MESSAGES = [
    Message(1, MessageType.REQUEST, 0, b"first request"),
    Message(1, MessageType.RESPONSE, 0, b""),
    Message(3, MessageType.DATA, 0x04, b""),
    Message(5, MessageType.REQUEST, 0, bytes(range(256)) * 2),
    Message(0xFFFFFFFF, 0xEE, 0xFF, b"unknown type survives decoding"),
]
STREAM = b"".join(encode_message(m.stream_id, m.type, m.data, m.flags) for m in MESSAGES)


def test_several_messages_in_one_feed() -> None:
    decoder = MessageDecoder()
    assert decoder.feed(STREAM) == MESSAGES
    assert decoder.buffered == 0


def test_split_at_every_offset_reassembles_identically() -> None:
    for split in range(len(STREAM) + 1):
        decoder = MessageDecoder()
        assert feed_all(decoder, [STREAM[:split], STREAM[split:]]) == MESSAGES, split
        assert decoder.buffered == 0


def test_byte_by_byte_feed() -> None:
    decoder = MessageDecoder()
    assert feed_all(decoder, [STREAM[i : i + 1] for i in range(len(STREAM))]) == MESSAGES


def test_message_spanning_several_mux_frames_split_at_every_offset() -> None:
    # One 10 000-byte message framed the way we send it (4096 + remainder) and
    # one framed the way an arbitrary writer might (five uneven frames), then
    # the socket bytes split at every offset.
    big = Message(9, MessageType.RESPONSE, 0, bytes(i % 253 for i in range(10_000)))
    small = Message(11, MessageType.RESPONSE, 0, b"after")
    big_wire = encode_message(big.stream_id, big.type, big.data)
    small_wire = encode_message(small.stream_id, small.type, small.data)
    cuts = [0, 3, 10, 2000, 2001, len(big_wire)]
    uneven = b"".join(raw_frame(1, big_wire[a:b]) for a, b in itertools.pairwise(cuts))
    socket_bytes = frame_message(1, big_wire) + uneven + frame_message(1, small_wire)
    assert len(MuxDecoder(KNOWN).feed(socket_bytes)) == 2 + 5 + 1
    for split in range(len(socket_bytes) + 1):
        mux, decoder = MuxDecoder(KNOWN), MessageDecoder()
        events = []
        for chunk in (socket_bytes[:split], socket_bytes[split:]):
            for _conn, payload in mux.feed(chunk):
                events += decoder.feed(payload)
        assert events == [big, big, small], split


def test_partial_message_is_buffered() -> None:
    wire = encode_message(1, MessageType.REQUEST, b"0123456789")
    decoder = MessageDecoder()
    assert decoder.feed(wire[:-1]) == []
    assert decoder.buffered == len(wire) - 1
    assert decoder.feed(wire[-1:]) == [Message(1, MessageType.REQUEST, 0, b"0123456789")]


# ---------------------------------------------------------------------------
# Oversized messages
# ---------------------------------------------------------------------------


def test_oversized_message_is_reported_and_skipped_without_buffering() -> None:
    length = MESSAGE_LENGTH_MAX + 1
    after = encode_message(5, MessageType.REQUEST, b"next")
    decoder = MessageDecoder()
    events = decoder.feed(HEADER.pack(length, 3, MessageType.REQUEST, 0))
    assert events == [OversizedMessage(3, MessageType.REQUEST, length)]
    assert isinstance(events[0], OversizedMessage)
    assert events[0].error_text == ("message length 4194305 exceed maximum message size of 4194304")
    body = b"\xab" * length
    piece = 65_536
    for start in range(0, length - 1, piece):
        end = min(start + piece, length - 1)
        assert decoder.feed(body[start:end]) == []
        assert decoder.buffered == 0
    # The body's last byte and the next message arrive together.
    assert decoder.feed(body[-1:] + after) == [Message(5, MessageType.REQUEST, 0, b"next")]
    assert decoder.buffered == 0


def test_oversized_message_with_split_header_and_body_in_the_same_feed() -> None:
    length = MESSAGE_LENGTH_MAX + 100
    wire = HEADER.pack(length, 1, MessageType.REQUEST, 0) + b"\x00" * length
    wire += encode_message(3, MessageType.REQUEST, b"ok")
    decoder = MessageDecoder()
    assert decoder.feed(wire[:4]) == []
    assert decoder.feed(wire[4:]) == [
        OversizedMessage(1, MessageType.REQUEST, length),
        Message(3, MessageType.REQUEST, 0, b"ok"),
    ]
    assert decoder.buffered == 0


def test_huge_declared_length_is_skipped_not_a_crash() -> None:
    decoder = MessageDecoder()
    (event,) = decoder.feed(HEADER.pack(0xFFFFFFFF, 1, MessageType.RESPONSE, 0) + b"junk")
    assert event == OversizedMessage(1, MessageType.RESPONSE, 0xFFFFFFFF)
    assert decoder.buffered == 0
    assert decoder.feed(b"more junk") == []


def test_message_of_exactly_the_maximum_is_accepted() -> None:
    data = b"m" * MESSAGE_LENGTH_MAX
    wire = encode_message(1, MessageType.RESPONSE, data)
    assert MessageDecoder().feed(wire) == [Message(1, MessageType.RESPONSE, 0, data)]


def test_encode_refuses_more_than_4_mib() -> None:
    with pytest.raises(OversizedMessageError) as info:
        encode_message(1, MessageType.RESPONSE, b"x" * (MESSAGE_LENGTH_MAX + 1))
    assert isinstance(info.value, ProtocolError)
    assert str(info.value) == "message length 4194305 exceed maximum message size of 4194304"


# ---------------------------------------------------------------------------
# Stream ids
# ---------------------------------------------------------------------------


def test_stream_ids_are_odd_and_increasing_from_one() -> None:
    ids = StreamIds()
    assert [ids.allocate() for _ in range(6)] == [1, 3, 5, 7, 9, 11]
    assert StreamIds().allocate() == 1  # each connection has its own id space


ODD = "StreamID must be odd for client initiated streams"
REUSED = "StreamID cannot be re-used and must increment"


def test_stream_check_go_server_rules() -> None:
    check = StreamCheck()
    assert check.check(0) == ODD
    assert check.check(2) == ODD
    assert check.check(1) is None
    assert check.check(1) == REUSED
    assert check.check(7) is None  # gaps are fine
    assert check.check(5) == REUSED
    assert check.check(7) == REUSED
    assert check.check(8) == ODD
    assert check.check(9) is None


def test_rejected_ids_do_not_advance_the_check() -> None:
    check = StreamCheck()
    assert check.check(4) == ODD
    assert check.check(3) is None
    assert check.check(3) == REUSED
    assert check.check(5) is None


# ---------------------------------------------------------------------------
# Property-based: fuzzing and round trips
# ---------------------------------------------------------------------------


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


frame_or_junk = st.one_of(
    st.binary(max_size=64),
    st.builds(
        lambda conn, payload: raw_frame(conn, payload),
        st.integers(0, 4),
        st.binary(max_size=64),
    ),
    st.builds(
        lambda conn, length, stream, kind, flags, body: raw_frame(
            conn, HEADER.pack(length, stream, kind, flags) + body
        ),
        st.sampled_from([1, 2]),
        st.one_of(st.integers(0, 80), st.integers(MESSAGE_LENGTH_MAX - 2, 2**32 - 1)),
        st.integers(0, 2**32 - 1),
        st.integers(0, 255),
        st.integers(0, 255),
        st.binary(max_size=80),
    ),
    st.builds(
        lambda conn, length: struct.pack(">II", conn, length),
        st.integers(0, 2**32 - 1),
        st.integers(0, 2**32 - 1),
    ),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pieces=st.lists(frame_or_junk, max_size=12),
    cuts=st.lists(st.integers(0, 2000), max_size=10),
)
def test_fuzz_arbitrary_bytes_yield_events_or_protocol_error(
    pieces: list[bytes], cuts: list[int]
) -> None:
    data = b"".join(pieces)
    mux = MuxDecoder(KNOWN)
    decoders = {1: MessageDecoder(), 2: MessageDecoder()}
    try:
        for chunk in chunked(data, cuts):
            for conn, payload in mux.feed(chunk):
                assert conn in KNOWN
                for event in decoders[conn].feed(payload):
                    assert isinstance(event, Message | OversizedMessage)
                    if isinstance(event, Message):
                        assert len(event.data) <= MESSAGE_LENGTH_MAX
                    else:
                        assert event.length > MESSAGE_LENGTH_MAX
    except ProtocolError:
        pass
    assert mux.buffered <= len(data)
    for decoder in decoders.values():
        assert decoder.buffered < HEADER.size + MESSAGE_LENGTH_MAX


message_strategy = st.builds(
    Message,
    stream_id=st.integers(0, 2**32 - 1),
    type=st.sampled_from(list(MessageType)),
    flags=st.integers(0, 255),
    data=st.one_of(
        st.binary(max_size=100),
        # Large bodies (first frame 4096 + a remainder) without making
        # hypothesis generate kilobytes byte by byte.
        st.builds(
            lambda size, start: (bytes(range(256)) * 40)[start : start + size],
            st.integers(4080, 9000),
            st.integers(0, 255),
        ),
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(st.tuples(st.sampled_from([1, 2]), message_strategy), max_size=8),
    cuts=st.lists(st.integers(0, 40_000), max_size=12),
)
def test_round_trip_through_ttrpc_and_mux(
    messages: list[tuple[int, Message]], cuts: list[int]
) -> None:
    wire = b"".join(
        frame_message(conn, encode_message(m.stream_id, MessageType(m.type), m.data, m.flags))
        for conn, m in messages
    )
    mux = MuxDecoder(KNOWN)
    decoders = {1: MessageDecoder(), 2: MessageDecoder()}
    got: dict[int, list[object]] = {1: [], 2: []}
    for chunk in chunked(wire, cuts):
        for conn, payload in mux.feed(chunk):
            got[conn] += decoders[conn].feed(payload)
    assert got == {c: [m for k, m in messages if k == c] for c in (1, 2)}
    assert mux.buffered == 0
    assert decoders[1].buffered == decoders[2].buffered == 0
    assert mux.dropped_frames == 0
