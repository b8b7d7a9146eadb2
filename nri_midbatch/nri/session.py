"""One registration with a runtime: the NRI plugin protocol over a MuxConnection.

The session owns what NRI requires of every plugin, whatever it does: serve
the Plugin service before registering, fit the event mask to the runtime's NRI
version, reassemble split Synchronize requests, route both the v0.12 dedicated
event RPCs and StateChange to one set of handlers, and keep UpdateContainers
out of event handlers. What to do with events is the `Plugin`'s business.

Longer than the house's 400 lines: Configure, the reassembly of split Synchronize requests
and its bounds, event routing and UpdateContainers all read and advance one lifecycle
phase (lifecycle.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from google.protobuf.message import Message

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.counts import CounterFamily, family, single
from nri_midbatch.nri import version as nri_version
from nri_midbatch.nri.events import (
    HANDLER_NAMES,
    POD_EVENTS,
    Event,
    declared,
    handled_events,
    mask,
)
from nri_midbatch.nri.lifecycle import Phase, Step, transition
from nri_midbatch.rpc.connection import MuxConnection
from nri_midbatch.rpc.errors import ConnectionClosed, RpcError
from nri_midbatch.rpc.service import CallContext, Handler, Method, Service
from nri_midbatch.wire.ratelimit import RateLimit
from nri_midbatch.wire.status import Code

log = structlog.get_logger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"

#: The runtime waits 5 s for RegisterPlugin by default; waiting a little longer
#: ourselves avoids giving up on a busy runtime that would still accept us.
DEFAULT_REGISTRATION_TIMEOUT = 6.0
#: How long UpdateContainers waits for the runtime's answer (the one deadline of
#: the call): a runtime that never answers must not hold the caller, a reload
#: say, or a pending-call slot, for ever. The runtime's own request timeout is 2 s.
DEFAULT_UPDATE_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class SyncLimits:
    """How much of a Synchronize split into `more=true` chunks is buffered until its last chunk.

    Runtimes split at 4 MiB per chunk; these bounds hold 16 full chunks, and far
    more pods and containers than any node runs, and stop a runtime that never
    sends the last chunk from growing the buffer without end.
    """

    bytes: int = 64 << 20
    #: Pods and containers.
    objects: int = 65_536


#: A warning the runtime can provoke at will (a StateChange with an event id we
#: do not know) is logged at most this many times a minute; the next line after
#: the minute says how many were left out.
WARNINGS_PER_MINUTE = 5

_in_event_handler: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "nri_in_event_handler", default=False
)


@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    name: str
    version: str
    nri_version: nri_version.Version
    #: Seconds, when the runtime tells us (NRI v0.7+).
    registration_timeout: float | None
    request_timeout: float | None

    @property
    def valid_events(self) -> int:
        return nri_version.valid_events(self.nri_version)

    @property
    def update_containers_safe(self) -> bool:
        return self.nri_version >= nri_version.SAFE_UPDATE_CONTAINERS


class Plugin(Protocol):
    """What every plugin a session drives defines.

    Its event handlers are its own choice: it handles an event by defining the
    method for it (nri.events: `HANDLER_NAMES`, or `pod_event` / `container_event`
    marked with `handles`), and the session subscribes to exactly those. The
    signatures are below (`CreateContainer` ...).
    """

    async def configure(self, config: str, runtime: RuntimeInfo) -> None: ...

    def synchronize_part(
        self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container], *, first: bool
    ) -> None:
        """One chunk of a Synchronize: keep what `synchronize` will need, not the messages.

        `first` starts a new Synchronize (what an abandoned one left is dropped).
        The session frees each chunk once it is taken in, so that a large
        node's Synchronize is never held as protobuf all at once.
        """
        ...

    async def synchronize(self) -> api.SynchronizeResponse:
        """The reply to the whole Synchronize, from the parts taken in: its updates."""
        ...


CreateContainer = Callable[[api.PodSandbox, api.Container], Awaitable[api.CreateContainerResponse]]
UpdateContainer = Callable[
    [api.PodSandbox, api.Container, api.LinuxResources], Awaitable[Sequence[api.ContainerUpdate]]
]
StopContainer = Callable[[api.PodSandbox, api.Container], Awaitable[Sequence[api.ContainerUpdate]]]
UpdatePodSandbox = Callable[
    [api.PodSandbox, api.LinuxResources, api.LinuxResources], Awaitable[None]
]
PodEvent = Callable[[Event, api.PodSandbox], Awaitable[None]]
ContainerEvent = Callable[[Event, api.PodSandbox, api.Container], Awaitable[None]]


class RecordedCall(Protocol):
    """A call an observer follows: told how it ended, once."""

    def replied(self, response: Message) -> None: ...

    def failed(self, error: BaseException) -> None: ...


class Link(Protocol):
    """The connection to the runtime, as observers may ask about it (rpc.connection)."""

    @property
    def writes(self) -> int:
        """Writes to the runtime so far on this connection."""
        ...

    def busy(self) -> bool:
        """A request from the runtime is in progress: being served, read, or on the socket."""
        ...


class SessionObserver:
    """Told what a session does; each method does nothing unless a subclass says otherwise.

    An observer may only take note: it must never block, and never fail, what it is told of.
    """

    def call_begun(self, method: str, request: Message) -> RecordedCall | None:
        """A Plugin-service call begins, in the call's own task; return it to follow it."""
        return None

    def state_changed(self, state: SessionState) -> None:
        """The phase changed, or a chunk of a Synchronize was taken in."""

    def connected(self, link: Link) -> None:
        """A connection to the runtime opened: asking `link` tells of it until the next one."""

    def idle(self) -> None:
        """The runtime's requests in progress have all been answered."""

    def reconnecting(self) -> None:
        """The plugin tries the runtime's socket again: a connection attempt after the first,
        successful or not (nri/runner.py, external plugins only)."""


class RegistrationError(Exception):
    """The runtime refused or never answered our RegisterPlugin."""


@dataclass
class SessionState:
    #: Where the session is; only `Session._advance` changes it (lifecycle.TRANSITIONS).
    phase: Phase = Phase.CLOSED
    #: The runtime answered this connection's RegisterPlugin (Configure may come first).
    register_replied: bool = False
    runtime: RuntimeInfo | None = None
    events: int = 0
    sync_chunks: int = 0
    #: Pods and containers of the Synchronize being received, so far (0 between them);
    #: observers are told after each chunk is taken in.
    sync_receiving: int = 0
    sync_pods: int = 0
    sync_containers: int = 0
    #: Completed Synchronizes, and how long the last took from first chunk to reply.
    syncs: int = 0
    last_sync_seconds: float = 0.0

    @property
    def registered(self) -> bool:
        return self.register_replied and self.phase is not Phase.CLOSED

    @property
    def configured(self) -> bool:
        return self.phase in (Phase.CONFIGURED, Phase.SYNCHRONIZING, Phase.READY)

    @property
    def synchronized(self) -> bool:
        return self.phase is Phase.READY


class Session:
    def __init__(
        self,
        plugin: Plugin,
        name: str,
        idx: str,
        *,
        registration_timeout: float = DEFAULT_REGISTRATION_TIMEOUT,
        observers: Sequence[SessionObserver] = (),
        clock: Callable[[], float] = time.monotonic,
        sync_limits: SyncLimits = SyncLimits(),
        enforce_lifecycle: bool = True,
    ) -> None:
        """observers: told of every call, state change, connection and idle spell, in order.

        clock: seconds, for the bounds kept per second or per minute (flood, warnings).
        sync_limits: the bounds of a Synchronize received in chunks.
        enforce_lifecycle: False for replay, whose recording may start anywhere in a
        session: requests the lifecycle table does not allow are then served anyway.
        Raises TypeError for a plugin that handles no event.
        """
        self._plugin = plugin
        self._handlers = _Handlers.of(plugin)
        self._enforce_lifecycle = enforce_lifecycle
        self._observers = tuple(observers)
        #: Those that follow calls: asking the others would be a call per request for None.
        self._call_observers = tuple(
            observer
            for observer in self._observers
            if type(observer).call_begun is not SessionObserver.call_begun
        )
        self._name = name
        self._idx = idx
        self._registration_timeout = registration_timeout
        self._clock = clock
        self._sync_limits = sync_limits
        self._warnings: RateLimit[str] = RateLimit(WARNINGS_PER_MINUTE, 60.0, clock=clock)
        self.state = SessionState()
        self._conn: MuxConnection | None = None
        #: What the wire layer refused or ignored on connections now closed.
        self._refused_before = 0
        self._ignored_before = 0
        #: Connections dropped because the runtime broke the protocol.
        self.protocol_disconnects = 0
        #: The Synchronize being received: chunks are handed to the plugin as they come.
        self._sync_pods = 0
        self._sync_containers = 0
        self._sync_bytes = 0
        self._sync_started: float | None = None
        self._configured = asyncio.Event()
        self._log = log.bind(plugin=f"{idx}-{name}")

    # -- running -------------------------------------------------------------

    async def run(self, sock: socket.socket) -> str:
        """Register and serve over the connected `sock` until it closes; returns why it ended."""
        conn = MuxConnection(
            {PLUGIN_SERVICE: self.service()},
            name=f"{self._idx}-{self._name}",
            on_idle=self._idle,
            clock=self._clock,
        )
        self._conn = conn
        for observer in self._observers:
            observer.connected(conn)
        self._configured.clear()
        self._drop_sync_buffer()
        self._advance(Step.CONNECT)
        try:
            # Serve connection 1 before registering: Configure may arrive before
            # the reply to RegisterPlugin.
            await conn.attach(sock)
            await self._register(conn)
            await conn.wait_closed()
        finally:
            conn.close()
            self._conn = None
            self._refused_before += conn.refused
            self._ignored_before += conn.ignored
            self.protocol_disconnects += conn.broken_by_peer
            self._drop_sync_buffer()
            self._advance(Step.CLOSE)
        return conn.close_reason or "closed"

    def protocol_violations(self) -> tuple[int, int]:
        """(requests refused, messages ignored) by the wire layer, over every connection."""
        conn = self._conn
        live = (conn.refused, conn.ignored) if conn is not None else (0, 0)
        return self._refused_before + live[0], self._ignored_before + live[1]

    def counter_families(self) -> Iterator[CounterFamily]:
        refused, ignored = self.protocol_violations()
        yield family(
            "nri_midbatch_runtime_protocol_violations",
            "Messages from the runtime the wire layer answered itself (refused: malformed or"
            " unknown requests) or dropped (ignored: stray replies, unknown message types)",
            ("kind",),
            {("refused",): refused, ("ignored",): ignored},
        )
        yield single(
            "nri_midbatch_runtime_protocol_disconnects",
            "Connections to the runtime dropped because it broke the protocol (framing garbage,"
            " or a flood of messages to refuse or ignore); the plugin then registers again",
            self.protocol_disconnects,
        )

    async def _register(self, conn: MuxConnection) -> None:
        request = api.RegisterPluginRequest(
            plugin_name=self._name,
            plugin_idx=self._idx,
            NRI_version=nri_version.format_version(nri_version.SAFE_UPDATE_CONTAINERS),
        )
        try:
            async with asyncio.timeout(self._registration_timeout):
                await conn.call(
                    RUNTIME_SERVICE,
                    "RegisterPlugin",
                    request,
                    api.Empty,
                    timeout=self._registration_timeout,
                )
                self._advance(Step.REGISTER_REPLY)
                # Like the Go stub, registration is complete only once the
                # runtime has configured us.
                configured = asyncio.create_task(self._configured.wait())
                closed = asyncio.create_task(conn.wait_closed())
                await asyncio.wait((configured, closed), return_when=asyncio.FIRST_COMPLETED)
                configured.cancel()
                closed.cancel()
                if not self._configured.is_set():
                    raise RegistrationError(
                        f"connection closed before Configure: {conn.close_reason}"
                    )
        except RpcError as exc:
            raise RegistrationError(f"runtime refused registration: {exc.message}") from exc
        except ConnectionClosed as exc:
            raise RegistrationError(f"connection closed while registering: {exc}") from exc
        except TimeoutError:
            raise RegistrationError(
                f"no Configure within {self._registration_timeout}s of registering"
            ) from None
        self._log.info("registered", runtime=self.state.runtime)

    def _advance(self, step: Step, what: str | None = None) -> None:
        """Take `step` (the table decides), or raise RpcError if it is illegal now."""
        state = self.state
        try:
            phase = transition(state.phase, step, what)
        except RpcError:
            if self._enforce_lifecycle:
                raise
            return
        replied = state.register_replied
        if step is Step.CONNECT:
            replied = False
        elif step is Step.REGISTER_REPLY:
            replied = True
        if (phase, replied) != (state.phase, state.register_replied):
            state.phase, state.register_replied = phase, replied
            self._state_changed()

    def _state_changed(self) -> None:
        for observer in self._observers:
            observer.state_changed(self.state)

    def _idle(self) -> None:
        for observer in self._observers:
            observer.idle()

    def reconnecting(self) -> None:
        """The runner is about to try the runtime's socket again: the observers are told."""
        for observer in self._observers:
            observer.reconnecting()

    def _check(self, step: Step) -> None:
        """Raise RpcError if `step` is illegal now, without taking it."""
        if self._enforce_lifecycle:
            transition(self.state.phase, step)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close("session closed")

    # -- unsolicited updates -------------------------------------------------

    async def update_containers(
        self,
        updates: Sequence[api.ContainerUpdate],
        *,
        timeout: float = DEFAULT_UPDATE_TIMEOUT,
    ) -> Sequence[api.ContainerUpdate]:
        """Ask the runtime to update containers; returns the updates that failed.

        Runtimes hold their locks while an event is out with a plugin, so this is
        awaited outside the event handlers (the reload pass does), never from one or
        from a task one started: those inherit its context and are refused.
        """
        if _in_event_handler.get():
            raise RuntimeError(
                "UpdateContainers awaited inside an event handler (or a task it started) "
                "would block the runtime; await it from outside the handlers, as the reload "
                "pass does"
            )
        if self._conn is None or not self.state.configured:
            raise RuntimeError("not registered with a runtime")
        reply = await self._conn.call(
            RUNTIME_SERVICE,
            "UpdateContainers",
            api.UpdateContainersRequest(update=updates),
            api.UpdateContainersResponse,
            timeout=timeout,
        )
        return list(reply.failed)

    # -- the Plugin service --------------------------------------------------

    def service(self) -> Service:
        """The Plugin service: the table of handlers, each a method of the session.

        Every call goes through `_around` (observers, the lifecycle table); replay
        calls it without a socket (see `enforce_lifecycle`).
        """
        methods = {
            "Configure": Method(api.ConfigureRequest, self._configure),
            "Synchronize": Method(api.SynchronizeRequest, self._synchronize),
            "Shutdown": Method(api.Empty, self._shutdown),
            "CreateContainer": Method(api.CreateContainerRequest, self._create_container),
            "UpdateContainer": Method(api.UpdateContainerRequest, self._update_container),
            "StopContainer": Method(api.StopContainerRequest, self._stop_container),
            "UpdatePodSandbox": Method(api.UpdatePodSandboxRequest, self._update_pod_sandbox),
            "StateChange": Method(api.StateChangeEvent, self._state_change),
            "ValidateContainerAdjustment": Method(
                api.ValidateContainerAdjustmentRequest, self._validate
            ),
        }
        for name, (request_type, _, _) in _POD_RPCS.items():
            methods[name] = Method(request_type, self._pod_rpc)
        for name, (request_type, _, _) in _CONTAINER_RPCS.items():
            methods[name] = Method(request_type, self._container_rpc)
        return Service(PLUGIN_SERVICE, methods, around=self._around)

    async def _around(self, handler: Handler, request: Any, ctx: CallContext) -> Message:
        """Every call: shown to the observers, checked against the lifecycle table, handled."""
        # Begun in the call's own task, so an observer can tie what the plugin
        # publishes during the call to this call.
        calls = [
            call
            for observer in self._call_observers
            if (call := observer.call_begun(ctx.method, request)) is not None
        ]
        try:
            step = _METHOD_STEPS.get(ctx.method, Step.EVENT)
            if step is not None:
                self._advance(step, ctx.method)
            _in_event_handler.set(True)
            response = await handler(request, ctx)
        except BaseException as exc:
            for call in calls:
                call.failed(exc)
            raise
        for call in calls:
            call.replied(response)
        return response

    async def _configure(
        self, request: api.ConfigureRequest, _ctx: CallContext
    ) -> api.ConfigureResponse:
        self._check(Step.CONFIGURE)  # refuse a second Configure up front
        runtime = RuntimeInfo(
            name=request.runtime_name,
            version=request.runtime_version,
            nri_version=nri_version.nri_version(
                request.NRI_version, request.runtime_name, request.runtime_version
            ),
            registration_timeout=request.registration_timeout / 1000
            if request.registration_timeout
            else None,
            request_timeout=request.request_timeout / 1000 if request.request_timeout else None,
        )
        events = mask(self._handlers.events) & runtime.valid_events
        if events == 0:
            # Zero would mean "everything" to the runtime.
            raise RpcError(Code.FAILED_PRECONDITION, "no event this runtime supports is wanted")
        await self._plugin.configure(request.config, runtime)
        self.state.runtime = runtime
        self.state.events = events
        self._advance(Step.CONFIGURE)
        self._configured.set()
        self._log.info(
            "configured",
            runtime=f"{runtime.name} {runtime.version}",
            nri=nri_version.format_version(runtime.nri_version),
            events=hex(events),
        )
        return api.ConfigureResponse(events=events)

    async def _synchronize(
        self, request: api.SynchronizeRequest, ctx: CallContext
    ) -> api.SynchronizeResponse:
        if request.more:
            self._advance(Step.SYNC_CHUNK)
        else:
            self._check(Step.SYNC_DONE)
        first = self._sync_started is None
        if self._sync_started is None:
            self._sync_started = time.perf_counter()
        self._sync_bytes += ctx.request_bytes
        self._sync_pods += len(request.pods)
        self._sync_containers += len(request.containers)
        self.state.sync_chunks += 1
        objects = self._sync_pods + self._sync_containers
        limits = self._sync_limits
        if self._sync_bytes > limits.bytes or objects > limits.objects:
            message = (
                f"Synchronize of {self._sync_bytes} bytes and {objects} pods and containers "
                f"so far exceeds the bound of {limits.bytes} bytes or {limits.objects} "
                "objects (docs/troubleshooting.md)"
            )
            self._log.error("synchronize refused", reason=message, chunks=self.state.sync_chunks)
            self._drop_sync_buffer()
            self._advance(Step.SYNC_FAILED)
            raise RpcError(Code.RESOURCE_EXHAUSTED, message)
        # The plugin keeps what it needs of the chunk; the request is freed
        # with this frame, so the peak memory is one chunk's, not the node's.
        self._plugin.synchronize_part(request.pods, request.containers, first=first)
        self.state.sync_receiving = objects
        self._state_changed()
        if request.more:
            # The runtime closes a plugin that answers a partial chunk with
            # anything but more=true.
            return api.SynchronizeResponse(more=True)
        started = self._sync_started
        self.state.sync_pods, self.state.sync_containers = self._sync_pods, self._sync_containers
        self._reset_sync_counts()
        try:
            response = await self._plugin.synchronize()
        except BaseException:
            self._advance(Step.SYNC_FAILED)
            raise
        self.state.syncs += 1
        self.state.last_sync_seconds = time.perf_counter() - started
        self._advance(Step.SYNC_DONE)
        return response

    def _drop_sync_buffer(self) -> None:
        """Abandon a Synchronize in progress: the plugin frees what its chunks brought."""
        if self._sync_started is not None:
            self._plugin.synchronize_part((), (), first=True)
        self._reset_sync_counts()

    def _reset_sync_counts(self) -> None:
        self.state.sync_receiving = 0
        self._sync_pods = self._sync_containers = 0
        self._sync_bytes = 0
        self._sync_started = None

    async def _shutdown(self, _request: api.Empty, _ctx: CallContext) -> api.Empty:
        self._log.info("runtime asked us to shut down")
        return api.Empty()

    # Each event's handler answers what the Go stub answers for a plugin that
    # does not handle it: an empty reply.

    async def _create_container(
        self, request: api.CreateContainerRequest, _ctx: CallContext
    ) -> api.CreateContainerResponse:
        if self._handlers.create_container is None:
            return api.CreateContainerResponse()
        return await self._handlers.create_container(request.pod, request.container)

    async def _update_container(
        self, request: api.UpdateContainerRequest, _ctx: CallContext
    ) -> api.UpdateContainerResponse:
        if self._handlers.update_container is None:
            return api.UpdateContainerResponse()
        updates = await self._handlers.update_container(
            request.pod, request.container, request.linux_resources
        )
        return api.UpdateContainerResponse(update=updates)

    async def _stop_container(
        self, request: api.StopContainerRequest, _ctx: CallContext
    ) -> api.StopContainerResponse:
        if self._handlers.stop_container is None:
            return api.StopContainerResponse()
        updates = await self._handlers.stop_container(request.pod, request.container)
        return api.StopContainerResponse(update=updates)

    async def _update_pod_sandbox(
        self, request: api.UpdatePodSandboxRequest, _ctx: CallContext
    ) -> api.UpdatePodSandboxResponse:
        if self._handlers.update_pod_sandbox is not None:
            await self._handlers.update_pod_sandbox(
                request.pod, request.overhead_linux_resources, request.linux_resources
            )
        return api.UpdatePodSandboxResponse()

    async def _pod_rpc(self, request: Any, ctx: CallContext) -> Message:
        """RunPodSandbox, StopPodSandbox, ...: the dedicated RPCs of NRI v0.12."""
        _, response_type, kind = _POD_RPCS[ctx.method]
        await self._pod_event(kind, request.pod)
        return response_type()

    async def _container_rpc(self, request: Any, ctx: CallContext) -> Message:
        """PostCreateContainer, StartContainer, ...: the dedicated RPCs of NRI v0.12."""
        _, response_type, kind = _CONTAINER_RPCS[ctx.method]
        await self._container_event(kind, request.pod, request.container)
        return response_type()

    async def _state_change(self, request: api.StateChangeEvent, _ctx: CallContext) -> api.Empty:
        """The same events as the dedicated RPCs, from runtimes before NRI v0.12."""
        try:
            kind = Event(request.event)
        except ValueError:
            self._warn("unknown event in StateChange", event_id=request.event)
            return api.Empty()
        if kind in POD_EVENTS:
            await self._pod_event(kind, request.pod)
        else:
            await self._container_event(kind, request.pod, request.container)
        return api.Empty()

    async def _pod_event(self, kind: Event, pod: api.PodSandbox) -> None:
        if self._handlers.pod_event is not None and kind in self._handlers.events:
            await self._handlers.pod_event(kind, pod)

    async def _container_event(
        self, kind: Event, pod: api.PodSandbox, container: api.Container
    ) -> None:
        if self._handlers.container_event is not None and kind in self._handlers.events:
            await self._handlers.container_event(kind, pod, container)

    def _warn(self, message: str, **fields: object) -> None:
        """Log a warning the runtime can repeat without end, within WARNINGS_PER_MINUTE."""
        suppressed = self._warnings.admit(message)
        if suppressed is not None:
            self._log.warning(message, **fields, suppressed_before=suppressed)

    async def _validate(
        self, _request: api.ValidateContainerAdjustmentRequest, _ctx: CallContext
    ) -> api.ValidateContainerAdjustmentResponse:
        # We never subscribe to validation; should a runtime ask anyway, an
        # error here would fail the container, so approve.
        return api.ValidateContainerAdjustmentResponse(reject=False)


@dataclass(frozen=True, slots=True)
class _Handlers:
    """The event handlers a plugin defines (None: it does not handle that event)."""

    events: frozenset[Event]
    create_container: CreateContainer | None
    update_container: UpdateContainer | None
    stop_container: StopContainer | None
    update_pod_sandbox: UpdatePodSandbox | None
    pod_event: PodEvent | None
    container_event: ContainerEvent | None

    @classmethod
    def of(cls, plugin: Plugin) -> _Handlers:
        """Raises TypeError for a plugin that handles no event (nri.events.handled_events)."""

        def defined(name: str) -> Any:
            handler = getattr(plugin, name, None)
            return handler if callable(handler) else None

        def marked(name: str) -> Any:
            return defined(name) if declared(getattr(plugin, name, None)) else None

        return cls(
            events=handled_events(plugin),
            create_container=defined(HANDLER_NAMES[Event.CREATE_CONTAINER]),
            update_container=defined(HANDLER_NAMES[Event.UPDATE_CONTAINER]),
            stop_container=defined(HANDLER_NAMES[Event.STOP_CONTAINER]),
            update_pod_sandbox=defined(HANDLER_NAMES[Event.UPDATE_POD_SANDBOX]),
            pod_event=marked("pod_event"),
            container_event=marked("container_event"),
        )


#: The dedicated RPCs of events only taken note of: request, response, event.
_POD_RPCS: dict[str, tuple[type[Message], type[Message], Event]] = {
    "RunPodSandbox": (api.RunPodSandboxRequest, api.RunPodSandboxResponse, Event.RUN_POD_SANDBOX),
    "StopPodSandbox": (
        api.StopPodSandboxRequest,
        api.StopPodSandboxResponse,
        Event.STOP_POD_SANDBOX,
    ),
    "RemovePodSandbox": (
        api.RemovePodSandboxRequest,
        api.RemovePodSandboxResponse,
        Event.REMOVE_POD_SANDBOX,
    ),
    "PostUpdatePodSandbox": (
        api.PostUpdatePodSandboxRequest,
        api.PostUpdatePodSandboxResponse,
        Event.POST_UPDATE_POD_SANDBOX,
    ),
}
_CONTAINER_RPCS: dict[str, tuple[type[Message], type[Message], Event]] = {
    "PostCreateContainer": (
        api.PostCreateContainerRequest,
        api.PostCreateContainerResponse,
        Event.POST_CREATE_CONTAINER,
    ),
    "StartContainer": (
        api.StartContainerRequest,
        api.StartContainerResponse,
        Event.START_CONTAINER,
    ),
    "PostStartContainer": (
        api.PostStartContainerRequest,
        api.PostStartContainerResponse,
        Event.POST_START_CONTAINER,
    ),
    "PostUpdateContainer": (
        api.PostUpdateContainerRequest,
        api.PostUpdateContainerResponse,
        Event.POST_UPDATE_CONTAINER,
    ),
    "RemoveContainer": (
        api.RemoveContainerRequest,
        api.RemoveContainerResponse,
        Event.REMOVE_CONTAINER,
    ),
}

#: The lifecycle step each method takes before its handler runs; None: the
#: handler takes its own steps. Every other method is an event.
_METHOD_STEPS: dict[str, Step | None] = {
    "Configure": None,
    "Synchronize": None,
    "Shutdown": Step.SHUTDOWN,
}
