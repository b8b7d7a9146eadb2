"""Keeping the process small and its pauses short after a large Synchronize.

Process policy, not protocol: the App triggers it once a large Synchronize
has been answered.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

#: Pods plus containers from which a Synchronize is large enough to settle the heap after.
LARGE_SYNC = 1000

_malloc_trim: Callable[[int], int] | None = None
_malloc_trim_loaded = False


def settle_heap() -> None:
    """After a large Synchronize: freeze what the plugin keeps, return freed memory.

    What a Synchronize leaves (the remembered pods and containers, tens of
    thousands of objects) would otherwise be walked by every later full
    garbage collection, and the first of them comes soon after, as those
    objects are promoted: a 36 ms pause in the middle of some CreateContainer
    on a node with 10,000 containers. Freezing them (gc.freeze, a few
    microseconds) takes them out of later collections; they are still freed
    by reference counting when the runtime removes them.

    No collection first: on the benchmark's node of 10,000 containers it took
    31 ms and found nothing to free (the plugin's state holds no cycles), and
    work deferred after a reply must not hold up the next request for that
    long. A cycle that is garbage at this moment stays frozen, uncollected.
    """
    gc.freeze()
    release_freed_memory()


def release_freed_memory() -> None:
    """Give the pages of freed heap memory back to the OS (glibc; elsewhere a no-op).

    A Synchronize of a large node parses tens of MB of protobuf, all freed
    once it is answered; glibc keeps such memory in the heap for reuse, so
    the plugin would go on holding its peak: 26 MB for 1,000 pods and 10,000
    containers, most of the process.
    """
    global _malloc_trim, _malloc_trim_loaded
    if not _malloc_trim_loaded:
        _malloc_trim_loaded = True
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = None
    if _malloc_trim is not None:
        _malloc_trim(0)
