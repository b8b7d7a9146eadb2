"""AfterReply: work left by a handler runs after its reply is on the wire, in order, in slices."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import structlog

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.api import ttrpc_pb2
from nri_midbatch.cgroups.paths import CgroupDriver
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import Config
from nri_midbatch.deferred import MAX_OWED, AfterReply, DeferredTimings
from nri_midbatch.plugin.cgroup_writer import CgroupWriter
from nri_midbatch.plugin.codec import pod_view
from nri_midbatch.plugin.context import InForce, Live
from nri_midbatch.plugin.records import Records
from nri_midbatch.rpc.connection import MuxConnection
from nri_midbatch.rpc.service import CallContext, Method, Service
from nri_midbatch.state.known import Known
from nri_midbatch.state.store import BaselineStore
from nri_midbatch.wire.mux import frame_message
from nri_midbatch.wire.ttrpc import MessageType, encode_message

from .nri_fixtures import STEP_TIMEOUT, Probe, run

PLUGIN_CONN = 1


def test_work_runs_once_the_reply_is_on_the_socket() -> None:
    """The property AfterReply rests on: a reply is written before deferred work runs."""
    after_reply = AfterReply()
    left, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    peer.setblocking(False)
    seen: list[int] = []
    looked = asyncio.Event()

    def look_at_the_peer() -> None:
        # What the runtime could read at this moment.
        try:
            seen.append(len(peer.recv(65536, socket.MSG_PEEK)))
        except BlockingIOError:
            seen.append(0)
        looked.set()

    async def handler(_request: Any, _ctx: CallContext) -> api.ConfigureResponse:
        after_reply.defer(look_at_the_peer)
        return api.ConfigureResponse(events=0x48D)

    async def scenario() -> None:
        service = Service("s", {"m": Method(api.Empty, handler)})
        conn = MuxConnection({"s": service}, name="test")
        await conn.attach(left)
        request = ttrpc_pb2.Request(service="s", method="m").SerializeToString()
        peer.send(frame_message(PLUGIN_CONN, encode_message(1, MessageType.REQUEST, request)))
        await asyncio.wait_for(looked.wait(), STEP_TIMEOUT)
        conn.close()

    run(scenario())
    peer.close()
    # mux header (8) + ttrpc header (10) + the Response around the payload.
    assert seen and seen[0] > 18


def test_work_runs_in_order_in_slices_that_let_requests_in() -> None:
    after_reply = AfterReply(slice_seconds=0)
    order: list[str] = []

    async def scenario() -> None:
        for n in range(3):
            after_reply.defer(order.append, f"work {n}")
        # A request arriving meanwhile runs between two pieces of work.
        asyncio.get_running_loop().call_soon(order.append, "request")
        await after_reply.settle()

    run(scenario())
    assert order == ["work 0", "request", "work 1", "work 2"]


def test_work_that_defers_more_work_runs_one_slice_per_turn_of_the_loop() -> None:
    """One chain of slices, however much the pieces defer: a second chain would
    run a slice of its own in every turn of the loop, and each piece that
    defers would start one more, so that requests and timers waited behind an
    ever longer run of slices."""
    after_reply = AfterReply(slice_seconds=0)  # one piece to a slice
    #: the loop's turn in which each piece ran
    turns: list[int] = []
    turn = 0

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        running = True

        def count_turns() -> None:
            nonlocal turn
            turn += 1
            if running:
                loop.call_soon(count_turns)

        def note_turn() -> None:
            turns.append(turn)

        def piece(left: int) -> None:
            note_turn()
            if left:
                after_reply.defer(piece, left - 1)
                after_reply.defer(note_turn)

        count_turns()
        after_reply.defer(piece, 20)
        await after_reply.settle()
        running = False

    run(scenario())
    assert len(turns) == 41
    most_in_one_turn = max(turns.count(t) for t in set(turns))
    assert most_in_one_turn == 1, turns


def test_settle_waits_for_delayed_work_and_what_it_queues() -> None:
    after_reply = AfterReply()
    done: list[str] = []

    def first() -> None:
        done.append("first")
        after_reply.defer_later(0.01, done.append, "again")

    async def scenario() -> None:
        after_reply.defer(first)
        await after_reply.settle()

    run(scenario())
    assert done == ["first", "again"]


def test_settle_returns_at_once_when_nothing_is_queued() -> None:
    run(AfterReply().settle(), timeout=STEP_TIMEOUT)


def test_a_failing_piece_of_work_is_logged_and_the_rest_runs() -> None:
    after_reply = AfterReply()
    done: list[int] = []

    def broken() -> None:
        raise ValueError("bad")

    async def scenario() -> None:
        after_reply.defer(broken)
        after_reply.defer(done.append, 1)
        await after_reply.settle()

    with structlog.testing.capture_logs() as logs:
        run(scenario())
    assert done == [1]
    (line,) = logs
    assert line["event"] == "work after reply failed"
    assert line["log_level"] == "error"
    assert "broken" in line["work"]


def test_flush_runs_what_is_queued_and_drops_what_waits() -> None:
    after_reply = AfterReply()
    done: list[str] = []

    async def scenario() -> int:
        after_reply.defer(done.append, "queued")
        after_reply.defer_later(60, done.append, "delayed")
        abandoned = after_reply.flush()
        await after_reply.settle()  # nothing left: returns at once
        return abandoned

    assert run(scenario(), timeout=STEP_TIMEOUT) == 1  # well before the delayed 60 s
    assert done == ["queued"]


@pytest.mark.parametrize("resumed", [False, True], ids=["rechecked", "resumed"])
def test_work_waits_while_the_probe_says_busy(resumed: bool) -> None:
    """Resumed: the connection says when it has answered, and the work goes on
    then, not after the recheck (stretched to a minute)."""
    timings = DeferredTimings(recheck=60.0) if resumed else DeferredTimings()
    after_reply = AfterReply(slice_seconds=60, timings=timings)
    busy = [False]
    order: list[str] = []

    def work(n: int) -> None:
        order.append(f"work {n}")
        if n == 0:
            busy[0] = True  # a request arrives during the first piece
            asyncio.get_running_loop().call_soon(done_with_request)

    def done_with_request() -> None:
        order.append("request answered")
        busy[0] = False
        if resumed:
            after_reply.idle()

    async def scenario() -> None:
        after_reply.connected(Probe(lambda: busy[0]))
        for n in range(3):
            after_reply.defer(work, n)
        await after_reply.settle()

    run(scenario(), timeout=STEP_TIMEOUT)
    assert order == ["work 0", "request answered", "work 1", "work 2"]


def test_idle_with_nothing_waiting_changes_nothing() -> None:
    after_reply = AfterReply(slice_seconds=0)
    order: list[str] = []

    async def scenario() -> None:
        after_reply.idle()  # idle: no slice is started
        for n in range(2):
            after_reply.defer(order.append, f"work {n}")
        after_reply.idle()  # not waiting for the connection: the order stands
        asyncio.get_running_loop().call_soon(order.append, "request")
        await after_reply.settle()

    run(scenario())
    assert order == ["work 0", "request", "work 1"]


def test_no_piece_runs_while_a_request_is_in_progress_unless_the_work_starves() -> None:
    """Requests that keep the connection busy for less than the starved time wait for nothing.

    Until round 8 the work ran regardless for half a millisecond after every
    wait of `recheck`: requests a millisecond apart met it in step. Here the
    connection is rechecked at every turn of the loop and is busy for 50 ms
    at a time, far less than the minute the work may starve for.
    """
    after_reply = AfterReply(slice_seconds=60, timings=DeferredTimings(recheck=0.0, starved=60.0))
    busy_until = [0.0]
    seen_busy: list[bool] = []

    def busy() -> bool:
        return time.perf_counter() < busy_until[0]

    def work(n: int) -> None:
        seen_busy.append(busy())
        if n % 2 == 0:  # a request arrives, and is in progress for 50 ms
            busy_until[0] = time.perf_counter() + 0.05

    async def scenario() -> None:
        after_reply.connected(Probe(busy))
        for n in range(6):
            after_reply.defer(work, n)
        await after_reply.settle()

    run(scenario(), timeout=STEP_TIMEOUT)
    assert seen_busy == [False] * 6


def test_work_gives_the_core_away_once_after_each_write_in_a_backlog() -> None:
    """A reply may have woken the runtime onto this core: the next slice sleeps first.

    A slice with no write before it does not sleep, so the work pays per reply
    only; nor does the first slice of new work, which came with its reply.
    """
    busy, writes = [False], [0]
    order: list[str] = []

    # The sleep is taken under SCHED_BATCH, so that waking from it preempts nothing.
    def sleep(seconds: float) -> None:
        order.append(f"sleep {seconds} under {os.sched_getscheduler(0)}")

    after_reply = AfterReply(slice_seconds=60, timings=DeferredTimings(give_way=0.25), sleep=sleep)

    def work(n: int) -> None:
        order.append(f"work {n}")
        if n in (0, 2):  # a request arrives; the first is answered, the second is not
            busy[0] = True
            asyncio.get_running_loop().call_soon(reply if n == 0 else no_reply)

    def reply() -> None:
        order.append("reply")
        writes[0] += 1
        busy[0] = False

    def no_reply() -> None:
        order.append("no reply")
        busy[0] = False

    async def scenario() -> None:
        after_reply.connected(Probe(lambda: busy[0], lambda: writes[0]))
        writes[0] += 1  # the reply of the handler that leaves the work
        for n in range(4):
            after_reply.defer(work, n)
        await after_reply.settle()

    run(scenario())
    give_way = f"sleep 0.25 under {os.SCHED_BATCH}"
    assert order == ["work 0", "reply", give_way, "work 1", "work 2", "no reply", "work 3"]


def test_no_sleep_while_another_request_waits() -> None:
    """Under steady load a request is always waiting: it is served, not slept on."""
    writes = [0]
    slept: list[float] = []
    # A piece per slice.
    after_reply = AfterReply(timings=DeferredTimings(run=0.0), sleep=slept.append)

    def reply() -> None:
        writes[0] += 1

    async def scenario() -> None:
        after_reply.connected(Probe(lambda: True, lambda: writes[0]))
        for _ in range(20):
            after_reply.defer(asyncio.get_running_loop().call_soon, reply)
        await after_reply.settle()

    run(scenario())
    assert writes[0] == 20
    assert slept == []


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_request_arriving_during_a_backlog_is_served_before_the_rest_of_it(loop: str) -> None:
    """On a real socket: the connection's busy() stops deferred work for a request,
    and its on_idle hook (the session's `idle`) starts it again once the request is answered.

    The slice is a minute long, so only the probe can let the request in
    before the backlog is done: the request is still on the socket, as the loop
    reads nothing while the slice runs.
    The wait for a busy connection is stretched to a minute, so that only the
    connection's hook can have the work go on within the test's 5 s.
    """
    order: list[str] = []
    after_reply = AfterReply(
        slice_seconds=60,
        timings=DeferredTimings(recheck=60.0),
        sleep=lambda _s: order.append("gave way"),
    )
    left, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    def request(stream_id: int, method: str) -> bytes:
        body = ttrpc_pb2.Request(service="s", method=method).SerializeToString()
        return frame_message(PLUGIN_CONN, encode_message(stream_id, MessageType.REQUEST, body))

    def work(n: int) -> None:
        order.append(f"work {n}")
        if n == 0:  # the runtime sends its next request now
            peer.send(request(3, "next"))

    async def first(_request: Any, _ctx: CallContext) -> api.Empty:
        for n in range(20):
            after_reply.defer(work, n)
        return api.Empty()

    next_request = asyncio.Event()

    async def following(_request: Any, _ctx: CallContext) -> api.Empty:
        order.append("next request")
        next_request.set()
        return api.Empty()

    async def scenario() -> None:
        service = Service(
            "s", {"first": Method(api.Empty, first), "next": Method(api.Empty, following)}
        )
        conn = MuxConnection({"s": service}, name="test", on_idle=after_reply.idle)
        after_reply.connected(conn)
        await conn.attach(left)
        peer.send(request(1, "first"))
        async with asyncio.timeout(STEP_TIMEOUT):
            await next_request.wait()  # sent by the first piece of work: the rest is queued
            await after_reply.settle()
        conn.close()

    factory = (
        asyncio.new_event_loop
        if loop == "asyncio"
        else pytest.importorskip("uvloop").new_event_loop
    )
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(asyncio.wait_for(scenario(), 5))
    peer.close()
    # The reply that came with the work is not followed by a sleep; the one
    # answered in the middle of the backlog is, once, before the work goes on.
    assert order[:3] == ["work 0", "next request", "gave way"]
    assert order[3:] == [f"work {n}" for n in range(1, 20)]


def test_work_still_gets_done_when_the_connection_is_never_idle() -> None:
    """Under steady load a request is always in flight: the work must not starve."""
    after_reply = AfterReply()
    done: list[int] = []

    async def scenario() -> None:
        after_reply.connected(Probe(lambda: True))
        for n in range(5):
            after_reply.defer(done.append, n)
        await after_reply.settle()

    run(scenario())
    assert done == [0, 1, 2, 3, 4]


def test_idle_work_waits_out_steady_load_that_the_other_work_runs_through() -> None:
    """Work deferred with defer_idle (a status answer) never runs while a request is in
    progress, not even in the runs that keep the other work from starving; and settling (a
    reload's) does not wait for it."""
    after_reply = AfterReply(timings=DeferredTimings(recheck=0.0, starved=0.0))
    busy = [True]
    done: list[str] = []

    async def scenario() -> None:
        after_reply.connected(Probe(lambda: busy[0]))
        after_reply.defer_idle(lambda: done.append("idle"))
        after_reply.defer(done.append, "kept up")
        await after_reply.settle()
        for _ in range(20):  # turns of the loop: the idle work is asked back again and again
            await asyncio.sleep(0)
        assert done == ["kept up"]
        busy[0] = False
        async with asyncio.timeout(STEP_TIMEOUT):
            while "idle" not in done:
                await asyncio.sleep(0)

    run(scenario())
    assert done == ["kept up", "idle"]


def test_under_steady_load_the_work_keeps_up_with_a_piece_per_request() -> None:
    """Each request leaves a piece (its log line): a piece per wait would fall behind."""
    after_reply = AfterReply()
    done: list[int] = []
    asked = [0]

    def busy() -> bool:
        asked[0] += 1
        return True

    async def scenario() -> None:
        after_reply.connected(Probe(busy))
        for n in range(200):
            after_reply.defer(done.append, n)
        await after_reply.settle()

    run(scenario())
    assert done == list(range(200))
    # Each wait for the busy connection costs two questions; 200 trivial
    # pieces fit in a handful of the runs that follow a wait.
    assert asked[0] < 50


class _SteadyLoad:
    """A connection never idle, and a clock that only the work and the requests move.

    Each piece of work takes `piece` seconds, each request `request`: the requests'
    pieces take more than the fifth of the time a run under steady load used to get."""

    def __init__(self, piece: float = 0.001, request: float = 0.0002) -> None:
        self.now = 0.0
        self.piece, self.request = piece, request
        self.queued = self.done = 0
        self.after_reply = AfterReply(
            timings=DeferredTimings(recheck=0.0, starved=0.002, run=0.0005),
            clock=lambda: self.now,
            set_scheduler=lambda _thread, _policy, _param: None,  # this thread's stays
        )

    def work(self) -> None:
        self.now += self.piece
        self.done += 1

    def defer(self) -> None:
        self.queued += 1
        self.after_reply.defer(self.work)

    async def requests(self, count: int, pieces: int) -> int:
        """`count` requests, each leaving `pieces`; returns the longest backlog met."""
        longest = 0
        for _ in range(count):
            self.now += self.request
            for _ in range(pieces):
                self.defer()
            longest = max(longest, self.queued - self.done)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        return longest


def test_under_steady_load_the_backlog_stays_within_what_one_wait_queues() -> None:
    """A request (a pod run and removed) leaves pieces that take longer than the time a run
    under steady load gets: those runs take at least what the requests queued, so the
    backlog (and what its pieces hold: a removed pod's view, log lines) stays bounded. On
    time alone it grew by some 1,900 pieces in 1,000 requests."""
    load = _SteadyLoad()

    async def scenario() -> int:
        load.after_reply.connected(Probe(lambda: True))
        longest = await load.requests(1000, pieces=2)
        while load.done < load.queued:  # the load goes on, with requests leaving nothing
            await load.requests(1, pieces=0)
        return longest

    longest = run(scenario())
    assert load.done == load.queued == 2000
    # A starved wait is 2 ms of the clock: 10 requests, 20 pieces.
    assert longest <= 2 * 2 * 10


def test_under_steady_load_what_began_the_backlog_goes_at_the_time_budgets_pace() -> None:
    """A Synchronize's pieces are queued before the load: a run under steady load does not
    take them all at once (the requests would wait for the whole backlog), only its time."""
    load = _SteadyLoad()

    async def scenario() -> int:
        load.after_reply.connected(Probe(lambda: True))
        for _ in range(100):
            load.defer()
        await load.requests(100, pieces=0)
        return load.done

    done = run(scenario())
    # 100 requests are 20 ms of the clock: under ten runs of one 1-ms piece each.
    assert 1 <= done < 10


def test_a_large_batch_queued_behind_a_backlog_is_owed_only_in_part() -> None:
    """A Synchronize on a reconnect may queue its pieces behind a backlog (a convergence pass
    under way): a run under steady load takes at most MAX_OWED of them beyond its time."""
    load = _SteadyLoad()

    async def scenario() -> int:
        load.after_reply.connected(Probe(lambda: True))
        load.defer()  # the backlog
        await asyncio.sleep(0)
        for _ in range(1000):
            load.defer()
        await load.requests(12, pieces=0)  # 2.4 ms: one run under steady load
        return load.done

    assert MAX_OWED <= run(scenario()) <= MAX_OWED + 2


def _policy() -> int:
    return os.sched_getscheduler(0)


def test_the_loop_thread_runs_under_sched_batch_while_work_is_pending() -> None:
    """Once work outlasts its first slice or waits for its delay; the normal policy after."""
    after_reply = AfterReply()
    seen: dict[str, int] = {}

    async def scenario() -> None:
        seen["before"] = _policy()
        # A request's own piece, done in the slice that follows its reply: no
        # backlog, and no system calls to move the thread for it.
        after_reply.defer(lambda: seen.setdefault("a lone piece", _policy()))
        await after_reply.settle()
        after_reply.defer_later(0.01, lambda: seen.setdefault("delayed work", _policy()))
        seen["while a delayed piece waits"] = _policy()
        after_reply.defer(lambda: seen.setdefault("queued work", _policy()))
        await after_reply.settle()
        seen["after"] = _policy()

    run(scenario())
    assert seen == {
        "before": os.SCHED_OTHER,
        "a lone piece": os.SCHED_OTHER,
        "while a delayed piece waits": os.SCHED_BATCH,
        "queued work": os.SCHED_BATCH,
        "delayed work": os.SCHED_BATCH,
        "after": os.SCHED_OTHER,
    }


def test_a_backlog_beyond_its_first_slice_runs_under_sched_batch() -> None:
    after_reply = AfterReply(slice_seconds=0.0)  # one piece a slice
    seen: list[int] = []

    async def scenario() -> None:
        for _ in range(3):
            after_reply.defer(lambda: seen.append(_policy()))
        await after_reply.settle()
        seen.append(_policy())

    run(scenario())
    assert seen == [os.SCHED_OTHER, os.SCHED_BATCH, os.SCHED_BATCH, os.SCHED_OTHER]


def test_a_policy_other_than_the_normal_one_is_left_as_it_is() -> None:
    """An operator who runs the plugin under SCHED_IDLE keeps it, work or no work."""
    seen: list[int] = []

    def in_an_idle_thread() -> None:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        after_reply = AfterReply()

        async def scenario() -> None:
            after_reply.defer_later(0, lambda: seen.append(_policy()))
            await after_reply.settle()
            seen.append(_policy())

        run(scenario())

    thread = threading.Thread(target=in_an_idle_thread)
    thread.start()
    thread.join(STEP_TIMEOUT)
    assert seen == [os.SCHED_IDLE, os.SCHED_IDLE]


def test_a_refused_policy_change_is_logged_once_and_the_work_still_runs() -> None:
    def refuse(_pid: int, _policy: int, _param: os.sched_param) -> None:
        raise PermissionError(1, "Operation not permitted")

    after_reply = AfterReply(set_scheduler=refuse)
    done: list[int] = []

    async def scenario() -> None:
        for n in range(3):
            after_reply.defer_later(0, done.append, n)
            await after_reply.settle()

    with structlog.testing.capture_logs() as logs:
        run(scenario())
    assert done == [0, 1, 2]
    refused = [e for e in logs if "scheduling policy" in e["event"]]
    assert len(refused) == 1
    assert "not permitted" in refused[0]["error"]


def test_pod_records_after_a_synchronize_are_written_one_a_piece(tmp_path: Path) -> None:
    """A request arriving while the records are written waits for the piece under way: one
    record (0.1-0.2 ms), not a batch (32 held requests for 3-7 ms)."""

    class Pieces(AfterReply):
        def __init__(self) -> None:
            super().__init__()
            self.pieces: list[tuple[Any, ...]] = []

        def defer(self, work: Any, *args: Any) -> None:
            self.pieces.append((getattr(work, "__name__", ""), *args))

    settings = settings_of(Config())
    writer = CgroupWriter(Path(settings.cgroups.root), CgroupDriver(settings.cgroups.driver))
    after = Pieces()
    live = Live(InForce(settings, settings.compile(), writer), Known())
    pod_ids = [f"s-{i}" for i in range(40)]
    for pod_id in pod_ids:
        live.known.add_pod(pod_id, pod_view(api.PodSandbox(id=pod_id, uid=f"u-{pod_id}")))
    records = Records(live, BaselineStore(tmp_path), after, dry_run=False)
    records.keep_after_sync({}, frozenset(f"u-{pod_id}" for pod_id in pod_ids))
    written = [piece[1] for piece in after.pieces if piece[0] == "_keep_all"]
    assert [pod_id for piece in written for pod_id in piece] == pod_ids
    assert max(len(piece) for piece in written) == 1
