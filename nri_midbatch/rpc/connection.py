"""One socket, two logical ttrpc connections over NRI's mux: the asyncio pump.

The protocol lives in `nri_midbatch.wire.connection`; this module moves bytes
between the socket and it, runs one task per request, and turns call outcomes
into results or exceptions. A plugin serves the Plugin service on mux
connection 1 and calls the Runtime service on connection 2; a runtime does the
reverse, so the connection ids are parameters (the test and replay runtimes
reuse this class with the roles swapped). Every reply is written as one
`write()` so frames of concurrent replies never interleave.
"""

from __future__ import annotations

import asyncio
import select
import time
from collections.abc import Callable, Mapping
from typing import TypeVar, cast

import structlog
from google.protobuf.message import Message

from nri_midbatch.rpc.errors import ConnectionClosed, RpcError, error_status
from nri_midbatch.rpc.service import CallContext, Service
from nri_midbatch.wire import connection as wire
from nri_midbatch.wire.errors import LocalProtocolError, RemoteProtocolError
from nri_midbatch.wire.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN
from nri_midbatch.wire.status import Code

log = structlog.get_logger(__name__)

ResponseT = TypeVar("ResponseT", bound=Message)

READ_CHUNK = 256 * 1024
#: Messages handled between two yields to the event loop. One read can hold
#: tens of thousands of tiny messages; handling them all in one go would keep
#: every other task (handlers, replies, cgroup writes, health) waiting.
MESSAGES_PER_TURN = 64

_Outcome = asyncio.Future[Message]


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
        on_idle: Callable[[], None] | None = None,
        max_violations_per_second: int = wire.MAX_VIOLATIONS_PER_SECOND,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """on_idle: called when the last request in progress has been answered.

        max_violations_per_second, clock: the flood bound (see wire.connection).
        """
        self._reader = reader
        self._writer = writer
        self._services = services
        self._log = log.bind(connection=name)
        self._wire: wire.Connection[_Outcome] = wire.Connection(
            {
                name: {method: m.request_type for method, m in service.methods.items()}
                for name, service in services.items()
            },
            server_conn=server_conn,
            client_conn=client_conn,
            max_violations_per_second=max_violations_per_second,
            clock=clock,
        )
        self._handlers: set[asyncio.Task[None]] = set()
        self._closed = asyncio.Event()
        #: True from a read's return until its messages are dispatched.
        self._dispatching = False
        #: Requests dispatched and not yet answered.
        self._serving = 0
        self._on_idle = on_idle
        self.close_reason: str | None = None
        #: The connection was dropped because the peer broke the protocol
        #: (framing garbage, or a flood of refused or ignored messages).
        self.broken_by_peer = False
        #: Writes to the peer so far: each may have woken a runtime thread onto
        #: this process's core, which deferred work then gives way to (plugin/deferred.py).
        self.writes = 0
        #: Requests the wire layer answered itself, and messages it ignored; only
        #: the first of each is logged, the totals when the connection closes.
        self.refused = 0
        self.ignored = 0

    # -- lifecycle -----------------------------------------------------------

    async def run(self) -> None:
        """Read and dispatch until the socket closes or the peer breaks protocol."""
        reason = "closed by peer"
        try:
            while not self._closed.is_set():
                data = await self._reader.read(READ_CHUNK)
                if not data:
                    break
                self._dispatching = True
                self._wire.receive_data(data)
                await self._dispatch()
                self._dispatching = False
        except RemoteProtocolError as exc:
            reason = f"protocol error: {exc}"
            self.broken_by_peer = True
            self._log.warning("dropping connection", reason=reason)
        except (ConnectionError, OSError) as exc:
            reason = f"socket error: {exc}"
        finally:
            self._shutdown(reason)

    async def _dispatch(self) -> None:
        handled = 0
        # Answers the wire layer made itself go out together, once per turn:
        # one write (and syscall) per turn rather than one per message.
        answers: list[bytes] = []
        while not self._closed.is_set() and (event := self._wire.next_event()) is not None:
            if isinstance(event, wire.Refused):
                self._note_refused(event)
                answers.append(event.data)
            else:
                self._on_event(event)
            handled += 1
            if handled % MESSAGES_PER_TURN == 0:
                self._write(b"".join(answers))
                answers.clear()
                await asyncio.sleep(0)
                # Replies pile up in the transport if the peer does not read
                # them; stop reading until it does (asyncio's high-water mark).
                await self._writer.drain()
        self._write(b"".join(answers))

    def close(self, reason: str = "closed locally") -> None:
        self._shutdown(reason)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    def busy(self) -> bool:
        """A request is being served or read, or bytes wait on the socket.

        Asked by work deferred after replies (plugin/deferred.py) before each piece,
        so that an arriving request does not wait behind it. Costs one
        zero-timeout poll of the socket (about 2 us).
        """
        if self._closed.is_set():
            return False
        if self._serving or self._dispatching:
            return True
        # Bytes the transport has read that the reader task has not taken yet:
        # uvloop reads the socket before it runs ready callbacks, so a request
        # is often there and not on the socket. StreamReader has no public way
        # to ask (its buffer is a bytearray).
        if getattr(self._reader, "_buffer", None):
            return True
        sock = self._writer.get_extra_info("socket")
        if sock is None:
            return False
        try:
            readable, _, _ = select.select((sock,), (), (), 0)
        except (OSError, ValueError):  # closed under us: nothing to wait for
            return False
        return bool(readable)

    def _shutdown(self, reason: str) -> None:
        if self._closed.is_set():
            return
        self.close_reason = reason
        self._closed.set()
        if self.refused > 1 or self.ignored > 1:
            self._log.warning(
                "connection closed after refusing requests or ignoring messages",
                requests_refused=self.refused,
                messages_ignored=self.ignored,
            )
        for fut in self._wire.close():
            if not fut.done():
                fut.set_exception(ConnectionClosed(reason))
        for task in self._handlers:
            task.cancel()
        self._writer.close()

    # -- receiving -----------------------------------------------------------

    def _on_event(self, event: wire.Event[_Outcome]) -> None:
        match event:
            case wire.Request():
                self._serving += 1
                task = asyncio.create_task(
                    self._serve(event, self._services[event.envelope.service])
                )
                self._handlers.add(task)
                task.add_done_callback(self._handlers.discard)
            case wire.CallSucceeded():
                if not event.token.done():
                    event.token.set_result(event.reply)
            case wire.CallFailed():
                if not event.token.done():
                    event.token.set_exception(RpcError(event.code, event.message))
            case wire.Dropped():
                self.ignored += 1
                if self.ignored == 1:
                    self._log.warning(
                        "message ignored", stream_id=event.stream_id, reason=event.reason
                    )

    def _note_refused(self, event: wire.Refused) -> None:
        self.refused += 1
        if self.refused == 1:  # a peer can send millions: the rest are counted
            self._log.warning(
                "request refused",
                stream_id=event.stream_id,
                code=event.code.name,
                message=event.message,
            )

    # -- serving -------------------------------------------------------------

    async def _serve(self, event: wire.Request, service: Service) -> None:
        request = event.envelope
        timeout = request.timeout_nano / 1e9 if request.timeout_nano > 0 else None
        metadata: dict[str, tuple[str, ...]] = {}
        for kv in request.metadata:
            metadata[kv.key] = (*metadata.get(kv.key, ()), kv.value)
        context = CallContext(
            request.service, request.method, event.stream_id, timeout, event.payload_size, metadata
        )
        try:
            async with asyncio.timeout(timeout):
                reply = await service.call(event.message, context)
        except Exception as exc:  # a handler's failure costs one reply, not the connection
            if not isinstance(exc, RpcError | TimeoutError):
                self._log.exception("handler failed", method=request.method)
            code, message = error_status(exc)
            self._write(self._wire.reply_status(event.stream_id, code, message))
            return
        else:
            # No await from here to the write: work the handler left for after
            # its reply (plugin/deferred.py) must find the reply already on its way.
            self._write(self._wire.reply(event.stream_id, reply))
        finally:
            # Served once its reply is written, in the same step (see busy()),
            # not when the task's done callbacks run a turn later.
            self._serving -= 1
            if not self._serving and not self._dispatching and self._on_idle is not None:
                self._on_idle()

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
        """Call `service.method` on the peer.

        Raises RpcError or ConnectionClosed, and nothing else, whatever the
        peer sends back (or fails to): a reply that is not a decodable
        `response_type` is an RpcError, no reply within `timeout` is
        DEADLINE_EXCEEDED.
        """
        if self._closed.is_set():
            raise ConnectionClosed(self.close_reason or "closed")
        fut: _Outcome = asyncio.get_running_loop().create_future()
        try:
            stream_id, data = self._wire.call(
                service,
                method,
                request,
                response_type,
                fut,
                timeout_nano=int(timeout * 1e9) if timeout else 0,
            )
        except LocalProtocolError as exc:
            raise RpcError(exc.status_hint, str(exc)) from None
        self._write(data)
        try:
            async with asyncio.timeout(timeout):
                reply = await fut
        except TimeoutError:
            raise RpcError(
                Code.DEADLINE_EXCEEDED, f"{method}: no reply within {timeout}s"
            ) from None
        finally:
            self._wire.forget_call(stream_id)
        return cast(ResponseT, reply)

    # -- sending -------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if data and not self._closed.is_set():
            self._writer.write(data)
            self.writes += 1
