"""The one pass's face: its triggers, and a whole pass run at its pace.

The values in force are a state the plugin keeps, not a reply it once sent. Events are the
fast path: each sets what it decides at once. This pass is what makes the promise hold
whoever wrote last: for a set of workloads it reads the cgroup files, compares them with
what they must hold, writes back what differs, and counts and logs it (check.py), in
pieces of the work after replies, pods before their containers (walk.py). Its triggers,
each a method here:

- the period: every `convergence.intervalSeconds` over every known pod and container
  (`run`); only reads and repairs;
- a resize or an UpdatePodSandbox (`recheck_soon`), for that pod alone, shortly after:
  kubelet writes the pod cgroup after the containers when a resize lowers them, and (from
  kubernetes#137555) right after UpdatePodSandbox whatever the direction, so its write
  comes after the plugin's;
- a reload (`reload`): its plan first (follow.py), then a whole pass, so a reload that
  changes nothing still puts back what someone else wrote;
- a Synchronize: it answers container updates in its reply (synchronize.py); its pods are
  written around the reply (`synchronize_pods`: raised before it, lowered once the runtime
  has lowered their containers, lowering.py, the rest after it); after the reply the
  containers it left are compared with the values the runtime reports they hold
  (`check_reported`), and a container whose write failed is tried once more after the
  pods (a pod someone lowered holds it back on v1).

Under the systemd driver a repaired value is also handed back to systemd to hold (the
cgroup writer does it for every write); unit properties are not read: setting them makes
systemd write the files, where the pass sees any change.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import structlog

from nri_midbatch.cgroups.values import CgroupValues
from nri_midbatch.counts import CounterFamily, family, single
from nri_midbatch.deferred import AfterReply
from nri_midbatch.plugin.context import Live
from nri_midbatch.plugin.counters import Counters
from nri_midbatch.plugin.decisions import PodTarget
from nri_midbatch.plugin.lowering import Check, LoweringTimings, LoweringWait, Write
from nri_midbatch.plugin.reconcile.check import Checker
from nri_midbatch.plugin.reconcile.follow import ReloadFollow, UpdateContainers
from nri_midbatch.plugin.reconcile.walk import Walk, Walker
from nri_midbatch.plugin.records import Records
from nri_midbatch.plugin.writes import Writes
from nri_midbatch.policy import PodView
from nri_midbatch.state.plan import Plan

log = structlog.get_logger(__name__)

#: With the periodic pass off (interval 0), how often the setting is looked at again.
IDLE_SECONDS = 1.0

#: A container a Synchronize left as the runtime reports it (pod id, container id, values):
#: its files are checked against those values.
Reported = tuple[str, str, CgroupValues]


@dataclass(frozen=True, slots=True)
class ConvergenceTimings:
    #: Seconds after a resize or an UpdatePodSandbox at which the pod is checked again:
    #: kubelet writes the pod cgroup within milliseconds of the runtime's answer; the
    #: second check is for a kubelet that is slow (a loaded node).
    rechecks: tuple[float, ...] = (0.3, 2.0)
    #: A piece of a pass checks workloads until it has checked this many, or spent this
    #: long: a request waits for at most one piece (about 0.05 ms a workload with its files
    #: located already, a repair's writes more).
    piece_workloads: int = 16
    piece_seconds: float = 0.0005


class Reconciler:
    def __init__(
        self,
        live: Live,
        counters: Counters,
        after_reply: AfterReply,
        records: Records,
        writes: Writes,
        timings: ConvergenceTimings = ConvergenceTimings(),
        lowering_timings: LoweringTimings = LoweringTimings(),
        clock: Callable[[], float] = time.time,
        on_recheck: Callable[[str, bool], None] | None = None,
        *,
        dry_run: bool = False,
    ) -> None:
        """`writes`: the pods' writes (a Synchronize's, decided around its reply).
        `lowering_timings`: a Synchronize's wait for the runtime to lower containers
        (lowering.py). `clock`: the wall clock of the times `status` shows.
        `on_recheck(pod_id, final)`: run first at each re-check of a pod (`final`: its last),
        after the reply. `dry_run`: no check nor write (replay, audits)."""
        self._live = live
        self._counters = counters
        self._after_reply = after_reply
        self._dry_run = dry_run
        self._writes = writes
        self._lowering_timings = lowering_timings
        #: The last Synchronize's pods waiting for their containers to be lowered.
        self._lowering: LoweringWait | None = None
        self._on_recheck = on_recheck
        self._timings = timings
        #: The check of one workload, with what it keeps per workload and the notes per pod
        #: that `status` shows (`checker.checks`).
        self.checker = Checker(live, counters, clock)
        self._walker = Walker(
            live,
            after_reply,
            self.checker,
            piece_workloads=timings.piece_workloads,
            piece_seconds=timings.piece_seconds,
        )
        #: A reload's plan followed (`follow.followed`: how many went which way).
        self.follow = ReloadFollow(live, records)
        #: (pod id, delay) -> its pending re-check: a newer event moves it, so a pod has at
        #: most one per delay
        self._rechecks: dict[tuple[str, float], asyncio.TimerHandle] = {}
        self._closed = False
        #: whole passes over every known pod
        self.passes = 0
        #: Passes a reload started, not awaited
        self._passes: set[asyncio.Task[None]] = set()
        #: Whole passes run one at a time (a reload's after the period's, or the reverse)
        self._passing = asyncio.Lock()

    def counter_families(self) -> Iterator[CounterFamily]:
        yield single(
            "nri_midbatch_convergence_passes",
            "Convergence passes over every known pod and container",
            self.passes,
        )
        yield family(
            "nri_midbatch_reload_writes",
            "Containers and pods brought to a reloaded configuration, by path and result",
            ("path", "result"),
            self.follow.followed,
        )

    # -- triggers ----------------------------------------------------------------

    def recheck_soon(self, pod_id: str) -> None:
        """Check the pod and its containers again after each of `ConvergenceTimings.rechecks`."""
        if self._dry_run or self._closed:
            return
        loop = asyncio.get_running_loop()
        for delay in self._timings.rechecks:
            key = (pod_id, delay)
            pending = self._rechecks.pop(key, None)
            if pending is not None:
                pending.cancel()
            self._rechecks[key] = loop.call_later(delay, self._recheck_due, key)

    def recheck_now(self) -> None:
        """Run every pending re-check now (tests, instead of waiting for their time)."""
        for key in sorted(self._rechecks, key=lambda key: key[1]):
            self._rechecks.pop(key).cancel()
            self._recheck(key)

    def _recheck_due(self, key: tuple[str, float]) -> None:
        self._rechecks.pop(key, None)
        self._recheck(key)

    def _recheck(self, key: tuple[str, float]) -> None:
        pod_id, delay = key
        if self._on_recheck is not None and not self._closed:
            final = delay == max(self._timings.rechecks)
            self._after_reply.defer(self._on_recheck, pod_id, final)
        self.check_pod(pod_id)

    def check_pod(self, pod_id: str) -> None:
        """Check the pod and its containers after the current reply, a piece at a time."""
        if not self._closed:
            self._walker.start(Walk(deque((pod_id,))))

    async def converge(self) -> None:
        """One pass over every known pod and container, after any other; returns once it is
        through."""
        if self._dry_run or self._closed:
            return
        async with self._passing:
            if not self._closed:
                await self._converge()

    async def _converge(self) -> None:
        self.checker.prune()
        done = asyncio.get_running_loop().create_future()
        walk = Walk(deque(self._live.known.pods), done)
        started, cpu = time.perf_counter(), time.process_time()
        self._walker.start(walk)
        await done
        self.passes += 1
        # Its cost, for operators and `make bench`: three files per workload read.
        (log.info if walk.repaired else log.debug)(
            "convergence pass",
            pods=len(self.checker.checks),
            cgroups_read=walk.read,
            files_read=3 * walk.read,
            repaired=walk.repaired,
            seconds=round(time.perf_counter() - started, 4),
            cpu_seconds=round(time.process_time() - cpu, 4),
        )

    async def run(self) -> None:
        """The periodic pass, for as long as the plugin runs: `convergence.intervalSeconds`
        after the end of the last one, the setting read again at least every IDLE_SECONDS (a
        reload applies within that)."""
        loop = asyncio.get_running_loop()
        since = loop.time()
        while True:
            interval = self._live.in_force.config.convergence.interval_seconds
            wait = IDLE_SECONDS if interval <= 0 else since + interval - loop.time()
            await asyncio.sleep(min(max(wait, 0.0), IDLE_SECONDS))
            interval = self._live.in_force.config.convergence.interval_seconds
            if interval > 0 and loop.time() >= since + interval:
                await self.converge()
                since = loop.time()

    def check_reported(self, reported: list[Reported]) -> None:
        """The Synchronize's trigger, after its reply: containers the runtime reports at the
        values in force (so asked for no update) whose files may not hold them.

        A runtime killed while it applied an update may have stored the new resources
        without their reaching the cgroup (containerd persists the spec first): its next
        Synchronize reports values the files do not hold. Queued now, before the pods the
        Synchronize writes after its reply (a pod goes down only after its containers).
        """
        size = self._timings.piece_workloads
        for start in range(0, len(reported), size):
            chunk = reported[start : start + size]
            walk = Walk(
                deque(),
                items=deque((pod_id, container_id) for pod_id, container_id, _ in chunk),
                reported={container_id: values for _, container_id, values in chunk},
            )
            self._walker.start(walk)

    def synchronize_pods(
        self, targets: Sequence[PodTarget], raising: set[str], lowered: Mapping[str, Check]
    ) -> None:
        """The Synchronize's trigger for its pods (decided, `targets`): written before its
        reply, after it, or later.

        The runtime applies the reply's container updates after the reply. A pod whose
        containers' quota goes up (`raising`) is raised first, now (on cgroup v1 a child's
        quota above its pod's is EINVAL); refused, it tries once more when its turn comes. A
        pod whose containers go down (`lowered`: the check of its last container, in the
        reply's order) is written once the runtime has lowered them, as their cgroup files
        show (lowering.py). Any other pod is written right after the reply, which also keeps
        0.2 ms of file I/O per pod out of the one request the runtime gives 2 s for the
        whole node.
        """
        writes = self._writes
        if self._lowering is not None:
            self._lowering.cancel()  # a newer Synchronize decides every pod anew
        wait = self._lowering = LoweringWait(
            self._after_reply, timings=self._lowering_timings, counters=self._counters
        )
        #: pod id -> its pod and its write, for the pods that wait
        waiting: dict[str, tuple[PodView, Write]] = {}
        for decided in targets:
            pod_id = decided.pod_id
            if pod_id in raising and writes.pod(decided, "Synchronize", refuse=False, final=False):
                continue
            write: Write = functools.partial(writes.pod_if_current, decided, "Synchronize")
            if pod_id in lowered:
                waiting[pod_id] = decided.pod, write
            else:
                self._after_reply.defer(write)
        # In the order the runtime will get to them.
        for pod_id, check in lowered.items():
            if pod_id in waiting:
                pod, write = waiting[pod_id]
                wait.add(f"{pod.namespace}/{pod.name}", check, write)
        wait.start()

    async def through(self) -> None:
        """Wait for the passes reloads started (tests)."""
        while self._passes:
            await asyncio.gather(*self._passes)

    def close(self) -> None:
        """Stop: no re-check or piece of a pass runs any more (shutting down)."""
        self._closed = True
        self._walker.close()
        for timer in self._rechecks.values():
            timer.cancel()
        self._rechecks.clear()
        for task in self._passes:
            task.cancel()  # its walk's pieces stop: it would wait for good

    # -- the reload's trigger ----------------------------------------------------------

    async def reload(
        self, plan: Plan, update_containers: UpdateContainers | None, timeout: float
    ) -> None:
        """Bring running workloads to a reload's `plan`, then start a pass over every one.

        `update_containers`: the runtime's, where it is safe (it returns once the runtime
        has applied the updates; `timeout` its deadline); else, and for what it refuses, the
        cgroup files. Pods whose containers' quota rises go first, the other pods after the
        containers. The pass (with convergence on) puts back what anyone else wrote, which no
        plan sees: a reload that changes nothing still repairs drift.
        """
        if plan:
            await self.follow.follow(plan, update_containers, timeout)
        interval = self._live.in_force.config.convergence.interval_seconds
        if interval > 0 and not self._dry_run and not self._closed:
            task = asyncio.create_task(self.converge())
            self._passes.add(task)
            task.add_done_callback(self._passes.discard)
