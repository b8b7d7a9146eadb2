"""BoundedCache: least recently used first out, bounded by entries and by bytes."""

from __future__ import annotations

import pytest

from nri_midbatch.policy.bounded_cache import BoundedCache


def test_bytes_bound_evicts_the_least_recently_used() -> None:
    cache: BoundedCache[str, int] = BoundedCache(max_entries=10, max_bytes=100)
    cache.put("a", 1, 40)
    cache.put("b", 2, 40)
    assert cache.get("a", None) == 1  # "b" is now the least recently used
    cache.put("c", 3, 40)
    assert (cache.get("a", None), cache.get("b", None), cache.get("c", None)) == (1, None, 3)
    assert (len(cache), cache.bytes) == (2, 80)


def test_entries_bound_holds_for_cheap_entries() -> None:
    cache: BoundedCache[int, int] = BoundedCache(max_entries=3, max_bytes=10**9)
    for n in range(10):
        cache.put(n, n, 1)
    assert len(cache) == 3
    assert [cache.get(n, None) for n in range(10)] == [None] * 7 + [7, 8, 9]


def test_an_entry_above_the_whole_budget_is_not_kept_and_evicts_nothing() -> None:
    cache: BoundedCache[str, int] = BoundedCache(max_entries=10, max_bytes=100)
    cache.put("small", 1, 10)
    cache.put("huge", 2, 101)
    assert cache.get("huge", None) is None
    assert cache.get("small", None) == 1
    assert cache.bytes == 10


def test_a_cached_falsy_value_is_told_from_a_miss() -> None:
    cache: BoundedCache[str, None] = BoundedCache(max_entries=10, max_bytes=100)
    cache.put("none", None, 1)
    missing = object()
    assert cache.get("none", missing) is None
    assert cache.get("other", missing) is missing
    cache.clear()
    assert (len(cache), cache.bytes, cache.get("none", missing)) == (0, 0, missing)


def test_memoize_calls_the_function_once_per_kept_key_and_charges_its_cost() -> None:
    cache: BoundedCache[str, int] = BoundedCache(max_entries=10, max_bytes=100)
    calls: list[str] = []

    def length(text: str) -> int:
        calls.append(text)
        return len(text)

    cached = cache.memoize(length, cost=lambda key, value: value)
    assert [cached("abc"), cached("abc"), cached("x" * 101), cached("x" * 101)] == [3, 3, 101, 101]
    # The 101-byte entry costs more than the whole budget: computed each time, never kept.
    assert calls == ["abc", "x" * 101, "x" * 101]
    assert (len(cache), cache.bytes) == (1, 3)
    cache.clear()
    assert cached("abc") == 3 and calls[-1] == "abc"


def test_memoize_keeps_no_outcome_of_a_call_that_raises() -> None:
    cache: BoundedCache[str, int] = BoundedCache(max_entries=10, max_bytes=100)
    cached = cache.memoize(int)
    with pytest.raises(ValueError):
        cached("not a number")
    assert len(cache) == 0 and cached("12") == 12
