"""Keeping the process small and its pauses short after a large Synchronize.

Process policy, not protocol: the App triggers it as the chunks of a large
Synchronize come in and once it has been answered.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

#: Pods plus containers from which a Synchronize is large enough to settle the heap after.
LARGE_SYNC = 1000

_malloc_trim: Callable[[int], int] | None = None
_malloc_trim_loaded = False


def freeze_survivors() -> None:
    """Take every object alive now out of the garbage collector's generations.

    Called after each chunk of a large Synchronize is taken in, and once it
    is answered. What a Synchronize keeps (the remembered pods and containers,
    hundreds of thousands of objects) would otherwise be walked by the full
    collections its own allocations set off: on a node of 10,000 containers,
    pauses of 20 ms while the chunks came in and of 75 ms among the work left
    for after the reply (taken with gc.callbacks on a loaded machine). Frozen
    (gc.freeze, microseconds), they are still freed by reference counting
    when the runtime removes them; the collector keeps to what came later.

    No collection first: on the benchmark's node it took 31 ms and found
    nothing to free (the plugin's state holds no cycles). A cycle that is
    garbage at this moment stays frozen, uncollected: a few objects per large
    Synchronize at most.
    """
    gc.freeze()


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
