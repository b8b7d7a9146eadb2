"""A least-recently-used cache bounded by entries and by bytes.

Pods and the runtime bring the strings this caches (annotations, serialized resources), so
a bound by entries alone is no bound on memory: 256 entries of a 250 KB annotation each
held hundreds of MB. The cost of an entry is an estimate of what it keeps alive; an entry
costing more than the whole budget is not kept. Every cache keyed by runtime, pod or
network input is one of these (tests/unit/test_caches.py holds the package to it).

Threads share these caches (the webhook's review workers share every module-level one), so
each has a lock, held for every touch of its entries. Without it two threads raced between a
lookup and `move_to_end` (a KeyError, an HTTP 500) and lost updates of `bytes`; worse, the C
OrderedDict is not safe against its table changing while it compares keys: a key whose
`__eq__` is Python code (a Fraction) lets another thread take the GIL mid-lookup, and a
resize meanwhile made `move_to_end` index with a value read from the freed table: a
segfault (CPython issue 142637 shows the same use-after-free from a re-entrant `__eq__`).
The computation itself runs outside the lock, so threads parse in parallel; two may
compute one key, and the second `put` keeps the first value.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

#: The byte bound of a cache over input: its texts or what they parse to.
INPUT_CACHE_BYTES = 1024 * 1024

__all__ = ["INPUT_CACHE_BYTES", "BoundedCache", "footprint"]

K = TypeVar("K")
V = TypeVar("V")

#: What the cache itself spends on an entry besides key and value: the ordered dict's
#: slot and link, and the (value, cost) pair.
_ENTRY_OVERHEAD = 200


def footprint(key: object, value: object) -> int:
    """About what an entry keeps alive: its key, its value and the cache's own share.

    The text a tuple key carries is counted too; an object shared with others (an int, a
    value instance many entries return) is counted at each use, so the count runs high.
    """
    size = sys.getsizeof(key) + sys.getsizeof(value) + _ENTRY_OVERHEAD
    if isinstance(key, tuple):
        size += sum(sys.getsizeof(part) for part in key)
    return size


class BoundedCache(Generic[K, V]):
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        #: Held for every read and change of `_entries` and `bytes`; never while computing.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: K, value: V, cost: int) -> None:
        if cost > self.max_bytes:
            return
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = (value, cost)
            self.bytes += cost
            while self.bytes > self.max_bytes or len(self._entries) > self.max_entries:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.bytes -= evicted

    def costs(self) -> list[int]:
        """Each entry's cost, oldest first: what `bytes` adds up."""
        with self._lock:
            return [cost for _, cost in self._entries.values()]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0

    def memoize(
        self, function: Callable[[K], V], cost: Callable[[K, V], int] = footprint
    ) -> Callable[[K], V]:
        """`function` with its results kept here, by its argument.

        A plain closure over the entries, not a method call per lookup: it sits on the
        path of every container decision (see bench/caches.py for what a hit costs; the
        lock adds about 80 ns to a hit).
        """
        entries = self._entries
        found = entries.get
        move_to_end = entries.move_to_end
        put = self.put
        # Bound methods, not `with`: a lock's __enter__ and __exit__ parse their arguments
        # and cost three times as much on 3.11 (300 against 100 ns here).
        acquire, release = self._lock.acquire, self._lock.release

        def cached(key: K) -> V:
            acquire()
            try:
                entry = found(key)
                if entry is not None:
                    move_to_end(key)
                    return entry[0]
            finally:
                release()
            value = function(key)
            put(key, value, cost(key, value))
            return value

        cached.__doc__ = function.__doc__
        cached.__name__ = getattr(function, "__name__", "cached")
        return cached
