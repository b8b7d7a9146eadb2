"""MuxConnection over a real socket pair, checked from a raw byte-level peer.

Reference §1.3-§1.5 and §2, checklist items 3-8: what a Go runtime sees on the
wire when it calls us, and what we send when we call it.
"""

from __future__ import annotations

import asyncio
import contextvars
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeAlias

import pytest
import structlog

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.api import rpc_status_pb2, ttrpc_pb2
from nri_midbatch.rpc.connection import MESSAGES_PER_TURN, MuxConnection
from nri_midbatch.rpc.errors import ConnectionClosed, RpcError
from nri_midbatch.rpc.service import CallContext, Method, Service
from nri_midbatch.wire.connection import MAX_PENDING_CALLS, MAX_REQUESTS_IN_FLIGHT
from nri_midbatch.wire.mux import MuxDecoder, frame_message
from nri_midbatch.wire.status import Code
from nri_midbatch.wire.ttrpc import (
    HEADER,
    MESSAGE_LENGTH_MAX,
    MessageDecoder,
    MessageType,
    encode_message,
)

from .nri_fixtures import STEP_TIMEOUT, RawPeer, run

SERVICE = "test.Echo"
RUNTIME = "test.Runtime"
KV: TypeAlias = ttrpc_pb2.KeyValue

#: A flood bound no test of other bounds reaches: these tests flood on purpose.
FLOODS = 1_000_000


class Handlers:
    """The service under test; records what the handlers saw."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.slow_started = asyncio.Event()
        self.contexts: list[CallContext] = []
        self.cancelled: list[str] = []

    def service(self) -> Service:
        async def echo(request: KV, ctx: CallContext) -> KV:
            self.contexts.append(ctx)
            return KV(key=request.key, value=request.value)

        async def empty(_request: api.Empty, ctx: CallContext) -> api.Empty:
            self.contexts.append(ctx)
            return api.Empty()

        async def fail(_request: KV, _ctx: CallContext) -> KV:
            raise RpcError(Code.NOT_FOUND, "no such thing")

        async def crash(_request: KV, _ctx: CallContext) -> KV:
            raise ValueError("boom")

        async def slow(_request: KV, _ctx: CallContext) -> KV:
            self.slow_started.set()
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled.append("Slow")
                raise
            return KV(key="slow")

        async def hang(_request: KV, ctx: CallContext) -> KV:
            self.contexts.append(ctx)
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        async def big(request: KV, _ctx: CallContext) -> KV:
            return KV(value="x" * int(request.value))

        return Service(
            SERVICE,
            {
                "Echo": Method(KV, echo),
                "Empty": Method(api.Empty, empty),
                "Fail": Method(KV, fail),
                "Crash": Method(KV, crash),
                "Slow": Method(KV, slow),
                "Hang": Method(KV, hang),
                "Big": Method(KV, big),
            },
        )


@asynccontextmanager
async def served(
    handlers: Handlers | None = None, on_idle: Callable[[], None] | None = None
) -> AsyncIterator[tuple[MuxConnection, RawPeer]]:
    """A MuxConnection serving `test.Echo` on conn 1 and calling on conn 2."""
    handlers = handlers or Handlers()
    peer, sock = await RawPeer.pair()
    conn = MuxConnection({SERVICE: handlers.service()}, name="test", on_idle=on_idle)
    await conn.attach(sock)
    try:
        yield conn, peer
    finally:
        conn.close("test over")
        peer.close()


def status_only(response: ttrpc_pb2.Response) -> tuple[int, str]:
    """(code, message) of an error reply, which must carry nothing else."""
    assert [f.name for f, _ in response.ListFields()] == ["status"]
    assert response.payload == b""
    assert not response.status.details
    return response.status.code, response.status.message


# ---------------------------------------------------------------------------
# Serving: unknown service / method (§1.5)
# ---------------------------------------------------------------------------


def test_unknown_service_is_unimplemented_with_go_text() -> None:
    async def scenario() -> None:
        async with served() as (_conn, peer):
            peer.send_request(1, 1, "nri.pkg.api.v1alpha1.Nope", "Configure")
            message, response = await peer.read_response(1)
            assert message.stream_id == 1
            assert status_only(response) == (12, "service nri.pkg.api.v1alpha1.Nope")
            expected = ttrpc_pb2.Response(
                status=rpc_status_pb2.Status(code=12, message="service nri.pkg.api.v1alpha1.Nope")
            ).SerializeToString()
            assert peer.frames[-1] == (
                1,
                encode_message(1, MessageType.RESPONSE, expected),
            )

    run(scenario())


def test_unknown_method_is_unimplemented_with_go_text() -> None:
    async def scenario() -> None:
        async with served() as (_conn, peer):
            peer.send_request(1, 3, SERVICE, "Foo")
            message, response = await peer.read_response(1)
            assert message.stream_id == 3
            assert status_only(response) == (12, "method Foo")
            # Byte-exact, as in reference §1.6.
            assert message.data.hex() == "0a0e080c120a" + b"method Foo".hex()

    run(scenario())


# ---------------------------------------------------------------------------
# Serving: success and error replies
# ---------------------------------------------------------------------------


def test_success_reply_has_no_status() -> None:
    async def scenario() -> None:
        async with served() as (_conn, peer):
            peer.send_request(1, 1, SERVICE, "Echo", KV(key="k", value="v"))
            message, response = await peer.read_response(1)
            assert message.stream_id == 1
            assert not response.HasField("status")
            assert KV.FromString(response.payload) == KV(key="k", value="v")
            assert (
                message.data
                == ttrpc_pb2.Response(
                    payload=KV(key="k", value="v").SerializeToString()
                ).SerializeToString()
            )

    run(scenario())


def test_empty_reply_is_a_zero_length_ttrpc_body() -> None:
    async def scenario() -> None:
        async with served() as (_conn, peer):
            peer.send_request(1, 1, SERVICE, "Empty")
            conn_id, payload = await peer.read_frame()
            # One mux frame of exactly a 10-byte ttrpc header with length 0.
            assert conn_id == 1
            assert payload == bytes.fromhex("00000000 00000001 02 00")

    run(scenario())


def test_rpc_error_becomes_status_with_empty_payload() -> None:
    async def scenario() -> None:
        async with served() as (_conn, peer):
            peer.send_request(1, 1, SERVICE, "Fail", KV(key="x"))
            message, response = await peer.read_response(1)
            assert message.stream_id == 1
            assert status_only(response) == (Code.NOT_FOUND, "no such thing")

    run(scenario())


def test_handler_exception_is_unknown_and_connection_survives() -> None:
    async def scenario() -> None:
        async with served() as (conn, peer):
            peer.send_request(1, 1, SERVICE, "Crash")
            _, response = await peer.read_response(1)
            code, text = status_only(response)
            assert code == Code.UNKNOWN
            assert "boom" in text
            peer.send_request(1, 3, SERVICE, "Echo", KV(key="again"))
            message, response = await peer.read_response(1)
            assert message.stream_id == 3
            assert KV.FromString(response.payload).key == "again"
            assert conn.close_reason is None

    run(scenario())


def test_undecodable_request_envelope_is_invalid_argument() -> None:
    async def scenario() -> None:
        async with served() as (conn, peer):
            peer.send(1, 1, MessageType.REQUEST, b"\xff\xff\xff")
            message, response = await peer.read_response(1)
            assert message.stream_id == 1
            code, text = status_only(response)
            assert code == Code.INVALID_ARGUMENT
            assert text.startswith("unmarshal request error: ")
            peer.send_request(1, 3, SERVICE, "Echo", KV(key="ok"))
            _, response = await peer.read_response(1)
            assert KV.FromString(response.payload).key == "ok"
            assert conn.close_reason is None

    run(scenario())


def test_undecodable_method_payload_is_invalid_argument() -> None:
    async def scenario() -> None:
        async with served() as (_conn, peer):
            peer.send_request(1, 1, SERVICE, "Echo", b"\x0a\x05ab")  # truncated string
            _, response = await peer.read_response(1)
            assert status_only(response)[0] == Code.INVALID_ARGUMENT

    run(scenario())


# ---------------------------------------------------------------------------
# Serving: concurrency, deadlines, metadata
# ---------------------------------------------------------------------------


def test_requests_are_served_concurrently() -> None:
    handlers = Handlers()

    async def scenario() -> None:
        async with served(handlers) as (_conn, peer):
            peer.send_request(1, 1, SERVICE, "Slow")
            async with asyncio.timeout(STEP_TIMEOUT):
                await handlers.slow_started.wait()
            peer.send_request(1, 3, SERVICE, "Echo", KV(key="fast"))
            message, response = await peer.read_response(1)
            assert message.stream_id == 3  # the fast reply overtakes the slow one
            assert KV.FromString(response.payload).key == "fast"
            handlers.gate.set()
            message, response = await peer.read_response(1)
            assert message.stream_id == 1
            assert KV.FromString(response.payload).key == "slow"

    run(scenario())


def test_on_idle_is_called_when_the_last_request_in_progress_is_answered() -> None:
    """What deferred work waits for (deferred.py): not after each reply, after the last one.

    A failed handler is answered too. At the hook, the reply is already
    written and the connection no longer busy.
    """
    handlers = Handlers()
    seen: list[tuple[int, bool]] = []
    conn_of: list[MuxConnection] = []

    def on_idle() -> None:
        (conn,) = conn_of
        seen.append((len(handlers.contexts), conn.busy()))

    async def scenario() -> None:
        async with served(handlers, on_idle) as (conn, peer):
            conn_of.append(conn)
            peer.send_request(1, 1, SERVICE, "Slow")
            async with asyncio.timeout(STEP_TIMEOUT):
                await handlers.slow_started.wait()
            peer.send_request(1, 3, SERVICE, "Echo", KV(key="fast"))
            await peer.read_response(1)
            assert seen == []  # the slow one is still in progress
            handlers.gate.set()
            await peer.read_response(1)
            assert seen == [(1, False)]
            peer.send_request(1, 5, SERVICE, "Crash")
            await peer.read_response(1)
            assert seen == [(1, False), (1, False)]

    run(scenario())


def test_timeout_nano_is_the_handler_deadline() -> None:
    handlers = Handlers()

    async def scenario() -> None:
        async with served(handlers) as (conn, peer):
            loop = asyncio.get_running_loop()
            start = loop.time()
            peer.send_request(1, 1, SERVICE, "Hang", timeout_nano=50_000_000)
            message, response = await peer.read_response(1)
            elapsed = loop.time() - start
            assert message.stream_id == 1
            code, _text = status_only(response)
            assert code == Code.DEADLINE_EXCEEDED
            # Not before the deadline; the upper bound only catches a deadline never applied.
            assert 0.04 <= elapsed < STEP_TIMEOUT
            assert handlers.contexts[0].timeout == pytest.approx(0.05)
            assert conn.close_reason is None

    run(scenario())


def test_no_timeout_nano_means_no_deadline() -> None:
    handlers = Handlers()

    async def scenario() -> None:
        async with served(handlers) as (_conn, peer):
            peer.send_request(1, 1, SERVICE, "Echo", KV(key="k"))
            await peer.read_response(1)
            assert handlers.contexts[0].timeout is None

    run(scenario())


def test_request_metadata_is_accepted_and_exposed() -> None:
    handlers = Handlers()
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    async def scenario() -> None:
        async with served(handlers) as (_conn, peer):
            peer.send_request(
                1,
                1,
                SERVICE,
                "Echo",
                KV(key="k"),
                timeout_nano=1_999_912_345,
                metadata=[
                    ("traceparent", traceparent),
                    ("tracestate", "a=1"),
                    ("tracestate", "b=2"),
                ],
            )
            _, response = await peer.read_response(1)
            assert not response.HasField("status")
            ctx = handlers.contexts[0]
            assert ctx.metadata == {"traceparent": (traceparent,), "tracestate": ("a=1", "b=2")}
            assert (ctx.service, ctx.method, ctx.stream_id) == (SERVICE, "Echo", 1)

    run(scenario())


# ---------------------------------------------------------------------------
# Serving: stream id rules and odd messages (§1.3)
# ---------------------------------------------------------------------------


def test_even_stream_id_is_rejected_with_go_text() -> None:
    async def scenario() -> None:
        async with served() as (_conn, peer):
            peer.send_request(1, 2, SERVICE, "Echo", KV(key="k"))
            message, response = await peer.read_response(1)
            assert message.stream_id == 2
            assert status_only(response) == (
                Code.INVALID_ARGUMENT,
                "StreamID must be odd for client initiated streams",
            )

    run(scenario())


def test_reused_or_decreasing_stream_id_is_rejected_with_go_text() -> None:
    handlers = Handlers()

    async def scenario() -> None:
        async with served(handlers) as (_conn, peer):
            peer.send_request(1, 5, SERVICE, "Echo", KV(key="first"))
            _, response = await peer.read_response(1)
            assert not response.HasField("status")
            for stale in (5, 3):
                peer.send_request(1, stale, SERVICE, "Echo", KV(key="again"))
                message, response = await peer.read_response(1)
                assert message.stream_id == stale
                assert status_only(response) == (
                    Code.INVALID_ARGUMENT,
                    "StreamID cannot be re-used and must increment",
                )
            peer.send_request(1, 7, SERVICE, "Echo", KV(key="next"))
            message, response = await peer.read_response(1)
            assert (message.stream_id, KV.FromString(response.payload).key) == (7, "next")
            assert [c.stream_id for c in handlers.contexts] == [5, 7]

    run(scenario())


def test_data_message_is_rejected_and_unknown_type_ignored() -> None:
    async def scenario() -> None:
        async with served() as (_conn, peer):
            peer.send(1, 1, MessageType.DATA, b"stray", flags=0x01)
            message, response = await peer.read_response(1)
            assert message.stream_id == 1
            assert status_only(response) == (
                Code.INVALID_ARGUMENT,
                "StreamID is no longer active",
            )
            peer.send(1, 3, 0x7F, b"future message type")
            peer.send_request(1, 5, SERVICE, "Echo", KV(key="k"))
            message, _ = await peer.read_response(1)
            assert message.stream_id == 5  # nothing was sent for stream 3

    run(scenario())


def test_oversized_request_gets_resource_exhausted_and_is_skipped() -> None:
    async def scenario() -> None:
        async with served() as (conn, peer):
            length = MESSAGE_LENGTH_MAX + 1
            peer.write(
                struct.pack(">II", 1, HEADER.size + length)
                + HEADER.pack(length, 1, MessageType.REQUEST, 0)
                + b"\x00" * length
            )
            peer.send_request(1, 3, SERVICE, "Echo", KV(key="after"))
            message, response = await peer.read_response(1)
            assert message.stream_id == 1
            assert status_only(response) == (
                Code.RESOURCE_EXHAUSTED,
                "message length 4194305 exceed maximum message size of 4194304",
            )
            message, response = await peer.read_response(1)
            assert (message.stream_id, KV.FromString(response.payload).key) == (3, "after")
            assert conn.close_reason is None

    run(scenario())


def test_frames_for_unknown_connections_are_dropped() -> None:
    async def scenario() -> None:
        async with served() as (_, peer):
            request = ttrpc_pb2.Request(service=SERVICE, method="Echo").SerializeToString()
            junk = encode_message(1, MessageType.REQUEST, request)
            peer.write(struct.pack(">II", 3, len(junk)) + junk)
            peer.write(struct.pack(">II", 0, 0))
            peer.send_request(1, 1, SERVICE, "Echo", KV(key="k"))
            # Answered: the junk's stream 1 was never seen (else this one would be a re-use).
            message, response = await peer.read_response(1)
            assert message.stream_id == 1 and not response.HasField("status")

    run(scenario())


# ---------------------------------------------------------------------------
# Serving: outbound framing
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("size", [5000, 3_000_000])
def test_large_reply_is_4096_then_one_remainder_frame(size: int) -> None:
    async def scenario() -> None:
        async with served() as (_conn, peer):
            peer.send_request(1, 1, SERVICE, "Big", KV(value=str(size)))
            first = await peer.read_frame()
            second = await peer.read_frame()
            body = ttrpc_pb2.Response(payload=KV(value="x" * size).SerializeToString())
            wire = encode_message(1, MessageType.RESPONSE, body.SerializeToString())
            assert first == (1, wire[:4096])
            assert second == (1, wire[4096:])
            _message, response = await peer.read_response(1)
            assert len(KV.FromString(response.payload).value) == size

    run(scenario())


def test_reply_of_exactly_4096_bytes_is_one_frame() -> None:
    async def scenario() -> None:
        async with served() as (_conn, peer):
            # Response{payload{value}}: 10 header + 2+2 + 1+2 overhead bytes.
            size = 4096 - 10 - 3 - 3
            peer.send_request(1, 1, SERVICE, "Big", KV(value=str(size)))
            conn_id, payload = await peer.read_frame()
            assert (conn_id, len(payload)) == (1, 4096)
            _, response = await peer.read_response(1)
            assert len(KV.FromString(response.payload).value) == size
            assert len(peer.frames) == 1

    run(scenario())


def test_each_message_goes_out_in_one_write() -> None:
    """Both frames of a large reply in one write(): concurrent replies cannot interleave."""

    async def scenario() -> list[bytes]:
        conn, transport = connected({SERVICE: Handlers().service()})
        request = ttrpc_pb2.Request(
            service=SERVICE, method="Big", payload=KV(value="9000").SerializeToString()
        ).SerializeToString()
        conn.data_received(frame_message(1, encode_message(1, MessageType.REQUEST, request)))
        request = ttrpc_pb2.Request(service=SERVICE, method="Empty").SerializeToString()
        conn.data_received(frame_message(1, encode_message(3, MessageType.REQUEST, request)))
        while len(transport.writes) < 2:
            await asyncio.sleep(0)
        conn.eof_received()
        await conn.wait_closed()
        return transport.writes

    writes = run(scenario())
    sizes = sorted([[len(p) for _, p in MuxDecoder(frozenset({1})).feed(w)] for w in writes])
    body = ttrpc_pb2.Response(payload=KV(value="x" * 9000).SerializeToString())
    assert sizes == [[10], [4096, HEADER.size + body.ByteSize() - 4096]]


def test_oversized_reply_fails_the_call_with_resource_exhausted() -> None:
    async def scenario() -> None:
        async with served() as (conn, peer):
            call = asyncio.create_task(conn.call(RUNTIME, "Do", KV(), KV))
            message, _ = await peer.read_request(2)
            length = MESSAGE_LENGTH_MAX + 1
            peer.write(
                struct.pack(">II", 2, HEADER.size + length)
                + HEADER.pack(length, message.stream_id, MessageType.RESPONSE, 0)
                + b"\x00" * length
            )
            with pytest.raises(RpcError) as info:
                await call
            assert info.value.code == Code.RESOURCE_EXHAUSTED
            assert conn.close_reason is None

    run(scenario())


# ---------------------------------------------------------------------------
# Closing
# ---------------------------------------------------------------------------


def test_garbage_closes_connection_and_fails_pending_calls() -> None:
    async def scenario() -> None:
        peer, sock = await RawPeer.pair()
        conn = MuxConnection({SERVICE: Handlers().service()})
        await conn.attach(sock)
        call = asyncio.create_task(conn.call(RUNTIME, "Do", KV(), KV))
        await peer.read_request(2)
        peer.write(b"\xff" * 16)  # a mux header declaring ~4 GiB
        with pytest.raises(ConnectionClosed):
            await call
        await conn.wait_closed()
        assert conn.close_reason is not None
        assert conn.close_reason.startswith("protocol error")
        assert conn.broken_by_peer
        assert await peer.read_eof() == b""  # and the socket is closed on our side
        with pytest.raises(ConnectionClosed):
            await conn.call(RUNTIME, "Do", KV(), KV)
        peer.close()

    run(scenario())


def test_truncated_frame_then_eof_closes_cleanly() -> None:
    handlers = Handlers()

    async def scenario() -> None:
        peer, sock = await RawPeer.pair()
        conn = MuxConnection({SERVICE: handlers.service()})
        await conn.attach(sock)
        peer.send_request(1, 1, SERVICE, "Slow")
        async with asyncio.timeout(STEP_TIMEOUT):
            await handlers.slow_started.wait()
        call = asyncio.create_task(conn.call(RUNTIME, "Do", KV(), KV))
        await peer.read_request(2)
        peer.write(struct.pack(">II", 1, 100) + b"only part")
        peer.writer.write_eof()
        with pytest.raises(ConnectionClosed):
            await call
        await conn.wait_closed()
        assert conn.close_reason == "closed by peer"
        await asyncio.sleep(0)
        assert handlers.cancelled == ["Slow"]  # in-flight handlers are cancelled
        with pytest.raises(ConnectionClosed):
            await conn.call(RUNTIME, "Do", KV(), KV)
        peer.close()

    run(scenario())


def test_local_close_fails_pending_calls_with_reason() -> None:
    async def scenario() -> None:
        async with served() as (conn, peer):
            call = asyncio.create_task(conn.call(RUNTIME, "Do", KV(), KV))
            await peer.read_request(2)
            conn.close("shutting down")
            with pytest.raises(ConnectionClosed, match="shutting down"):
                await call
            assert conn.close_reason == "shutting down"
            await conn.wait_closed()

    run(scenario())


# ---------------------------------------------------------------------------
# Calling the peer on conn 2
# ---------------------------------------------------------------------------


def test_calls_use_odd_increasing_stream_ids_and_match_replies() -> None:
    async def scenario() -> None:
        async with served() as (conn, peer):
            calls = [
                asyncio.create_task(conn.call(RUNTIME, "Do", KV(key=str(i)), KV, timeout=2.0))
                for i in range(3)
            ]
            requests = [await peer.read_request(2) for _ in calls]
            assert [m.stream_id for m, _ in requests] == [1, 3, 5]
            for _message, request in requests:
                assert (request.service, request.method) == (RUNTIME, "Do")
                assert request.timeout_nano == 2_000_000_000
                assert not request.metadata
            # Reply out of order: each call gets the reply on its own stream.
            for message, request in reversed(requests):
                key = KV.FromString(request.payload).key
                peer.send_response(2, message.stream_id, KV(key=key, value=f"reply-{key}"))
            results = await asyncio.gather(*calls)
            assert [r.value for r in results] == ["reply-0", "reply-1", "reply-2"]

    run(scenario())


def test_call_without_timeout_sends_zero_timeout_nano() -> None:
    async def scenario() -> None:
        async with served() as (conn, peer):
            call = asyncio.create_task(conn.call(RUNTIME, "Do", api.Empty(), api.Empty))
            message, request = await peer.read_request(2)
            assert request.timeout_nano == 0
            assert request.payload == b""
            peer.send_response(2, message.stream_id, raw=b"")  # a 0-length Response is OK
            assert await call == api.Empty()

    run(scenario())


def test_call_error_status_raises_rpc_error() -> None:
    async def scenario() -> None:
        async with served() as (conn, peer):
            call = asyncio.create_task(conn.call(RUNTIME, "Do", KV(), KV))
            message, _ = await peer.read_request(2)
            error = ttrpc_pb2.Response(status=rpc_status_pb2.Status(code=9, message="nope"))
            peer.send_response(2, message.stream_id, raw=error.SerializeToString())
            with pytest.raises(RpcError) as info:
                await call
            assert (info.value.code, info.value.message) == (Code.FAILED_PRECONDITION, "nope")

            call = asyncio.create_task(conn.call(RUNTIME, "Do", KV(), KV))
            message, _ = await peer.read_request(2)
            error = ttrpc_pb2.Response(status=rpc_status_pb2.Status(code=99, message="odd"))
            peer.send_response(2, message.stream_id, raw=error.SerializeToString())
            with pytest.raises(RpcError) as info:
                await call
            assert info.value.code == Code.UNKNOWN

    run(scenario())


def test_call_timeout_and_late_reply_is_ignored() -> None:
    async def scenario() -> None:
        async with served() as (conn, peer):
            with pytest.raises(RpcError) as info:
                await conn.call(RUNTIME, "Do", KV(), KV, timeout=0.05)
            assert info.value.code == Code.DEADLINE_EXCEEDED
            late, _ = await peer.read_request(2)
            peer.send_response(2, late.stream_id, KV(key="late"))
            call = asyncio.create_task(conn.call(RUNTIME, "Do", KV(), KV))
            message, _ = await peer.read_request(2)
            assert message.stream_id == late.stream_id + 2
            peer.send_response(2, message.stream_id, KV(key="on time"))
            assert (await call).key == "on time"
            assert conn.close_reason is None

    run(scenario())


def test_large_request_is_4096_then_one_remainder_frame() -> None:
    async def scenario() -> None:
        async with served() as (conn, peer):
            call = asyncio.create_task(conn.call(RUNTIME, "Do", KV(value="y" * 20_000), KV))
            first = await peer.read_frame()
            second = await peer.read_frame()
            assert (first[0], len(first[1])) == (2, 4096)
            assert second[0] == 2
            message, request = await peer.read_request(2)
            assert len(first[1]) + len(second[1]) == HEADER.size + len(message.data)
            assert KV.FromString(request.payload).value == "y" * 20_000
            peer.send_response(2, message.stream_id, KV())
            await call

    run(scenario())


# ---------------------------------------------------------------------------
# A transport that keeps every write (the fuzz test is now pure: test_wire_connection.py)
# ---------------------------------------------------------------------------


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()
        self.writes: list[bytes] = []
        self.closed = False
        self.reading = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed
        self.data += data
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def is_reading(self) -> bool:
        return self.reading and not self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def connected(
    services: dict[str, Service], **options: Any
) -> tuple[MuxConnection, RecordingTransport]:
    """A connection on a transport that records what it is given; its input is fed by hand."""
    conn = MuxConnection(services, **options)
    transport = RecordingTransport()
    conn.connection_made(transport)
    return conn, transport


# ---------------------------------------------------------------------------
# Starvation
# ---------------------------------------------------------------------------


def test_a_flood_of_tiny_messages_does_not_starve_a_request_before_it() -> None:
    """One read of 5,000 empty messages: the reader yields between them.

    The request that came first is answered while the flood is still being
    refused, not after it (before the fix its handler never even ran: the
    whole flood was handled in one go, then EOF cancelled it).
    """

    async def scenario() -> RecordingTransport:
        conn, transport = connected(
            {SERVICE: Handlers().service()}, max_violations_per_second=FLOODS
        )
        echo = ttrpc_pb2.Request(
            service=SERVICE, method="Echo", payload=KV(key="first").SerializeToString()
        ).SerializeToString()
        # Even stream ids: each message of the flood is refused on the spot.
        flood = b"".join(HEADER.pack(0, 2, MessageType.REQUEST, 0) for _ in range(5000))
        conn.data_received(
            frame_message(1, encode_message(1, MessageType.REQUEST, echo))
            + struct.pack(">II", 1, len(flood))
            + flood
        )
        conn.eof_received()
        await conn.wait_closed()
        return transport

    transport = run(scenario())
    decoder = MessageDecoder()
    streams = [
        m.stream_id
        for _, payload in MuxDecoder(frozenset({1})).feed(bytes(transport.data))
        for m in decoder.feed(payload)
    ]
    assert len(streams) == 5001
    assert streams.index(1) < 5000 - 64


def replies(transport: RecordingTransport) -> int:
    frames = MuxDecoder(frozenset({1})).feed(bytes(transport.data))
    decoder = MessageDecoder()
    return sum(len(decoder.feed(payload)) for _, payload in frames)


def test_replies_the_peer_does_not_read_stop_the_reading() -> None:
    """Bounded output: while the transport is over its high-water mark, no more is read."""

    async def scenario() -> None:
        conn, transport = connected(
            {SERVICE: Handlers().service()}, max_violations_per_second=FLOODS
        )
        conn.pause_writing()
        flood = b"".join(HEADER.pack(0, 2, MessageType.REQUEST, 0) for _ in range(1000))
        conn.data_received(struct.pack(">II", 1, len(flood)) + flood)
        for _ in range(20):
            await asyncio.sleep(0)
        # One turn's worth of answers, then waiting for the peer to read.
        assert replies(transport) == 64
        assert not transport.reading
        conn.resume_writing()
        for _ in range(20):
            await asyncio.sleep(0)
        assert replies(transport) == 1000
        assert transport.reading  # the backlog is done: the next bytes are welcome
        conn.eof_received()
        assert conn.close_reason == "closed by peer"

    run(scenario())


def test_busy_while_a_request_is_received_and_not_yet_dispatched() -> None:
    """What deferred work asks before each piece (deferred.py), from the connection's
    own state: part of a request, or a request behind a turn's worth of messages."""
    handlers = Handlers()

    async def scenario() -> None:
        conn, transport = connected({SERVICE: handlers.service()}, max_violations_per_second=FLOODS)
        echo = ttrpc_pb2.Request(service=SERVICE, method="Echo").SerializeToString()
        request = frame_message(1, encode_message(1, MessageType.REQUEST, echo))
        assert not conn.busy()
        conn.data_received(request[:-1])
        assert conn.busy() and not handlers.contexts
        conn.data_received(request[-1:])
        # A handler that waits for nothing is served and answered in the same step.
        assert replies(transport) == 1 and handlers.contexts
        assert not conn.busy()

        refused = b"".join(
            HEADER.pack(0, 2, MessageType.REQUEST, 0) for _ in range(MESSAGES_PER_TURN)
        )
        echo_3 = frame_message(1, encode_message(3, MessageType.REQUEST, echo))
        conn.data_received(struct.pack(">II", 1, len(refused)) + refused + echo_3)
        assert conn.refused == MESSAGES_PER_TURN and len(handlers.contexts) == 1
        assert conn.busy()
        while replies(transport) < MESSAGES_PER_TURN + 2:
            await asyncio.sleep(0)
        assert len(handlers.contexts) == 2
        assert not conn.busy()

    run(scenario())


def test_handlers_are_served_in_the_step_that_reads_them_and_keep_their_context() -> None:
    """One read, one dispatch, one write: a handler that waits for nothing needs no task;
    one that waits goes on in a task from where it stopped, as often as it waits, under
    its deadline. What either sets in a context variable stays its own, as in a task."""
    seen = contextvars.ContextVar("seen", default="none")
    steps: list[str] = []

    async def at_once(request: KV, _ctx: CallContext) -> KV:
        seen.set(request.key)
        return KV(key=seen.get())

    async def in_steps(request: KV, _ctx: CallContext) -> KV:
        seen.set(request.key)
        for step in range(3):
            await asyncio.sleep(0)
            steps.append(f"{seen.get()}-{step}")
        await asyncio.sleep(10)  # past the deadline
        return KV(key="unreachable")

    service = Service(SERVICE, {"AtOnce": Method(KV, at_once), "InSteps": Method(KV, in_steps)})

    async def scenario() -> None:
        conn, transport = connected({SERVICE: service})
        tasks = len(asyncio.all_tasks())

        def request(stream_id: int, method: str, key: str, timeout_nano: int = 0) -> bytes:
            envelope = ttrpc_pb2.Request(
                service=SERVICE,
                method=method,
                payload=KV(key=key).SerializeToString(),
                timeout_nano=timeout_nano,
            ).SerializeToString()
            return frame_message(1, encode_message(stream_id, MessageType.REQUEST, envelope))

        conn.data_received(request(1, "AtOnce", "a"))
        assert replies(transport) == 1 and len(asyncio.all_tasks()) == tasks
        before = asyncio.all_tasks()
        conn.data_received(request(3, "InSteps", "b", timeout_nano=50_000_000))
        assert replies(transport) == 1 and len(asyncio.all_tasks()) == tasks + 1
        assert seen.get() == "none"
        # The handler's task ends with its reply, once its deadline has passed.
        await asyncio.wait(asyncio.all_tasks() - before, timeout=STEP_TIMEOUT)
        assert replies(transport) == 2
        assert steps == ["b-0", "b-1", "b-2"]
        assert seen.get() == "none"
        frames = MuxDecoder(frozenset({1})).feed(bytes(transport.data))
        decoder = MessageDecoder()
        answers = [m for _, payload in frames for m in decoder.feed(payload)]
        first, second = (ttrpc_pb2.Response.FromString(m.data) for m in answers)  # type: ignore[union-attr]
        assert KV.FromString(first.payload).key == "a"
        assert second.status.code == Code.DEADLINE_EXCEEDED
        assert not conn.busy()

    run(scenario())


def test_nothing_more_is_served_once_a_handler_closes_the_connection() -> None:
    """Handlers run in the read's dispatch: one that closes the connection ends it there."""
    served: list[str] = []
    conns: list[MuxConnection] = []

    async def close(request: KV, _ctx: CallContext) -> KV:
        served.append(request.key)
        conns[0].close("closed by a handler")
        return KV()

    service = Service(SERVICE, {"Close": Method(KV, close)})

    async def scenario() -> None:
        conn, _transport = connected({SERVICE: service})
        conns.append(conn)
        data = b"".join(
            frame_message(
                1,
                encode_message(
                    stream_id,
                    MessageType.REQUEST,
                    ttrpc_pb2.Request(
                        service=SERVICE, method="Close", payload=KV(key=key).SerializeToString()
                    ).SerializeToString(),
                ),
            )
            for stream_id, key in ((1, "first"), (3, "second"))
        )
        conn.data_received(data)
        assert served == ["first"]
        assert conn.close_reason == "closed by a handler"

    run(scenario())


def test_a_flood_of_bad_messages_logs_once_and_counts() -> None:
    """Log volume is bounded: the first refusal and the first ignored message, then totals."""

    async def scenario() -> MuxConnection:
        conn, _transport = connected(
            {SERVICE: Handlers().service()}, max_violations_per_second=FLOODS
        )
        refused = b"".join(HEADER.pack(0, 2, MessageType.REQUEST, 0) for _ in range(1000))
        stray = b"".join(HEADER.pack(0, 7, MessageType.RESPONSE, 0) for _ in range(1000))
        conn.data_received(
            struct.pack(">II", 1, len(refused))
            + refused
            + struct.pack(">II", 2, len(stray))
            + stray
        )
        conn.eof_received()
        await conn.wait_closed()
        return conn

    with structlog.testing.capture_logs() as logs:
        conn = run(scenario())
    assert (conn.refused, conn.ignored) == (1000, 1000)
    events = [e["event"] for e in logs]
    assert events.count("request refused") == 1
    assert events.count("message ignored") == 1
    (summary,) = [
        e
        for e in logs
        if e["event"] == "connection closed after refusing requests or ignoring messages"
    ]
    assert (summary["requests_refused"], summary["messages_ignored"]) == (1000, 1000)


# ---------------------------------------------------------------------------
# Bounds driven past, through the asyncio layer
# ---------------------------------------------------------------------------


def test_requests_in_flight_past_the_bound_get_resource_exhausted() -> None:
    handlers = Handlers()

    async def scenario() -> None:
        async with served(handlers) as (_conn, peer):
            for i in range(MAX_REQUESTS_IN_FLIGHT + 1):
                peer.send_request(1, 2 * i + 1, SERVICE, "Hang")
            message, response = await peer.read_response(1)
            assert message.stream_id == 2 * MAX_REQUESTS_IN_FLIGHT + 1
            assert response.status.code == Code.RESOURCE_EXHAUSTED
            assert len(handlers.contexts) <= MAX_REQUESTS_IN_FLIGHT  # no task for it

    run(scenario())


def test_calls_pending_past_the_bound_fail_with_rpc_error() -> None:
    async def scenario() -> None:
        async with served() as (conn, _peer):
            calls = [
                asyncio.create_task(conn.call(RUNTIME, "Do", KV(), KV, timeout=5.0))
                for _ in range(MAX_PENDING_CALLS)
            ]
            await asyncio.sleep(0)
            with pytest.raises(RpcError) as info:
                await conn.call(RUNTIME, "Do", KV(), KV, timeout=5.0)
            assert info.value.code == Code.RESOURCE_EXHAUSTED
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            # Cancelled calls free their slots.
            late = asyncio.create_task(conn.call(RUNTIME, "Do", KV(), KV, timeout=0.01))
            with pytest.raises(RpcError) as info:
                await late
            assert info.value.code == Code.DEADLINE_EXCEEDED

    run(scenario())
