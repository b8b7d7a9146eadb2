"""The sans-IO ttrpc connection: properties over arbitrary input, both directions.

No sockets and no sleeps: bytes in, events and bytes out (reference §1.3-§1.5, §2).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.api import rpc_status_pb2, ttrpc_pb2
from nri_midbatch.wire import connection as wire
from nri_midbatch.wire.errors import LocalProtocolError, RemoteProtocolError
from nri_midbatch.wire.mux import MuxDecoder, frame_message
from nri_midbatch.wire.status import Code
from nri_midbatch.wire.ttrpc import HEADER, Message, MessageDecoder, MessageType, encode_message

SERVICE = "test.Echo"
KV = ttrpc_pb2.KeyValue
METHODS = {SERVICE: {"Echo": KV, "Empty": api.Empty}}


def connection(
    *,
    max_requests_in_flight: int = wire.MAX_REQUESTS_IN_FLIGHT,
    max_pending_calls: int = wire.MAX_PENDING_CALLS,
    max_violations_per_second: int = wire.MAX_VIOLATIONS_PER_SECOND,
    clock: Callable[[], float] = lambda: 0.0,
) -> wire.Connection[str]:
    return wire.Connection(
        METHODS,
        server_conn=1,
        client_conn=2,
        max_requests_in_flight=max_requests_in_flight,
        max_pending_calls=max_pending_calls,
        max_violations_per_second=max_violations_per_second,
        clock=clock,
    )


def events(conn: wire.Connection[str]) -> list[wire.Event[str]]:
    out: list[wire.Event[str]] = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


def request(
    stream_id: int, method: str = "Echo", payload: bytes = b"", service: str = SERVICE
) -> bytes:
    body = ttrpc_pb2.Request(service=service, method=method, payload=payload).SerializeToString()
    return frame_message(1, encode_message(stream_id, MessageType.REQUEST, body))


def responses(data: bytes, conn_id: int = 1) -> list[tuple[int, ttrpc_pb2.Response]]:
    """(stream id, Response) of every message in `data`, which must be whole frames on `conn_id`."""
    decoder = MessageDecoder()
    out = []
    for frame_conn, payload in MuxDecoder(frozenset({1, 2})).feed(data):
        assert frame_conn == conn_id
        for message in decoder.feed(payload):
            assert isinstance(message, Message)
            assert (message.type, message.flags) == (MessageType.RESPONSE, 0)
            out.append((message.stream_id, ttrpc_pb2.Response.FromString(message.data)))
    assert decoder.buffered == 0
    return out


# ---------------------------------------------------------------------------
# Serving
# ---------------------------------------------------------------------------


def test_good_request_is_passed_on_decoded_and_its_reply_framed() -> None:
    conn = connection()
    conn.receive_data(request(1, payload=KV(key="k").SerializeToString()))
    (event,) = events(conn)
    assert isinstance(event, wire.Request)
    assert (event.stream_id, event.message) == (1, KV(key="k"))
    # Its size as received, for the session's Synchronize bound.
    assert event.payload_size == len(KV(key="k").SerializeToString()) == 3
    assert conn.requests_in_flight == 1
    ((stream_id, response),) = responses(conn.reply(1, KV(key="r")))
    assert stream_id == 1 and not response.HasField("status")
    assert KV.FromString(response.payload).key == "r"
    assert conn.requests_in_flight == 0


def test_an_empty_reply_is_a_zero_byte_response_as_protobuf_encodes_it() -> None:
    """The payload envelope is skipped for it: protobuf omits an empty field."""
    conn = connection()
    conn.receive_data(request(1, method="Empty"))
    events(conn)
    ((_, frame),) = MuxDecoder(frozenset({1, 2})).feed(conn.reply(1, api.Empty()))
    (message,) = MessageDecoder().feed(frame)
    assert isinstance(message, Message)
    assert message.data == ttrpc_pb2.Response(payload=b"").SerializeToString() == b""


@pytest.mark.parametrize(
    ("data", "code", "text"),
    [
        (request(1, service="nope"), Code.UNIMPLEMENTED, "service nope"),
        (request(1, method="Nope"), Code.UNIMPLEMENTED, "method Nope"),
        (request(2), Code.INVALID_ARGUMENT, "StreamID must be odd for client initiated streams"),
        (request(1, payload=b"\xff"), Code.INVALID_ARGUMENT, "unmarshal Echo payload"),
        (
            frame_message(1, encode_message(1, MessageType.REQUEST, b"\xff")),
            Code.INVALID_ARGUMENT,
            "unmarshal request error",
        ),
        (
            frame_message(1, encode_message(1, MessageType.DATA, b"")),
            Code.INVALID_ARGUMENT,
            "StreamID is no longer active",
        ),
    ],
)
def test_bad_request_is_refused_with_the_reply_to_send(data: bytes, code: Code, text: str) -> None:
    conn = connection()
    conn.receive_data(data)
    (event,) = events(conn)
    assert isinstance(event, wire.Refused)
    assert (event.code, event.message.startswith(text)) == (code, True)
    ((stream_id, response),) = responses(event.data)
    assert stream_id == 1 or stream_id == 2
    assert (response.status.code, response.payload) == (code, b"")
    assert conn.requests_in_flight == 0


def test_requests_in_flight_are_bounded() -> None:
    conn = connection(max_requests_in_flight=2)
    conn.receive_data(b"".join(request(s) for s in (1, 3, 5)))
    first, second, third = events(conn)
    assert isinstance(first, wire.Request) and isinstance(second, wire.Request)
    assert isinstance(third, wire.Refused)
    assert third.code == Code.RESOURCE_EXHAUSTED
    conn.reply(1, KV())  # one answered: room for the next
    conn.receive_data(request(7))
    assert isinstance(events(conn)[0], wire.Request)


def test_messages_are_cut_one_at_a_time() -> None:
    """A frame packed with many messages is not decoded all at once (the reader yields between)."""
    conn = connection(max_violations_per_second=10_000)
    flood = b"".join(HEADER.pack(0, 2, MessageType.REQUEST, 0) for _ in range(10_000))
    conn.receive_data(struct.pack(">II", 1, len(flood)) + flood)
    first = conn.next_event()
    assert isinstance(first, wire.Refused)
    assert conn.holds_input  # the other messages are still bytes
    assert len(events(conn)) == 9_999


def empty_requests_frame(count: int) -> bytes:
    """One mux frame of `count` empty ttrpc requests on odd, increasing stream ids."""
    flood = b"".join(HEADER.pack(0, 2 * i + 1, MessageType.REQUEST, 0) for i in range(count))
    return struct.pack(">II", 1, len(flood)) + flood


def test_a_flood_of_refused_messages_is_a_protocol_error_after_the_bound() -> None:
    """Issue 24: one 16 MiB frame of empty messages; the connection gives up after 100, not 1.6M."""
    conn = connection()
    count = ((1 << 24) - 8) // HEADER.size  # as many as the largest accepted frame holds
    conn.receive_data(empty_requests_frame(count))
    refused = []
    with pytest.raises(RemoteProtocolError, match="more than 100 messages refused or ignored"):
        while (event := conn.next_event()) is not None:
            refused.append(event)
    assert len(refused) == wire.MAX_VIOLATIONS_PER_SECOND == 100
    assert all(isinstance(e, wire.Refused) and e.code == Code.UNIMPLEMENTED for e in refused)


def test_refusals_spread_over_seconds_are_not_a_flood() -> None:
    now = [0.0]
    conn = connection(max_violations_per_second=10, clock=lambda: now[0])
    for second in range(5):
        now[0] = float(second)
        conn.receive_data(request(2 * second + 1, method="Nope"))
        conn.receive_data(empty_requests_frame(0))
        batch = [request(1000 + 20 * second + 2 * i + 1, method="Nope") for i in range(9)]
        conn.receive_data(b"".join(batch))
        answered = events(conn)
        assert len(answered) == 10  # ten a second: at the bound, never past it
        assert all(isinstance(e, wire.Refused) for e in answered)
    conn.receive_data(request(5001, method="Nope"))  # the eleventh in the last second
    with pytest.raises(RemoteProtocolError):
        events(conn)


# ---------------------------------------------------------------------------
# Calling
# ---------------------------------------------------------------------------


def reply(stream_id: int, msg_type: MessageType, body: bytes) -> bytes:
    return frame_message(2, encode_message(stream_id, msg_type, body))


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (reply(1, MessageType.RESPONSE, b"\xff"), Code.INTERNAL),  # undecodable envelope
        (
            reply(1, MessageType.RESPONSE, ttrpc_pb2.Response(payload=b"\xff").SerializeToString()),
            Code.INTERNAL,  # undecodable payload
        ),
        (reply(1, MessageType.REQUEST, b""), Code.INTERNAL),  # wrong message type
        (reply(1, MessageType.DATA, b""), Code.INTERNAL),
        (
            reply(
                1,
                MessageType.RESPONSE,
                ttrpc_pb2.Response(
                    status=rpc_status_pb2.Status(code=9, message="no")
                ).SerializeToString(),
            ),
            Code.FAILED_PRECONDITION,
        ),
    ],
)
def test_every_bad_reply_fails_the_call_with_a_status(data: bytes, code: Code) -> None:
    conn = connection()
    stream_id, _ = conn.call("rt", "RegisterPlugin", api.Empty(), api.Empty, "token")
    assert stream_id == 1
    conn.receive_data(data)
    (event,) = events(conn)
    assert isinstance(event, wire.CallFailed)
    assert (event.token, event.code) == ("token", code)
    assert conn.pending_calls == 0


def test_pending_calls_are_bounded_and_forgotten_calls_free_a_slot() -> None:
    conn = connection(max_pending_calls=2)
    first, _ = conn.call("rt", "Do", api.Empty(), api.Empty, "a")
    conn.call("rt", "Do", api.Empty(), api.Empty, "b")
    with pytest.raises(LocalProtocolError) as info:
        conn.call("rt", "Do", api.Empty(), api.Empty, "c")
    assert info.value.status_hint == Code.RESOURCE_EXHAUSTED
    conn.forget_call(first)  # its deadline passed
    conn.call("rt", "Do", api.Empty(), api.Empty, "c")
    conn.receive_data(reply(first, MessageType.RESPONSE, b""))  # the late reply
    (late,) = events(conn)
    assert isinstance(late, wire.Dropped)
    assert sorted(conn.close()) == ["b", "c"]


def test_framing_garbage_is_a_remote_protocol_error() -> None:
    conn = connection()
    with pytest.raises(RemoteProtocolError) as info:
        conn.receive_data(b"\xff" * 16)
    assert info.value.status_hint == Code.RESOURCE_EXHAUSTED


# ---------------------------------------------------------------------------
# Properties: whatever the runtime sends
# ---------------------------------------------------------------------------

envelope = st.one_of(
    st.binary(max_size=40),
    st.builds(
        lambda service, method, payload, timeout: ttrpc_pb2.Request(
            service=service, method=method, payload=payload, timeout_nano=timeout
        ).SerializeToString(),
        st.sampled_from([SERVICE, "other.Service", ""]),
        st.sampled_from(["Echo", "Empty", "Nope", ""]),
        st.one_of(st.binary(max_size=20), st.just(KV(value="7").SerializeToString())),
        st.integers(-(2**63), 2**63 - 1),
    ),
    st.builds(
        lambda code, payload: ttrpc_pb2.Response(
            status=rpc_status_pb2.Status(code=code) if code is not None else None,
            payload=payload,
        ).SerializeToString(),
        st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
        st.binary(max_size=20),
    ),
)
message = st.builds(
    lambda conn, stream, kind, flags, body: (
        struct.pack(">II", conn, HEADER.size + len(body))
        + HEADER.pack(len(body), stream, kind, flags)
        + body
    ),
    st.sampled_from([1, 1, 2, 2, 5]),
    st.one_of(st.integers(0, 12), st.integers(0, 2**32 - 1)),
    st.sampled_from([1, 1, 2, 2, 3, 0, 200]),
    st.integers(0, 255),
    envelope,
)
stream = st.lists(st.one_of(message, message, st.binary(max_size=24)), max_size=10)


@settings(max_examples=300, deadline=None)
@given(pieces=stream, cuts=st.lists(st.integers(0, 600), max_size=6), calls=st.integers(0, 4))
def test_any_input_yields_well_formed_answers_and_ends_every_call(
    pieces: list[bytes], cuts: list[int], calls: int
) -> None:
    conn = connection()
    tokens = [f"call-{i}" for i in range(calls)]
    for token in tokens:
        conn.call("rt", "Do", api.Empty(), KV, token)
    data = b"".join(pieces)
    points = sorted({0, *(min(c, len(data)) for c in cuts), len(data)})
    sent = bytearray()
    outcomes: dict[str, wire.Event[str]] = {}
    try:
        for a, b in itertools.pairwise(points):
            conn.receive_data(data[a:b])
            for event in events(conn):
                if isinstance(event, wire.Refused):
                    sent += event.data
                elif isinstance(event, wire.Request):
                    sent += conn.reply(event.stream_id, event.message)
                elif isinstance(event, wire.CallSucceeded | wire.CallFailed):
                    assert event.token not in outcomes  # one outcome per call
                    outcomes[event.token] = event
                    if isinstance(event, wire.CallSucceeded):
                        assert isinstance(event.reply, KV)
    except RemoteProtocolError:
        pass  # framing garbage: the caller drops the connection
    # Every call ended exactly once: by an outcome or by the close.
    assert sorted([*outcomes, *conn.close()]) == sorted(tokens)
    # Whatever we answered is whole Responses on conn 1, one per refused or served request.
    responses(bytes(sent))
    assert conn.requests_in_flight == 0
