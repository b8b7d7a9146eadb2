"""A small HTTP/1.1 server for untrusted networks: one thread, one event loop, every connection
bounded. The metrics/health endpoint and the admission webhook both serve through it.

Why not `http.server`: its threading server spends a thread and a file descriptor on every
connection, and its timeout is per socket operation, so idle clients hold them for ever and a
client that sends one byte now and then holds them as long as it likes.

The bounds, per server:
- `max_connections` open at once. A connection accepted at the cap evicts the connection that
  has waited longest for its request (idle keep-alive, a TLS handshake or a request still
  arriving); when every open connection is being answered, the new one is closed instead. So
  clients that connect and stall cannot lock out one that sends its request at once.
- `deadline` seconds for a whole request, counted from the accept (TLS handshake included) or
  from the end of the previous answer on a keep-alive connection: bytes that trickle in do not
  extend it. Writing an answer has the same deadline, for a client that never reads.
- `MAX_HEAD_BYTES` of request line and headers, at most `MAX_HEADERS` header lines, and a body
  of at most `max_body` bytes, sent with a Content-Length (no chunked bodies).
- A body's framing must be unambiguous (RFC 9112 section 6.3): Content-Length headers that
  differ, a Content-Length beside a Transfer-Encoding, or one that is not a plain decimal
  number get 400 and the connection is closed, as a proxy in front may have read the body
  differently (request smuggling).

Handlers are plain functions called on the server's loop; they must be quick and must not block
(a metrics scrape). One with slow work returns an awaitable instead, which the connection awaits
while the loop serves the others (the webhook's reviews, run in worker threads). The loop runs
in its own thread, so a wedged plugin loop can still be reported by `/healthz`.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus

import structlog

__all__ = [
    "MAX_HEADERS",
    "MAX_HEAD_BYTES",
    "BoundedHTTPServer",
    "Handler",
    "Request",
    "Response",
    "parse_address",
]

#: Request line plus headers; a kubelet probe, Prometheus or the API server send under 1 KiB.
MAX_HEAD_BYTES = 16 * 1024
MAX_HEADERS = 64
#: For stop(): how long to wait for the loop thread to finish.
_STOP_WAIT = 5.0
#: RFC 9110's 1*DIGIT, ASCII only (str.isdigit takes "²", which int() refuses), and short
#: enough for int() (which refuses more than 4,300 digits); 20 digits pass any 64-bit size.
_CONTENT_LENGTH = re.compile(r"[0-9]{1,20}")

log = structlog.get_logger("nri_midbatch.httpd")


def parse_address(address: str) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or `:port` (all interfaces)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"metrics address {address!r} must be HOST:PORT")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    #: Without the query string.
    path: str
    #: Header names in lower case; a repeated header keeps its last value.
    headers: Mapping[str, str]
    body: bytes
    #: HTTP/1.1 without `Connection: close`, or HTTP/1.0 with `Connection: keep-alive`.
    keep_alive: bool = True


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    #: Close the connection after this answer.
    close: bool = False

    @classmethod
    def text(cls, status: int, text: str, *, close: bool = False) -> Response:
        return cls(status, (text + "\n").encode(), close=close)


Handler = Callable[[Request], Response | Awaitable[Response]]


class _Refused(Exception):
    """A request that is answered with an error and then the connection closed."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.response = Response.text(status, text, close=True)


class _Connection:
    __slots__ = ("answered", "task", "waiting_since", "writer")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.answered = 0
        self.task = asyncio.current_task()
        #: When it started waiting for a request; None while it is being answered.
        self.waiting_since: float | None = time.monotonic()

    def drop(self) -> None:
        self.writer.transport.abort()
        if self.task is not None:
            self.task.cancel()


class BoundedHTTPServer:
    """Binds at construction (so a taken port fails there), serves from `start()`."""

    def __init__(
        self,
        address: str,
        handler: Handler,
        *,
        name: str,
        max_connections: int,
        deadline: float,
        max_body: int,
        tls: Callable[[], ssl.SSLContext] | None = None,
        server_header: str = "nri-midbatch",
        on_drop: Callable[[str], None] = lambda reason: None,
    ) -> None:
        """`on_drop(reason)` counts each connection the bounds end early: `evicted` for a newer
        one at the cap, `refused` at the cap, `deadline` (no answer yet when it passed), or
        `bad_request` (over a size bound, or not HTTP/1.x)."""
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.max_connections = max_connections
        self.deadline = deadline
        self.max_body = max_body
        self._handler = handler
        self._tls = tls
        self._on_drop = on_drop
        self._server_header = server_header
        host, port = parse_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # `[::]:port` takes IPv4 too, as the kernel's default for an IPv6 socket would.
        dualstack = family == socket.AF_INET6 and socket.has_dualstack_ipv6()
        self._sock = socket.create_server(
            (host, port), family=family, backlog=128, dualstack_ipv6=dualstack
        )
        self._port = int(self._sock.getsockname()[1])
        self._connections: set[_Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def port(self) -> int:
        return self._port

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=_STOP_WAIT)
        self._sock.close()

    # -- the loop thread ------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception:
            log.exception("HTTP server failed")
        finally:
            self._ready.set()  # start() must not wait for a server that never came up

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._connected, sock=self._sock, limit=MAX_HEAD_BYTES)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for connection in list(self._connections):
                connection.drop()
            self._connections.clear()

    def _admit(self, connection: _Connection) -> bool:
        if len(self._connections) >= self.max_connections:
            waiting = [c for c in self._connections if c.waiting_since is not None]
            if not waiting:
                return False
            oldest = min(waiting, key=lambda c: c.waiting_since or 0.0)
            self._connections.discard(oldest)
            oldest.drop()
            self._on_drop("evicted")
        self._connections.add(connection)
        return True

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(writer)
        if not self._admit(connection):
            log.warning("connection refused: every connection is busy", limit=self.max_connections)
            self._on_drop("refused")
            writer.transport.abort()
            return
        try:
            await self._serve_connection(connection, reader, writer)
        except TimeoutError:
            # An idle keep-alive connection closed after its answers is the normal end.
            if not connection.answered:
                self._on_drop("deadline")
        except (OSError, EOFError, asyncio.IncompleteReadError) as error:
            log.debug("connection ended", error=repr(error))
        except asyncio.CancelledError:
            pass  # evicted or stopping; the task ends here either way
        finally:
            self._connections.discard(connection)
            writer.transport.abort()

    async def _serve_connection(
        self, connection: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        async with asyncio.timeout(self.deadline):
            if self._tls is not None:
                await writer.start_tls(self._tls())
            request = await self._read_request(reader)
        while request is not None:
            connection.waiting_since = None
            if isinstance(request, Response):
                self._on_drop("bad_request")
                await self._write(writer, request)
                return
            response = await self._answer(request)
            close = response.close or not request.keep_alive
            await self._write(writer, response, close)
            connection.answered += 1
            if close:
                return
            connection.waiting_since = time.monotonic()
            async with asyncio.timeout(self.deadline):
                request = await self._read_request(reader)

    async def _answer(self, request: Request) -> Response:
        try:
            response = self._handler(request)
            return await response if inspect.isawaitable(response) else response
        except Exception:  # a handler bug must not take the server down
            log.exception("unexpected error answering a request", path=request.path)
            return Response.text(500, "internal error", close=True)

    async def _read_request(self, reader: asyncio.StreamReader) -> Request | Response | None:
        """The next request; None at a clean end of the connection; a Response for a bad one."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as error:
            if error.partial.strip():
                raise
            return None
        except asyncio.LimitOverrunError:
            return Response.text(431, f"request head over {MAX_HEAD_BYTES} bytes", close=True)
        try:
            method, path, version, headers = _parse_head(head)
            length = self._body_length(method, headers)
        except _Refused as refused:
            return refused.response
        body = await reader.readexactly(length) if length else b""
        connection = headers.get("connection", "").lower()
        keep_alive = connection == "keep-alive" if version == "HTTP/1.0" else connection != "close"
        return Request(method, path, headers, body, keep_alive)

    def _body_length(self, method: str, headers: Mapping[str, str]) -> int:
        raw = headers.get("content-length")
        if "transfer-encoding" in headers:
            if raw is not None:
                raise _Refused(400, "both Transfer-Encoding and Content-Length")
            raise _Refused(411, "send the body with a Content-Length")
        if raw is None:
            if method == "POST":
                raise _Refused(411, "Content-Length is required")
            return 0
        if not _CONTENT_LENGTH.fullmatch(raw):
            raise _Refused(400, "Content-Length is not a number of at most 20 digits")
        length = int(raw)
        if length > self.max_body:
            # Not read: the connection closes instead.
            raise _Refused(413, f"body over {self.max_body} bytes")
        return length

    async def _write(
        self, writer: asyncio.StreamWriter, response: Response, close: bool = True
    ) -> None:
        close = close or response.close
        try:
            phrase = HTTPStatus(response.status).phrase
        except ValueError:
            phrase = ""
        lines = [
            f"HTTP/1.1 {response.status} {phrase}",
            f"Server: {self._server_header}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
        ]
        if close:
            lines.append("Connection: close")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body)
        async with asyncio.timeout(self.deadline):
            # drain() only waits for the buffer to fall below its high-water mark; a close
            # waits for the rest to be sent too, or the final abort would discard it.
            await writer.drain()
            if close:
                writer.close()
                await writer.wait_closed()


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _Refused(400, "not an HTTP/1.x request line")
    if len(lines) - 1 > MAX_HEADERS:
        raise _Refused(431, f"more than {MAX_HEADERS} header lines")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _Refused(400, "malformed header line")
        key, value = name.lower(), value.strip()
        if key == "content-length" and headers.get(key, value) != value:
            raise _Refused(400, "Content-Length headers that differ")
        headers[key] = value
    method, target, version = parts
    return method, target.split("?", 1)[0], version, headers
