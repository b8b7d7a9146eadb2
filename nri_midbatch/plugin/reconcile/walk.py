"""The pass's pace: a walk over workloads in pieces of the work left for after replies.

A request must never wait for a whole pass: each piece checks workloads (check.py) up to
`piece_workloads` of them or `piece_seconds`, then queues the next (deferred.py), so a
request waits for at most one piece; the pieces of a whole pass are queued one at a time.
The walk owns the order of writes: a pod before its containers, and a pod whose write
failed once more after them (on cgroup v1 a pod's quota may not go below a child's, nor a
child's above its pod's). A piece opens each directory on its way once: a pod's and its
containers' cgroups sit side by side.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from nri_midbatch.cgroups.fs import OpenDirectories
from nri_midbatch.cgroups.values import CgroupValues
from nri_midbatch.deferred import AfterReply
from nri_midbatch.plugin.context import Live
from nri_midbatch.plugin.reconcile.check import Checker, Outcome, Workload


@dataclass(slots=True)
class Walk:
    """Where a pass (or a re-check) is: the pods left, and the current pod's workloads."""

    pods: deque[str]
    done: asyncio.Future[None] | None = None
    items: deque[Workload] = field(default_factory=deque)
    retried: bool = False
    #: workloads whose files were read, and those put back
    read: int = 0
    repaired: int = 0
    #: The Synchronize's trigger: container id -> the values the runtime reports it holds,
    #: which the walk compares its files with (not the target: the runtime applies the
    #: reply's updates itself); None: the target
    reported: dict[str, CgroupValues] | None = None
    #: Of those, the ones whose write failed, tried once more after the Synchronize's pods
    #: (`final`: the last try)
    again: list[Workload] = field(default_factory=list)
    final: bool = False


class Walker:
    def __init__(
        self,
        live: Live,
        after_reply: AfterReply,
        checker: Checker,
        *,
        piece_workloads: int,
        piece_seconds: float,
    ) -> None:
        self._live = live
        self._after_reply = after_reply
        self._checker = checker
        self._piece_workloads = piece_workloads
        self._piece_seconds = piece_seconds
        self._closed = False

    def start(self, walk: Walk) -> None:
        """Walk after the current reply, a piece at a time."""
        self._after_reply.defer(self._step, walk)

    def close(self) -> None:
        """No piece runs any more (shutting down)."""
        self._closed = True

    def _step(self, walk: Walk) -> None:
        """One piece: workloads checked until `piece_workloads` or `piece_seconds`; then the
        next piece is queued."""
        if self._closed:
            return
        deadline = time.perf_counter() + self._piece_seconds
        directories = OpenDirectories()
        try:
            for _ in range(self._piece_workloads):
                item = self._next(walk)
                if item is None:
                    self._through(walk)
                    return
                pod_id, container_id = item
                reported = None
                if walk.reported is not None:
                    assert container_id is not None  # it reports containers only
                    reported = walk.reported[container_id]
                outcome = self._checker.check(item, directories, reported, final=walk.final)
                if outcome is not Outcome.SKIPPED:
                    walk.read += 1
                    walk.repaired += outcome is Outcome.REPAIRED
                if outcome is Outcome.FAILED and walk.reported is not None and not walk.final:
                    walk.again.append(item)
                elif container_id is None and outcome is Outcome.FAILED and not walk.retried:
                    # Once more after its containers: they may hold it back (cgroup v1).
                    walk.retried = True
                    walk.items.append((pod_id, None))
                if time.perf_counter() >= deadline:
                    break
        finally:
            directories.close()
        if not walk.items and not walk.pods:
            self._through(walk)
        elif walk.done is None:
            self.start(walk)
        else:
            # A turn of the loop between the pieces of a pass: whatever waits for the work
            # after replies to settle (a reload) does not wait for the whole pass.
            asyncio.get_running_loop().call_soon(self.start, walk)

    def _through(self, walk: Walk) -> None:
        if walk.done is not None and not walk.done.done():
            walk.done.set_result(None)
        if walk.again:
            # Once more after the pods the Synchronize writes after its reply, queued
            # before: on cgroup v1 a pod's quota that someone lowered holds its containers'
            # back until the pod is written.
            again = Walk(deque(), items=deque(walk.again), reported=walk.reported)
            again.final = True
            self.start(again)

    def _next(self, walk: Walk) -> Workload | None:
        """The walk's next workload (a pod before its containers); None once through."""
        known = self._live.known
        while not walk.items:
            if not walk.pods:
                return None
            pod_id = walk.pods.popleft()
            if pod_id in known.pods:
                walk.retried = False
                walk.items.append((pod_id, None))
                walk.items.extend((pod_id, c) for c in known.containers_of(pod_id))
        return walk.items.popleft()
