"""A least-recently-used cache bounded by entries and by bytes.

Pods bring the strings this caches (annotations), so a bound by entries
alone is no bound on memory: 256 entries of a 250 KB annotation each held
hundreds of MB. The cost of an entry is the caller's estimate of what it
keeps alive; an entry costing more than the whole budget is not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["BoundedCache"]

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")


class BoundedCache(Generic[K, V]):
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K, default: D) -> V | D:
        entry = self._entries.get(key)
        if entry is None:
            return default
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: K, value: V, cost: int) -> None:
        if cost > self.max_bytes or key in self._entries:
            return
        self._entries[key] = (value, cost)
        self.bytes += cost
        while self.bytes > self.max_bytes or len(self._entries) > self.max_entries:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.bytes -= evicted

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0
