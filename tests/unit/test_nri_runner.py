"""Keeping a session connected (reference §4.1, §5.1, §5.2, checklist items 21-22)."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from structlog.typing import EventDict, WrappedLogger

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.api import rpc_status_pb2, ttrpc_pb2
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import Config
from nri_midbatch.nri.runner import Backoff, run_external, run_prelaunched
from nri_midbatch.nri.session import PLUGIN_SERVICE, Session, SessionObserver
from nri_midbatch.nri.testing import LoopbackRuntime
from nri_midbatch.process.app import App
from nri_midbatch.wire import mux
from nri_midbatch.wire.connection import MAX_VIOLATIONS_PER_SECOND
from nri_midbatch.wire.mux import MAX_FRAME_PAYLOAD
from nri_midbatch.wire.ttrpc import HEADER, MessageDecoder, MessageType

from .nri_fixtures import RawPeer, RecordingPlugin, run

FAST = Backoff(initial=0.05, maximum=0.4, jitter=0.0)
#: A backoff no test lives to see expire: a reconnection that happens at all did not wait for it.
NEVER = Backoff(initial=3600.0, maximum=3600.0, jitter=0.0)
#: Upper bound for one step: a hang fails the test instead of blocking it. Generous, as a
#: loaded 2-core machine may be slow; a passing test never waits for it.
STEP = 10.0


BAD_REPLIES = {
    "refuse": (
        MessageType.RESPONSE,
        ttrpc_pb2.Response(
            status=rpc_status_pb2.Status(code=2, message="invalid plugin name")
        ).SerializeToString(),
    ),
    "garbage": (MessageType.RESPONSE, b"\xff\xff"),
    "garbage payload": (
        MessageType.RESPONSE,
        ttrpc_pb2.Response(payload=b"\xff").SerializeToString(),
    ),
    "wrong type": (MessageType.REQUEST, b""),
}


class FakeRuntime:
    """A runtime's NRI listener at `path`; each accepted plugin gets a LoopbackRuntime.

    `behaviour` is "normal" (register, configure, synchronize, then serve),
    "hangup" (close as soon as RegisterPlugin arrives), or answers RegisterPlugin
    with `BAD_REPLIES[behaviour]` (an error status, garbage, the wrong message
    type), or "silent" (never answers).
    """

    def __init__(self, path: Path, behaviour: str = "normal") -> None:
        self.path = path
        self.behaviour = behaviour
        self.listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._handling: set[asyncio.Task[None]] = set()
        self.runtimes: list[LoopbackRuntime] = []
        self.synced: asyncio.Queue[LoopbackRuntime] = asyncio.Queue()
        self.accepted = 0
        self._accepted_more = asyncio.Event()
        self.accept_times: list[float] = []
        self.live = 0
        self.max_live = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.flood_answers = b""

    async def start(self) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.listener.listen()
        self.listener.setblocking(False)
        self._accepting = asyncio.create_task(self._accept(self.listener))

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(listener)
            task = asyncio.create_task(self._handle(sock))
            self._handling.add(task)
            task.add_done_callback(self._handling.discard)

    async def stop_listening(self) -> None:
        """Close the listener and remove the socket, as a stopping runtime does."""
        assert self._accepting is not None and self.listener is not None
        self._accepting.cancel()
        await asyncio.gather(self._accepting, return_exceptions=True)
        self.listener.close()
        self.path.unlink()

    async def drop_connections(self) -> None:
        for runtime in self.runtimes:
            await runtime.close()

    async def restart(self) -> None:
        await self.drop_connections()
        await self.stop_listening()
        await self.start()

    async def wait_accepted(self, count: int) -> None:
        while self.accepted < count:
            self._accepted_more.clear()
            await self._accepted_more.wait()

    async def _handle(self, sock: socket.socket) -> None:
        self.accepted += 1
        self._accepted_more.set()
        self.accept_times.append(asyncio.get_running_loop().time())
        self.live += 1
        self.max_live = max(self.max_live, self.live)
        self.idle.clear()
        try:
            if self.behaviour == "flood" and self.accepted == 1:
                await self._flood(await RawPeer.over(sock))
                return
            if self.behaviour in ("normal", "flood"):
                runtime = await LoopbackRuntime.over(sock)
                self.runtimes.append(runtime)
                await runtime.start(registration_timeout=STEP)
                await self.synced.put(runtime)
                await runtime.conn.wait_closed()
                return
            peer = await RawPeer.over(sock)
            message, _ = await peer.read_request(2)
            if self.behaviour in BAD_REPLIES:
                msg_type, body = BAD_REPLIES[self.behaviour]
                peer.send(2, message.stream_id, msg_type, body)
                await peer.read_eof()  # the plugin hangs up after a refusal
            elif self.behaviour == "silent":
                await peer.read_eof()
            peer.close()
        finally:
            self.live -= 1
            if self.live == 0:
                self.idle.set()

    async def _flood(self, peer: RawPeer) -> None:
        """Register and configure the plugin, then send issue 24's flood and a real request."""
        message, _ = await peer.read_request(2)
        peer.send_response(2, message.stream_id, api.Empty())
        configure = api.ConfigureRequest(runtime_name="containerd", runtime_version="v2.3.0")
        peer.send_request(1, 1, PLUGIN_SERVICE, "Configure", configure)
        await peer.read_response(1)
        # One 16 MiB mux frame of empty ttrpc requests (1.67 million of them).
        count = MAX_FRAME_PAYLOAD // HEADER.size
        empty = b"".join(HEADER.pack(0, 2 * i + 3, MessageType.REQUEST, 0) for i in range(count))
        peer.write(mux.HEADER.pack(1, len(empty)) + empty)
        peer.send_request(1, 2 * count + 3, PLUGIN_SERVICE, "CreateContainer", api.Empty())
        self.flood_answers = await peer.read_eof()  # the plugin hangs up
        peer.close()

    async def close(self) -> None:
        await self.drop_connections()
        if self._accepting is not None and not self._accepting.done():
            await self.stop_listening()
        await asyncio.gather(*self._handling, return_exceptions=True)


def socket_path(tmp_path: Path) -> Path:
    path = tmp_path / "nri.sock"
    assert len(str(path)) < 100, "AF_UNIX path too long"
    return path


async def next_sync(runtime: FakeRuntime, timeout: float = STEP) -> LoopbackRuntime:
    async with asyncio.timeout(timeout):
        return await runtime.synced.get()


class Logged:
    """A log processor (for `capture_logs(processors=...)`) that notes each line's event, so
    that a test waits for the line that says the runner got that far."""

    def __init__(self) -> None:
        self.events: set[str] = set()
        self._changed = asyncio.Event()

    def __call__(self, _logger: WrappedLogger, _method: str, line: EventDict) -> EventDict:
        self.events.add(line["event"])
        self._changed.set()
        return line

    async def wait(self, event: str) -> None:
        async with asyncio.timeout(STEP):
            while event not in self.events:
                self._changed.clear()
                await self._changed.wait()


async def stop_runner(stop: asyncio.Event, task: asyncio.Task[None]) -> None:
    stop.set()
    async with asyncio.timeout(STEP):
        await task


def test_registers_with_the_runtime(tmp_path: Path) -> None:
    path = socket_path(tmp_path)
    plugin = RecordingPlugin()

    async def scenario() -> None:
        fake = FakeRuntime(path)
        await fake.start()
        session = Session(plugin, "midbatch", "50")
        stop = asyncio.Event()
        task = asyncio.create_task(run_external(session, str(path), stop, FAST))
        runtime = await next_sync(fake)
        (registration,) = runtime.record.registrations
        assert (registration.plugin_name, registration.plugin_idx) == ("midbatch", "50")
        assert session.state.configured and session.state.synchronized
        assert len(plugin.configs) == len(plugin.syncs) == 1
        await stop_runner(stop, task)
        async with asyncio.timeout(STEP):
            await fake.idle.wait()  # stopping closed our connection
        assert not session.state.registered
        await fake.close()

    run(scenario())


class Reconnects(SessionObserver):
    def __init__(self, told: list[int]) -> None:
        self._told = told

    def reconnecting(self) -> None:
        self._told.append(1)


def test_reregisters_quickly_when_the_runtime_restarts(tmp_path: Path) -> None:
    path = socket_path(tmp_path)
    plugin = RecordingPlugin()
    reconnects: list[int] = []

    async def scenario() -> None:
        fake = FakeRuntime(path)
        await fake.start()
        session = Session(plugin, "midbatch", "50", observers=[Reconnects(reconnects)])
        stop = asyncio.Event()
        task = asyncio.create_task(
            run_external(
                session,
                str(path),
                stop,
                NEVER,  # a new socket must not wait for the backoff
            )
        )
        first = await next_sync(fake)
        for _ in range(2):
            await fake.restart()
            again = await next_sync(fake)  # before the backoff: it never expires in a test
            assert again is not first
            assert len(again.record.registrations) == 1
            first = again
        # Each connection was a whole new registration: Configure and Synchronize again.
        assert fake.accepted == 3
        assert len(plugin.configs) == len(plugin.syncs) == 3
        assert len(reconnects) == 2
        assert fake.max_live == 1
        await stop_runner(stop, task)
        await fake.close()

    run(scenario())


def test_a_new_socket_is_tried_at_once_not_after_the_backoff(tmp_path: Path) -> None:
    path = socket_path(tmp_path)

    async def scenario() -> None:
        fake = FakeRuntime(path)
        await fake.start()
        session = Session(RecordingPlugin(), "midbatch", "50")
        stop = asyncio.Event()
        task = asyncio.create_task(run_external(session, str(path), stop, NEVER))
        await next_sync(fake)
        # The runtime goes away for a moment, then listens on a new socket.
        await fake.drop_connections()
        await fake.stop_listening()
        await asyncio.sleep(0.05)
        await fake.start()
        await next_sync(fake)  # before the backoff: it never expires in a test
        assert fake.max_live == 1
        await stop_runner(stop, task)
        await fake.close()

    run(scenario())


def test_reconnects_when_dropped_on_the_same_socket(tmp_path: Path) -> None:
    path = socket_path(tmp_path)

    async def scenario() -> None:
        fake = FakeRuntime(path)
        await fake.start()
        session = Session(RecordingPlugin(), "midbatch", "50")
        stop = asyncio.Event()
        task = asyncio.create_task(run_external(session, str(path), stop, FAST))
        first = await next_sync(fake)
        await fake.drop_connections()
        second = await next_sync(fake)
        assert second is not first
        assert fake.accepted == 2
        assert fake.max_live == 1
        await stop_runner(stop, task)
        await fake.close()

    run(scenario())


def test_a_flood_of_empty_messages_drops_the_connection_and_the_plugin_registers_again(
    tmp_path: Path,
) -> None:
    """Issue 24: served one by one, the flood delayed the next request by 11.9 s."""
    path = socket_path(tmp_path)
    plugin = RecordingPlugin()

    async def scenario() -> None:
        fake = FakeRuntime(path, "flood")
        await fake.start()
        session = Session(plugin, "midbatch", "50")
        stop = asyncio.Event()
        task = asyncio.create_task(run_external(session, str(path), stop, FAST))
        again = await next_sync(fake)  # the second connection: a whole new registration
        assert len(again.record.registrations) == 1
        assert fake.accepted == 2
        assert len(plugin.configs) == 2
        # At most the bound's worth was answered before the plugin gave up on the peer.
        answered = [
            m
            for _, p in mux.MuxDecoder(frozenset({1})).feed(fake.flood_answers)
            for m in MessageDecoder().feed(p)
        ]
        assert 0 < len(answered) <= MAX_VIOLATIONS_PER_SECOND
        assert session.protocol_violations()[0] == MAX_VIOLATIONS_PER_SECOND
        assert session.protocol_disconnects == 1
        await stop_runner(stop, task)
        await fake.close()

    run(scenario())


def test_connects_once_the_socket_appears(tmp_path: Path) -> None:
    path = socket_path(tmp_path)

    async def scenario() -> None:
        session = Session(RecordingPlugin(), "midbatch", "50")
        stop = asyncio.Event()
        logged = Logged()
        with capture_logs(processors=[logged]):
            task = asyncio.create_task(run_external(session, str(path), stop, NEVER))
            await logged.wait("waiting for the runtime's NRI socket")
        assert not task.done()
        fake = FakeRuntime(path)
        await fake.start()
        await next_sync(fake)  # before the backoff: it never expires in a test
        await stop_runner(stop, task)
        await fake.close()

    run(scenario())


def test_stop_while_waiting_for_the_socket(tmp_path: Path) -> None:
    path = socket_path(tmp_path)

    async def scenario() -> None:
        session = Session(RecordingPlugin(), "midbatch", "50")
        stop = asyncio.Event()
        task = asyncio.create_task(run_external(session, str(path), stop, Backoff()))
        await asyncio.sleep(0.05)
        await stop_runner(stop, task)

    run(scenario())


def test_stale_socket_file_without_listener_is_retried(tmp_path: Path) -> None:
    path = socket_path(tmp_path)

    async def scenario() -> None:
        # A socket file nobody listens on: connect() is refused.
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(str(path))
        dead.close()
        session = Session(RecordingPlugin(), "midbatch", "50")
        stop = asyncio.Event()
        logged = Logged()
        with capture_logs(processors=[logged]):
            task = asyncio.create_task(run_external(session, str(path), stop, FAST))
            await logged.wait("cannot connect to runtime")
        assert not task.done()
        path.unlink()
        fake = FakeRuntime(path)
        await fake.start()
        await next_sync(fake)
        await stop_runner(stop, task)
        await fake.close()

    run(scenario())


@pytest.mark.parametrize(
    "behaviour", ["hangup", "refuse", "garbage", "garbage payload", "wrong type", "silent"]
)
def test_failed_registration_is_retried_with_backoff(tmp_path: Path, behaviour: str) -> None:
    """Whatever the runtime answers RegisterPlugin with, the runner reconnects.

    Before the failure contract, an undecodable reply or one of the wrong type
    escaped as DecodeError / ProtocolError and ended the runner (and the process).
    """
    path = socket_path(tmp_path)

    async def scenario() -> None:
        fake = FakeRuntime(path, behaviour)
        await fake.start()
        session = Session(RecordingPlugin(), "midbatch", "50", registration_timeout=0.05)
        stop = asyncio.Event()
        backoff = Backoff(initial=0.05, maximum=0.2, jitter=0.0)
        task = asyncio.create_task(run_external(session, str(path), stop, backoff))
        accepted = asyncio.create_task(fake.wait_accepted(4))
        await asyncio.wait({accepted, task}, timeout=STEP, return_when=asyncio.FIRST_COMPLETED)
        assert not task.done(), task.exception() if task.done() else None
        assert accepted.done()
        # Retried, but backing off rather than hammering the runtime: the
        # delay doubles up to its cap (waits are whole poll intervals).
        times = fake.accept_times
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert gaps[0] >= 0.05
        assert gaps[2] >= 0.19
        assert fake.max_live == 1
        # A fixed runtime is then picked up.
        fake.behaviour = "normal"
        await next_sync(fake)
        await stop_runner(stop, task)
        await fake.close()

    run(scenario())


def test_backoff_doubles_up_to_the_cap_with_bounded_jitter() -> None:
    backoff = Backoff(initial=0.5, maximum=10.0, factor=2.0, jitter=0.1)
    delays = [backoff.initial]
    for _ in range(6):
        delays.append(backoff.next(delays[-1]))
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    samples = [backoff.jittered(1.0) for _ in range(200)]
    assert all(0.9 <= d <= 1.1 for d in samples)
    assert len(set(samples)) > 1


def test_stop_while_connected_closes_the_connection(tmp_path: Path) -> None:
    path = socket_path(tmp_path)

    async def scenario() -> None:
        fake = FakeRuntime(path)
        await fake.start()
        session = Session(RecordingPlugin(), "midbatch", "50")
        stop = asyncio.Event()
        task = asyncio.create_task(run_external(session, str(path), stop, FAST))
        runtime = await next_sync(fake)
        await stop_runner(stop, task)
        async with asyncio.timeout(STEP):
            await runtime.conn.wait_closed()
        assert runtime.conn.close_reason == "closed by peer"
        assert fake.accepted == 1
        await fake.close()

    run(scenario())


# ---------------------------------------------------------------------------
# Pre-launched
# ---------------------------------------------------------------------------


def test_run_prelaunched_serves_the_inherited_fd_until_it_closes() -> None:
    plugin = RecordingPlugin()

    async def scenario() -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fd = ours.detach()
        runtime = await LoopbackRuntime.over(theirs)
        session = Session(plugin, "midbatch", "10")
        task = asyncio.create_task(run_prelaunched(session, fd))
        configured, _ = await runtime.start(config="from conf.d", runtime_version="v1.7.0")
        assert configured.events == 0x7FF
        assert runtime.record.registrations[0].plugin_idx == "10"
        assert plugin.configs[0][0] == "from conf.d"
        reply = await runtime.call(
            "StateChange",
            api.StateChangeEvent(
                event=6, pod=api.PodSandbox(id="p"), container=api.Container(id="c")
            ),
            api.Empty,
        )
        assert reply == api.Empty()
        await runtime.close()
        ended = await task
        assert ended.reason == "closed by peer"
        assert not ended.failed
        for _ in range(3):
            await asyncio.sleep(0)
        with pytest.raises(OSError):
            os.fstat(fd)  # the inherited socket is closed with the session

    run(scenario())


def test_run_prelaunched_returns_when_the_runtime_hangs_up_early() -> None:
    async def scenario() -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        peer = await RawPeer.over(theirs)
        session = Session(RecordingPlugin(), "midbatch", "10")
        task = asyncio.create_task(run_prelaunched(session, ours.detach()))
        await peer.read_request(2)
        peer.close()
        ended = await task
        assert "closed" in ended.reason
        assert ended.failed  # never registered: the process exits non-zero

    run(scenario())


@pytest.mark.parametrize("behaviour", ["hangup", "garbage", "wrong type"])
def test_prelaunched_app_says_why_and_exits_non_zero(behaviour: str) -> None:
    """A pre-launched plugin cannot reconnect: a failed session is a logged exit 1.

    Before, a runtime hanging up before registration exited 0, and a garbage
    reply ended the process with a traceback.
    """

    async def scenario() -> int:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        peer = await RawPeer.over(theirs)
        app = App(settings_of(Config()), name="midbatch", idx="10", config_path=None)
        task = asyncio.create_task(app.run_prelaunched(ours.detach()))
        message, _ = await peer.read_request(2)
        if behaviour in BAD_REPLIES:
            msg_type, body = BAD_REPLIES[behaviour]
            peer.send(2, message.stream_id, msg_type, body)
            await peer.read_eof()
        peer.close()
        return await task

    with capture_logs() as logs:
        assert run(scenario()) == 1
    (failed,) = [e for e in logs if e["event"].startswith("runtime connection failed")]
    assert failed["log_level"] == "error"
    assert "regist" in failed["reason"]


def test_runner_survives_a_session_that_raises(tmp_path: Path) -> None:
    """Any exception out of a session (a bug of ours) means: reconnect, not exit."""
    path = socket_path(tmp_path)

    class Flaky(Session):
        failures = 0

        async def run(self, sock: socket.socket) -> str:
            if Flaky.failures < 2:
                Flaky.failures += 1
                sock.close()
                raise ValueError("a bug")
            return await super().run(sock)

    async def scenario() -> None:
        fake = FakeRuntime(path)
        await fake.start()
        session = Flaky(RecordingPlugin(), "midbatch", "10")
        stop = asyncio.Event()
        task = asyncio.create_task(run_external(session, str(path), stop, FAST))
        await next_sync(fake)
        assert Flaky.failures == 2
        assert session.state.synchronized
        await stop_runner(stop, task)
        await fake.close()

    run(scenario())
