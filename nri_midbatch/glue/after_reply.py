"""Work an event handler leaves for after its reply is on the wire.

The runtime waits for every plugin's reply while it holds its locks, and
drops a plugin that is late once. Whatever the reply does not depend on (the
decision log lines, the pod cgroup files of a Synchronize) is better done
once the runtime has its answer.

This relies on one property of the connection (rpc/connection.py): a reply
is written in the same step of the event loop as its handler returns, so
nothing queued here can run before it. Work runs in the order it was queued,
in slices of at most `slice_seconds`, so that a request arriving in the
middle of a long backlog waits for one slice, not for all of it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger(__name__)

#: Long enough to amortize a trip through the loop, short next to an event.
DEFAULT_SLICE_SECONDS = 0.002


class AfterReply:
    def __init__(self, slice_seconds: float = DEFAULT_SLICE_SECONDS) -> None:
        self._slice = slice_seconds
        self._queue: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        #: The next slice, when one is due: a loop callback, cheaper than a task per reply.
        self._next_slice: asyncio.Handle | None = None
        self._timers: set[asyncio.TimerHandle] = set()
        self._waiters: list[asyncio.Future[None]] = []

    def defer(self, work: Callable[..., Any], *args: Any) -> None:
        """Run work(*args) once the current handler's reply is out."""
        self._queue.append((work, args))
        if self._next_slice is None:
            self._next_slice = asyncio.get_running_loop().call_soon(self._run_slice)

    def defer_later(self, delay: float, work: Callable[..., Any], *args: Any) -> None:
        """Queue work(*args) after `delay` seconds, e.g. to try a write again."""

        def due() -> None:
            self._timers.discard(timer)
            self.defer(work, *args)

        timer = asyncio.get_running_loop().call_later(delay, due)
        self._timers.add(timer)

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
        while self._queue:
            self._run_one()
        self._wake_if_idle()
        return cancelled

    def _run_slice(self) -> None:
        self._next_slice = None
        deadline = time.perf_counter() + self._slice
        while self._queue:
            self._run_one()
            if time.perf_counter() >= deadline:
                break
        if self._queue:
            # Behind whatever became ready meanwhile, a request among them.
            self._next_slice = asyncio.get_running_loop().call_soon(self._run_slice)
        else:
            self._wake_if_idle()

    def _busy(self) -> bool:
        return bool(self._queue or self._timers or self._next_slice is not None)

    def _wake_if_idle(self) -> None:
        if self._busy():
            return
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    def _run_one(self) -> None:
        work, args = self._queue.popleft()
        try:
            work(*args)
        except Exception:  # one bad item must not stop the ones behind it
            log.exception("work after reply failed", work=getattr(work, "__qualname__", work))
