"""BoundedCache: least recently used first out, bounded by entries and by bytes."""

from __future__ import annotations

import threading
from fractions import Fraction

import pytest

from nri_midbatch.policy.bounded_cache import BoundedCache


class Memoized:
    """A function memoized in `cache`, each key costing `costs[key]` (1 unless listed)."""

    def __init__(self, cache: BoundedCache[str, str | None], costs: dict[str, int]) -> None:
        self.cache = cache
        self.calls: list[str] = []
        self.cached = cache.memoize(self._compute, cost=lambda key, value: costs.get(key, 1))

    def _compute(self, key: str) -> str | None:
        self.calls.append(key)
        return None if key == "none" else key.upper()

    def kept(self, key: str) -> bool:
        """Whether `key` was answered from the cache (it is kept, and touched, either way)."""
        calls = len(self.calls)
        self.cached(key)
        return len(self.calls) == calls


def test_bytes_bound_evicts_the_least_recently_used() -> None:
    memo = Memoized(BoundedCache(max_entries=10, max_bytes=100), {"a": 40, "b": 40, "c": 40})
    assert [memo.cached(key) for key in "aba"] == ["A", "B", "A"]  # "b" is now the oldest
    memo.cached("c")
    assert (len(memo.cache), memo.cache.bytes) == (2, 80)
    assert (memo.kept("a"), memo.kept("c"), memo.kept("b")) == (True, True, False)


def test_entries_bound_holds_for_cheap_entries() -> None:
    memo = Memoized(BoundedCache(max_entries=3, max_bytes=10**9), {})
    for n in range(10):
        memo.cached(str(n))
    assert len(memo.cache) == 3
    assert [memo.kept(str(n)) for n in (7, 8, 9)] == [True, True, True]
    assert memo.kept("0") is False


def test_an_entry_above_the_whole_budget_is_not_kept_and_evicts_nothing() -> None:
    memo = Memoized(BoundedCache(max_entries=10, max_bytes=100), {"small": 10, "huge": 101})
    assert (memo.cached("small"), memo.cached("huge")) == ("SMALL", "HUGE")
    assert (len(memo.cache), memo.cache.bytes) == (1, 10)
    assert (memo.kept("small"), memo.kept("huge")) == (True, False)


def test_a_cached_none_is_told_from_a_miss_and_clear_empties() -> None:
    memo = Memoized(BoundedCache(max_entries=10, max_bytes=100), {})
    assert memo.cached("none") is None
    assert memo.kept("none") is True
    memo.cache.clear()
    assert (len(memo.cache), memo.cache.bytes) == (0, 0)
    assert memo.kept("none") is False


def test_memoize_keeps_no_outcome_of_a_call_that_raises() -> None:
    cache: BoundedCache[str, int] = BoundedCache(max_entries=10, max_bytes=100)
    cached = cache.memoize(int)
    with pytest.raises(ValueError):
        cached("not a number")
    assert len(cache) == 0 and cached("12") == 12


def test_threads_sharing_a_cache_get_their_values_and_leave_it_whole(
    switching_often: None,
) -> None:
    """Issue 30: the webhook's review workers share every module-level cache.

    Keys are Fractions, made afresh for each call (equal, not identical, to the cached
    one), so every hit runs Fraction.__eq__, Python code, inside the OrderedDict's C
    lookup; 24 of them through 4 entries, so the cache evicts all along. Unlocked, this
    raised KeyError from move_to_end within a few hundred calls, and could segfault.
    """
    cache: BoundedCache[Fraction, str] = BoundedCache(max_entries=4, max_bytes=10**9)
    cached = cache.memoize(str)
    failures: list[BaseException] = []

    def calls(seed: int) -> None:
        for n in range(10_000):
            amount = Fraction(seed + 7 * n % 24, 1000)
            try:
                assert cached(amount) == str(amount)
            except BaseException as error:
                failures.append(error)

    threads = [threading.Thread(target=calls, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    costs = cache.costs()  # in the order list, which must still agree with the table
    assert len(costs) == len(cache) <= 4
    assert cache.bytes == sum(costs)
