"""Reviews decided off the server's event loop, in worker threads, bounded in number and time.

The HTTP loop only reads requests and writes answers; each review runs in a worker, so a slow
one delays no other. Lanes by body size, each with its own workers and its own bound on
reviews waiting for one: a review takes the first lane whose `max_body` its body fits. A
review's cost (time, and the memory it parses into, several times its body) grows with its
body, so reviews wait only behind reviews of their own size class: however many bodies just
under one lane's line arrive, the lanes below keep every one of their slots, and the memory
the costly ones hold is bounded by their lane's few workers.

A review gets `budget` seconds from the moment it is handed over (its wait for a worker
included); admission stops at the budget and answers as the failure policy says
(admission.over_budget). A review still not back `grace` seconds after its budget (a single
uninterruptible step, such as parsing a 3 MiB body on a starved core) is abandoned: the loop
answers without it (`Abandoned`), and its worker is counted busy until it returns.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from .budget import Budget

__all__ = ["Abandoned", "Busy", "Lane", "ReviewPool"]

T = TypeVar("T")


class Busy(Exception):
    """Every worker of the lane is busy and its waiting room is full."""


class Abandoned(Exception):
    """The review was not back from its worker within its budget and the grace."""


class Lane:
    """Workers and a bound on the reviews handed to them and not yet finished.

    For bodies of at most `max_body` bytes (None: any body the server reads).
    """

    def __init__(self, name: str, workers: int, waiting: int, max_body: int | None) -> None:
        if workers < 1 or waiting < 0:
            raise ValueError(f"lane {name}: at least one worker and no negative waiting room")
        self.name = name
        self.max_body = max_body
        self.capacity = workers + waiting
        #: Reviews handed over and not finished, running or waiting; touched on the loop only.
        self.taken = 0
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix=f"webhook-{name}")

    def submit(self, work: Callable[[], T]) -> asyncio.Future[T]:
        if self.taken >= self.capacity:
            raise Busy(f"{self.capacity} {self.name} reviews in progress or waiting")
        future = asyncio.get_running_loop().run_in_executor(self._executor, work)
        self.taken += 1
        # The slot is free when the worker is, not when the loop stops waiting for it.
        future.add_done_callback(self._release)
        return future

    def _release(self, _: object) -> None:
        self.taken -= 1

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class ReviewPool:
    def __init__(
        self,
        lanes: Sequence[Lane],
        *,
        budget: float,
        grace: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`lanes` by growing `max_body`; the last one takes any body (max_body None)."""
        if not lanes or lanes[-1].max_body is not None:
            raise ValueError("the last lane takes any body: its max_body is None")
        bounds = [lane.max_body for lane in lanes[:-1] if lane.max_body is not None]
        if len(bounds) != len(lanes) - 1 or bounds != sorted(bounds):
            raise ValueError("the other lanes have a max_body each, growing")
        self.lanes = tuple(lanes)
        self.budget = budget
        self.grace = grace
        self._clock = clock

    def lane(self, body_bytes: int) -> Lane:
        return next(
            lane for lane in self.lanes if lane.max_body is None or body_bytes <= lane.max_body
        )

    async def run(self, body_bytes: int, review: Callable[[Budget], T]) -> T:
        """review(budget) in a worker of the body's lane; Busy or Abandoned when it cannot be."""
        budget = Budget(self.budget, self._clock)
        future = self.lane(body_bytes).submit(lambda: review(budget))
        try:
            # shield: the worker runs on after a timeout here; its lane slot stays taken
            # until it returns.
            return await asyncio.wait_for(asyncio.shield(future), self.budget + self.grace)
        except TimeoutError:
            raise Abandoned(
                f"no answer within the {self.budget:g} s budget and {self.grace:g} s grace"
            ) from None

    def shutdown(self) -> None:
        for lane in self.lanes:
            lane.shutdown()
