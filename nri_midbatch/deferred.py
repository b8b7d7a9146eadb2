"""Work an event handler leaves for after its reply is on the wire.

The runtime waits for every plugin's reply while it holds its locks, and
drops a plugin that is late once. Whatever the reply does not depend on (the
decision log lines, the pod cgroup files of a Synchronize) is better done
once the runtime has its answer.

This room knows nothing of NRI: it asks one thing of the connection that
serves the runtime (`Connection`, rpc/connection.py's `MuxConnection` in the
plugin), and is told two (`connected`, `idle`), by an adapter that hears the
session (plugin/observer.py, `AfterReplyListener`). It relies on one property of
that connection: a reply is written in the same step of the event loop as its
handler returns, so nothing queued here can run before it. Work runs in the
order it was queued, in slices of at most `slice_seconds`, and only while the
connection is idle: before each piece of work it asks the connection it was
last told of (`connected`) whether it is busy (a request being served,
received and not yet dispatched, or bytes waiting on the socket). While it
says yes the work waits until the connection has answered what it was serving
(`idle`), or `DeferredTimings.recheck` if nothing is answered (bytes that are
not a request yet). A request arriving in the middle of a long backlog so
waits for at most the piece of work under way (a pod's cgroup files, one
container's read, 8 log lines: 0.1-0.6 ms), not for a slice or the whole
backlog.

Only under steady load, when the work has not run for `DeferredTimings.starved`
because a request was always in flight, does it run regardless: for
`DeferredTimings.run`, and on until the pieces handlers queued since the
backlog began have run (up to `MAX_OWED` of them). It must keep up, or what it
holds (log lines, a removed sandbox's pod) grows without end: on time alone it
fell behind once the requests' pieces took more than a fifth of the time, and
the benchmark's pods, run and removed back to back, left about 4 KB each in
the queue (285 MB after 110,000 of them). The pieces that began the backlog
(a Synchronize's) are not owed and go at the pace of the time budget. So under
steady load the queue never grows past what began the backlog plus what the
requests of one starved wait queued. The work used to run regardless after any
wait of `DeferredTimings.recheck`, and requests that came about a millisecond
apart (the benchmark's probes, a runtime starting containers one by one) met
that forced run, in step with it, in one case in ten.

The other way round, the runtime must not wait for the work either. A reply
wakes the runtime's thread, and Linux often wakes it on the core of the
process that wrote (the waker is expected to sleep next). The work keeps
that core busy, so the thread would wait for the scheduler's next tick (4 ms
at HZ=250). Two things prevent that:

- after a write to the runtime (the connection's `writes` count) in the middle of a
  backlog, the next slice first sleeps `DeferredTimings.give_way`, which hands the
  core over at once. Not when the work is the new work of the request just
  answered (a CreateContainer's log line: the loop is idle again right after
  it), nor while another request waits: serving it comes first, and under
  steady load a sleep per reply cost 15% of the throughput;
- while a backlog is pending (work that outlasts its first slice, or waits
  for its delay), the loop's thread runs under `SCHED_BATCH` (`BatchPolicy`).
  When it wakes (from that sleep, or a wait for a busy connection) it then
  does not preempt the thread on its core: at the normal policy it did, and
  the runtime's thread it displaced waited for the tick. A request's own
  piece, done in the slice after its reply, costs no system call for this.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

log = structlog.get_logger(__name__)

#: Long enough to amortize a trip through the loop, short next to an event.
DEFAULT_SLICE_SECONDS = 0.002
#: Containers whose cgroup files one piece of work reads: finding and reading a
#: container's three files takes 0.1 ms on a quiet node and 0.5 ms on this
#: project's 2-core VM.
CGROUP_READS_PER_PIECE = 1
#: At most this many pieces are owed (see the module's text): more than the requests of
#: one starved wait queue (a piece or two a request, a few dozen requests in 2 ms at
#: most), and what a run under steady load may take beyond its time when a
#: large batch (a Synchronize's on a reconnect) was queued behind a backlog: at 0.1-0.5 ms
#: a piece, tens of milliseconds once, not the whole batch.
MAX_OWED = 128


@dataclass(frozen=True, slots=True)
class DeferredTimings:
    """How deferred work waits for a busy connection and gives the runtime its core."""

    #: How long deferred work waits for a busy connection that answers nothing
    #: before it asks again: a request takes a fraction of a millisecond, and
    #: nothing deferred is urgent.
    recheck: float = 0.001
    #: How long the work must have been kept from running by a busy connection
    #: before it runs regardless: only steady load (a request always in flight)
    #: keeps it from running that long; the connection is idle between requests
    #: that are not.
    starved: float = 0.002
    #: How long it then runs: a fifth of the time under steady load, many times
    #: what the work of the requests needs.
    run: float = 0.0005
    #: How long a slice sleeps after a write to the runtime before it begins:
    #: enough for the scheduler to switch to the thread the write woke, short
    #: next to the work (with timer slack, 0.1 ms).
    give_way: float = 0.00005


#: os.sched_setscheduler's signature: the thread (0: the caller), the policy, its parameter.
SetScheduler = Callable[[int, int, os.sched_param], None]


class BatchPolicy:
    """Runs the calling thread under SCHED_BATCH between `enter` and `leave`.

    SCHED_BATCH keeps the thread's share of the CPU; it only gives up
    preempting on wake-up. The thread is moved only if it runs under
    SCHED_OTHER when first entered, so that a policy the operator chose
    stands; if the kernel refuses (a seccomp profile, say), the work runs
    under the thread's policy as it is, and that is logged once.
    """

    def __init__(self, set_scheduler: SetScheduler = os.sched_setscheduler) -> None:
        self._set_scheduler = set_scheduler
        self._usable: bool | None = None  # known at the first enter, in the loop's thread
        self._entered = False

    def enter(self) -> None:
        if self._entered:
            return
        if self._usable is None:
            self._usable = os.sched_getscheduler(0) == os.SCHED_OTHER
        if self._usable and self._set(os.SCHED_BATCH):
            self._entered = True

    def leave(self) -> None:
        if self._entered:
            self._entered = False
            self._set(os.SCHED_OTHER)

    def _set(self, policy: int) -> bool:
        try:
            self._set_scheduler(0, policy, os.sched_param(0))
        except OSError as exc:
            self._usable = False
            log.info("deferred work runs under the thread's own scheduling policy", error=str(exc))
            return False
        return True


class Connection(Protocol):
    """What the work asks of the connection it yields to, before each piece."""

    @property
    def writes(self) -> int:
        """Writes to the peer so far on this connection."""
        ...

    def busy(self) -> bool:
        """A request is in progress: being served, read, or on the socket."""
        ...


class _NoConnection:
    """Before any connection (replay, tests): never busy, nothing written."""

    writes = 0

    def busy(self) -> bool:
        return False


class AfterReply:
    def __init__(
        self,
        slice_seconds: float = DEFAULT_SLICE_SECONDS,
        *,
        timings: DeferredTimings = DeferredTimings(),
        sleep: Callable[[float], None] = time.sleep,
        set_scheduler: SetScheduler = os.sched_setscheduler,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """sleep: how a slice gives the core away; set_scheduler: how it moves to SCHED_BATCH;
        clock: what times the slices."""
        self._slice = slice_seconds
        self._timings = timings
        self._sleep = sleep
        self._clock = clock
        self._queue: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        #: The next slice, when one is due: a loop callback, cheaper than a task per reply.
        self._next_slice: asyncio.Handle | None = None
        #: The next slice waits for a busy connection (`idle` starts it early).
        self._waiting = False
        #: When a piece of work last ran, or the work began (see DeferredTimings.starved).
        self._ran_at = 0.0
        #: The next slice is the first since the loop had nothing deferred.
        self._first_slice = False
        #: Pieces handlers queued since the backlog began, less those run since: what a
        #: run under steady load must at least take (see the module's text).
        self._owed = 0
        #: A slice is running: what its work queues is not a handler's.
        self._in_slice = False
        self._timers: set[asyncio.TimerHandle] = set()
        self._waiters: list[asyncio.Future[None]] = []
        self._policy = BatchPolicy(set_scheduler)
        #: The connection to yield to, and its writes as of the last slice.
        self._connection: Connection = _NoConnection()
        self._writes_seen = 0

    def connected(self, connection: Connection) -> None:
        """Run work only while `connection.busy()` is false (it is asked before each piece).

        When `connection.writes` has moved since the last slice, the next one gives the
        core away first (see the module's text).
        """
        self._connection = connection
        self._writes_seen = connection.writes

    def idle(self) -> None:
        """The connection has answered the requests it was serving: work waiting for it goes on.

        Told by the session after the last reply; the slice runs a turn of the loop
        later, so that whatever that reply made ready (another request) goes first.
        """
        if self._waiting and self._next_slice is not None:
            self._next_slice.cancel()
            self._waiting = False
            self._next_slice = asyncio.get_running_loop().call_soon(self._run_slice)

    def defer(self, work: Callable[..., Any], *args: Any) -> None:
        """Run work(*args) once the current handler's reply is out."""
        self._queue.append((work, args))
        if self._next_slice is None:
            self._first_slice = True
            self._next_slice = asyncio.get_running_loop().call_soon(self._run_slice)
        elif not self._in_slice and self._owed < MAX_OWED:
            self._owed += 1

    def defer_idle(self, work: Callable[..., Any], *args: Any) -> None:
        """Like `defer`, for work that need not keep up (a status answer): never run while a
        request is in progress, not even under steady load (`DeferredTimings.starved`); there
        it waits `DeferredTimings.recheck` and is queued again. While it waits, `settle` and
        `flush` do not wait for it."""
        self.defer(self._when_idle, work, args)

    def _when_idle(self, work: Callable[..., Any], args: tuple[Any, ...]) -> None:
        if self._connection.busy():
            loop = asyncio.get_running_loop()
            loop.call_later(self._timings.recheck, self.defer_idle, work, *args)
        else:
            work(*args)

    def defer_later(self, delay: float, work: Callable[..., Any], *args: Any) -> None:
        """Queue work(*args) after `delay` seconds, e.g. to try a write again."""

        def due() -> None:
            self._timers.discard(timer)
            self.defer(work, *args)

        timer = asyncio.get_running_loop().call_later(delay, due)
        self._timers.add(timer)
        self._policy.enter()

    async def settle(self) -> None:
        """Wait until everything queued, and everything it queues in turn, has run."""
        if self._busy():
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def flush(self) -> int:
        """Run what is queued now and cancel what waits for its delay (shutting down).

        Returns how many delayed items were cancelled.
        """
        cancelled = len(self._timers)
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        if self._next_slice is not None:
            self._next_slice.cancel()
            self._next_slice = None
            self._waiting = False
        while self._queue:
            self._run_one()
        self._wake_if_idle()
        return cancelled

    def _run_slice(self) -> None:
        # `_next_slice` stays set while the slice runs: work that defers more
        # work (the lowering wait does) must not start a second chain of
        # slices beside this one. Each chain would run its own slice per turn
        # of the loop, and each deferring piece would add one more: timers and
        # requests waited 5, 15, 40, then 100 ms behind them.
        self._waiting = False
        self._in_slice = True
        try:
            self._run_pieces()
        finally:
            self._in_slice = False

    def _run_pieces(self) -> None:
        connection = self._connection
        busy = connection.busy
        clock = self._clock
        if not self._first_slice:
            # Before the sleep below: waking from it must not preempt the runtime.
            self._policy.enter()
        writes = connection.writes
        if writes != self._writes_seen:
            # Only between slices can a reply go out: the loop runs one thing at a time.
            self._writes_seen = writes
            if not self._first_slice and not busy():
                self._sleep(self._timings.give_way)
        now = clock()
        if self._first_slice:
            self._first_slice = False
            self._ran_at = now
            self._owed = 0  # what began the backlog goes at the time budget's pace
        deadline = now + self._slice
        if now - self._ran_at >= self._timings.starved and busy():
            forced_until = now + self._timings.run
            while self._queue:
                self._run_one()
                self._ran_at = clock()
                if self._ran_at >= forced_until and not self._owed:
                    break
        while self._queue and not busy():
            self._run_one()
            self._ran_at = clock()
            if self._ran_at >= deadline:
                break
        if not self._queue:
            self._next_slice = None
            self._wake_if_idle()
        elif busy():
            # A request goes first; the session says when it has answered (`idle`).
            self._waiting = True
            loop = asyncio.get_running_loop()
            self._next_slice = loop.call_later(self._timings.recheck, self._run_slice)
        else:
            # Behind whatever became ready meanwhile.
            self._next_slice = asyncio.get_running_loop().call_soon(self._run_slice)

    def _busy(self) -> bool:
        return bool(self._queue or self._timers or self._next_slice is not None)

    def _wake_if_idle(self) -> None:
        if self._busy():
            return
        self._policy.leave()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    def _run_one(self) -> None:
        work, args = self._queue.popleft()
        if self._owed > 0:  # the oldest pieces run first, owed or not
            self._owed -= 1
        try:
            work(*args)
        except Exception:  # one bad item must not stop the ones behind it
            log.exception("work after reply failed", work=getattr(work, "__qualname__", work))
