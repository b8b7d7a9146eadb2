"""One socket, two logical ttrpc connections over NRI's mux: an asyncio.Protocol.

The protocol's rules live in `nri_midbatch.wire.connection`; this module feeds
it what the transport receives, serves each request in the step that reads
it (a task only for a handler that waits), writes what it answers, and turns
call outcomes into results or exceptions. A plugin serves the Plugin service
on mux connection 1 and calls the Runtime service on connection 2; a runtime
does the reverse, so the connection ids are parameters (the test and replay
runtimes reuse this class with the roles swapped). Every reply is written as one
`write()` so frames of concurrent replies never interleave.
"""

from __future__ import annotations

import asyncio
import contextvars
import select
import socket
import time
from collections.abc import Callable, Generator, Mapping
from typing import Any, TypeVar, cast

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

#: Messages handled between two yields to the event loop. One read can hold
#: tens of thousands of tiny messages; handling them all in one go would keep
#: every other task (handlers, replies, cgroup writes, health) waiting.
MESSAGES_PER_TURN = 64

_Outcome = asyncio.Future[Message]


class MuxConnection(asyncio.Protocol):
    def __init__(
        self,
        services: Mapping[str, Service],
        *,
        server_conn: int = PLUGIN_SERVICE_CONN,
        client_conn: int = RUNTIME_SERVICE_CONN,
        name: str = "nri",
        on_idle: Callable[[], None] | None = None,
        max_violations_per_second: int = wire.MAX_VIOLATIONS_PER_SECOND,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """on_idle: called when the last request in progress has been answered. The hook of
        the connection's owner (the session, which rpc/ may not import), not an observer:
        the session tells its observers in turn (`SessionObserver.idle`).

        max_violations_per_second, clock: the flood bound (see wire.connection).
        The connection serves once a transport is made for it: `attach` (a
        connected socket) or the loop's own `connection_made`.
        """
        self._transport: asyncio.Transport | None = None
        self._fileno = -1  # the socket's, for busy()
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
        #: `_closed.is_set()` as a plain attribute: asked several times a request, where
        #: the Event's method would be a Python call each time.
        self._ended = False
        #: Messages received and not yet dispatched wait for a later turn; reading
        #: is paused meanwhile, so what is held stays one read's worth.
        self._backlog = False
        self._next_turn: asyncio.Handle | None = None
        #: The peer does not read what we write (the transport's high-water mark).
        self._writing_paused = False
        #: The peer has closed its end; we do once the backlog is dispatched.
        self._eof = False
        #: Requests dispatched and not yet answered.
        self._serving = 0
        self._on_idle = on_idle
        self.close_reason: str | None = None
        #: The connection was dropped because the peer broke the protocol
        #: (framing garbage, or a flood of refused or ignored messages).
        self.broken_by_peer = False
        #: Writes to the peer so far: each may have woken a runtime thread onto
        #: this process's core, which deferred work then gives way to (deferred.py).
        self.writes = 0
        #: Requests the wire layer answered itself, and messages it ignored; only
        #: the first of each is logged, the totals when the connection closes.
        self.refused = 0
        self.ignored = 0

    # -- lifecycle -----------------------------------------------------------

    async def attach(self, sock: socket.socket) -> None:
        """Serve over the connected socket `sock`, which the connection then owns."""
        try:
            await asyncio.get_running_loop().connect_accepted_socket(lambda: self, sock)
        except BaseException:
            sock.close()
            raise

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        self._fileno = -1 if sock is None else sock.fileno()

    def data_received(self, data: bytes) -> None:
        try:
            self._wire.receive_data(data)
        except RemoteProtocolError as exc:
            self._broken(exc)
            return
        if not self._backlog:  # else its next turn takes these messages too
            self._dispatch()

    def eof_received(self) -> bool:
        self._eof = True
        if not self._backlog:
            self._shutdown("closed by peer")
        return True  # the transport stays open until the backlog is dispatched

    def connection_lost(self, exc: Exception | None) -> None:
        self._shutdown("closed by peer" if exc is None else f"socket error: {exc}")

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._backlog and self._next_turn is None:
            self._next_turn = asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        """Dispatch up to MESSAGES_PER_TURN messages; the rest wait for a later turn."""
        self._next_turn = None
        # Answers the wire layer made itself go out together, once per turn:
        # one write (and syscall) per turn rather than one per message.
        answers: list[bytes] = []
        handled = 0
        try:
            # A handler served here may close the connection: nothing more is served then.
            while (
                handled < MESSAGES_PER_TURN
                and not self._ended
                and (event := self._wire.next_event()) is not None
            ):
                if isinstance(event, wire.Refused):
                    self._note_refused(event)
                    answers.append(event.data)
                else:
                    if answers and isinstance(event, wire.Request):
                        # Its reply is written as it is served: what came before goes first.
                        self._write(b"".join(answers))
                        answers.clear()
                    self._on_event(event)
                handled += 1
        except RemoteProtocolError as exc:
            self._broken(exc)
            return
        self._write(b"".join(answers))
        transport = self._transport
        if self._ended or transport is None:
            return
        self._backlog = handled == MESSAGES_PER_TURN
        if self._backlog:
            # One read can hold tens of thousands of tiny messages: the rest
            # wait behind every other task, and reading waits for the rest.
            if transport.is_reading():
                transport.pause_reading()
            # Replies pile up in the transport if the peer does not read them:
            # then the rest waits until it does (resume_writing).
            if not self._writing_paused:
                self._next_turn = asyncio.get_running_loop().call_soon(self._dispatch)
        elif self._eof:
            self._shutdown("closed by peer")
        elif not transport.is_reading():
            transport.resume_reading()

    def close(self, reason: str = "closed locally") -> None:
        self._shutdown(reason)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    def busy(self) -> bool:
        """A request is being served, received, or waits to be dispatched or read.

        Asked by work deferred after replies (deferred.py) before each piece,
        so that an arriving request does not wait behind it. What has been
        received and not dispatched is the connection's own state; bytes still
        in the kernel cost one zero-timeout poll of the socket (about 2 us).
        """
        if self._ended:
            return False
        if self._serving or self._backlog or self._wire.holds_input:
            return True
        # Deferred work holds the loop for a slice of pieces, and the loop reads
        # nothing meanwhile: a request sent during the slice is still in the kernel.
        if self._fileno < 0:
            return False
        try:
            readable, _, _ = select.select((self._fileno,), (), (), 0)
        except (OSError, ValueError):  # closed under us: nothing to wait for
            return False
        return bool(readable)

    def _broken(self, exc: RemoteProtocolError) -> None:
        reason = f"protocol error: {exc}"
        self.broken_by_peer = True
        self._log.warning("dropping connection", reason=reason)
        self._shutdown(reason)

    def _shutdown(self, reason: str) -> None:
        if self._ended:
            return
        self.close_reason = reason
        self._ended = True
        self._closed.set()
        if self.refused > 1 or self.ignored > 1:
            self._log.warning(
                "connection closed after refusing requests or ignoring messages",
                requests_refused=self.refused,
                messages_ignored=self.ignored,
            )
        if self._next_turn is not None:
            self._next_turn.cancel()
            self._next_turn = None
        for fut in self._wire.close():
            if not fut.done():
                fut.set_exception(ConnectionClosed(reason))
        for task in self._handlers:
            task.cancel()
        if self._transport is not None:
            self._transport.close()

    # -- receiving -----------------------------------------------------------

    def _on_event(self, event: wire.Event[_Outcome]) -> None:
        match event:
            case wire.Request():
                self._serving += 1
                self._serve(event, self._services[event.envelope.service])
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

    def _serve(self, event: wire.Request, service: Service) -> None:
        """Run the request's handler now, in this turn of the loop, and answer it.

        Most handlers never wait for anything: they run to their reply here, with no
        task, deadline timer or later turn of the loop for them (one read, one
        dispatch, one write). One that waits goes on in a task of its own, under
        the caller's deadline, counted from now.
        """
        request = event.envelope
        timeout = request.timeout_nano / 1e9 if request.timeout_nano > 0 else None
        metadata: dict[str, tuple[str, ...]] = {}
        for kv in request.metadata:
            metadata[kv.key] = (*metadata.get(kv.key, ()), kv.value)
        context = CallContext(
            request.service, request.method, event.stream_id, timeout, event.payload_size, metadata
        )
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        steps = service.call(event.message, context).__await__()
        # What the handler sets in context variables stays its own, as in a task.
        own = contextvars.copy_context()
        try:
            waits_for = own.run(steps.send, None)
        except StopIteration as returned:
            self._answer(event, returned.value)
        except BaseException as exc:
            self._answer_error(event, exc)
        else:
            task = asyncio.create_task(
                self._serve_waiting(event, _Resumed(steps, waits_for), deadline), context=own
            )
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

    async def _serve_waiting(
        self, event: wire.Request, handler: _Resumed, deadline: float | None
    ) -> None:
        """The rest of a handler that waits for something, until its reply or its deadline."""
        try:
            async with asyncio.timeout_at(deadline):
                reply = await handler
        except BaseException as exc:
            self._answer_error(event, exc)
        else:
            self._answer(event, reply)

    def _answer(self, event: wire.Request, reply: Message) -> None:
        # Written in the step the handler returned in: work the handler left for
        # after its reply (deferred.py) must find the reply already on its way.
        try:
            self._write(self._wire.reply(event.stream_id, reply))
        finally:
            self._served()

    def _answer_error(self, event: wire.Request, exc: BaseException) -> None:
        """A handler's failure costs one reply, not the connection; cancellation none."""
        try:
            if not isinstance(exc, Exception):
                raise exc
            if not isinstance(exc, RpcError | TimeoutError):
                self._log.exception("handler failed", method=event.envelope.method, exc_info=exc)
            code, message = error_status(exc)
            self._write(self._wire.reply_status(event.stream_id, code, message))
        finally:
            self._served()

    def _served(self) -> None:
        # Served once its reply is written, in the same step (see busy()).
        self._serving -= 1
        if not self._serving and not self._backlog and self._on_idle is not None:
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
        if self._ended or self._transport is None:
            raise ConnectionClosed(self.close_reason or "not connected")
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
        if data and self._transport is not None and not self._ended:
            self._transport.write(data)
            self.writes += 1


class _Resumed:
    """A coroutine that has run to its first wait, as an awaitable that goes on from there.

    `steps` is the coroutine's iterator (its `__await__()`), `waits_for` what its
    first `send` yielded: awaiting this hands that on to the task, then passes every
    value and exception between the task and the coroutine until it returns.
    """

    __slots__ = ("_steps", "_waits_for")

    def __init__(self, steps: Generator[Any, None, Message], waits_for: Any) -> None:
        self._steps = steps
        self._waits_for = waits_for

    def __await__(self) -> Generator[Any, Any, Message]:
        steps, waits_for = self._steps, self._waits_for
        while True:
            try:
                sent = yield waits_for
            except GeneratorExit:
                steps.close()
                raise
            except BaseException as exc:  # from the task (a cancellation): the coroutine's
                try:
                    waits_for = steps.throw(exc)
                except StopIteration as returned:
                    return cast(Message, returned.value)
            else:
                try:
                    waits_for = steps.send(sent)
                except StopIteration as returned:
                    return cast(Message, returned.value)
