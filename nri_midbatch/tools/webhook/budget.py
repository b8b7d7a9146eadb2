"""A review's time budget: admission checks it as it walks the containers, and stops when spent.

The clock is the caller's (the server passes `time.monotonic`, tests a counter), so admission
itself reads no clock. A check costs one clock read; admission makes one per container and
step, so a review stops within one container's work of its budget.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["UNLIMITED", "Budget", "OverBudget"]


class OverBudget(Exception):
    """The review used its whole budget; it is answered as the webhook's failure policy says."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the review took more than its budget of {seconds:g} s")
        self.seconds = seconds


class Budget:
    __slots__ = ("_clock", "_ends", "seconds")

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._ends = clock() + seconds

    def check(self) -> None:
        """Raise OverBudget once the budget is spent."""
        if self._clock() >= self._ends:
            raise OverBudget(self.seconds)


#: For callers with no deadline (the CLI's explain, tests of the decisions themselves).
UNLIMITED = Budget(math.inf)
