"""Shared helpers for the transport tests: a recording Plugin, object builders,
a raw byte-level peer, and a session wired to a LoopbackRuntime."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections import deque
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf.message import Message

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.api import ttrpc_pb2
from nri_midbatch.nri.events import CONTAINER_EVENTS, HANDLER_NAMES, POD_EVENTS, Event, handles
from nri_midbatch.nri.session import (
    ContainerEvent,
    PodEvent,
    RuntimeInfo,
    Session,
    SessionObserver,
)
from nri_midbatch.nri.testing import LoopbackRuntime
from nri_midbatch.wire import mux
from nri_midbatch.wire.ttrpc import Message as TtrpcMessage
from nri_midbatch.wire.ttrpc import MessageDecoder, MessageType, OversizedMessage, encode_message
from tests.factory import update

T = TypeVar("T")

#: Every event a plugin can handle: validation is the runtime's to ask of validators only.
ALL_EVENTS: frozenset[Event] = frozenset(Event) - {Event.VALIDATE_CONTAINER_ADJUSTMENT}

#: Upper bound for any single await in a test: a hang fails instead of blocking. Generous,
#: as up to 8 processes share a 2-core machine; a passing test never waits it out.
STEP_TIMEOUT = 10.0
#: Upper bound for a new plugin process to start and register (Python's imports under load).
STARTUP_TIMEOUT = 60.0


def run(coro: Coroutine[Any, Any, T], timeout: float = 3 * STEP_TIMEOUT) -> T:
    """asyncio.run with an overall deadline."""

    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


def plugin_command() -> list[str]:
    """The installed `nri-midbatch` command, or the module it runs."""
    script = Path(sys.executable).parent / "nri-midbatch"
    return [str(script)] if script.exists() else [sys.executable, "-m", "nri_midbatch.tools.launch"]


def start_prelaunched(
    *args: str,
    stderr: int = subprocess.DEVNULL,
    env: Mapping[str, str] | None = None,
    command: Sequence[str] | None = None,
) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """`nri-midbatch ARGS` started as a runtime pre-launches a plugin, on one end of a socketpair.

    env: variables besides NRI's. command: what the runtime starts, `nri-midbatch` by
    default. Returns the process and the runtime's end of the socket; the caller ends the
    process.
    """
    plugin_end, runtime_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = plugin_end.fileno()
    command = plugin_command() if command is None else command
    process = subprocess.Popen(
        [*command, *args],
        env={
            **(env or {}),
            "NRI_PLUGIN_NAME": "midbatch",
            "NRI_PLUGIN_IDX": "10",
            "NRI_PLUGIN_SOCKET": str(fd),
        },
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        pass_fds=[fd],
    )
    plugin_end.close()
    return process, runtime_end


class Probe:
    """A connection as the deferred work asks about it (nri.session.Link), from functions."""

    def __init__(self, busy: Callable[[], bool], writes: Callable[[], int] = lambda: 0) -> None:
        self._busy = busy
        self._writes = writes

    def busy(self) -> bool:
        return self._busy()

    @property
    def writes(self) -> int:
        return self._writes()


# ---------------------------------------------------------------------------
# A Plugin that records what the session hands it
# ---------------------------------------------------------------------------

EventHook = Callable[[Event], Awaitable[None]]


class RecordingPlugin:
    """Implements session.Plugin, handling `events` only; records every call.

    The handlers of other events are taken away, so the session sees a plugin
    that defines just those (nri.events.handled_events).
    """

    def __init__(
        self,
        events: Iterable[Event] = ALL_EVENTS,
        *,
        sync_updates: Sequence[api.ContainerUpdate] = (),
        create_response: api.CreateContainerResponse | None = None,
        on_event: EventHook | None = None,
    ) -> None:
        wanted = frozenset(events)
        for event, name in HANDLER_NAMES.items():
            if event not in wanted:
                setattr(self, name, None)

        # Functions of this instance, not bound methods: `handles` marks them,
        # and a bound method takes no attributes.
        async def pod_event(event: Event, pod: api.PodSandbox) -> None:
            self.pod_events.append((event, pod.id))
            await self._hook(event)

        async def container_event(
            event: Event, pod: api.PodSandbox, container: api.Container
        ) -> None:
            self.container_events.append((event, pod.id, container.id))
            await self._hook(event)

        self.pod_event: PodEvent = handles(*(wanted & POD_EVENTS))(pod_event)
        self.container_event: ContainerEvent = handles(*(wanted & CONTAINER_EVENTS))(
            container_event
        )
        self.sync_updates = list(sync_updates)
        self.create_response = create_response or api.CreateContainerResponse()
        self.on_event = on_event
        self.configs: list[tuple[str, RuntimeInfo]] = []
        self.syncs: list[tuple[list[api.PodSandbox], list[api.Container]]] = []
        #: The Synchronize being received: its chunks' pods and containers so far.
        self.parts: tuple[list[api.PodSandbox], list[api.Container]] = ([], [])
        self.created: list[tuple[str, str]] = []
        self.updated: list[tuple[str, str, api.LinuxResources]] = []
        self.stopped: list[tuple[str, str]] = []
        self.pod_updates: list[tuple[str, api.LinuxResources, api.LinuxResources]] = []
        self.pod_events: list[tuple[Event, str]] = []
        self.container_events: list[tuple[Event, str, str]] = []

    async def configure(self, config: str, runtime: RuntimeInfo) -> None:
        self.configs.append((config, runtime))

    def synchronize_part(
        self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container], *, first: bool
    ) -> None:
        if first:
            self.parts = ([], [])
        self.parts[0].extend(pods)
        self.parts[1].extend(containers)

    async def synchronize(self) -> api.SynchronizeResponse:
        parts, self.parts = self.parts, ([], [])
        self.syncs.append(parts)
        return api.SynchronizeResponse(update=self.sync_updates)

    async def create_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> api.CreateContainerResponse:
        self.created.append((pod.id, container.id))
        await self._hook(Event.CREATE_CONTAINER)
        return self.create_response

    async def update_container(
        self, pod: api.PodSandbox, container: api.Container, resources: api.LinuxResources
    ) -> Sequence[api.ContainerUpdate]:
        self.updated.append((pod.id, container.id, resources))
        return [update(container.id)]

    async def stop_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> Sequence[api.ContainerUpdate]:
        self.stopped.append((pod.id, container.id))
        return [update(container.id)]

    async def update_pod_sandbox(
        self, pod: api.PodSandbox, overhead: api.LinuxResources, resources: api.LinuxResources
    ) -> None:
        self.pod_updates.append((pod.id, overhead, resources))

    async def _hook(self, event: Event) -> None:
        if self.on_event is not None:
            await self.on_event(event)


# ---------------------------------------------------------------------------
# A session driven by the LoopbackRuntime
# ---------------------------------------------------------------------------


@dataclass
class Loopback:
    session: Session
    runtime: LoopbackRuntime
    task: asyncio.Task[str]


@asynccontextmanager
async def loopback(
    plugin: RecordingPlugin,
    *,
    name: str = "midbatch",
    idx: str = "50",
    failed_updates: Sequence[str] = (),
    registration_timeout: float = STEP_TIMEOUT,
    observers: Sequence[SessionObserver] = (),
) -> AsyncIterator[Loopback]:
    plugin_end, runtime_end = socket.socketpair()
    runtime = await LoopbackRuntime.over(runtime_end, failed_updates=failed_updates)
    session = Session(
        plugin, name, idx, registration_timeout=registration_timeout, observers=observers
    )
    task = asyncio.create_task(session.run(plugin_end))
    try:
        yield Loopback(session, runtime, task)
    finally:
        await runtime.close()
        session.close()
        await asyncio.gather(task, return_exceptions=True)


# ---------------------------------------------------------------------------
# A raw peer: writes and reads mux frames byte by byte
# ---------------------------------------------------------------------------


class RawPeer:
    """The far end of a socket, speaking mux + ttrpc with no rpc layer on top.

    Every frame read is kept in `frames`, so tests can assert on framing.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.frames: list[tuple[int, bytes]] = []
        self._decoders: dict[int, MessageDecoder] = {}
        self._messages: dict[int, deque[TtrpcMessage | OversizedMessage]] = {}

    @classmethod
    async def over(cls, sock: socket.socket) -> RawPeer:
        """A raw peer on the connected `sock`."""
        return cls(*await asyncio.open_unix_connection(sock=sock))

    @classmethod
    async def pair(cls) -> tuple[RawPeer, socket.socket]:
        """A raw peer and the socket of the other side."""
        ours, theirs = socket.socketpair()
        return await cls.over(ours), theirs

    # -- writing -------------------------------------------------------------

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    def send(self, conn: int, stream_id: int, msg_type: int, data: bytes, flags: int = 0) -> None:
        self.write(mux.frame_message(conn, encode_message(stream_id, msg_type, data, flags)))

    def send_request(
        self,
        conn: int,
        stream_id: int,
        service: str,
        method: str,
        payload: Message | bytes = b"",
        *,
        timeout_nano: int = 0,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        body = payload if isinstance(payload, bytes) else payload.SerializeToString()
        request = ttrpc_pb2.Request(
            service=service,
            method=method,
            payload=body,
            timeout_nano=timeout_nano,
            metadata=[ttrpc_pb2.KeyValue(key=k, value=v) for k, v in metadata],
        )
        self.send(conn, stream_id, MessageType.REQUEST, request.SerializeToString())

    def send_response(
        self, conn: int, stream_id: int, reply: Message | None = None, *, raw: bytes | None = None
    ) -> None:
        if raw is None:
            raw = ttrpc_pb2.Response(
                payload=reply.SerializeToString() if reply is not None else b""
            ).SerializeToString()
        self.send(conn, stream_id, MessageType.RESPONSE, raw)

    # -- reading -------------------------------------------------------------

    async def read_frame(self) -> tuple[int, bytes]:
        async with asyncio.timeout(STEP_TIMEOUT):
            header = await self.reader.readexactly(mux.HEADER.size)
            conn, length = mux.HEADER.unpack(header)
            payload = await self.reader.readexactly(length)
        self.frames.append((conn, payload))
        decoder = self._decoders.setdefault(conn, MessageDecoder())
        self._messages.setdefault(conn, deque()).extend(decoder.feed(payload))
        return conn, payload

    async def read_message(self, conn: int) -> TtrpcMessage:
        queue = self._messages.setdefault(conn, deque())
        while not queue:
            await self.read_frame()
        event = queue.popleft()
        assert isinstance(event, TtrpcMessage), event
        return event

    async def read_response(self, conn: int) -> tuple[TtrpcMessage, ttrpc_pb2.Response]:
        message = await self.read_message(conn)
        assert message.type == MessageType.RESPONSE
        assert message.flags == 0
        return message, ttrpc_pb2.Response.FromString(message.data)

    async def read_request(self, conn: int) -> tuple[TtrpcMessage, ttrpc_pb2.Request]:
        message = await self.read_message(conn)
        assert message.type == MessageType.REQUEST
        assert message.flags == 0
        return message, ttrpc_pb2.Request.FromString(message.data)

    async def read_eof(self) -> bytes:
        """Everything left until the other side closes."""
        async with asyncio.timeout(STEP_TIMEOUT):
            return await self.reader.read()

    def close(self) -> None:
        self.writer.close()
