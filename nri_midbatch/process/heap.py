"""The process's heap: glibc's reuse of large buffers, and the collector after a large Synchronize.

Process policy, not protocol: `reuse_large_buffers` runs once, at start-up;
the App's session observer (session_watch.py) triggers `freeze_survivors` as
the chunks of a large Synchronize come in and once it has been answered, and
holds the collector's automatic runs from its first large chunk to its reply.
"""

from __future__ import annotations

import gc
import os

#: glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Allocations from this size up are mapped on their own. Above the largest
#: ttrpc message (4 MiB, wire/ttrpc.py) and its buffers, so that those come
#: from the heap.
MMAP_THRESHOLD = 8 << 20
#: Free memory at the top of the heap that glibc keeps rather than returning:
#: room for what one Synchronize chunk allocates and frees (its 4 MiB received,
#: framed and copied, and the objects it is decoded into), which the next chunk
#: then reuses. At 16 MiB, about half the Synchronizes still gave back 21 MB or
#: more and faulted it in again. The most this adds to the resident memory.
TRIM_THRESHOLD = 32 << 20


def reuse_large_buffers() -> bool:
    """Have glibc serve a Synchronize chunk's buffers from its heap, and keep them for the next.

    By default glibc maps each allocation of 128 KiB and more on its own and
    unmaps it when freed, raising that bound as it sees larger ones freed, and
    returns the heap's free top once it passes twice the bound. A chunk of a
    large Synchronize is 4 MiB received, copied into its message and decoded,
    so in a new process, whose first Synchronize is the one that counts,
    chunk after chunk landed on fresh pages: 35,000 page faults for the
    benchmark's node, against 10,500 (the pages the heap grows by) with these
    settings, each 1-2 us on its VM: some 30 ms of the 0.24 s the
    Synchronize took (docs/performance-history.md, round 7).

    Fixed bounds (which also turn glibc's adjustment off) keep them in the
    heap. True if glibc took them; on another C library nothing changes.
    """
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        glibc = None
    if not glibc:
        return False
    import ctypes  # here: 1.5 ms and 0.4 MB that only glibc's processes pay

    libc = ctypes.CDLL(None)
    return bool(
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


#: Pods plus containers from which a Synchronize is large enough to freeze what it leaves.
LARGE_SYNC = 1000


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


def hold_collections() -> None:
    """No automatic collection until `release_collections`: while a large Synchronize is decided.

    Its reply builds the node's state anew (a view, an entry and ids per container,
    dicts of 10,000 entries), all of it kept, and none of it in cycles. Each young
    collection it set off walked what it had built so far: 9 ms of the last chunk's
    time on the benchmark's node, 38 ms in a run on a loaded machine, for nothing
    to free (docs/performance-history.md, round 9). Frozen once answered, it never
    meets the collector at all.
    """
    gc.disable()


def release_collections() -> None:
    """The collector runs again, as usual (the Synchronize is answered, failed or gone)."""
    gc.enable()
