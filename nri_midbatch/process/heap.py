"""Keeping the garbage collector's pauses short after a large Synchronize.

Process policy, not protocol: the App triggers it as the chunks of a large
Synchronize come in and once it has been answered.
"""

from __future__ import annotations

import gc

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
