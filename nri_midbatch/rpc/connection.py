"""One socket, two logical ttrpc connections over NRI's mux.

A plugin serves the Plugin service on mux connection 1 and calls the Runtime
service on connection 2; a runtime does the reverse. `MuxConnection` takes the
two connection ids as parameters so the test and replay runtimes reuse it with
the roles swapped. Requests are served concurrently, one task each, and every
reply is written as one `write()` so frames of concurrent replies never
interleave.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TypeVar

import structlog
from google.protobuf.message import DecodeError, Message

from nri_midbatch.api import rpc_status_pb2, ttrpc_pb2
from nri_midbatch.rpc.errors import ConnectionClosed, RpcError
from nri_midbatch.rpc.service import CallContext, Method, Service
from nri_midbatch.wire.errors import OversizedMessageError, ProtocolError
from nri_midbatch.wire.mux import (
    PLUGIN_SERVICE_CONN,
    RUNTIME_SERVICE_CONN,
    MuxDecoder,
    frame_ttrpc,
)
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

log = structlog.get_logger(__name__)

ResponseT = TypeVar("ResponseT", bound=Message)

READ_CHUNK = 256 * 1024
# A serialized empty Response: success with an empty payload.
EMPTY_RESPONSE = b""


class MuxConnection:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        services: Mapping[str, Service],
        *,
        server_conn: int = PLUGIN_SERVICE_CONN,
        client_conn: int = RUNTIME_SERVICE_CONN,
        name: str = "nri",
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._services = services
        self._server_conn = server_conn
        self._client_conn = client_conn
        self._log = log.bind(connection=name)
        self._mux = MuxDecoder(frozenset((server_conn, client_conn)))
        self._server_decoder = MessageDecoder()
        self._client_decoder = MessageDecoder()
        self._stream_check = StreamCheck()
        self._stream_ids = StreamIds()
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._handlers: set[asyncio.Task[None]] = set()
        self._closed = asyncio.Event()
        self.close_reason: str | None = None

    # -- lifecycle -----------------------------------------------------------

    async def run(self) -> None:
        """Read and dispatch until the socket closes or the peer breaks protocol."""
        reason = "closed by peer"
        try:
            while not self._closed.is_set():
                data = await self._reader.read(READ_CHUNK)
                if not data:
                    break
                self._receive(data)
        except ProtocolError as exc:
            reason = f"protocol error: {exc}"
            self._log.warning("dropping connection", reason=reason)
        except (ConnectionError, OSError) as exc:
            reason = f"socket error: {exc}"
        finally:
            self._shutdown(reason)

    def close(self, reason: str = "closed locally") -> None:
        self._shutdown(reason)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    @property
    def is_closed(self) -> bool:
        return self._closed.is_set()

    @property
    def dropped_frames(self) -> int:
        return self._mux.dropped_frames

    def _shutdown(self, reason: str) -> None:
        if self._closed.is_set():
            return
        self.close_reason = reason
        self._closed.set()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionClosed(reason))
        self._pending.clear()
        for task in self._handlers:
            task.cancel()
        self._writer.close()

    # -- receiving -----------------------------------------------------------

    def _receive(self, data: bytes) -> None:
        for conn_id, payload in self._mux.feed(data):
            if conn_id == self._server_conn:
                for event in self._server_decoder.feed(payload):
                    self._on_server_event(event)
            else:
                for event in self._client_decoder.feed(payload):
                    self._on_client_event(event)

    def _on_server_event(self, event: TtrpcMessage | OversizedMessage) -> None:
        if isinstance(event, OversizedMessage):
            self._log.warning(
                "oversized request discarded", stream_id=event.stream_id, length=event.length
            )
            self._reply_status(event.stream_id, Code.RESOURCE_EXHAUSTED, event.error_text)
            return
        if event.type == MessageType.DATA:
            # Every NRI call is unary: no stream is ever open for data.
            self._reply_status(
                event.stream_id, Code.INVALID_ARGUMENT, "StreamID is no longer active"
            )
            return
        if event.type != MessageType.REQUEST:
            return  # the Go server ignores message types it does not know
        violation = self._stream_check.check(event.stream_id)
        if violation is not None:
            self._reply_status(event.stream_id, Code.INVALID_ARGUMENT, violation)
            return
        try:
            request = ttrpc_pb2.Request.FromString(event.data)
        except DecodeError as exc:
            self._reply_status(
                event.stream_id, Code.INVALID_ARGUMENT, f"unmarshal request error: {exc}"
            )
            return
        service = self._services.get(request.service)
        if service is None:
            self._reply_status(event.stream_id, Code.UNIMPLEMENTED, f"service {request.service}")
            return
        method = service.methods.get(request.method)
        if method is None:
            self._reply_status(event.stream_id, Code.UNIMPLEMENTED, f"method {request.method}")
            return
        task = asyncio.create_task(self._serve(event.stream_id, request, method))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    def _on_client_event(self, event: TtrpcMessage | OversizedMessage) -> None:
        fut = self._pending.get(event.stream_id)
        if fut is None or fut.done():
            self._log.warning("reply for no pending call", stream_id=event.stream_id)
            return
        if isinstance(event, OversizedMessage):
            fut.set_exception(RpcError(Code.RESOURCE_EXHAUSTED, event.error_text))
        elif event.type == MessageType.RESPONSE:
            fut.set_result(event.data)
        else:
            fut.set_exception(
                ProtocolError(f"message type {event.type} where a response was expected")
            )

    # -- serving -------------------------------------------------------------

    async def _serve(self, stream_id: int, request: ttrpc_pb2.Request, method: Method) -> None:
        timeout = request.timeout_nano / 1e9 if request.timeout_nano > 0 else None
        metadata: dict[str, tuple[str, ...]] = {}
        for kv in request.metadata:
            metadata[kv.key] = (*metadata.get(kv.key, ()), kv.value)
        context = CallContext(request.service, request.method, stream_id, timeout, metadata)
        try:
            message = method.request_type.FromString(request.payload)
        except DecodeError as exc:
            self._reply_status(
                stream_id, Code.INVALID_ARGUMENT, f"unmarshal {request.method} payload: {exc}"
            )
            return
        try:
            async with asyncio.timeout(timeout):
                reply = await method.handler(message, context)
        except RpcError as exc:
            self._reply_status(stream_id, exc.code, exc.message)
            return
        except TimeoutError:
            self._reply_status(stream_id, Code.DEADLINE_EXCEEDED, "context deadline exceeded")
            return
        except Exception as exc:  # a handler bug must cost one reply, not the connection
            self._log.exception("handler failed", method=request.method)
            self._reply_status(stream_id, Code.UNKNOWN, f"{type(exc).__name__}: {exc}")
            return
        # No await from here to the write: work the handler left for after its
        # reply (after_reply.py) must find the reply already on its way.
        payload = reply.SerializeToString()
        # Success replies carry no status, as the Go server's do; an empty reply
        # message makes the whole Response zero bytes.
        data = _response_with_payload(payload) if payload else EMPTY_RESPONSE
        try:
            self._send(self._server_conn, stream_id, MessageType.RESPONSE, data)
        except OversizedMessageError as exc:
            self._log.error("reply too large", method=request.method, error=str(exc))
            self._reply_status(stream_id, Code.RESOURCE_EXHAUSTED, str(exc))

    def _reply_status(self, stream_id: int, code: Code, message: str) -> None:
        # Errors carry an empty payload: the Go client decodes the payload
        # before it looks at the status.
        response = ttrpc_pb2.Response(status=rpc_status_pb2.Status(code=code, message=message))
        self._send(self._server_conn, stream_id, MessageType.RESPONSE, response.SerializeToString())

    # -- calling -------------------------------------------------------------

    async def call(
        self,
        service: str,
        method: str,
        request: Message,
        response_type: type[ResponseT],
        *,
        timeout: float | None = None,
    ) -> ResponseT:
        """Call `service.method` on the peer; raises RpcError or ConnectionClosed."""
        if self._closed.is_set():
            raise ConnectionClosed(self.close_reason or "closed")
        stream_id = self._stream_ids.allocate()
        envelope = ttrpc_pb2.Request(
            service=service,
            method=method,
            payload=request.SerializeToString(),
            timeout_nano=int(timeout * 1e9) if timeout else 0,
        )
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = fut
        try:
            self._send(
                self._client_conn, stream_id, MessageType.REQUEST, envelope.SerializeToString()
            )
            async with asyncio.timeout(timeout):
                data = await fut
        except TimeoutError:
            raise RpcError(
                Code.DEADLINE_EXCEEDED, f"{method}: no reply within {timeout}s"
            ) from None
        finally:
            self._pending.pop(stream_id, None)
        response = ttrpc_pb2.Response.FromString(data)
        if response.HasField("status") and response.status.code != Code.OK:
            raise RpcError(_code(response.status.code), response.status.message)
        return response_type.FromString(response.payload)

    # -- sending -------------------------------------------------------------

    def _send(self, conn_id: int, stream_id: int, msg_type: MessageType, data: bytes) -> None:
        if self._closed.is_set():
            return
        self._writer.write(frame_ttrpc(conn_id, stream_id, msg_type, data))


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
