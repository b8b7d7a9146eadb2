"""A rate limit per key over fixed windows, with the clock injected.

What a peer can repeat without end (a warning it provokes, a protocol rule it
breaks) is let through at most `limit` times per `window` seconds per key; the
rest is counted, and the count is handed back with the first one let through
once the window has passed, so a log line can say how many it stands for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

#: Keys remembered at once. Keys may come from a peer (an event id, say); past
#: this the oldest window is forgotten, and with it its count of suppressed ones.
MAX_KEYS = 256


@dataclass(slots=True)
class _Window:
    start: float
    admitted: int
    suppressed: int


class RateLimit(Generic[K]):
    def __init__(
        self,
        limit: int,
        window: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = MAX_KEYS,
    ) -> None:
        self._limit = limit
        self._window = window
        self._clock = clock
        self._max_keys = max_keys
        self._windows: dict[K, _Window] = {}

    def admit(self, key: K) -> int | None:
        """None if `key` is over its limit now; else how many were suppressed before this one."""
        now = self._clock()
        window = self._windows.get(key)
        if window is not None and now - window.start < self._window:
            if window.admitted < self._limit:
                window.admitted += 1
                return 0
            window.suppressed += 1
            return None
        suppressed = 0
        if window is not None:
            suppressed = window.suppressed
            del self._windows[key]  # re-inserted last: the oldest keys go first
        elif len(self._windows) >= self._max_keys:
            del self._windows[next(iter(self._windows))]
        self._windows[key] = _Window(now, 1, 0)
        return suppressed
