"""When to repair after systemd's reloads: once a burst of them is over.

Pure: times are the caller's (the event loop's clock), so the rule can be
tested without waiting. A reload that ends starts or extends a burst; the
repair pass comes `quiet` seconds after the last reload of the burst, but no
later than `longest` seconds after its first, so reloads that never stop
still get a pass that often. Passes are therefore at least `quiet` apart.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RepairTimings:
    #: Seconds without a reload before the pass; also covers a unit whose
    #: cgroup is realized a little after systemd announced the reload's end.
    quiet: float = 1.0
    #: The most seconds a pass waits after the first reload of a burst.
    longest: float = 10.0


DEFAULT_TIMINGS = RepairTimings()


@dataclass(slots=True)
class ReloadBurst:
    timings: RepairTimings = DEFAULT_TIMINGS
    #: When the burst's first reload ended; None: no burst.
    _start: float | None = None
    #: Reloads in the burst so far.
    reloads: int = 0

    def note(self, now: float) -> float:
        """A reload ended at `now`: when the repair pass is due."""
        if self._start is None:
            self._start = now
        self.reloads += 1
        return min(now + self.timings.quiet, self._start + self.timings.longest)

    def end(self) -> int:
        """The pass starts: the burst is over; how many reloads it had."""
        reloads, self.reloads, self._start = self.reloads, 0, None
        return reloads
