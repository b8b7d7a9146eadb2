"""Lowering a pod only once the runtime has lowered its containers.

A pod's cgroup bounds its containers'. Lowered first, it would hold less than
its children for a while, and on cgroup v1 the kernel refuses outright a pod
CFS quota below a child's (EINVAL). So a pod goes down only after its
containers, and up before them (the plugin raises those before its reply).

After a Synchronize, the runtime applies the reply's container updates on
its own time: containerd does it in its plugin accept loop once it has the
reply, one container after another, 0.3 to 0.9 s later on a quiet node. It
tells the plugin nothing when it is done: no reply, and no event unless a pod
happens to change. The only witness is the containers' own cgroup files. The
runtime applies the updates one after another, in the reply's order, so a
pod whose containers are being lowered waits here until the last of them in
that order holds no more than the values sent for it (or its cgroup is gone),
and is written then: one container read per pod, not one per container.
(After a reload, UpdateContainers returns once the runtime has applied the
updates, and the cgroup-file path writes containers itself: the order holds
there without waiting; see reconcile/follow.py.)

Bounded in time and reads:
- polled every `LoweringTimings.poll`, from the work queue that runs after replies,
  `CGROUP_READS_PER_PIECE` containers to a piece of work, so a poll never delays a
  request by more than those few reads;
- pods are waited for in the order of their last updates, which is the
  order the runtime gets to them: a poll stops at the first pod not yet
  lowered, so it usually reads one container's files;
- with no container seen lowered for `LoweringTimings.stall` (an update the runtime
  failed to apply, or one changed again since), the pods still waiting are
  written anyway, the kernel decides, and the warning names them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from nri_midbatch.deferred import CGROUP_READS_PER_PIECE, AfterReply
from nri_midbatch.plugin.counters import Counters

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class LoweringTimings:
    """How often the containers are read, and how long the pods wait for them at most."""

    #: Fine next to the 0.3-0.9 s the runtime takes; one read of two or three files each.
    poll: float = 0.02
    #: Longer than containerd takes for one container (a runc update, 10-50 ms under load).
    stall: float = 5.0


#: True once the container holds no more than what the runtime was asked to set.
Check = Callable[[], bool]
#: Writes the pod.
Write = Callable[[], None]


@dataclass(slots=True)
class _Waiting:
    name: str
    lowered: Check
    write: Write


class LoweringWait:
    """The pods of one Synchronize that wait for their containers to be lowered."""

    def __init__(
        self,
        after_reply: AfterReply,
        *,
        timings: LoweringTimings = LoweringTimings(),
        counters: Counters | None = None,
    ) -> None:
        """counters: the plugin's, where pods written unconfirmed are counted."""
        self._after_reply = after_reply
        self._counters = Counters() if counters is None else counters
        self._poll = timings.poll
        self._stall = timings.stall
        self._waiting: deque[_Waiting] = deque()
        self._progress_at = 0.0
        self._cancelled = False

    def add(self, name: str, lowered: Check, write: Write) -> None:
        """Write a pod (`name` for the log) once `lowered` holds, after those added before."""
        self._waiting.append(_Waiting(name, lowered, write))

    def start(self) -> None:
        """Begin once the reply is out (call from the handler that replies)."""
        if self._waiting:
            self._progress_at = time.monotonic()
            self._after_reply.defer(self._check)

    def cancel(self) -> None:
        """A newer Synchronize has taken over: it decides every pod anew."""
        self._cancelled = True
        self._waiting.clear()

    def _check(self) -> None:
        if self._cancelled:
            return
        waiting = self._waiting
        # Many containers seen lowered at once (a node's worth): a few reads
        # to a piece of work, so that a request waits for no more than those.
        reads = CGROUP_READS_PER_PIECE
        while waiting and waiting[0].lowered():
            self._progress_at = time.monotonic()
            # Each write is a piece of work of its own: a request arriving
            # meanwhile waits for one pod, not for all of them.
            self._after_reply.defer(waiting.popleft().write)
            reads -= 1
            if not reads:
                self._after_reply.defer(self._check)
                return
        if not waiting:
            return
        if time.monotonic() - self._progress_at < self._stall:
            self._after_reply.defer_later(self._poll, self._check)
            return
        log.warning(
            "runtime did not lower containers in time, writing their pods anyway",
            waited_seconds=self._stall,
            pods=len(waiting),
            first_pod=waiting[0].name,
        )
        self._counters.pods_lowered_unconfirmed += len(waiting)
        while waiting:
            self._after_reply.defer(waiting.popleft().write)
