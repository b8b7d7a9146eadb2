"""The runtime end of the benchmark: a lean, blocking NRI runtime on a real Unix socket.

It does what containerd does with an external plugin (accept, answer
RegisterPlugin, Configure, Synchronize, then events) at as little cost of its
own as possible, so that the time it measures is the plugin's:

* every request is encoded once (mux + ttrpc + protobuf) as a `Template`;
  per call only the stream id is packed and, for per-pod requests, a 12-byte
  placeholder is swapped for a counter (`bytes.replace`, equal length);
* the parts go out in one `sendmsg` (no joining), framed like Go's runtime:
  at most 4096 bytes in the first mux frame, the rest in one more;
* replies are matched by stream id from their headers alone; every reply's
  type, flags and length are checked, and the first and every Nth reply of a
  kind is decoded and compared with what the plugin must answer.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from nri_midbatch.api import ttrpc_pb2
from nri_midbatch.nri.events import Event
from nri_midbatch.wire.mux import FIRST_FRAME_MAX, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN

MUX = struct.Struct(">II")
TTRPC = struct.Struct(">IIBB")
REQUEST, RESPONSE = 1, 2

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
#: What the plugin subscribes to at Configure (and so does bench.floor).
SUBSCRIBED_EVENTS = (
    Event.RUN_POD_SANDBOX.bit
    | Event.CREATE_CONTAINER.bit
    | Event.UPDATE_CONTAINER.bit
    | Event.REMOVE_CONTAINER.bit
    | Event.UPDATE_POD_SANDBOX.bit
    | Event.REMOVE_POD_SANDBOX.bit
)
#: containerd's default request timeout, carried in every request as timeout_nano.
REQUEST_TIMEOUT_NANO = 2_000_000_000
READ_SIZE = 1 << 20


class BenchError(Exception):
    """The plugin answered wrongly, or not at all."""


@dataclass(frozen=True)
class Template:
    """One request, encoded once; `frames` makes the bytes for a stream id (and a counter)."""

    method: str
    envelope: bytes  # the serialized ttrpc Request
    token: bytes | None = None  # placeholder to replace per call, if any

    @classmethod
    def build(cls, method: str, payload: bytes, token: str | None = None) -> Template:
        envelope = ttrpc_pb2.Request(
            service=PLUGIN_SERVICE,
            method=method,
            payload=payload,
            timeout_nano=REQUEST_TIMEOUT_NANO,
        ).SerializeToString()
        if token is not None and token.encode() not in envelope:
            raise ValueError(f"{method}: placeholder not in the request")
        return cls(method, envelope, None if token is None else token.encode())

    @property
    def size(self) -> int:
        return len(self.envelope)

    def frames(self, stream_id: int, counter: bytes | None = None) -> list[bytes | memoryview]:
        body = self.envelope
        if counter is not None and self.token is not None:
            body = body.replace(self.token, counter)
        header = TTRPC.pack(len(body), stream_id, REQUEST, 0)
        total = len(body) + TTRPC.size
        if total <= FIRST_FRAME_MAX:
            return [MUX.pack(PLUGIN_SERVICE_CONN, total), header, body]
        view = memoryview(body)
        head = FIRST_FRAME_MAX - TTRPC.size
        return [
            MUX.pack(PLUGIN_SERVICE_CONN, FIRST_FRAME_MAX),
            header,
            view[:head],
            MUX.pack(PLUGIN_SERVICE_CONN, total - FIRST_FRAME_MAX),
            view[head:],
        ]


#: Checks a decoded reply (the ttrpc Response's bytes); raises BenchError if wrong.
Check = Callable[[bytes], None]


@dataclass
class Kind:
    """A kind of request in a stream, with what its replies must look like."""

    name: str
    template: Template
    #: Every reply must have exactly this many bytes (None: that of the first reply).
    reply_size: int | None
    check: Check
    check_every: int = 64
    latencies: list[float] = field(default_factory=list)
    replies: int = 0


@dataclass
class _InFlight:
    kind: Kind
    sent: float


#: (stream id, buffer, start, stop): a reply's bytes are buffer[start:stop].
Reply = tuple[int, bytes, int, int]


class Runtime:
    """One accepted plugin connection, driven synchronously from this thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._next_stream = 1
        self._pending = b""
        self._streams: dict[int, bytes] = {PLUGIN_SERVICE_CONN: b"", RUNTIME_SERVICE_CONN: b""}
        self._timeout: float | None = -1.0
        self.registrations: list[bytes] = []
        self.unsolicited: list[str] = []

    # -- sending -------------------------------------------------------------

    def send(self, template: Template, counter: bytes | None = None) -> int:
        stream_id = self._next_stream
        self._next_stream += 2
        parts = template.frames(stream_id, counter)
        sent = self.sock.sendmsg(parts)
        total = sum(len(p) for p in parts)
        if sent != total:  # a short send on a large message: finish it
            self.sock.sendall(b"".join(bytes(p) for p in parts)[sent:])
        return stream_id

    # -- receiving -----------------------------------------------------------

    def receive(self, timeout: float | None = None) -> tuple[float, list[Reply]]:
        """Wait for bytes; returns their arrival time and the replies they complete.

        A reply is (stream id, buffer, start, stop): its bytes are not copied
        out of the receive buffer unless they are checked.
        """
        if timeout != self._timeout:
            # settimeout costs two fcntl calls: only when it changes.
            self.sock.settimeout(timeout)
            self._timeout = timeout
        try:
            data = self.sock.recv(READ_SIZE)
        except TimeoutError:
            raise BenchError(f"no reply within {timeout}s") from None
        now = time.perf_counter()
        if not data:
            raise BenchError("the plugin closed the connection")
        replies: list[Reply] = []
        if self._pending:
            data = self._pending + data
            self._pending = b""
        offset, end = 0, len(data)
        while end - offset >= MUX.size:
            conn, length = MUX.unpack_from(data, offset)
            start = offset + MUX.size
            stop = start + length
            if stop > end:
                break
            self._frame(conn, data, start, stop, replies)
            offset = stop
        if offset < end:
            self._pending = data[offset:]
        return now, replies

    def _frame(self, conn: int, data: bytes, start: int, stop: int, replies: list[Reply]) -> None:
        buffered = self._streams.get(conn)
        if buffered is None:
            return  # frames for unknown connections are dropped, as the Go mux does
        if not buffered and stop - start >= TTRPC.size:
            length, stream_id, msg_type, flags = TTRPC.unpack_from(data, start)
            if TTRPC.size + length == stop - start:  # the common case: one message, one frame
                body = start + TTRPC.size
                self._message(conn, stream_id, msg_type, flags, data, body, stop, replies)
                return
        buffered += data[start:stop]
        offset = 0
        while len(buffered) - offset >= TTRPC.size:
            length, stream_id, msg_type, flags = TTRPC.unpack_from(buffered, offset)
            body = offset + TTRPC.size
            if body + length > len(buffered):
                break
            self._message(conn, stream_id, msg_type, flags, buffered, body, body + length, replies)
            offset = body + length
        self._streams[conn] = buffered[offset:]

    def _message(
        self,
        conn: int,
        stream_id: int,
        msg_type: int,
        flags: int,
        data: bytes,
        start: int,
        stop: int,
        replies: list[Reply],
    ) -> None:
        if conn == RUNTIME_SERVICE_CONN:
            # The plugin calls us: RegisterPlugin, or UpdateContainers (never in this run).
            if msg_type != REQUEST:
                raise BenchError(f"message type {msg_type} on the runtime's service connection")
            request = ttrpc_pb2.Request.FromString(data[start:stop])
            if request.method == "RegisterPlugin":
                self.registrations.append(request.payload)
            else:
                self.unsolicited.append(request.method)
            # Empty reply: a Response of zero bytes (success, empty payload).
            empty = TTRPC.pack(0, stream_id, RESPONSE, 0)
            self.sock.sendall(MUX.pack(RUNTIME_SERVICE_CONN, TTRPC.size) + empty)
            return
        if msg_type != RESPONSE or flags != 0:
            raise BenchError(f"stream {stream_id}: type {msg_type} flags {flags}, not a reply")
        replies.append((stream_id, data, start, stop))

    # -- calling -------------------------------------------------------------

    def call(self, template: Template, timeout: float = 10.0) -> tuple[bytes, float]:
        """One request, waiting for its reply; returns (ttrpc Response bytes, seconds)."""
        sent = time.perf_counter()
        stream_id = self.send(template)
        while True:
            now, replies = self.receive(timeout)
            for sid, data, start, stop in replies:
                if sid != stream_id:
                    raise BenchError(f"reply on stream {sid}, expected {stream_id}")
                return data[start:stop], now - sent

    def wait_registered(self, timeout: float) -> None:
        deadline = time.perf_counter() + timeout
        while not self.registrations:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise BenchError(f"no RegisterPlugin within {timeout}s")
            _now, replies = self.receive(left)
            if replies:
                raise BenchError("a reply before any request")

    def stream(
        self,
        events: Iterable[tuple[Kind, bytes | None]],
        window: int,
        timeout: float = 10.0,
    ) -> tuple[int, float]:
        """Send `events` keeping `window` requests in flight; returns (requests, seconds).

        Each latency (send to the arrival of the bytes holding the reply) goes
        to its kind; window 1 is one request at a time.
        """
        in_flight: dict[int, _InFlight] = {}
        source: Iterator[tuple[Kind, bytes | None]] = iter(events)
        exhausted = False
        count = 0
        perf = time.perf_counter
        started = perf()
        while True:
            while not exhausted and len(in_flight) < window:
                try:
                    kind, counter = next(source)
                except StopIteration:
                    exhausted = True
                    break
                sent = perf()
                stream_id = self.send(kind.template, counter)
                in_flight[stream_id] = _InFlight(kind, sent)
                count += 1
            if not in_flight:
                break
            now, replies = self.receive(timeout)
            for stream_id, data, start, stop in replies:
                call = in_flight.pop(stream_id, None)
                if call is None:
                    raise BenchError(f"reply on stream {stream_id}, which is not in flight")
                kind = call.kind
                kind.latencies.append(now - call.sent)
                if kind.reply_size is not None and stop - start != kind.reply_size:
                    raise BenchError(
                        f"{kind.name}: reply of {stop - start} bytes, expected "
                        f"{kind.reply_size}: {data[start:stop]!r}"
                    )
                if kind.replies % kind.check_every == 0:
                    kind.check(data[start:stop])
                    if kind.reply_size is None:
                        # Identical requests get identical replies: the first,
                        # checked in full, sets the size every later one must have.
                        kind.reply_size = stop - start
                kind.replies += 1
        return count, perf() - started
