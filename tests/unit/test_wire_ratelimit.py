"""The rate limit per key: what passes, what is counted, what a reopened window reports."""

from __future__ import annotations

from nri_midbatch.wire.ratelimit import RateLimit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_past_the_limit_is_suppressed_and_counted_until_the_window_passes() -> None:
    clock = Clock()
    limit: RateLimit[str] = RateLimit(2, 60.0, clock=clock)
    assert [limit.admit("a") for _ in range(5)] == [0, 0, None, None, None]
    clock.now = 59.9
    assert limit.admit("a") is None
    clock.now = 60.0
    # The first one through after the window says how many it stands for.
    assert limit.admit("a") == 4
    assert limit.admit("a") == 0
    assert limit.admit("a") is None


def test_keys_are_limited_apart() -> None:
    limit: RateLimit[str] = RateLimit(1, 1.0, clock=Clock())
    assert limit.admit("a") == 0
    assert limit.admit("a") is None
    assert limit.admit("b") == 0


def test_keys_are_bounded_the_oldest_forgotten() -> None:
    limit: RateLimit[int] = RateLimit(1, 1.0, clock=Clock(), max_keys=3)
    for key in range(1000):  # a peer choosing keys cannot grow the table
        assert limit.admit(key) == 0
    # The three newest are remembered, and limited still; the fourth newest is forgotten.
    assert [limit.admit(key) for key in (997, 998, 999)] == [None, None, None]
    assert limit.admit(996) == 0
    assert limit.admit(0) == 0  # the oldest were forgotten
